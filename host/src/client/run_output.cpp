#include "run_output.hpp"

#include <algorithm>
#include <cstdio>

namespace skyforge {

Printer::~Printer() {
  std::lock_guard<std::mutex> lock(mu_);
  clear_status();
}

void Printer::clear_status() {
  if (!live_ || status_.empty()) return;
  std::fflush(stdout);
  std::fputs("\r\033[K", stderr);  // carriage return, erase the line
  std::fflush(stderr);
}

void Printer::redraw_status() {
  if (!live_ || status_.empty()) return;
  std::fflush(stdout);
  const std::string l = "skyforge: " + status_;
  std::fwrite(l.data(), 1, l.size(), stderr);
  std::fflush(stderr);
}

void Printer::status(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!live_) return;
  clear_status();
  status_ = line.substr(0, line.find('\n'));
  redraw_status();
}

void Printer::node_lines(uint32_t node, int stream, const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  clear_status();
  FILE* f = stream == 1 ? stdout : stderr;
  std::string prefix = "[node " + std::to_string(node) + "] ";
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    std::string line = prefix;
    line.append(text, start, nl - start);
    line.push_back('\n');
    std::fwrite(line.data(), 1, line.size(), f);
    start = nl + 1;
  }
  std::fflush(f);
  redraw_status();
}

void Printer::out(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  clear_status();
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  redraw_status();
}

void Printer::err(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  clear_status();
  std::string l = "skyforge: " + line + "\n";
  std::fwrite(l.data(), 1, l.size(), stderr);
  std::fflush(stderr);
  redraw_status();
}

void Printer::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  std::fflush(stdout);
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
