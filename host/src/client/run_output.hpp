// What `skyforge run` prints on the terminal: every node's output, prefixed with [node N] and
// filtered by the job's stdout/stderr policy, the host's own messages, and the --timings line
// (docs/architecture.md, "Output").
#pragma once

#include <cstdint>
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

// Whether `node`'s stdout or stderr is shown under [job] stdout / stderr = `policy`.
bool policy_allows(OutputPolicy policy, uint32_t node);

// `skyforge run --timings`: one machine-readable line (bench/ parses it), each phase as
// "name=ms since the run started", then, when batches were timed (map), their count and the
// p50 and p99 of their round trips.
std::string timings_line(const std::vector<std::pair<std::string, double>>& phases, std::vector<double> batch_rtt_us);

}  // namespace skyforge
