// Redirects this process's stdout and stderr into pipes and forwards whole lines to a
// callback, from two reader threads. Children started afterwards inherit the pipes, so a
// native app's output and a command app's output travel the same way.
//
// Flow control (msg::OutputAck, docs/architecture.md "Output"): with an OutputWindow the readers
// forward at most its size ahead of what the host has acknowledged, then stop reading the pipes
// until the host catches up: the writers (the job) block in write() as on a stalled terminal,
// and nothing is dropped.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace skyforge {

class OutputWindow {
 public:
  explicit OutputWindow(uint64_t window) : window_(window) {}
  // Waits while `window` bytes or more are forwarded and not acknowledged (unless released),
  // then counts `bytes` more as forwarded. One chunk may overshoot the window: lines stay whole.
  void acquire(size_t bytes);
  // The host is done with `total` bytes in all (a running total: an older one changes nothing).
  void ack(uint64_t total);
  // acquire() never waits again: the host is gone (or the worker is leaving).
  void release();
  uint64_t forwarded() const;
  uint64_t acknowledged() const;

 private:
  const uint64_t window_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t forwarded_ = 0, acked_ = 0;
  bool released_ = false;
};

class OutputPump {
 public:
  // stream: 1 stdout, 2 stderr; text: one or more '\n'-terminated lines
  using LineFn = std::function<void(int stream, std::string&& text)>;

  // `window`, if any, must outlive the pump; its acquire() is called before each forward.
  explicit OutputPump(LineFn fn, OutputWindow* window = nullptr);
  ~OutputPump();
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;

  // A descriptor that still reaches the original stderr (for the process's own diagnostics).
  int diag_fd() const { return diag_fd_; }

  // Flushes C and C++ streams, points fds 1 and 2 back at the originals and waits until the
  // readers have forwarded everything (once every other writer, e.g. a child, is gone).
  void finish();

 private:
  void reader(int fd, int stream);

  LineFn fn_;
  OutputWindow* window_ = nullptr;
  int saved_out_ = -1;
  int saved_err_ = -1;
  int diag_fd_ = -1;
  int read_out_ = -1;
  int read_err_ = -1;
  std::thread t_out_, t_err_;
  bool finished_ = false;
};

}  // namespace skyforge
