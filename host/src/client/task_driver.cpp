#include "task_driver.hpp"

#include <algorithm>
#include <stdexcept>

#include "lent.hpp"

namespace skyforge {

namespace {

sf_sink string_sink(std::string& s) {
  return sf_sink{&s, [](void* c, const char* d, size_t n) { lent([&] { static_cast<std::string*>(c)->append(d, n); }); }};
}

sf_sink lines_sink(std::vector<std::string>& v) {
  return sf_sink{&v, [](void* c, const char* d, size_t n) {
                   lent([&] { static_cast<std::vector<std::string>*>(c)->emplace_back(d, n); });
                 }};
}

// Batches hold at most this many tasks (the buffer the backend writes into).
constexpr size_t kMaxBatch = 1 << 18;

}  // namespace

TaskDriver::TaskDriver(const PluginInstance& backend, const JobSpec& job, uint32_t nodes, uint32_t concurrency,
                       uint32_t pipeline, bool timings)
    : backend_(backend),
      hooks_(*backend.hooks<sf_task_hooks>()),
      job_(job),
      timings_(timings),
      held_max_(uint64_t(std::max<uint32_t>(1, concurrency)) * std::max<uint32_t>(1, pipeline)),
      sent_(nodes),
      lost_(nodes) {
  n_tasks_ = job.inputs.empty() ? job.tasks : job.inputs.size();
  if (hooks_.plan) {
    std::vector<std::string> given;
    if (job.inputs.empty()) {
      given.reserve(n_tasks_);
      for (uint64_t i = 0; i < n_tasks_; ++i) given.push_back(std::to_string(i));
    }
    const std::vector<std::string>& in = job.inputs.empty() ? given : job.inputs;
    std::vector<const char*> ptrs;
    ptrs.reserve(in.size());
    for (const auto& s : in) ptrs.push_back(s.c_str());
    backend_.call(&sf_task_hooks::plan, "plan", ptrs.data(), ptrs.size(), lines_sink(planned_));
    if (!planned_.empty()) n_tasks_ = planned_.size();
  }
  results_.resize(n_tasks_);
  result_node_.resize(n_tasks_);
  out_.resize(n_tasks_);
  sf_task_job j{};
  j.struct_size = sizeof j;
  j.nodes = nodes;
  j.slots_per_node = std::max<uint32_t>(1, concurrency);
  j.pipeline = std::max<uint32_t>(1, pipeline);
  j.n_tasks = n_tasks_;
  j.app = job.app.c_str();
  backend_.call(&sf_task_hooks::begin, "begin", &j);
  refresh_state();
}

std::string TaskDriver::input(uint64_t task) const {
  if (!planned_.empty()) return planned_[task];
  return job_.inputs.empty() ? std::to_string(task) : job_.inputs[task];
}

std::optional<std::string> TaskDriver::refresh_state() {
  std::string why;
  state_ = backend_.invoke(&sf_task_hooks::state, "state", string_sink(why));
  if (state_ == SF_TASKS_FAILED)
    return why.empty() ? "task backend '" + backend_.plugin().name + "' failed the job without saying why" : why;
  if (state_ != SF_TASKS_RUNNING && state_ != SF_TASKS_DONE) {
    const int32_t bad = state_;
    state_ = SF_TASKS_FAILED;
    return "task backend '" + backend_.plugin().name + "': state() returned " + std::to_string(bad) +
           ", expected SF_TASKS_RUNNING, _DONE or _FAILED";
  }
  if (state_ == SF_TASKS_DONE)
    for (const auto& s : sent_)
      if (!s.empty()) {
        state_ = SF_TASKS_FAILED;
        return "task backend '" + backend_.plugin().name + "' said the job was done with batches still out";
      }
  return std::nullopt;
}

std::optional<msg::TaskBatch> TaskDriver::next_batch(uint32_t node) {
  if (state_ != SF_TASKS_RUNNING || lost_[node] || sent_[node].size() >= held_max_) return std::nullopt;
  buffer_.resize(std::min<uint64_t>(kMaxBatch, std::max<uint64_t>(1, n_tasks_)));
  size_t n = 0;
  backend_.call(&sf_task_hooks::next_batch, "next_batch", node, buffer_.data(), buffer_.size(), &n);
  if (n == 0) return std::nullopt;
  if (n > buffer_.size())
    throw PluginError("plugin '" + backend_.plugin().name + "' next_batch: " + std::to_string(n) +
                          " tasks in a buffer of " + std::to_string(buffer_.size()), SF_ERR);
  Sent sent;
  sent.first = buffer_[0];
  sent.count = n;
  bool contiguous = true;
  for (size_t k = 0; k < n; ++k) {
    const uint64_t t = buffer_[k];
    if (t >= n_tasks_ || out_[t])
      throw PluginError("plugin '" + backend_.plugin().name + "' next_batch: handed out task " + std::to_string(t) +
                            (t >= n_tasks_ ? ", which does not exist (the job has " + std::to_string(n_tasks_) + ")"
                                           : ", which is already out on a node"),
                        SF_ERR);
    out_[t] = 1;
    contiguous = contiguous && t == sent.first + k;
  }
  if (!contiguous) sent.tasks.assign(buffer_.begin(), buffer_.begin() + n);
  msg::TaskBatch b;
  b.first = sent.first;
  b.tasks = sent.tasks;
  b.inputs.reserve(n);
  for (size_t k = 0; k < n; ++k) b.inputs.push_back(input(sent.task(k)));
  if (timings_) sent.at = Clock::now();
  sent_[node].emplace(b.first, std::move(sent));
  return b;
}

std::optional<std::string> TaskDriver::take_results(uint32_t node, msg::TaskResults&& r) {
  auto it = sent_[node].find(r.first);
  if (it == sent_[node].end()) throw std::runtime_error("results for a batch it was not sent (task " + std::to_string(r.first) + ")");
  Sent sent = std::move(it->second);
  sent_[node].erase(it);
  if (r.results.size() != sent.count)
    throw std::runtime_error(std::to_string(r.results.size()) + " results for a batch of " + std::to_string(sent.count));
  if (timings_)
    batch_rtt_us_.push_back(std::chrono::duration<double, std::micro>(Clock::now() - sent.at).count());
  outcomes_.resize(sent.count);
  for (size_t k = 0; k < sent.count; ++k) {
    const uint64_t t = sent.task(k);
    out_[t] = 0;
    msg::TaskResult& res = results_[t];
    res = std::move(r.results[k]);
    result_node_[t] = node;
    outcomes_[k] = sf_task_outcome{t, node, res.slot, res.ok ? 1 : 0, res.value.data(), res.value.size()};
  }
  if (state_ != SF_TASKS_RUNNING) return std::nullopt;
  backend_.call(&sf_task_hooks::completed, "completed", node, outcomes_.data(), outcomes_.size(), r.elapsed_ns);
  return refresh_state();
}

std::optional<std::string> TaskDriver::node_lost(uint32_t node) {
  if (lost_[node]) return std::nullopt;
  lost_[node] = 1;
  for (auto& [first, sent] : sent_[node])
    for (size_t k = 0; k < sent.count; ++k) out_[sent.task(k)] = 0;
  sent_[node].clear();
  if (state_ != SF_TASKS_RUNNING) return std::nullopt;
  backend_.call(&sf_task_hooks::node_lost, "node_lost", node);
  return refresh_state();
}

std::vector<std::string> TaskDriver::report() const {
  std::vector<std::string> lines;
  if (hooks_.report) {
    std::vector<sf_task_outcome> all(n_tasks_);
    for (uint64_t t = 0; t < n_tasks_; ++t)
      all[t] = sf_task_outcome{t, result_node_[t], results_[t].slot, results_[t].ok ? 1 : 0, results_[t].value.data(),
                               results_[t].value.size()};
    backend_.call(&sf_task_hooks::report, "report", all.data(), all.size(), lines_sink(lines));
    return lines;
  }
  lines.reserve(n_tasks_);
  for (uint64_t t = 0; t < n_tasks_; ++t) lines.push_back("[task " + std::to_string(t) + "] => " + results_[t].value);
  return lines;
}

}  // namespace skyforge
