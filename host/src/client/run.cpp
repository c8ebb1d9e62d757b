// The pool run behind `skyforge run` (run.hpp, pool_run.hpp): the phases from loading the plugins
// to the verdict, one after the other, and the teardown that every exit path goes through
// (docs/architecture.md). The io thread's callbacks are in run_events.cpp, restarts in
// recovery.cpp.
#include "run.hpp"

#include <csignal>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/signal_set.hpp>

#include <skyforge/config_keys.hpp>

#include <algorithm>
#include <future>
#include <map>
#include <thread>

#include "bootstrap_script.hpp"
#include "io_loop.hpp"
#include "lent.hpp"
#include "plugin_resolution.hpp"
#include "pool_run.hpp"
#include "self_exe.hpp"
#include "stage_files.hpp"
#include "watchdog.hpp"

namespace skyforge {

PoolRun::PoolRun(const Manifest& m, const Catalog& c, const RunOptions& o)
    : m_(m), catalog_(c), opt_(o), services_([this](int32_t level, const std::string& msg) {
        if (level == SF_LOG_STATUS) printer_.status(msg);  // a live line on a terminal only
        else if (level >= SF_LOG_INFO || opt_.verbose) printer_.err(msg);  // debug: -v only
      }) {}

void PoolRun::load_plugins() {
  provider_ = create_plugin(loader_, catalog_, m_.pool.provider, SF_KIND_PROVIDER, m_.pool.provider_options);
  for (const auto& use : m_.plugins)
    frameworks_.push_back(create_plugin(loader_, catalog_, use.name, std::nullopt, use.options));
  if (!m_.job.app.empty()) app_ = &load_app(loader_, catalog_, m_.job);
  if (m_.job.mode == JobMode::map) {
    task_backend_ = create_plugin(loader_, catalog_, m_.job.task_backend, SF_KIND_TASK_BACKEND, m_.job.task_options);
    std::lock_guard<std::mutex> lock(st_.mu);
    tasks_.emplace(*task_backend_, m_.job, m_.pool.nodes, m_.pool.concurrency, uint32_t(std::max(1, opt_.pipeline)),
                   opt_.timings);
  }
}

void PoolRun::client_enter() {
  cluster_.struct_size = sizeof(sf_cluster);
  cluster_.total_nodes = m_.pool.nodes;
  cluster_.concurrency = m_.pool.concurrency;
  cluster_.accelerator = m_.pool.accelerator.c_str();
  cluster_.provider = m_.pool.provider.c_str();
  cluster_.pool_id = pool_id_.c_str();
  image_ = m_.image;
  for (const auto& [k, v] : opt_.env) image_.env[k] = v;
  client_hooks_.enter(cluster_, image_, bootstrap_lines_);
}

void PoolRun::provision() {
  // Nodes are recorded as the provider reports them, under the mutex, so that a forced teardown
  // (second Ctrl-C) in the middle of a slow provision still terminates every node made so far.
  sf_node_sink ns{};
  ns.ctx = this;
  ns.add_node = [](void* c, const char* id, const char* addr) {
    lent([&] {
      auto* self = static_cast<PoolRun*>(c);
      std::lock_guard<std::mutex> lock(self->st_.mu);
      self->st_.nodes.add(id ? id : "", addr ? addr : "");
    });
  };
  ns.set_control_address = [](void* c, const char* a) {
    lent([&] {
      auto* self = static_cast<PoolRun*>(c);
      std::lock_guard<std::mutex> lock(self->st_.mu);
      self->control_address_ = a ? a : "";
    });
  };
  std::map<std::string, std::string> config;
  const std::vector<std::string> files =
      stage_files(worker_path(), node_plugins(m_, catalog_, frameworks_, app_, config), catalog_, image_);
  std::vector<const char*> cfiles;
  for (const auto& f : files) cfiles.push_back(f.c_str());
  sf_pool_spec spec{};
  spec.struct_size = sizeof spec;
  spec.nodes = m_.pool.nodes;
  spec.concurrency = m_.pool.concurrency;
  spec.accelerator = m_.pool.accelerator.c_str();
  spec.pool_id = pool_id_.c_str();
  spec.stage_files = cfiles.data();
  spec.n_stage_files = cfiles.size();
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    provisioned_ = true;  // from here on, teardown calls terminate even if provision fails half-way
  }
  provisioning_ = true;
  struct Done {
    std::atomic<bool>& flag;
    ~Done() { flag = false; }
  } done{provisioning_};
  provider_->call(&sf_provider_hooks::provision, "provision", &spec, &ns);
  if (st_.nodes.size() != m_.pool.nodes)
    throw std::runtime_error("provider '" + m_.pool.provider + "' provisioned " + std::to_string(st_.nodes.size()) +
                             " nodes, " + std::to_string(m_.pool.nodes) + " were asked for");
  if (control_address_.empty()) control_address_ = "127.0.0.1";
}

