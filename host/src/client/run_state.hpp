// What the pool run's phases, the io thread's callbacks and a restart share: the node table and
// the run's verdict under one mutex, the signals seen, the job's deadline, and the wait they all
// wait with.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>

#include "node_table.hpp"

namespace skyforge {

struct RunState {
  using Clock = std::chrono::steady_clock;

  std::mutex mu;
  std::condition_variable cv;
  NodeTable nodes;                // under mu
  std::string failure;            // under mu: the first failure, the run's verdict
  std::atomic<int> signals{0};    // SIGINT/SIGTERM received
  std::optional<Clock::time_point> deadline;  // [job] timeout, from the run's start
  double timeout_s = 0;

  void fail(const std::string& why) {  // under mu: the first failure stands
    if (failure.empty()) failure = why;
    cv.notify_all();
  }

  // Waits until pred() holds, the run has failed or the deadline passes (`deadline`, or the job's,
  // which fails the run). Under mu; pred() is looked at every 100 ms at least.
  template <class Pred>
  bool wait_for(std::unique_lock<std::mutex>& lock, Pred pred, std::optional<Clock::time_point> until_at) {
    auto stop = [&] { return pred() || !failure.empty(); };
    for (;;) {
      auto until = Clock::now() + std::chrono::milliseconds(100);
      if (until_at && *until_at < until) until = *until_at;
      if (deadline && *deadline < until) until = *deadline;
      cv.wait_until(lock, until, stop);
      if (pred()) return true;
      if (!failure.empty()) return false;
      if (deadline && Clock::now() >= *deadline) {
        fail("the job ran past its timeout of " + std::to_string(timeout_s) + " s");
        return false;
      }
      if (until_at && Clock::now() >= *until_at) return false;
    }
  }
};

}  // namespace skyforge
