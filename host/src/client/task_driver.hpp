// A map job's run of its task backend (abi.h, sf_task_hooks; docs/plugins.md): the plugin
// decides which tasks go to which node in which batches, and what a failure or a lost node
// means; the driver turns its decisions into TaskBatch messages, feeds the nodes' answers back,
// keeps each task's last answer, holds the plugin to its contract (a task it hands out exists
// and is not already out), and bounds what a node holds: slots × pipeline batches not yet
// answered. The pool run calls it under its lock, one call at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loader.hpp"
#include "manifest.hpp"
#include "messages.hpp"

namespace skyforge {

class TaskDriver {
 public:
  // `backend` (a task_backend instance) and `job` outlive the driver. `timings`: time each
  // batch's round trip (batch_rtt_us). Calls the backend's plan (when it has one) and begin.
  TaskDriver(const PluginInstance& backend, const JobSpec& job, uint32_t nodes, uint32_t concurrency,
             uint32_t pipeline, bool timings);

  uint64_t n_tasks() const { return n_tasks_; }
  // The next batch for `node`, counted as out there; nothing when the backend has none for it,
  // and nothing, without asking the backend, while `node` holds slots × pipeline batches.
  // Throws PluginError when the backend breaks its contract or fails.
  std::optional<msg::TaskBatch> next_batch(uint32_t node);
  // `node`'s answer to one of its batches. Returns the job's failure once it has failed.
  // Throws std::runtime_error for an answer to no batch of that node.
  std::optional<std::string> take_results(uint32_t node, msg::TaskResults&& r);
  // `node` is gone: its unanswered batches go back to the backend. Returns the job's failure
  // when that fails it.
  std::optional<std::string> node_lost(uint32_t node);
  bool done() const { return state_ == SF_TASKS_DONE; }
  // What the run prints after a job that is done: the backend's report, else `[task I] =>
  // result` per task.
  std::vector<std::string> report() const;
  const std::vector<double>& batch_rtt_us() const { return batch_rtt_us_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Sent {
    uint64_t first = 0, count = 0;
    std::vector<uint64_t> tasks;  // only when they are not first, first+1, ...
    Clock::time_point at;
    uint64_t task(size_t k) const { return tasks.empty() ? first + k : tasks[k]; }
  };

  std::optional<std::string> refresh_state();
  std::string input(uint64_t task) const;

  const PluginInstance& backend_;
  const sf_task_hooks& hooks_;
  const JobSpec& job_;
  bool timings_;
  uint64_t held_max_;  // batches a node may hold: slots × pipeline
  std::vector<std::string> planned_;  // the backend's inputs, when it made them
  uint64_t n_tasks_ = 0;
  int32_t state_ = SF_TASKS_RUNNING;
  std::vector<msg::TaskResult> results_;  // by task: its last answer
  std::vector<uint32_t> result_node_;
  std::vector<uint8_t> out_;                 // by task: in a batch not yet answered
  std::vector<std::map<uint64_t, Sent>> sent_;  // by node: first task -> the batch
  std::vector<uint8_t> lost_;
  std::vector<uint64_t> buffer_;
  std::vector<sf_task_outcome> outcomes_;  // reused for every answer
  std::vector<double> batch_rtt_us_;
};

}  // namespace skyforge