std::string PoolRun::worker_path() const {
  if (!opt_.worker_path.empty()) return opt_.worker_path;
  const std::string dir = self_exe_dir();
  return (dir.empty() ? "." : dir) + "/skyforge-worker";
}

void PoolRun::bootstrap_nodes() {
  script_ = bootstrap_script(image_, bootstrap_lines_);
  std::vector<std::future<std::string>> jobs;
  for (uint32_t i = 0; i < st_.nodes.size(); ++i)
    jobs.push_back(std::async(std::launch::async, [this, i] { return bootstrap_node(i); }));
  std::string first;
  for (auto& j : jobs) {
    std::string e = j.get();
    if (!e.empty() && first.empty()) first = e;
  }
  if (!first.empty()) throw std::runtime_error(first);
}

std::string PoolRun::bootstrap_node(uint32_t node) {
  struct Ctx {
    PoolRun* self;
    uint32_t node;
  } ctx{this, node};
  sf_sink log{&ctx, [](void* c, const char* d, size_t n) {
                lent([&] {
                  auto* x = static_cast<Ctx*>(c);
                  std::string line(d, n);
                  if (line.empty() || line.back() != '\n') line.push_back('\n');
                  if (x->self->opt_.verbose) x->self->printer_.node_lines(x->node, 2, "[bootstrap] " + line);
                });
              }};
  std::string id;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    id = st_.nodes[node].id;
  }
  if (provider_->invoke(&sf_provider_hooks::bootstrap, "bootstrap", id.c_str(), script_.c_str(), log) == SF_OK) return "";
  return "node " + std::to_string(node) + ": bootstrap failed: " + provider_->last_error();
}

void PoolRun::start_workers() {
  server_ = std::make_unique<net::Server>(
      io_, control_address_, 0, secret_,
      net::ConnectionOptions{net::kDefaultMaxFrame, opt_.heartbeat_ms, opt_.lease_ms, 5000},
      [this](std::shared_ptr<net::Connection> c) { on_authenticated(std::move(c)); },
      [this](const std::string& peer, const std::string& why) { rejections_.add(peer, why); });
  for (uint32_t i = 0; i < st_.nodes.size(); ++i) launch_worker(i);
}

void PoolRun::launch_worker(uint32_t node) {
  const std::string worker = worker_path();
  const std::string connect = control_address_ + ":" + std::to_string(server_->port());
  const std::string secret_key = "SKYFORGE_POOL_SECRET";
  std::string id, address;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    id = st_.nodes[node].id;
    address = st_.nodes[node].address;
  }
  std::vector<std::string> argv = {worker,    "--connect", connect, "--node", std::to_string(node), "--address",
                                   address, "--lease-ms", std::to_string(opt_.lease_ms),
                                   "--heartbeat-ms", std::to_string(opt_.heartbeat_ms), "--remove-work-dir"};
  std::vector<const char*> cargv;
  for (auto& a : argv) cargv.push_back(a.c_str());
  sf_argv av{cargv.size(), cargv.data()};
  sf_kv env[] = {{secret_key.c_str(), secret_.c_str()}};
  provider_->call(&sf_provider_hooks::start_worker, "start_worker", id.c_str(), &av, env, size_t{1});
}


