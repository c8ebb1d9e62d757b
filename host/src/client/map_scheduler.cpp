#include "map_scheduler.hpp"

#include <algorithm>
#include <stdexcept>

namespace skyforge {

MapScheduler::MapScheduler(const JobSpec& job, uint32_t nodes, uint32_t concurrency, int pipeline, bool timings)
    : job_(job), nodes_(nodes), concurrency_(concurrency), pipeline_(pipeline), timings_(timings), inflight_(nodes) {
  if (job.mode == JobMode::map) {
    n_tasks_ = job.inputs.empty() ? job.tasks : job.inputs.size();
    task_results_.resize(n_tasks_);
    task_node_.resize(n_tasks_);
  }
}

std::string MapScheduler::input(uint64_t i) const {
  return job_.inputs.empty() ? std::to_string(i) : job_.inputs[i];
}

std::optional<msg::TaskBatch> MapScheduler::next_batch(uint32_t node) {
  if (failed_task_) return std::nullopt;
  const uint32_t slots_here = std::max<uint32_t>(1, concurrency_);
  const uint64_t total_slots = uint64_t(slots_here) * nodes_;
  if (!(inflight_[node] < uint32_t(pipeline_) * slots_here && next_task_ < n_tasks_)) return std::nullopt;
  uint64_t remaining = n_tasks_ - next_task_;
  uint64_t size = job_.batch;
  if (size == 0) {
    // Auto batching: ~20 ms of work per batch once the cost of a task is known, but never so
    // large that the tail leaves slots idle (at least 4 batches per slot remain available).
    uint64_t cap = std::max<uint64_t>(1, remaining / (4 * total_slots));
    uint64_t want = ns_per_task_ > 0 ? static_cast<uint64_t>(20e6 / ns_per_task_) : 1;
    size = std::clamp<uint64_t>(want, 1, cap);
  }
  size = std::min(size, remaining);
  msg::TaskBatch b;
  b.first = next_task_;
  b.inputs.reserve(size);
  for (uint64_t i = 0; i < size; ++i) b.inputs.push_back(input(next_task_ + i));
  next_task_ += size;
  ++inflight_[node];
  if (timings_) batch_sent_[b.first] = Clock::now();
  return b;
}

std::optional<std::string> MapScheduler::take_results(uint32_t node, msg::TaskResults&& r) {
  if (inflight_[node] > 0) --inflight_[node];
  if (timings_) {
    auto it = batch_sent_.find(r.first);
    if (it != batch_sent_.end()) {
      batch_rtt_us_.push_back(std::chrono::duration<double, std::micro>(Clock::now() - it->second).count());
      batch_sent_.erase(it);
    }
  }
  if (r.first + r.results.size() > n_tasks_) throw std::runtime_error("task results out of range");
  if (!r.results.empty()) {
    double per = double(r.elapsed_ns) / double(r.results.size());
    ns_per_task_ = ns_per_task_ == 0 ? per : 0.7 * ns_per_task_ + 0.3 * per;
  }
  for (size_t k = 0; k < r.results.size(); ++k) {
    uint64_t idx = r.first + k;
    if (!r.results[k].ok && (!failed_task_ || idx < *failed_task_)) failed_task_ = idx;
    task_node_[idx] = node;
    task_results_[idx] = std::move(r.results[k]);
  }
  tasks_done_ += r.results.size();
  if (!failed_task_) return std::nullopt;
  const auto& tr = task_results_[*failed_task_];
  return "task " + std::to_string(*failed_task_) + " failed on node " + std::to_string(task_node_[*failed_task_]) +
         " slot " + std::to_string(tr.slot) + ": " + tr.value;
}

}  // namespace skyforge
