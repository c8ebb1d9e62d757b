#include "run_output.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace skyforge {

Printer::Printer(bool live_status, int out_fd, int err_fd) : live_(live_status), out_fd_(out_fd), err_fd_(err_fd) {
  std::fflush(nullptr);  // whatever stdio holds goes first: from here on the writer writes the descriptors
  thread_ = std::thread([this] { writer(); });
}

Printer::~Printer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Printer::push(Item&& item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (item.bounded && unpaced_bytes_ + item.bytes.size() > kMaxUnpaced) {
      counts_.dropped_lines += static_cast<uint64_t>(std::count(item.bytes.begin(), item.bytes.end(), '\n'));
      return;
    }
    if (item.kind == Kind::Text && !item.paced) unpaced_bytes_ += item.bytes.size();
    if (item.paced) ++paced_pending_;
    ++pushed_;
    queue_.push_back(std::move(item));
  }
  cv_.notify_one();
}

void Printer::writer() {
  // A reader that went away makes write() fail with EPIPE; this thread never dies of SIGPIPE.
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, nullptr);
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stop_, and everything written
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    switch (item.kind) {
      case Kind::Text:
        clear_status();
        write_text(item.fd, item.bytes);
        redraw_status();
        break;
      case Kind::Status:
        clear_status();
        status_ = item.bytes;
        redraw_status();
        break;
      case Kind::Flush:
        say_counts(true);
        break;
    }
    if (item.done) item.done();
    bool idle;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (item.kind == Kind::Text && !item.paced) unpaced_bytes_ -= item.bytes.size();
      if (item.paced) {
        --paced_pending_;
        paced_last_ = std::chrono::steady_clock::now();
      }
      ++written_;
      idle = queue_.empty();
    }
    written_cv_.notify_all();
    if (idle) say_counts(false);  // caught up: lines dropped meanwhile are said now
  }
  say_counts(true);
  clear_status();
}

bool Printer::write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void Printer::write_text(int fd, const std::string& bytes) {
  const bool is_out = fd == out_fd_;
  int& failed = is_out ? out_errno_ : err_errno_;
  if (failed == 0) {
    if (fd == STDOUT_FILENO) std::fflush(stdout);  // what a plugin printf()ed goes first, as it did
    if (write_all(fd, bytes.data(), bytes.size())) return;
    // Part of these bytes may have gone out; the whole item counts as not written.
    failed = errno ? errno : EIO;
    int& other_failed = is_out ? err_errno_ : out_errno_;
    const int other = is_out ? err_fd_ : out_fd_;
    if (other_failed == 0) {
      const std::string l = std::string("skyforge: ") + (is_out ? "stdout" : "stderr") + ": " + std::strerror(failed) +
                            ": what is meant for it is discarded from here on; the run goes on\n";
      if (!write_all(other, l.data(), l.size())) other_failed = errno ? errno : EIO;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  (is_out ? counts_.discarded_out : counts_.discarded_err) +=
      static_cast<uint64_t>(std::count(bytes.begin(), bytes.end(), '\n'));
}

void Printer::say_counts(bool all) {
  Counts c = counts();
  std::string l;
  if (c.dropped_lines > said_dropped_) {
    l += "skyforge: " + std::to_string(c.dropped_lines - said_dropped_) + " lines of the workers' logs dropped: more than " +
         std::to_string(kMaxUnpaced >> 20) + " MiB of output waited for stdout/stderr to be read\n";
    said_dropped_ = c.dropped_lines;
  }
  if (all && c.discarded_out > said_out_ && out_errno_ != 0) {
    l += "skyforge: " + std::to_string(c.discarded_out - said_out_) + " lines not written to stdout (" +
         std::strerror(out_errno_) + ")\n";
    said_out_ = c.discarded_out;
  }
  if (all && c.discarded_err > said_err_ && err_errno_ != 0 && out_errno_ == 0) {
    // stderr is gone: said on stdout, the only place left
    l += "skyforge: " + std::to_string(c.discarded_err - said_err_) + " lines not written to stderr (" +
         std::strerror(err_errno_) + ")\n";
    said_err_ = c.discarded_err;
    if (write_all(out_fd_, l.data(), l.size())) return;
    out_errno_ = errno ? errno : EIO;
    return;
  }
  if (l.empty() || err_errno_ != 0) return;
  clear_status();
  if (!write_all(err_fd_, l.data(), l.size())) err_errno_ = errno ? errno : EIO;
  redraw_status();
}

void Printer::clear_status() {
  if (!live_ || status_.empty() || err_errno_ != 0) return;
  if (!write_all(err_fd_, "\r\033[K", 4)) err_errno_ = errno ? errno : EIO;  // carriage return, erase the line
}

void Printer::redraw_status() {
  if (!live_ || status_.empty() || err_errno_ != 0) return;
  const std::string l = "skyforge: " + status_;
  if (!write_all(err_fd_, l.data(), l.size())) err_errno_ = errno ? errno : EIO;
}

void Printer::status(const std::string& line) {
  if (!live_) return;
  Item item;
  item.kind = Kind::Status;
  item.bytes = line.substr(0, line.find('\n'));
  push(std::move(item));
}

void Printer::node_lines(uint32_t node, int stream, const std::string& text, Done done) {
  const std::string prefix = "[node " + std::to_string(node) + "] ";
  Item item;
  item.fd = stream == 1 ? out_fd_ : err_fd_;
  item.bytes.reserve(text.size() + (text.size() / 32 + 1) * prefix.size());
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    item.bytes += prefix;
    item.bytes.append(text, start, nl - start);
    item.bytes.push_back('\n');
    start = nl + 1;
  }
  if (done) {
    item.paced = true;
    item.done = std::move(done);
  } else {
    item.bounded = true;
  }
  push(std::move(item));
}

void Printer::out(const std::string& line) {
  Item item;
  item.fd = out_fd_;
  item.bytes = line + "\n";
  push(std::move(item));
}

void Printer::err(const std::string& line) {
  Item item;
  item.fd = err_fd_;
  item.bytes = "skyforge: " + line + "\n";
  push(std::move(item));
}

void Printer::flush() {
  Item item;
  item.kind = Kind::Flush;
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t mine = ++pushed_;
  queue_.push_back(std::move(item));
  cv_.notify_one();
  written_cv_.wait(lock, [&] { return written_ >= mine; });
}

std::chrono::steady_clock::duration Printer::output_idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (paced_pending_ > 0) return std::chrono::steady_clock::duration::zero();
  if (paced_last_ == std::chrono::steady_clock::time_point{}) return std::chrono::steady_clock::duration::max();
  return std::chrono::steady_clock::now() - paced_last_;
}