void PoolRun::wait_joined() {
  std::unique_lock<std::mutex> lock(st_.mu);
  const auto deadline = Clock::now() + std::chrono::milliseconds(opt_.join_timeout_ms);
  const bool alive_hook = provider_->hooks<sf_provider_hooks>()->worker_alive != nullptr;
  for (;;) {
    if (st_.wait_for(lock, [&] { return st_.nodes.all_joined(); },
                     std::min(deadline, Clock::now() + std::chrono::milliseconds(100))))
      return;
    if (!st_.failure.empty()) return;
    if (Clock::now() >= deadline) {
      st_.fail("nodes " + NodeTable::ranks(st_.nodes.not_joined(), ", ") + " did not join the pool within " +
               std::to_string(opt_.join_timeout_ms) + " ms");
      return;
    }
    if (alive_hook)
      for (uint32_t i : st_.nodes.not_joined())
        if (provider_->invoke(&sf_provider_hooks::worker_alive, "worker_alive", st_.nodes[i].id.c_str()) == 0) {
          st_.fail("node " + std::to_string(i) + ": the worker exited before joining the pool");
          return;
        }
  }
}

void PoolRun::send_jobs() {
  std::lock_guard<std::mutex> lock(st_.mu);
  if (!st_.failure.empty()) return;
  const NodeTable& nodes = st_.nodes;
  const std::string store_addr = nodes[0].hello->store_addr;
  const std::vector<NodeTable::Local> local = nodes.local_ranks();
  std::map<std::string, std::string> config = job_config(m_, opt_.verbose);
  namespace keys = skyforge::config::keys;
  auto put = [&](const auto& key, std::string value) { config[std::string(key.name)] = std::move(value); };
  if (recovery_.restarts_used() > 0) put(keys::job_restart, std::to_string(recovery_.restarts_used()));
  // The communicator's own timeout is the backstop behind the host's watchdog, which names the
  // laggard: it must not fire first.
  if (m_.job.collective_timeout_given) {
    const double s = std::max(2 * m_.job.collective_timeout_s, m_.job.collective_timeout_s + 30);
    put(keys::job_collective_timeout, std::to_string(s));
  }
  if (opt_.resume) put(keys::job_resume, "true");
  if (!m_.job.outputs.empty()) put(keys::job_outputs, config::join_lines(m_.job.outputs));
  put(keys::job_outputs_max_bytes, std::to_string(m_.job.outputs_max_bytes));
  const NodePlugins plugins = node_plugins(m_, catalog_, frameworks_, app_, config);
  for (uint32_t i = 0; i < nodes.size(); ++i) {
    msg::Job j;
    j.id.node = i;
    j.id.total_nodes = static_cast<uint32_t>(nodes.size());
    j.id.head_addr = nodes[0].address;
    j.id.private_ip = nodes[i].address;
    j.id.local_rank = local[i].rank;
    j.id.local_world_size = local[i].size;
    j.id.accelerator = m_.pool.accelerator;
    j.id.accelerators = m_.pool.accelerator_count;
    j.id.concurrency = m_.pool.concurrency;
    j.id.pool_id = pool_id_;
    j.id.store_addr = store_addr;
    j.frameworks = plugins.plugins;
    j.app = plugins.app;
    j.mode = m_.job.mode;
    j.command = m_.job.command;
    j.env = image_.env;
    j.config = config;
    nodes[i].conn->send_msg(msg::Type::Job, j);
  }
}

void PoolRun::wait_ready() {
  std::unique_lock<std::mutex> lock(st_.mu);
  const auto deadline = Clock::now() + std::chrono::milliseconds(opt_.join_timeout_ms);
  const bool ok = st_.wait_for(lock, [&] { return st_.nodes.all_settled(); }, deadline);
  if (!ok && st_.failure.empty())
    st_.fail("not every node became ready within " + std::to_string(opt_.join_timeout_ms) + " ms");
}

