// The map-job scheduler ([job] mode = "map", docs/manifest.md): hands the tasks out in batches,
// keeping every node `pipeline` batches per slot ahead, sizes the batches itself when [job]
// batch is 0, and gathers the results in task order. It lives in the host until task-backend
// plugins take map scheduling over (docs/architecture.md). It only decides: the pool run sends
// the batches and feeds back the answers, under its lock (one thread at a time).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "manifest.hpp"
#include "messages.hpp"

namespace skyforge {

class MapScheduler {
 public:
  // `job` (its tasks or inputs, its batch size) outlives the scheduler; a job in another mode
  // than map has no tasks. `timings`: time each batch's round trip (batch_rtt_us).
  MapScheduler(const JobSpec& job, uint32_t nodes, uint32_t concurrency, int pipeline, bool timings);

  // The next batch for `node`, counted as in flight there; nothing once the node has its
  // pipeline full, every task has been handed out, or a task failed.
  std::optional<msg::TaskBatch> next_batch(uint32_t node);
  // Takes `node`'s answer to one of its batches. Once a task has failed, returns the run's
  // failure, naming the lowest failed task, its node and slot. Throws std::runtime_error for
  // results beyond the job's tasks.
  std::optional<std::string> take_results(uint32_t node, msg::TaskResults&& r);

  bool done() const { return tasks_done_ == n_tasks_; }
  const std::vector<msg::TaskResult>& results() const { return task_results_; }  // by task index
  const std::vector<double>& batch_rtt_us() const { return batch_rtt_us_; }

 private:
  using Clock = std::chrono::steady_clock;

  std::string input(uint64_t i) const;

  const JobSpec& job_;
  uint32_t nodes_;
  uint32_t concurrency_;
  int pipeline_;
  bool timings_;
  uint64_t n_tasks_ = 0;
  uint64_t next_task_ = 0;
  uint64_t tasks_done_ = 0;
  std::vector<uint32_t> inflight_;  // per node: batches sent, not yet answered
  std::vector<msg::TaskResult> task_results_;
  std::vector<uint32_t> task_node_;
  double ns_per_task_ = 0;  // moving estimate, for auto batching
  std::optional<uint64_t> failed_task_;
  std::map<uint64_t, Clock::time_point> batch_sent_;  // first index -> send time (for timings)
  std::vector<double> batch_rtt_us_;
};

}  // namespace skyforge
