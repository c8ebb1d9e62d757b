// What `skyforge run` prints on the terminal: every node's output, prefixed with [node N] and
// filtered by the job's stdout/stderr policy, the host's own messages, and the --timings line
// (docs/architecture.md, "Output").
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "manifest.hpp"

namespace skyforge {

// Serialises terminal output from many nodes: whole lines, never interleaved mid-line, in the
// order they were handed in. Nothing here blocks its caller: lines go into a queue that one
// writer thread of its own writes to stdout and stderr, so a slow or stalled reader (`| less`,
// Ctrl-S, a pipe nobody reads) holds that thread only, never the control loop and its
// heartbeats (docs/architecture.md, "Output"). What bounds the queue is the nodes' flow control:
// a node's output is handed in with a `done` callback, called once it is written (or discarded),
// which acknowledges it to the node (OutputAcks). Lines without one (the workers' own log, the
// bootstrap's lines) are dropped while more than kMaxUnpaced bytes wait, and counted; the host's
// own lines are never dropped. A descriptor that fails (EPIPE: the reader is gone) is written no
// more; what was meant for it is discarded and counted, said once at once on the other one and
// with the count at flush() and at the end.
class Printer {
 public:
  using Done = std::function<void()>;
  static constexpr size_t kMaxUnpaced = size_t{16} << 20;

  // `live_status`: stderr is a terminal, so status() keeps one live line below the output.
  explicit Printer(bool live_status = false, int out_fd = 1, int err_fd = 2);
  // Writes everything still queued (it waits for a stalled reader, as any program would).
  ~Printer();
  Printer(const Printer&) = delete;
  Printer& operator=(const Printer&) = delete;
  // Each line of `text` on stdout (stream 1) or stderr (any other stream), prefixed "[node N] ".
  // `done` runs on the writer thread once they are written or discarded.
  void node_lines(uint32_t node, int stream, const std::string& text, Done done = {});
  void out(const std::string& line);  // one line on stdout
  void err(const std::string& line);  // "skyforge: <line>" on stderr
  void flush();                       // waits until everything handed in so far is written
  // A transient status (SF_LOG_STATUS): with live_status, "skyforge: <line>" kept as the last
  // line of the terminal and replaced by the next status; every other line is printed above
  // it. Without, nothing. An empty line clears it.
  void status(const std::string& line);
  // Zero while node output with a `done` callback waits or is being written; else how long ago
  // the last was written (the teardown waits for workers whose output is still flowing).
  std::chrono::steady_clock::duration output_idle() const;

  struct Counts {
    uint64_t dropped_lines = 0;      // lines without `done` dropped: the queue was over kMaxUnpaced
    uint64_t discarded_out = 0;      // lines not written: stdout had failed
    uint64_t discarded_err = 0;      // lines not written: stderr had failed
  };
  Counts counts() const;

 private:
  enum class Kind { Text, Status, Flush };
  struct Item {
    Kind kind = Kind::Text;
    int fd = 1;
    std::string bytes;
    Done done;
    bool paced = false;    // node output under flow control
    bool bounded = false;  // node output without: dropped (and counted) beyond kMaxUnpaced
  };
  void push(Item&& item);
  void writer();
  void write_text(int fd, const std::string& bytes);  // writer thread
  bool write_all(int fd, const char* data, size_t size);  // false: the descriptor failed
  void clear_status();    // writer thread
  void redraw_status();   // writer thread
  // writer thread: the lines dropped since the last time; `all`: and those discarded (a failed descriptor)
  void say_counts(bool all);

  const bool live_;
  const int out_fd_, err_fd_;
  // writer-thread state
  std::string status_;
  int out_errno_ = 0, err_errno_ = 0;  // the descriptor failed with this
  uint64_t said_dropped_ = 0, said_out_ = 0, said_err_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_, written_cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  size_t unpaced_bytes_ = 0;      // queued bytes of items without `done`
  size_t paced_pending_ = 0;      // paced items queued or in the writer's hands
  std::chrono::steady_clock::time_point paced_last_{};
  uint64_t pushed_ = 0, written_ = 0;
  Counts counts_;
  std::thread thread_;
};

// The host's end of one node's output window (msg::OutputAck): counts the bytes of the node's
// stdout/stderr Log text the host is done with and sends the running total to the node each time
// a quarter window has accumulated since the last acknowledgement. Thread-safe.
class OutputAcks {
 public:
  explicit OutputAcks(std::function<void(uint64_t total)> send, uint64_t window);
  void done(size_t bytes);

 private:
  std::function<void(uint64_t)> send_;
  const uint64_t step_;
  std::mutex mu_;
  uint64_t total_ = 0, sent_ = 0;
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
