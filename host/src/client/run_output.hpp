// What `skyforge run` prints on the terminal: every node's output, prefixed with [node N] and
// filtered by the job's stdout/stderr policy, the host's own messages, and the --timings line
// (docs/architecture.md, "Output").
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "manifest.hpp"

namespace skyforge {

// Serialises terminal output from many nodes: whole lines, never interleaved mid-line.
class Printer {
 public:
  // `live_status`: stderr is a terminal, so status() keeps one live line below the output.
  explicit Printer(bool live_status = false) : live_(live_status) {}
  ~Printer();
  // Each line of `text` on stdout (stream 1) or stderr (any other stream), prefixed "[node N] ".
  void node_lines(uint32_t node, int stream, const std::string& text);
  void out(const std::string& line);  // one line on stdout
  void err(const std::string& line);  // "skyforge: <line>" on stderr
  void flush();                       // stdout
  // A transient status (SF_LOG_STATUS): with live_status, "skyforge: <line>" kept as the last
  // line of the terminal and replaced by the next status; every other line is printed above
  // it. Without, nothing. An empty line clears it.
  void status(const std::string& line);

 private:
  void clear_status();    // with mu_ held
  void redraw_status();   // with mu_ held
  std::mutex mu_;
  bool live_ = false;
  std::string status_;
};

// Connections the control port turned away (wrong secret, junk, too many pending handshakes),
// told without letting a flood flood the output: the first kShown verbatim, then at most one
// summary line per kWindow (as the next rejection arrives) and one from flush() at the end, each
// with the count held back and the last peer and reason.
class RejectionLog {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  static constexpr uint64_t kShown = 3;
  static constexpr std::chrono::seconds kWindow{10};

  explicit RejectionLog(std::function<void(const std::string&)> out, Clock clock = std::chrono::steady_clock::now)
      : out_(std::move(out)), clock_(std::move(clock)) {}
  void add(const std::string& peer, const std::string& why);
  void flush();

 private:
  void summary(std::unique_lock<std::mutex>& lock);  // prints and resets what was held back
  std::function<void(const std::string&)> out_;
  Clock clock_;
  std::mutex mu_;
  uint64_t total_ = 0, held_ = 0;
  std::string last_;
  std::chrono::steady_clock::time_point window_start_{};
};

// Whether `node`'s stdout or stderr is shown under [job] stdout / stderr = `policy`.
bool policy_allows(OutputPolicy policy, uint32_t node);

// `skyforge run --timings`: one machine-readable line (bench/ parses it), each phase as
// "name=ms since the run started", then, when batches were timed (map), their count and the
// p50 and p99 of their round trips.
std::string timings_line(const std::vector<std::pair<std::string, double>>& phases, std::vector<double> batch_rtt_us);

}  // namespace skyforge
