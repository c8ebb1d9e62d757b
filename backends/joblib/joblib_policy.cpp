#include "joblib_policy.hpp"

#include <algorithm>

namespace skyforge::joblib {

namespace {

// "task 4 was" / "3 tasks (4 to 9) were" / "no task was": what a lost node held.
std::string held_text(const std::vector<uint64_t>& tasks) {
  if (tasks.empty()) return "no task was";
  const auto [lo, hi] = std::minmax_element(tasks.begin(), tasks.end());
  if (tasks.size() == 1) return "task " + std::to_string(*lo) + " was";
  return std::to_string(tasks.size()) + " tasks (" + std::to_string(*lo) + " to " + std::to_string(*hi) + ") were";
}

}  // namespace

Options Options::from(const skyforge::Options& o) {
  Options r;
  const int64_t b = o.get_int("batch_size", 0);
  if (b < 0) throw Error("option 'batch_size': expected 0 (automatic) or more tasks, got " + std::to_string(b), SF_ERR_INVALID);
  r.batch_size = uint64_t(b);
  const int64_t n = o.get_int("retries", 0);
  if (n < 0 || n > 1000) throw Error("option 'retries': expected 0 to 1000, got " + std::to_string(n), SF_ERR_INVALID);
  r.retries = uint32_t(n);
  r.retry_failed = o.get_bool("retry_failed", false);
  if (r.retry_failed && r.retries == 0)
    throw Error("option 'retry_failed': true runs a failed task again within 'retries', which is 0; set retries = N",
                SF_ERR_INVALID);
  return r;
}

void Policy::begin(const TaskJob& job) {
  job_ = job;
  job_.slots_per_node = std::max<uint32_t>(1, job.slots_per_node);
  job_.pipeline = std::max<uint32_t>(1, job.pipeline);
  nodes_.assign(job.nodes, Node{});
  live_nodes_ = job.nodes;
  done_.assign(job.n_tasks, 0);
  order_.clear();
  next_ = 0;
}

uint64_t Policy::batch_size(uint64_t available) const {
  if (o_.batch_size > 0) return std::min(o_.batch_size, available);
  // joblib's auto batching: enough tasks for the target duration once a task's cost is known,
  // one until then; and at most a quarter of a slot's share of what is left.
  const uint64_t slots = uint64_t(std::max<uint32_t>(1, live_nodes_)) * job_.slots_per_node;
  const uint64_t tail_cap = std::max<uint64_t>(1, available / (4 * slots));
  const uint64_t want = ns_per_task_ > 0 ? uint64_t(kTargetBatchSeconds * 1e9 / ns_per_task_) : 1;
  return std::clamp<uint64_t>(want, 1, std::min(tail_cap, available));
}

std::vector<uint64_t> Policy::next_batch(uint32_t node, size_t cap) {
  std::vector<uint64_t> batch;
  if (failed_ || node >= nodes_.size() || nodes_[node].lost) return batch;
  if (nodes_[node].out.size() >= size_t(job_.pipeline) * job_.slots_per_node) return batch;
  const uint64_t available = again_.size() + (job_.n_tasks - next_);
  if (available == 0) return batch;
  const uint64_t size = std::min<uint64_t>(batch_size(available), cap);
  batch.reserve(size);
  while (batch.size() < size && !again_.empty()) {
    batch.push_back(*again_.begin());
    again_.erase(again_.begin());
  }
  const bool scattered = !batch.empty() || !order_.empty();  // not first, first+1, ...
  while (batch.size() < size && next_ < job_.n_tasks) batch.push_back(order_.empty() ? next_ : order_[next_]), ++next_;
  Batch& b = nodes_[node].out[batch.front()];
  b.first = batch.front();
  b.count = batch.size();
  if (scattered) b.tasks = batch;
  return batch;
}

bool Policy::run_again(uint64_t task) {
  uint32_t& n = attempts_[task];
  if (n >= o_.retries) return false;
  ++n;
  again_.insert(task);
  return true;
}

void Policy::fail(std::string why) {
  if (!failed_) failed_ = std::move(why);
}

void Policy::completed(uint32_t node, const TaskOutcomes& outcomes, uint64_t elapsed_ns) {
  if (node >= nodes_.size() || outcomes.empty()) return;
  nodes_[node].out.erase(outcomes.front().task);
  const double per = double(elapsed_ns) / double(outcomes.size());
  ns_per_task_ = ns_per_task_ == 0 ? per : 0.7 * ns_per_task_ + 0.3 * per;
  for (const TaskOutcome r : outcomes) {
    if (r.task >= done_.size() || done_[r.task]) continue;
    if (r.ok) {
      done_[r.task] = 1;
      ++n_done_;
    } else if (failed_ || !o_.retry_failed || !run_again(r.task)) {
      // The first failure stops the dispatch; a later one in the same batch does not change why.
      const uint32_t again = o_.retry_failed ? attempts_[r.task] : 0;
      fail("task " + std::to_string(r.task) + " failed on node " + std::to_string(r.node) + " slot " +
           std::to_string(r.slot) + ": " + std::string(r.value) +
           (again ? " (run " + std::to_string(again + 1) + " times; [tasks] retries = " + std::to_string(o_.retries) + ")"
                  : ""));
    }
  }
}

void Policy::reorder(const std::function<bool(uint64_t, uint64_t)>& before) {
  if (order_.empty()) {
    order_.resize(job_.n_tasks);
    for (uint64_t i = 0; i < job_.n_tasks; ++i) order_[i] = i;
  }
  std::stable_sort(order_.begin() + std::ptrdiff_t(next_), order_.end(), before);
}

void Policy::node_lost(uint32_t node) {
  if (node >= nodes_.size() || nodes_[node].lost) return;
  Node& n = nodes_[node];
  n.lost = true;
  --live_nodes_;
  std::vector<uint64_t> held;
  for (const auto& [first, b] : n.out)
    for (uint64_t k = 0; k < b.count; ++k) held.push_back(b.tasks.empty() ? b.first + k : b.tasks[k]);
  n.out.clear();
  if (o_.retries == 0) {
    fail("[tasks] retries = 0, so a lost node fails the job (" + held_text(held) + " out on it)");
    return;
  }
  for (uint64_t t : held)
    if (!run_again(t)) {
      fail("task " + std::to_string(t) + " was out on a lost node " + std::to_string(attempts_[t] + 1) +
           " times ([tasks] retries = " + std::to_string(o_.retries) + ")");
      return;
    }
  if (live_nodes_ == 0) fail("every node of the pool is lost");
}

TasksState Policy::state(std::string& why) const {
  if (failed_) {
    why = *failed_;
    return TasksState::failed;
  }
  return n_done_ == job_.n_tasks ? TasksState::done : TasksState::running;
}

}  // namespace skyforge::joblib
