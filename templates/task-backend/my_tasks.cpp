// A task backend decides how a map job's tasks are spread over the pool (docs/plugins.md, "Task
// backends"). This one is OpenMP's schedule(static): the tasks are cut into one contiguous
// chunk per slot up front, each chunk goes out as one batch to its node, and a failed task
// fails the job. Its report says which node ran which tasks, then (option report_results)
// each result.
//
// The host calls these hooks from its own threads, one at a time, and never waits on them for
// long: keep them quick and non-blocking.
#include <skyforge/sdk.hpp>

#include <string>
#include <vector>

class MyTasks : public skyforge::TaskBackend {
 public:
  explicit MyTasks(const skyforge::Context& ctx)
      : TaskBackend(ctx), report_results_(ctx.options.get_bool("report_results", true)) {}

  void begin(const skyforge::TaskJob& job) override {
    // Slot s of node n gets chunk n * slots + s; chunks differ in size by one task at most.
    const uint64_t chunks = uint64_t(job.nodes) * job.slots_per_node;
    next_chunk_.assign(job.nodes, 0);
    slots_ = job.slots_per_node;
    for (uint64_t c = 0; c < chunks; ++c) bounds_.push_back(job.n_tasks * c / chunks);
    bounds_.push_back(job.n_tasks);
    todo_ = job.n_tasks;
  }

  std::vector<uint64_t> next_batch(uint32_t node, size_t cap) override {
    std::vector<uint64_t> batch;
    while (batch.empty() && next_chunk_[node] < slots_) {
      const uint64_t c = uint64_t(node) * slots_ + next_chunk_[node]++;
      for (uint64_t t = bounds_[c]; t < bounds_[c + 1] && batch.size() < cap; ++t) batch.push_back(t);
      if (batch.size() == cap && batch.back() + 1 < bounds_[c + 1])
        throw skyforge::Error("a chunk of " + std::to_string(bounds_[c + 1] - bounds_[c]) +
                              " tasks does not fit one batch (at most " + std::to_string(cap) + ")");
    }
    return batch;
  }

  void completed(uint32_t node, const skyforge::TaskOutcomes& outcomes, uint64_t) override {
    for (const skyforge::TaskOutcome o : outcomes) {
      --todo_;
      if (!o.ok && failure_.empty())
        failure_ = "task " + std::to_string(o.task) + " failed on node " + std::to_string(node) + ": " + std::string(o.value);
    }
  }

  // Static chunks have nowhere else to go: a lost node fails the job.
  void node_lost(uint32_t node) override {
    if (failure_.empty()) failure_ = "node " + std::to_string(node) + " was lost with its chunk";
  }

  skyforge::TasksState state(std::string& why) override {
    if (!failure_.empty()) {
      why = failure_;
      return skyforge::TasksState::failed;
    }
    return todo_ == 0 ? skyforge::TasksState::done : skyforge::TasksState::running;
  }

  std::vector<std::string> report(const skyforge::TaskOutcomes& results) override {
    std::vector<std::string> lines;
    for (uint32_t node = 0; node < next_chunk_.size(); ++node) {
      const uint64_t lo = bounds_[uint64_t(node) * slots_], hi = bounds_[uint64_t(node + 1) * slots_];
      lines.push_back("my_tasks: node " + std::to_string(node) + " ran tasks " + std::to_string(lo) + " to " +
                      std::to_string(hi - 1));
    }
    if (report_results_)
      for (const skyforge::TaskOutcome r : results) lines.push_back("[task " + std::to_string(r.task) + "] => " + std::string(r.value));
    return lines;
  }

 private:
  bool report_results_;
  uint32_t slots_ = 1;
  std::vector<uint64_t> bounds_;      // chunk c is [bounds_[c], bounds_[c + 1])
  std::vector<uint32_t> next_chunk_;  // per node: its next slot's chunk
  uint64_t todo_ = 0;
  std::string failure_;
};

SKYFORGE_PLUGIN(MyTasks, "my_tasks", "0.1.0", "Template task backend: static chunks, one per slot")
