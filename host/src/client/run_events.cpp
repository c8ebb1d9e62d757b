// What the io thread hands the pool run (pool_run.hpp): a worker's authenticated connection, its
// frames, the connection's end (a node lost: the task backend, a restart or the run's failure
// answers it), SIGINT/SIGTERM; and a map job's scheduling of batches onto the nodes.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "pool_run.hpp"

namespace skyforge {
namespace {

// How a node's worker ended, as its provider saw it (worker_exit, ABI 1.2): the signal or exit
// status and the worker's last words ("task 17 (slot 0) of app 'x' died of SIGSEGV"), then the
// connection's own reason. The connection drops a moment before the worker can be reaped, so
// the provider is asked for up to 500 ms (a remote agent notices within 100 ms, then its line
// crosses the network); a worker still running (a lease that ran out on a stopped one) or a
// provider that cannot tell leaves the reason as it was.
std::string describe_loss(const PluginInstance& provider, const std::string& node_id, const std::string& reason) {
  using Clock = std::chrono::steady_clock;
  const sf_provider_hooks* h = provider.hooks<sf_provider_hooks>();
  if (!h || !h->worker_exit) return reason;
  sf_worker_exit e{};
  e.struct_size = sizeof e;
  int32_t known = 0;
  for (const auto until = Clock::now() + std::chrono::milliseconds(500);;) {
    known = provider.invoke(&sf_provider_hooks::worker_exit, "worker_exit", node_id.c_str(), &e);
    if (known != 0 || Clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (known != 1) return reason;
  e.last_words[sizeof e.last_words - 1] = '\0';
  std::string how;
  if (e.signal > 0) {
    const char* abbrev = sigabbrev_np(e.signal);
    const char* descr = sigdescr_np(e.signal);
    how = "its worker was killed by " + (abbrev ? "SIG" + std::string(abbrev) : "signal " + std::to_string(e.signal)) +
          (descr ? " (" + std::string(descr) + ")" : "");
  } else {
    how = "its worker exited with status " + std::to_string(e.exit_code);
  }
  if (e.last_words[0]) how += "; its last words: " + std::string(e.last_words);
  return how + " [" + reason + "]";
}

}  // namespace

void PoolRun::on_authenticated(std::shared_ptr<net::Connection> c) {
  const uint32_t node = c->node();
  std::lock_guard<std::mutex> lock(st_.mu);
  if (!st_.nodes.attach(node, c)) {
    printer_.err("dropping a duplicate or out-of-range worker claiming node " + std::to_string(node));
    c->abort();
    return;
  }
  const uint64_t gen = recovery_.generation();
  c->start([this, node, gen](msg::Type t, std::string&& p) { on_frame(node, gen, t, std::move(p)); },
           [this, node, gen](const std::string& reason) { on_closed(node, gen, reason); });
}

void PoolRun::on_frame(uint32_t node, uint64_t gen, msg::Type t, std::string&& payload) {
  std::unique_lock<std::mutex> lock(st_.mu);
  if (gen != recovery_.generation()) return;  // a worker a restart replaced
  Node& n = st_.nodes[node];
  try {
    switch (t) {
      case msg::Type::Hello: {
        auto h = net::deserialize<msg::Hello>(payload);
        if (h.node != node) throw std::runtime_error("Hello names node " + std::to_string(h.node));
        n.hello = std::move(h);
        break;
      }
      case msg::Type::Progress:
        n.progress = net::deserialize<msg::Progress>(payload);
        n.progress_at = Clock::now();
        return;  // nobody waits on it: execute() looks every 100 ms
      case msg::Type::Ready:
        n.ready = true;
        if (m_.job.mode == JobMode::map) dispatch(node);
        break;
      case msg::Type::Log:
        on_log(node, net::deserialize<msg::Log>(payload), lock);
        return;
      case msg::Type::OutputsBegin:
      case msg::Type::OutputChunk:
      case msg::Type::OutputsEnd: {  // written without the run's mutex: files take their time
        auto conn = n.conn;
        lock.unlock();
        outputs_.on_frame(node, t, payload, [conn](uint64_t total) {
          conn->send_msg(msg::Type::OutputsAck, msg::OutputsAck{total});
        });
        return;
      }
      case msg::Type::TaskResults:
        on_results(node, net::deserialize<msg::TaskResults>(payload));
        break;
      case msg::Type::RunResult: {
        auto r = net::deserialize<msg::RunResult>(payload);
        if (!r.ok && m_.job.mode != JobMode::map) recovery_.app_failed("node " + std::to_string(node) + " failed: " + r.error);
        if (!r.ok && m_.job.mode == JobMode::map && st_.failure.empty())
          st_.fail("node " + std::to_string(node) + ": " + r.error);
        n.result = std::move(r);
        break;
      }
      default:
        throw std::runtime_error("unexpected frame type " + std::to_string(static_cast<int>(t)));
    }
  } catch (const std::exception& e) {
    st_.fail("node " + std::to_string(node) + " sent a bad frame: " + e.what());
  }
  st_.cv.notify_all();
}

// The job's stdout and stderr are acknowledged once written (or not shown): the node's flow
// control, so that a stalled reader of ours holds its output, never our io thread.
void PoolRun::on_log(uint32_t node, msg::Log&& l, std::unique_lock<std::mutex>& lock) {
  Printer::Done done;
  if (l.stream == 1 || l.stream == 2)
    done = [acks = st_.nodes[node].acks, bytes = l.text.size()] { acks->done(bytes); };
  lock.unlock();
  if (opt_.output_filter && opt_.output_filter(node, l.stream, l.text)) {
    if (done) done();
  } else if (l.stream == 3) {
    printer_.node_lines(node, 2, l.text);
  } else if (policy_allows(l.stream == 1 ? m_.job.stdout_policy : m_.job.stderr_policy, node)) {
    printer_.node_lines(node, l.stream, l.text, std::move(done));
  } else if (done) {
    done();
  }
}

void PoolRun::on_closed(uint32_t node, uint64_t gen, const std::string& reason) {
  std::unique_lock<std::mutex> lock(st_.mu);
  if (gen != recovery_.generation()) return;  // a worker a restart replaced
  st_.nodes[node].closed = true;
  outputs_.on_closed(node);
  const bool expected = st_.nodes[node].result.has_value() || st_.signals > 0 || recovery_.stopping();
  if (!expected) {
    st_.nodes[node].lost = reason;
    std::string why = reason;
    if (st_.failure.empty()) {  // the run's first failure: worth asking the provider how the worker ended
      const std::string id = st_.nodes[node].id;
      lock.unlock();
      why = describe_loss(*provider_, id, reason);
      lock.lock();
      if (gen != recovery_.generation()) return;  // a restart began meanwhile: this worker is already replaced
    }
    std::string lost = "node " + std::to_string(node) + " lost: " + why;
    if (const auto& p = st_.nodes[node].progress; p && !p->status.empty()) lost += "; last seen at " + p->status;
    if (tasks_ && st_.failure.empty() && !tasks_->done()) {
      // A map job's task backend says what the loss means: its tasks run again elsewhere
      // ([tasks] retries), or the job fails.
      std::optional<std::string> verdict;
      try {
        verdict = tasks_->node_lost(node);
      } catch (const PluginError& e) {
        verdict = std::string("task backend: ") + e.what();
      }
      if (!verdict) {
        printer_.err(lost + "; the task backend hands its tasks to the other nodes");
        for (uint32_t i = 0; i < st_.nodes.size(); ++i) dispatch(i);
        st_.cv.notify_all();
        return;
      }
      st_.fail(lost + " — " + *verdict);
    } else {
      recovery_.node_lost(lost);
    }
  }
  st_.cv.notify_all();
}

void PoolRun::on_signal(int sig) {
  if (++st_.signals == 1) {
    signal_exit_ = 128 + sig;
    printer_.err(std::string(sig == SIGINT ? "interrupted" : "terminated") +
                 ": tearing the pool down (Ctrl-C again to force)");
    {
      std::lock_guard<std::mutex> lock(st_.mu);
      st_.fail(std::string("cancelled by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM"));
    }
    // A provision still waiting (machines booting, a job queued) stops now (ABI 1.6).
    if (provisioning_ && provider_) {
      const sf_provider_hooks* h = provider_->hooks<sf_provider_hooks>();
      if (h->cancel) provider_->invoke(&sf_provider_hooks::cancel, "cancel");
    }
    return;
  }
  // Second signal: no more waiting on anyone. Terminate what exists, then leave.
  printer_.err("forced: terminating the pool now");
  if (provider_) terminate_nodes();
  std::fflush(nullptr);
  _exit(kExitInterrupted);
}

void PoolRun::dispatch(uint32_t node) {
  Node& n = st_.nodes[node];
  if (!n.ready || n.closed || !st_.failure.empty()) return;
  try {
    while (auto batch = tasks_->next_batch(node)) n.conn->send_msg(msg::Type::TaskBatch, *batch);
  } catch (const PluginError& e) {
    st_.fail(std::string("task backend: ") + e.what());
  }
}

void PoolRun::on_results(uint32_t node, msg::TaskResults&& r) {
  std::optional<std::string> failed;
  try {
    failed = tasks_->take_results(node, std::move(r));
  } catch (const PluginError& e) {
    failed = std::string("task backend: ") + e.what();
  }
  if (failed) {
    st_.fail(*failed);
    return;
  }
  dispatch(node);
}

}  // namespace skyforge
