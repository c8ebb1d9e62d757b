// The client's end of the nodes' job files (docs/manifest.md, "Getting files back"): what each
// node streams after the run's final Shutdown (msg::OutputsBegin, OutputChunk, OutputsEnd) is
// written under <dir>/node-<N>/. A name from a node is checked (msg::output_name_problem) before
// it becomes a path, is opened part by part without following a symlink, and is written to a
// temporary name that becomes its own only once the whole file is in; the node's cap is held
// here too, whatever the node says. What is left behind, and why, is said; so are the
// progress of a long copy and, at the end, where the files are.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "manifest.hpp"
#include "messages.hpp"
#include "run.hpp"

namespace skyforge {

// "512 B", "1.5 KiB", "312.0 MiB", "1.0 GiB".
std::string byte_text(uint64_t bytes);

// Where a run's files go: `skyforge run --outputs DIR` (against the current directory), else
// [job] outputs_dir, else skyforge-outputs/<date>-<time>-<pool id> in the current directory, a
// fresh one per run.
std::string outputs_dir(const Manifest& m, const RunOptions& options, const std::string& pool_id);

class OutputsReceiver {
 public:
  using Clock = std::chrono::steady_clock;
  using Say = std::function<void(const std::string& line)>;
  // A progress line per node this often, once its copy has taken that long.
  static constexpr std::chrono::seconds kProgressEvery{5};

  // `dir`: where node-<N>/ go (made when the first file comes); `cap`: a node's bytes at most;
  // `progress_every`: how often a long copy says how far it is.
  OutputsReceiver(std::string dir, uint64_t cap, uint32_t nodes, Say say, Clock::duration progress_every = kProgressEvery);
  ~OutputsReceiver();
  OutputsReceiver(const OutputsReceiver&) = delete;
  OutputsReceiver& operator=(const OutputsReceiver&) = delete;

  // One of `node`'s Outputs* frames; `ack` sends the node a running total (msg::OutputsAck).
  // Never throws: a frame that breaks the rules ends what the node may send, said.
  void on_frame(uint32_t node, msg::Type type, std::string_view payload, const std::function<void(uint64_t)>& ack);
  // `node`'s connection ended: a file it was sending is removed, and the loss said.
  void on_closed(uint32_t node);
  // Whether a node is sending and was heard from within `idle` (the teardown waits for it).
  bool busy(Clock::duration idle) const;
  // The run's end: whatever is unfinished is removed and said, then where the files are.
  void finish();

 private:
  struct Node;
  void on_begin(Node& n, const msg::OutputsBegin& b);
  void on_chunk(Node& n, msg::OutputChunk&& c);
  void on_end(Node& n, const msg::OutputsEnd& e);
  std::string open_file(Node& n, const std::string& name);  // "" or why not
  void drop_file(Node& n, const std::string& why);          // the open file removed; why said
  void cut_short(Node& n);                                   // the node stopped mid-way
  std::string node_dir(uint32_t node) const;

  const std::string dir_;
  const uint64_t cap_;
  const Say say_;
  const Clock::duration progress_every_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Node>> nodes_;
  bool finished_ = false;
};

}  // namespace skyforge
