// Redirects this process's stdout and stderr into pipes and forwards whole lines to a
// callback, from two reader threads. Children started afterwards inherit the pipes, so a
// native app's output and a command app's output travel the same way.
#pragma once

#include <functional>
#include <string>
#include <thread>

namespace skyforge {

class OutputPump {
 public:
  // stream: 1 stdout, 2 stderr; text: one or more '\n'-terminated lines
  using LineFn = std::function<void(int stream, std::string&& text)>;

  explicit OutputPump(LineFn fn);
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
  int saved_out_ = -1;
  int saved_err_ = -1;
  int diag_fd_ = -1;
  int read_out_ = -1;
  int read_err_ = -1;
  std::thread t_out_, t_err_;
  bool finished_ = false;
};

}  // namespace skyforge
