#include "output_pump.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <system_error>

namespace skyforge {
namespace {
int checked(int rc, const char* what) {
  if (rc < 0) throw std::system_error(errno, std::generic_category(), what);
  return rc;
}
}  // namespace

void OutputWindow::acquire(size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return released_ || forwarded_ - acked_ < window_; });
  forwarded_ += bytes;
}

void OutputWindow::ack(uint64_t total) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (total <= acked_) return;
    acked_ = total;
  }
  cv_.notify_all();
}

void OutputWindow::release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
  }
  cv_.notify_all();
}

uint64_t OutputWindow::forwarded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return forwarded_;
}

uint64_t OutputWindow::acknowledged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return acked_;
}

OutputPump::OutputPump(LineFn fn, OutputWindow* window) : fn_(std::move(fn)), window_(window) {
  std::fflush(nullptr);
  saved_out_ = checked(fcntl(1, F_DUPFD_CLOEXEC, 3), "dup stdout");
  saved_err_ = checked(fcntl(2, F_DUPFD_CLOEXEC, 3), "dup stderr");
  diag_fd_ = saved_err_;
  int out[2], err[2];
  checked(pipe2(out, O_CLOEXEC), "pipe");
  checked(pipe2(err, O_CLOEXEC), "pipe");
  // dup2 clears FD_CLOEXEC on 1 and 2: children inherit the write ends, nothing else.
  checked(dup2(out[1], 1), "dup2 stdout");
  checked(dup2(err[1], 2), "dup2 stderr");
  close(out[1]);
  close(err[1]);
  read_out_ = out[0];
  read_err_ = err[0];
  setvbuf(stdout, nullptr, _IOLBF, 0);
  t_out_ = std::thread([this] { reader(read_out_, 1); });
  t_err_ = std::thread([this] { reader(read_err_, 2); });
}

OutputPump::~OutputPump() { finish(); }

void OutputPump::reader(int fd, int stream) {
  std::string pending;
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t last_nl = pending.rfind('\n');
    if (last_nl == std::string::npos) {
      if (pending.size() < (1u << 20)) continue;  // an endless line: forward it in 1 MiB pieces
      pending.push_back('\n');
      last_nl = pending.size() - 1;
    }
    std::string whole = pending.substr(0, last_nl + 1);
    pending.erase(0, last_nl + 1);
    // Without the host's window the pipe is left unread: its writers block, as on a terminal.
    if (window_) window_->acquire(whole.size());
    fn_(stream, std::move(whole));
  }
  if (!pending.empty()) {
    pending.push_back('\n');
    if (window_) window_->acquire(pending.size());
    fn_(stream, std::move(pending));
  }
  close(fd);
}

void OutputPump::finish() {
  if (finished_) return;
  finished_ = true;
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  // Closing our write ends (by pointing 1 and 2 back) lets the readers see EOF.
  dup2(saved_out_, 1);
  dup2(saved_err_, 2);
  if (t_out_.joinable()) t_out_.join();
  if (t_err_.joinable()) t_err_.join();
  close(saved_out_);
  // saved_err_ stays open as diag_fd_ until the process exits.
}

}  // namespace skyforge