// The job runs to its end; a lost node (or a failed app, once held) asks for a restart
// ([job] max_restarts), which runs here, and the collective watchdog stops a run that hangs.
void PoolRun::execute() {
  std::unique_lock<std::mutex> lock(st_.mu);
  if (!st_.failure.empty()) return;
  if (m_.job.mode == JobMode::map) {
    st_.wait_for(lock, [&] { return tasks_->done(); }, std::nullopt);
    return;
  }
  const bool single = m_.job.mode == JobMode::single && m_.job.command.empty();
  auto all_done = [&] { return single ? st_.nodes[0].result.has_value() : st_.nodes.all_done(); };
  std::optional<std::string> hang;
  for (;;) {
    const bool woke = st_.wait_for(lock, [&] {
      return recovery_.restart_asked() || all_done() || recovery_.held_failure_due(Clock::now()) ||
             (hang = collective_hang(st_.nodes, m_.job.collective_timeout_s, Clock::now()));
    }, std::nullopt);
    if (!woke) return;  // failed, or cancelled
    if (hang && !recovery_.restart_asked() && !all_done()) {
      printer_.err("collective watchdog: " + *hang + "; stopping the run");  // now, not after the teardown
      st_.fail(*hang);
      return;
    }
    if (recovery_.restart_asked() && st_.failure.empty()) {
      lock.unlock();
      recovery_.restart();
      lock.lock();
      if (!st_.failure.empty()) return;
      continue;
    }
    recovery_.fail_held();  // an app failed, and no node was lost
    return;
  }
}

void PoolRun::teardown() {
  bool provisioned;
  {
    std::unique_lock<std::mutex> lock(st_.mu);
    for (uint32_t i : st_.nodes.open()) {
      Node& n = st_.nodes[i];
      n.cancelled = !n.result.has_value();
      // The run's end: each node sends its job's files before it leaves (even after a failure).
      n.conn->send_msg(msg::Type::Shutdown, msg::Shutdown{st_.failure.empty() ? "done" : st_.failure, true});
    }
    // Give workers a moment to run their exit hooks, flush output and leave on their own.
    auto deadline = Clock::now() + std::chrono::seconds(5);
    // ... for longer while their output is still being written: a slow or stalled reader of
    // ours holds it, and a worker leaves once it is delivered (docs/architecture.md, "Output");
    // and while their files are coming (after a first Ctrl-C too: a second one gives them up).
    auto flowing = [&] {
      return (st_.signals == 0 && printer_.output_idle() < std::chrono::seconds(1)) ||
             outputs_.busy(std::chrono::seconds(10));
    };
    while (!st_.cv.wait_until(lock, deadline, [&] { return st_.nodes.all_closed(); }) && flowing())
      deadline = Clock::now() + std::chrono::seconds(1);
    provisioned = provisioned_;
  }
  if (provisioned && provider_ && terminate_nodes() != SF_OK)
    printer_.err("provider terminate failed: " + provider_->last_error() + " — check for leftover nodes");
  if (server_) server_->close();
  rejections_.flush();
  std::lock_guard<std::mutex> lock(st_.mu);
  st_.nodes.abort_all();
}

sf_status PoolRun::terminate_nodes() {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(st_.mu);  // only ever held briefly
    ids = st_.nodes.ids();
  }
  std::vector<const char*> cids;
  for (const auto& id : ids) cids.push_back(id.c_str());
  return provider_->invoke(&sf_provider_hooks::terminate, "terminate", cids.data(), cids.size());
}