Printer::Counts Printer::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

OutputAcks::OutputAcks(std::function<void(uint64_t)> send, uint64_t window)
    : send_(std::move(send)), step_(window / 4 > 0 ? window / 4 : 1) {}

void OutputAcks::done(size_t bytes) {
  uint64_t total;
  {
    std::lock_guard<std::mutex> lock(mu_);
    total_ += bytes;
    if (total_ - sent_ < step_) return;
    sent_ = total = total_;
  }
  send_(total);  // a later total may overtake an earlier one: the node keeps the largest
}

bool policy_allows(OutputPolicy p, uint32_t node) {
  return p == OutputPolicy::All || (p == OutputPolicy::Head && node == 0);
}

std::string timings_line(const std::vector<std::pair<std::string, double>>& phases, std::vector<double> batch_rtt_us) {
  std::string line = "timings:";
  char buf[64];
  for (const auto& [name, ms] : phases) {
    std::snprintf(buf, sizeof buf, " %s=%.3f", name.c_str(), ms);
    line += buf;
  }
  if (!batch_rtt_us.empty()) {
    std::sort(batch_rtt_us.begin(), batch_rtt_us.end());
    auto pct = [&](double q) { return batch_rtt_us[std::min(batch_rtt_us.size() - 1, size_t(q * batch_rtt_us.size()))]; };
    std::snprintf(buf, sizeof buf, " batches=%zu", batch_rtt_us.size());
    line += buf;
    std::snprintf(buf, sizeof buf, " batch_rtt_p50_us=%.1f batch_rtt_p99_us=%.1f", pct(0.50), pct(0.99));
    line += buf;
  }
  return line;
}

void RejectionLog::add(const std::string& peer, const std::string& why) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::string line = "rejected a connection from " + peer + ": " + why;
  if (++total_ <= kShown) {
    lock.unlock();
    out_(line);
    return;
  }
  if (held_ == 0 && window_start_ == std::chrono::steady_clock::time_point{}) window_start_ = clock_();
  ++held_;
  last_ = peer + ": " + why;
  if (clock_() - window_start_ >= kWindow) summary(lock);
}

void RejectionLog::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  if (held_) summary(lock);
}

void RejectionLog::summary(std::unique_lock<std::mutex>& lock) {
  const std::string line = "rejected " + std::to_string(held_) + " more connection" + (held_ == 1 ? "" : "s") +
                           " (" + std::to_string(total_) + " in all; the last from " + last_ + ")";
  held_ = 0;
  window_start_ = clock_();
  lock.unlock();
  out_(line);
}

}  // namespace skyforge
