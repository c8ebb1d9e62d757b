// The `joblib` task backend's policy (docs/plugins.md, "Task backends"): what joblib's
// Parallel does with a pool of workers, for a map job's tasks.
//  - Order: tasks go out in input order (tasks to run again first, lowest index first), or in
//    the order an owner sets with reorder() (the sklearn backend: longest fits first).
//  - Batching: `batch_size` tasks per batch, or automatic: joblib's rule, a batch aims at
//    0.2-1 s of work (0.5 s, from a moving estimate of a task's cost; the first batches hold
//    one task), and never more than a quarter of a slot's share of what is left, so the tail
//    keeps every slot busy.
//  - Pipelining: a node holds at most `pipeline` batches per slot.
//  - Failures: the first task that fails stops the dispatch (joblib's abort_everything) and
//    fails the job, naming the task, its node and slot — unless `retry_failed` and it has
//    retries left.
//  - Lost nodes: with `retries = N`, the tasks that were out on a lost node run again
//    elsewhere, each at most N times; with 0, a lost node fails the job.
#pragma once

#include <skyforge/sdk.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace skyforge::joblib {

struct Options {
  uint64_t batch_size = 0;  // 0: automatic
  uint32_t retries = 0;
  bool retry_failed = false;
  static Options from(const skyforge::Options& o);  // throws skyforge::Error(SF_ERR_INVALID)
};

class Policy {
 public:
  // The automatic batch aims at this much work (joblib: between 0.2 and 2 s per batch; the
  // issue that made this backend asks for 0.2-1 s).
  static constexpr double kTargetBatchSeconds = 0.5;

  explicit Policy(Options o) : o_(o) {}
  void begin(const TaskJob& job);
  std::vector<uint64_t> next_batch(uint32_t node, size_t cap);
  void completed(uint32_t node, const TaskOutcomes& outcomes, uint64_t elapsed_ns);
  void node_lost(uint32_t node);
  TasksState state(std::string& why) const;
  // Sorts the tasks not handed out yet (stable) so that `before(a, b)` holds for a ahead of b;
  // tasks to run again still go first. Costs O(n log n) per call: for owners of small jobs.
  void reorder(const std::function<bool(uint64_t, uint64_t)>& before);

  double ns_per_task() const { return ns_per_task_; }

 private:
  struct Batch {
    uint64_t first = 0, count = 0;
    std::vector<uint64_t> tasks;  // only when they are not first, first+1, ...
  };
  struct Node {
    std::map<uint64_t, Batch> out;  // first task -> the batch
    bool lost = false;
  };
  uint64_t batch_size(uint64_t available) const;
  bool run_again(uint64_t task);  // counts an attempt; false when none is left
  void fail(std::string why);

  Options o_;
  TaskJob job_;
  std::vector<Node> nodes_;
  uint32_t live_nodes_ = 0;
  uint64_t next_ = 0;           // position in the dispatch order: those before it went out at least once
  std::vector<uint64_t> order_; // the dispatch order; empty: input order (next_ is the task)
  std::set<uint64_t> again_;    // to run again, lowest first
  std::map<uint64_t, uint32_t> attempts_;  // runs after the first, per task that had any
  std::vector<uint8_t> done_;
  uint64_t n_done_ = 0;
  double ns_per_task_ = 0;      // moving estimate, for automatic batches
  std::optional<std::string> failed_;
};

}  // namespace skyforge::joblib