int PoolRun::report() {
  std::lock_guard<std::mutex> lock(st_.mu);
  const NodeTable& nodes = st_.nodes;
  std::string& failure = st_.failure;
  if (m_.job.mode == JobMode::map && failure.empty()) {
    if (!opt_.quiet_results) {
      std::string out;
      try {
        for (const auto& line : tasks_->report()) out += line + "\n";
      } catch (const PluginError& e) {
        printer_.err(std::string("task backend: ") + e.what());
        return kExitJobFailed;
      }
      printer_.out(out.empty() ? "" : out.substr(0, out.size() - 1));
    }
  } else if (m_.job.command.empty() && failure.empty()) {
    for (uint32_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].result && (m_.job.mode != JobMode::single || i == 0))
        printer_.out("[node " + std::to_string(i) + "] => " + nodes[i].result->value);
  }
  if (!m_.job.command.empty()) {
    std::string failed;
    for (uint32_t i = 0; i < nodes.size(); ++i) {
      const auto& r = nodes[i].result;
      // A command the teardown itself stopped (SIGTERM after another node failed, or Ctrl-C;
      // SIGKILL when it ignored that) did not fail: the run's failure is reported once, below.
      if (r && r->exit_code != 0 && !(nodes[i].cancelled && (r->exit_code == -SIGTERM || r->exit_code == -SIGKILL)))
        failed += (failed.empty() ? "" : ", ") + std::string("node ") + std::to_string(i) + " (" +
                  (r->exit_code < 0 ? "signal " + std::to_string(-r->exit_code) : "exit " + std::to_string(r->exit_code)) +
                  ")";
    }
    if (!failed.empty()) {
      printer_.err("command failed on " + failed);
      if (failure.empty()) failure = "command failed";
    }
  }
  printer_.flush();
  if (signal_exit_) return signal_exit_ == 128 + SIGINT ? kExitInterrupted : signal_exit_;
  if (!failure.empty()) {
    printer_.err("job failed: " + failure);
    return kExitJobFailed;
  }
  return kExitOk;
}

int PoolRun::run() {
  boost::asio::signal_set signals(io_, SIGINT, SIGTERM);
  std::function<void(const boost::system::error_code&, int)> on_sig = [&](const boost::system::error_code& ec,
                                                                          int sig) {
    if (ec) return;
    on_signal(sig);
    signals.async_wait(on_sig);
  };
  signals.async_wait(on_sig);
  auto guard = boost::asio::make_work_guard(io_);
  std::thread io_thread([this] { run_io_with_spin(io_, std::chrono::microseconds(50)); });

  if (m_.job.timeout_s > 0) {
    st_.timeout_s = m_.job.timeout_s;
    st_.deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(m_.job.timeout_s * 1000));
  }
  auto step = [&](auto&& fn) {
    {
      std::lock_guard<std::mutex> lock(st_.mu);
      if (!st_.failure.empty()) return;
    }
    try {
      fn();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(st_.mu);
      st_.fail(e.what());
    }
  };
  services_.set_config(job_config(m_, opt_.verbose));  // before any plugin exists: constructors may read it
  step([&] { load_plugins(); });
  step([&] { client_enter(); });
  step([&] { provision(); });
  mark("provisioned");
  step([&] { bootstrap_nodes(); });
  mark("bootstrapped");
  step([&] { start_workers(); });
  step([&] { wait_joined(); });
  mark("joined");
  step([&] { send_jobs(); });
  step([&] { wait_ready(); });
  mark("ready");
  step([&] { execute(); });
  mark("ran");
  teardown();
  outputs_.finish();
  mark("torn_down");
  if (opt_.timings) printer_.err(timings_line(phases_, tasks_ ? tasks_->batch_rtt_us() : std::vector<double>{}));
  bool ok;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    ok = st_.failure.empty();
  }
  client_hooks_.exit(cluster_, ok, [this](const std::string& e) { printer_.err(e); });
  int code = report();
  signals.cancel();
  guard.reset();
  io_.stop();
  io_thread.join();
  return code;
}

int run_job(const Manifest& manifest, const Catalog& catalog, const RunOptions& options) {
  PoolRun run(manifest, catalog, options);
  return run.run();
}

}  // namespace skyforge
