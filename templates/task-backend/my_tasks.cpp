// A task backend decides how a map job's tasks are spread over the pool (docs/plugins.md, "Task
// backends"). This one is OpenMP's schedule(static) by default: the tasks are cut into one
// contiguous chunk per slot up front and each chunk goes out as one batch to its node. With the
// option `chunk` = N it is schedule(dynamic, N): whichever node asks gets the next N tasks, as
// often as it asks; the host stops asking a node that holds slots × pipeline batches, so a
// faster node simply gets more. A failed task fails the job. Its report says which node ran
// which tasks, then (option report_results) each result.
//
// The host calls these hooks from its own threads, one at a time, and never waits on them for
// long: keep them quick and non-blocking.
#include <skyforge/sdk.hpp>

#include <algorithm>
#include <string>
#include <vector>

class MyTasks : public skyforge::TaskBackend {
 public:
  explicit MyTasks(const skyforge::Context& ctx)
      : TaskBackend(ctx),
        chunk_(ctx.options.get_int("chunk", 0)),
        report_results_(ctx.options.get_bool("report_results", true)) {
    if (chunk_ < 0) throw skyforge::Error("option 'chunk': expected 0 (static) or more tasks, got " + std::to_string(chunk_), SF_ERR_INVALID);
  }

  void begin(const skyforge::TaskJob& job) override {
    // Static: slot s of node n gets chunk n * slots + s; chunks differ in size by one task at most.
    const uint64_t chunks = uint64_t(job.nodes) * job.slots_per_node;
    next_chunk_.assign(job.nodes, 0);
    nodes_.assign(job.nodes, Node{});
    slots_ = job.slots_per_node;
    for (uint64_t c = 0; c < chunks; ++c) bounds_.push_back(job.n_tasks * c / chunks);
    bounds_.push_back(job.n_tasks);
    n_tasks_ = job.n_tasks;
    todo_ = job.n_tasks;
  }

  std::vector<uint64_t> next_batch(uint32_t node, size_t cap) override {
    std::vector<uint64_t> batch = chunk_ > 0 ? next_dynamic(cap) : next_static(node, cap);
    if (!batch.empty()) {
      Node& n = nodes_[node];
      n.most_out = std::max(n.most_out, ++n.out);
    }
    return batch;
  }

  void completed(uint32_t node, const skyforge::TaskOutcomes& outcomes, uint64_t) override {
    Node& n = nodes_[node];
    --n.out;
    ++n.batches;
    for (const skyforge::TaskOutcome o : outcomes) {
      --todo_;
      ++n.tasks;
      if (!o.ok && failure_.empty())
        failure_ = "task " + std::to_string(o.task) + " failed on node " + std::to_string(node) + ": " + std::string(o.value);
    }
  }

  // Tasks out on a lost node are not run again here: a lost node fails the job.
  void node_lost(uint32_t node) override {
    if (failure_.empty()) failure_ = "node " + std::to_string(node) + " was lost with its tasks";
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
    for (uint32_t node = 0; node < nodes_.size(); ++node) {
      const Node& n = nodes_[node];
      std::string line = "my_tasks: node " + std::to_string(node) + " ran ";
      if (chunk_ > 0)
        line += std::to_string(n.tasks) + " tasks in " + std::to_string(n.batches) + " batches, at most " +
                std::to_string(n.most_out) + " out at once";
      else
        line += "tasks " + std::to_string(bounds_[uint64_t(node) * slots_]) + " to " +
                std::to_string(bounds_[uint64_t(node + 1) * slots_] - 1);
      lines.push_back(line);
    }
    if (report_results_)
      for (const skyforge::TaskOutcome r : results) lines.push_back("[task " + std::to_string(r.task) + "] => " + std::string(r.value));
    return lines;
  }

 private:
  struct Node {
    uint64_t out = 0, most_out = 0;  // batches handed out and not yet answered; the most at once
    uint64_t tasks = 0, batches = 0;  // answered
  };

  // schedule(static): this node's next slot's chunk, once.
  std::vector<uint64_t> next_static(uint32_t node, size_t cap) {
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

  // schedule(dynamic, chunk): the next chunk of tasks, to whoever asks.
  std::vector<uint64_t> next_dynamic(size_t cap) {
    std::vector<uint64_t> batch;
    while (next_task_ < n_tasks_ && batch.size() < std::min<uint64_t>(cap, chunk_)) batch.push_back(next_task_++);
    return batch;
  }

  int64_t chunk_;  // 0: static
  bool report_results_;
  uint32_t slots_ = 1;
  std::vector<uint64_t> bounds_;      // static: chunk c is [bounds_[c], bounds_[c + 1])
  std::vector<uint32_t> next_chunk_;  // static, per node: its next slot's chunk
  uint64_t n_tasks_ = 0, next_task_ = 0;  // dynamic: the next task to hand out
  std::vector<Node> nodes_;
  uint64_t todo_ = 0;
  std::string failure_;
};

SKYFORGE_PLUGIN(MyTasks, "my_tasks", "0.1.0", "Template task backend: static chunks, one per slot, or dynamic ones")
