// Restarts and node replacement for [job] max_restarts (recovery.hpp).
#include "recovery.hpp"

#include <algorithm>
#include <thread>

#include "lent.hpp"
#include "protocol.hpp"

namespace skyforge {
namespace {

long long ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

bool Recovery::can_restart() const {
  return m_.job.mode != JobMode::map && restarts_used_ < m_.job.max_restarts && state_.signals == 0 &&
         state_.failure.empty();
}

void Recovery::app_failed(const std::string& why) {
  if (!state_.failure.empty() || stopping_) return;
  if (!can_restart()) state_.fail(why);
  else if (!held_ && !restart_) held_ = HeldFailure{why, Clock::now()};
}

void Recovery::node_lost(const std::string& lost) {
  if (can_restart()) {
    if (!restart_) restart_ = lost;  // the run's execute() calls restart()
    return;
  }
  const bool first = state_.failure.empty();
  state_.fail(m_.job.max_restarts > 0 && restarts_used_ >= m_.job.max_restarts && first
                  ? lost + " (no restart left: [job] max_restarts = " + std::to_string(m_.job.max_restarts) + ")"
                  : lost);
  // Said now: the teardown may take seconds (a node that cannot be reached is waited for).
  if (first) printer_.err(state_.failure + "; stopping the run");
}

void Recovery::fail_held() {
  if (held_) state_.fail(held_->why);
}

std::string Recovery::label(uint32_t restart) const {
  return "restart " + std::to_string(restart) + "/" + std::to_string(m_.job.max_restarts);
}

void Recovery::restart() {
  const auto t0 = Clock::now();
  uint32_t k;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    k = ++restarts_used_;
    why = *restart_;
    restart_.reset();
    held_.reset();
    stopping_ = true;
    for (uint32_t i : state_.nodes.open()) state_.nodes[i].conn->send_msg(msg::Type::Shutdown, msg::Shutdown{"restart"});
  }
  printer_.err(why + "; " + label(k) + ": a new worker on every node, the job resumes from its last checkpoint");
  const std::optional<std::vector<uint32_t>> unreachable = wait_stopped(k, t0);
  if (!unreachable) return;  // the run failed meanwhile
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    ++generation_;
    stopping_ = false;
    held_.reset();  // what the stopped workers said as they went
    state_.nodes.reset_workers();
  }
  const auto stop_wait = net::shutdown_wait(lease_ms_);
  for (uint32_t i = 0; i < state_.nodes.size(); ++i) {
    std::string gone;
    if (std::find(unreachable->begin(), unreachable->end(), i) != unreachable->end()) {
      replace_node(i, k, "its worker was out of reach for " + std::to_string(stop_wait.count() / 1000) + " s after it lost the host");
      continue;
    }
    try {
      pool_.launch_worker(i);
      continue;
    } catch (const PluginError& e) {
      // Only a node whose machine or session is gone (an ssh host down, an instance reclaimed)
      // is moved; any other failure ends the run as it says.
      if (e.status() != SF_ERR_GONE)
        throw std::runtime_error(label(k) + " failed: node " + std::to_string(i) + ": " + e.what());
      gone = e.what();
    }
    replace_node(i, k, gone);
  }
  pool_.rejoin();
  printer_.err(label(k) + ": every node ready again in " + std::to_string(ms_since(t0)) + " ms");
}

std::optional<std::vector<uint32_t>> Recovery::wait_stopped(uint32_t k, Clock::time_point t0) {
  const PluginInstance& provider = pool_.provider();
  const sf_provider_hooks* h = provider.hooks<sf_provider_hooks>();
  const auto deadline = t0 + net::shutdown_wait(lease_ms_);  // a worker's stop grace ends 6 s before
  for (;;) {
    std::vector<uint32_t> running;
    std::vector<std::string> ids;
    {
      std::lock_guard<std::mutex> lock(state_.mu);
      if (!state_.failure.empty()) return std::nullopt;
      ids = state_.nodes.ids();
      running = state_.nodes.open();
    }
    if (running.empty() && h->worker_alive)  // the provider is asked without the mutex: it may take a while
      for (uint32_t i = 0; i < ids.size(); ++i)
        if (provider.invoke(&sf_provider_hooks::worker_alive, "worker_alive", ids[i].c_str()) == 1) running.push_back(i);
    if (running.empty()) return std::vector<uint32_t>{};
    if (Clock::now() >= deadline) {
      // Their connections closed long ago (none is open: those go first), yet the provider cannot
      // see the workers end: their machines are out of reach (a Slurm node whose slurmd died with
      // it keeps its step's srun waiting). A provider that can gives them other machines.
      bool all_closed = true;
      {
        std::lock_guard<std::mutex> lock(state_.mu);
        for (uint32_t i : running) all_closed = all_closed && !state_.nodes[i].open();
      }
      if (h->replace_node && all_closed) return running;
      throw std::runtime_error("restart " + std::to_string(k) + ": the workers of node" + (running.size() > 1 ? "s " : " ") +
                               NodeTable::ranks(running, ", ") + " did not stop");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Recovery::replace_node(uint32_t node, uint32_t restart, const std::string& why) {
  const auto t0 = Clock::now();
  const std::string k = label(restart);
  const PluginInstance& provider = pool_.provider();
  const std::string& name = m_.pool.provider;
  if (!provider.hooks<sf_provider_hooks>()->replace_node)
    throw std::runtime_error(k + " failed: the '" + name + "' provider could not start a worker again on node " +
                             std::to_string(node) + " (" + why + ") and cannot replace a node");
  printer_.err(k + ": node " + std::to_string(node) + " cannot take a worker (" + why + "); the '" + name +
               "' provider gives it another machine");
  std::string id, address;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    id = state_.nodes[node].id;
  }
  if (provider.invoke(&sf_provider_hooks::replace_node, "replace_node", id.c_str(), text_sink(address)) != SF_OK)
    throw std::runtime_error(k + " failed: node " + std::to_string(node) + " could not be replaced: " + provider.last_error());
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    state_.nodes[node].address = address;
  }
  if (std::string e = pool_.bootstrap_node(node); !e.empty()) throw std::runtime_error(k + " failed: the replacement of " + e);
  pool_.launch_worker(node);
  printer_.err(k + ": node " + std::to_string(node) + " replaced: now at " + address + ", bootstrapped in " +
               std::to_string(ms_since(t0)) + " ms");
}

}  // namespace skyforge
