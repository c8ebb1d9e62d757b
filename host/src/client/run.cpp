// The pool run behind `skyforge run` (run.hpp): the phases from loading the plugins to the
// verdict, one after the other, the control connections' callbacks and the teardown that every
// exit path goes through (docs/architecture.md). What it leans on has rooms of its own: the
// terminal (run_output), the plugins and their configuration (plugin_resolution), the nodes'
// bootstrap script (bootstrap_script) and a map job's task backend (task_driver).
#include "run.hpp"
#include "lent.hpp"

#include <unistd.h>

#include <csignal>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <mutex>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "bootstrap_script.hpp"
#include "io_loop.hpp"
#include "loader.hpp"
#include "plugin_resolution.hpp"
#include "protocol.hpp"
#include "run_output.hpp"
#include "self_exe.hpp"
#include "services.hpp"
#include "task_driver.hpp"

namespace skyforge {
namespace {

using Clock = std::chrono::steady_clock;

struct NodeState {
  std::string id;       // provider's handle
  std::string address;  // as other nodes see it
  std::shared_ptr<net::Connection> conn;
  std::optional<msg::Hello> hello;
  bool ready = false;
  bool closed = false;
  std::string lost;  // why the connection ended before the node was done
  std::optional<msg::RunResult> result;
  bool cancelled = false;  // told to shut down while its part was still running
  std::optional<msg::Progress> progress;  // its communicator's collectives (the watchdog's input)
  std::chrono::steady_clock::time_point progress_at{};
  std::shared_ptr<OutputAcks> acks;  // its output's flow control (msg::OutputAck)
};

class PoolRun {
 public:
  PoolRun(const Manifest& m, const Catalog& c, const RunOptions& o)
      : m_(m), catalog_(c), opt_(o), services_([this](int32_t level, const std::string& msg) {
          if (level == SF_LOG_STATUS) printer_.status(msg);  // a live line on a terminal only
          else if (level >= SF_LOG_INFO || opt_.verbose) printer_.err(msg);  // debug: -v only
        }) {}
  int run();

 private:
  // phases
  void load_plugins();
  void client_enter();
  void client_exit(bool ok);
  void provision();
  std::vector<std::string> stage_files() const;
  std::string worker_path() const;
  void bootstrap_nodes();
  std::string bootstrap_node(uint32_t node, const std::string& script);  // "" or why it failed
  void start_workers();   // the control server, then launch_workers()
  void launch_workers();  // a worker on every node
  void launch_worker(uint32_t node);
  // [job] max_restarts: node `node`'s machine is gone; the provider gives it another (ABI 1.7
  // replace_node), which is bootstrapped and gets its worker. Throws when it cannot.
  void replace_node(uint32_t node, uint32_t restart, const std::string& why);
  void restart_workers(const std::string& why);  // [job] max_restarts: every worker again
  void wait_joined();
  void send_jobs();
  void wait_ready();
  void execute();
  void teardown();
  int report();

  // io-thread callbacks; `gen` is the worker generation the connection belongs to (a restart
  // starts a new one, and what the old connections still say is ignored)
  void on_authenticated(std::shared_ptr<net::Connection> c);
  void on_frame(uint32_t node, uint64_t gen, msg::Type t, std::string&& payload);
  void on_closed(uint32_t node, uint64_t gen, const std::string& reason);
  bool can_restart() const;  // under mu_
  // The collective watchdog (under mu_): why the run must stop, when a node has sat in
  // collective #N for [job] collective_timeout while another never entered it.
  std::optional<std::string> collective_hang() const;
  std::string describe_loss(const std::string& node_id, const std::string& reason);  // without mu_
  void on_signal(int sig);

  // map scheduling (under mu_)
  void dispatch(uint32_t node);
  void on_results(uint32_t node, msg::TaskResults&& r);

  // Waits until pred() holds, the run is cancelled or the deadline passes. Under mu_.
  template <class Pred>
  bool wait_for(std::unique_lock<std::mutex>& lock, Pred pred, std::optional<Clock::time_point> deadline);
  void fail(const std::string& why);  // under mu_
  bool node_done(const NodeState& n) const;

  const Manifest& m_;
  const Catalog& catalog_;
  RunOptions opt_;
  Printer printer_{::isatty(2) == 1};  // a live status line on a terminal
  RejectionLog rejections_{[this](const std::string& line) { printer_.err(line); }};
  Services services_;
  Loader loader_{services_.table()};
  std::unique_ptr<PluginInstance> provider_;
  std::vector<std::unique_ptr<PluginInstance>> frameworks_;
  size_t client_entered_ = 0;
  const LoadedPlugin* app_ = nullptr;
  sf_cluster cluster_{};
  std::string pool_id_ = net::random_hex(6);
  std::string secret_ = net::random_hex(32);
  std::vector<std::string> bootstrap_lines_;
  Image image_;

  boost::asio::io_context io_;
  std::unique_ptr<net::Server> server_;
  std::string control_address_ = "127.0.0.1";

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<NodeState> nodes_;
  bool provisioned_ = false;
  std::string failure_;        // first failure; the run's verdict
  std::atomic<int> signals_{0};
  std::atomic<bool> provisioning_{false};  // provision() is running: a first signal cancels it
  int signal_exit_ = 0;
  Clock::time_point deadline_;
  bool has_deadline_ = false;

  // [job] max_restarts (under mu_): a lost node asks for a restart instead of failing the run; a
  // node whose app failed is held for a moment first, since a peer's loss makes the others'
  // collectives fail too, and that loss may not have been seen yet.
  uint64_t generation_ = 0;
  uint32_t restarts_used_ = 0;
  bool stopping_for_restart_ = false;  // the workers were told to stop: their connections end
  std::optional<std::string> restart_;  // why: the first loss since the last restart
  struct HeldFailure {
    std::string why;
    Clock::time_point at;
  };
  std::optional<HeldFailure> held_failure_;
  static constexpr std::chrono::milliseconds kHoldFailure{2000};

  std::unique_ptr<PluginInstance> task_backend_;  // a map job's ([tasks] backend)
  std::optional<TaskDriver> tasks_;

  // --timings
  Clock::time_point t0_ = Clock::now();
  std::vector<std::pair<std::string, double>> phases_;
  void mark(const std::string& phase) {
    phases_.emplace_back(phase, std::chrono::duration<double, std::milli>(Clock::now() - t0_).count());
  }
};

template <class Pred>
bool PoolRun::wait_for(std::unique_lock<std::mutex>& lock, Pred pred, std::optional<Clock::time_point> deadline) {
  auto stop = [&] { return pred() || !failure_.empty(); };
  for (;;) {
    auto until = Clock::now() + std::chrono::milliseconds(100);
    if (deadline && *deadline < until) until = *deadline;
    if (has_deadline_ && deadline_ < until) until = deadline_;
    cv_.wait_until(lock, until, stop);
    if (pred()) return true;
    if (!failure_.empty()) return false;
    if (has_deadline_ && Clock::now() >= deadline_) {
      fail("the job ran past its timeout of " + std::to_string(m_.job.timeout_s) + " s");
      return false;
    }
    if (deadline && Clock::now() >= *deadline) return false;
  }
}

void PoolRun::fail(const std::string& why) {
  if (failure_.empty()) failure_ = why;
  cv_.notify_all();
}

bool PoolRun::node_done(const NodeState& n) const { return n.result.has_value(); }


void PoolRun::load_plugins() {
  provider_ = create_plugin(loader_, catalog_, m_.pool.provider, SF_KIND_PROVIDER, m_.pool.provider_options);
  for (const auto& use : m_.plugins)
    frameworks_.push_back(create_plugin(loader_, catalog_, use.name, std::nullopt, use.options));
  if (!m_.job.app.empty()) app_ = &load_app(loader_, catalog_, m_.job);
  if (m_.job.mode == JobMode::map) {
    task_backend_ = create_plugin(loader_, catalog_, m_.job.task_backend, SF_KIND_TASK_BACKEND, m_.job.task_options);
    std::lock_guard<std::mutex> lock(mu_);
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
  sf_image_editor ed{};
  ed.ctx = &image_;
  ed.add_apt = [](void* c, const char* p) { lent([&] { static_cast<Image*>(c)->apt.emplace_back(p ? p : ""); }); };
  ed.add_pip = [](void* c, const char* p) { lent([&] { static_cast<Image*>(c)->pip.emplace_back(p ? p : ""); }); };
  ed.set_env = [](void* c, const char* k, const char* v) {
    lent([&] { static_cast<Image*>(c)->env[k ? k : ""] = v ? v : ""; });
  };
  ed.add_file = [](void* c, const char* s, const char* d) {
    lent([&] { static_cast<Image*>(c)->files.push_back(FileCopy{s ? s : "", d ? d : "", SourcePos{}}); });
  };
  for (auto& fw : frameworks_)
    if (fw->plugin().kind == SF_KIND_FRAMEWORK)
      fw->call_optional(&sf_framework_hooks::transform_image, "transform_image", &cluster_, &ed);
  const sf_sink lines{&bootstrap_lines_, [](void* c, const char* d, size_t n) {
                        lent([&] { static_cast<std::vector<std::string>*>(c)->emplace_back(d, n); });
                      }};
  for (auto& fw : frameworks_)
    if (fw->plugin().kind == SF_KIND_FRAMEWORK)
      fw->call_optional(&sf_framework_hooks::bootstrap, "bootstrap", &cluster_, lines);
  for (auto& fw : frameworks_) {
    ++client_entered_;
    if (fw->plugin().kind == SF_KIND_FRAMEWORK)
      fw->call_optional(&sf_framework_hooks::around_client_enter, "around_client_enter", &cluster_);
  }
}

void PoolRun::client_exit(bool ok) {
  while (client_entered_ > 0) {
    auto& fw = frameworks_[--client_entered_];
    if (fw->plugin().kind != SF_KIND_FRAMEWORK) continue;
    try {
      fw->call_optional(&sf_framework_hooks::around_client_exit, "around_client_exit", &cluster_, ok ? SF_OK : SF_ERR);
    } catch (const std::exception& e) {
      printer_.err(e.what());
    }
  }
}

void PoolRun::provision() {
  // Nodes are recorded as the provider reports them, under mu_, so that a forced teardown
  // (second Ctrl-C) in the middle of a slow provision still terminates every node made so far.
  sf_node_sink ns{};
  ns.ctx = this;
  ns.add_node = [](void* c, const char* id, const char* addr) {
    lent([&] {
      auto* self = static_cast<PoolRun*>(c);
      NodeState n;
      n.id = id ? id : "";
      n.address = addr ? addr : "";
      std::lock_guard<std::mutex> lock(self->mu_);
      self->nodes_.push_back(std::move(n));
    });
  };
  ns.set_control_address = [](void* c, const char* a) {
    lent([&] {
      auto* self = static_cast<PoolRun*>(c);
      std::lock_guard<std::mutex> lock(self->mu_);
      self->control_address_ = a ? a : "";
    });
  };
  const std::vector<std::string> files = stage_files();
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
    std::lock_guard<std::mutex> lock(mu_);
    provisioned_ = true;  // from here on, teardown calls terminate even if provision fails half-way
  }
  provisioning_ = true;
  struct Done {
    std::atomic<bool>& flag;
    ~Done() { flag = false; }
  } done{provisioning_};
  provider_->call(&sf_provider_hooks::provision, "provision", &spec, &ns);
  if (nodes_.size() != m_.pool.nodes)
    throw std::runtime_error("provider '" + m_.pool.provider + "' provisioned " + std::to_string(nodes_.size()) +
                             " nodes, " + std::to_string(m_.pool.nodes) + " were asked for");
  if (control_address_.empty()) control_address_ = "127.0.0.1";
}

std::string PoolRun::worker_path() const {
  if (!opt_.worker_path.empty()) return opt_.worker_path;
  const std::string dir = self_exe_dir();
  return (dir.empty() ? "." : dir) + "/skyforge-worker";
}

// What a node needs from this machine at the same path (sf_pool_spec.stage_files): the worker,
// every plugin library the nodes load with its plugin.toml, the image's file sources (the
// regular files under a directory source). Absolute, each once, in a stable order.
std::vector<std::string> PoolRun::stage_files() const {
  std::set<std::string> out;
  auto add = [&](const std::filesystem::path& p) {
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(p, ec).lexically_normal();
    if (std::filesystem::is_directory(abs, ec)) {
      for (auto it = std::filesystem::recursive_directory_iterator(abs, ec);
           !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file(ec)) out.insert(it->path().string());
    } else if (std::filesystem::is_regular_file(abs, ec)) {
      out.insert(abs.string());
    }
  };
  add(worker_path());
  std::map<std::string, std::string> config;
  const NodePlugins plugins = node_plugins(m_, catalog_, frameworks_, app_, config);
  auto add_plugin = [&](const std::string& name, const std::string& library) {
    add(library);
    if (const PluginInfo* info = catalog_.find(name)) add(info->manifest_path);
  };
  for (const auto& p : plugins.plugins) add_plugin(p.name, p.library);
  if (!plugins.app.library.empty()) add_plugin(plugins.app.name, plugins.app.library);
  for (const auto& f : image_.files) add(f.source);
  return {out.begin(), out.end()};
}

void PoolRun::bootstrap_nodes() {
  const std::string script = bootstrap_script(image_, bootstrap_lines_);
  std::vector<std::future<std::string>> jobs;
  for (size_t i = 0; i < nodes_.size(); ++i)
    jobs.push_back(std::async(std::launch::async, [&, i] { return bootstrap_node(uint32_t(i), script); }));
  std::string first;
  for (auto& j : jobs) {
    std::string e = j.get();
    if (!e.empty() && first.empty()) first = e;
  }
  if (!first.empty()) throw std::runtime_error(first);
}

std::string PoolRun::bootstrap_node(uint32_t node, const std::string& script) {
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
    std::lock_guard<std::mutex> lock(mu_);
    id = nodes_[node].id;
  }
  sf_status st = provider_->invoke(&sf_provider_hooks::bootstrap, "bootstrap", id.c_str(), script.c_str(), log);
  if (st == SF_OK) return "";
  const char* msg = provider_->plugin().descriptor->last_error(provider_->self());
  return "node " + std::to_string(node) + ": bootstrap failed: " + (msg ? msg : "");
}

void PoolRun::start_workers() {
  server_ = std::make_unique<net::Server>(
      io_, control_address_, 0, secret_,
      net::ConnectionOptions{net::kDefaultMaxFrame, opt_.heartbeat_ms, opt_.lease_ms, 5000},
      [this](std::shared_ptr<net::Connection> c) { on_authenticated(std::move(c)); },
      [this](const std::string& peer, const std::string& why) { rejections_.add(peer, why); });
  launch_workers();
}

void PoolRun::launch_workers() {
  for (size_t i = 0; i < nodes_.size(); ++i) launch_worker(uint32_t(i));
}

void PoolRun::launch_worker(uint32_t node) {
  const std::string worker = worker_path();
  const std::string connect = control_address_ + ":" + std::to_string(server_->port());
  const std::string secret_key = "SKYFORGE_POOL_SECRET";
  std::string id, address;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = nodes_[node].id;
    address = nodes_[node].address;
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

void PoolRun::replace_node(uint32_t node, uint32_t restart, const std::string& why) {
  const auto t0 = Clock::now();
  const std::string k = "restart " + std::to_string(restart) + "/" + std::to_string(m_.job.max_restarts);
  auto* h = provider_->hooks<sf_provider_hooks>();
  const bool can = h && h->struct_size >= offsetof(sf_provider_hooks, replace_node) + sizeof h->replace_node &&
                   h->replace_node;
  if (!can)
    throw std::runtime_error(k + " failed: the '" + m_.pool.provider + "' provider could not start a worker again on node " +
                             std::to_string(node) + " (" + why + ") and cannot replace a node");
  printer_.err(k + ": node " + std::to_string(node) + " cannot take a worker (" + why + "); the '" + m_.pool.provider +
               "' provider gives it another machine");
  std::string id, address;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = nodes_[node].id;
  }
  sf_status st = provider_->invoke(&sf_provider_hooks::replace_node, "replace_node", id.c_str(), text_sink(address));
  if (st != SF_OK) {
    const char* msg = provider_->plugin().descriptor->last_error(provider_->self());
    throw std::runtime_error(k + " failed: node " + std::to_string(node) + " could not be replaced: " + (msg ? msg : ""));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    nodes_[node].address = address;
  }
  if (std::string e = bootstrap_node(node, bootstrap_script(image_, bootstrap_lines_)); !e.empty())
    throw std::runtime_error(k + " failed: the replacement of " + e);
  launch_worker(node);
  printer_.err(k + ": node " + std::to_string(node) + " replaced: now at " + address + ", bootstrapped in " +
               std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()) + " ms");
}

void PoolRun::on_authenticated(std::shared_ptr<net::Connection> c) {
  uint32_t node = c->node();
  std::lock_guard<std::mutex> lock(mu_);
  if (node >= nodes_.size() || nodes_[node].conn) {
    printer_.err("dropping a duplicate or out-of-range worker claiming node " + std::to_string(node));
    c->abort();
    return;
  }
  nodes_[node].conn = c;
  nodes_[node].acks = std::make_shared<OutputAcks>(
      [w = std::weak_ptr<net::Connection>(c)](uint64_t total) {
        if (auto conn = w.lock()) conn->send_msg(msg::Type::OutputAck, msg::OutputAck{total});
      },
      msg::kOutputWindow);
  const uint64_t gen = generation_;
  c->start([this, node, gen](msg::Type t, std::string&& p) { on_frame(node, gen, t, std::move(p)); },
           [this, node, gen](const std::string& reason) { on_closed(node, gen, reason); });
}

std::optional<std::string> PoolRun::collective_hang() const {
  const auto now = Clock::now();
  const double limit_ms = m_.job.collective_timeout_s * 1000;
  auto ms_since = [&](const NodeState& n) {
    return double(n.progress->since_ms) + std::chrono::duration<double, std::milli>(now - n.progress_at).count();
  };
  auto inside = [](const NodeState& n) { return n.progress && n.progress->entered > n.progress->done; };
  // The newest collective some node has sat in for the limit.
  uint64_t seq = 0;
  std::string op;
  for (const auto& n : nodes_)
    if (!n.closed && inside(n) && ms_since(n) >= limit_ms && n.progress->entered > seq) {
      seq = n.progress->entered;
      op = n.progress->op;
    }
  if (seq == 0) return std::nullopt;
  std::vector<size_t> waiting, never;
  double waited_ms = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const NodeState& n = nodes_[i];
    const uint64_t entered = n.progress ? n.progress->entered : 0;
    if (entered < seq) {
      never.push_back(i);
    } else if (inside(n) && entered == seq) {
      waiting.push_back(i);
      waited_ms = std::max(waited_ms, ms_since(n));
    }
  }
  auto list = [](const std::vector<size_t>& v) {
    std::string s = v.size() == 1 ? "node " : "nodes ";
    for (size_t k = 0; k < v.size(); ++k) s += (k ? "," : "") + std::to_string(v[k]);
    return s;
  };
  auto secs = [](double ms) {
    char b[32];
    std::snprintf(b, sizeof b, "%.0f s", ms / 1000);
    return std::string(b);
  };
  const std::string what = op + " #" + std::to_string(seq);
  if (never.empty()) {
    if (waiting.size() < nodes_.size()) return std::nullopt;
    const auto& p0 = nodes_[0].progress;
    return "every node has been in " + what + " for " + secs(waited_ms) +
           " and none has finished it ([job] collective_timeout = " + secs(limit_ms) +
           "): a link between nodes may be down" + (p0 && !p0->status.empty() ? "; node 0 was at " + p0->status : "");
  }
  std::string why = list(never) + " never entered " + what + " (" + list(waiting) + " waiting " + secs(waited_ms) +
                    ", [job] collective_timeout = " + secs(limit_ms) + ")";
  for (size_t i : never) {
    const NodeState& n = nodes_[i];
    why += "; node " + std::to_string(i);
    if (n.result) why += "'s job had already ended";
    else if (!n.progress || n.progress->entered == 0) why += " has made no collective call yet";
    else if (inside(n)) why += " is in " + n.progress->op + " #" + std::to_string(n.progress->entered) + " since " + secs(ms_since(n));
    else why += "'s last was " + n.progress->op + " #" + std::to_string(n.progress->done) + ", " + secs(ms_since(n)) + " ago";
    if (n.progress && !n.progress->status.empty()) why += ", last seen at " + n.progress->status;
  }
  return why;
}

bool PoolRun::can_restart() const {
  return m_.job.mode != JobMode::map && restarts_used_ < m_.job.max_restarts && signals_ == 0 && failure_.empty();
}

void PoolRun::on_frame(uint32_t node, uint64_t gen, msg::Type t, std::string&& payload) {
  std::unique_lock<std::mutex> lock(mu_);
  if (gen != generation_) return;  // a worker a restart replaced
  NodeState& n = nodes_[node];
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
      case msg::Type::Log: {
        auto l = net::deserialize<msg::Log>(payload);
        // The job's stdout and stderr are acknowledged once written (or not shown): the node's
        // flow control, so that a stalled reader of ours holds its output, never our io thread.
        Printer::Done done;
        if (l.stream == 1 || l.stream == 2) done = [acks = n.acks, bytes = l.text.size()] { acks->done(bytes); };
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
        return;
      }
      case msg::Type::TaskResults:
        on_results(node, net::deserialize<msg::TaskResults>(payload));
        break;
      case msg::Type::RunResult: {
        auto r = net::deserialize<msg::RunResult>(payload);
        if (!r.ok && failure_.empty() && m_.job.mode != JobMode::map && !stopping_for_restart_) {
          const std::string why = "node " + std::to_string(node) + " failed: " + r.error;
          if (!can_restart()) fail(why);
          else if (!held_failure_ && !restart_) held_failure_ = HeldFailure{why, Clock::now()};
        }
        if (!r.ok && m_.job.mode == JobMode::map && failure_.empty()) fail("node " + std::to_string(node) + ": " + r.error);
        n.result = std::move(r);
        break;
      }
      default:
        throw std::runtime_error("unexpected frame type " + std::to_string(static_cast<int>(t)));
    }
  } catch (const std::exception& e) {
    fail("node " + std::to_string(node) + " sent a bad frame: " + e.what());
  }
  cv_.notify_all();
}

void PoolRun::on_closed(uint32_t node, uint64_t gen, const std::string& reason) {
  std::unique_lock<std::mutex> lock(mu_);
  if (gen != generation_) return;  // a worker a restart replaced
  nodes_[node].closed = true;
  const bool expected = nodes_[node].result.has_value() || signals_ > 0 || stopping_for_restart_;
  if (!expected) {
    nodes_[node].lost = reason;
    std::string why = reason;
    if (failure_.empty()) {  // the run's first failure: worth asking the provider how the worker ended
      const std::string id = nodes_[node].id;
      lock.unlock();
      why = describe_loss(id, reason);
      lock.lock();
      if (gen != generation_) return;  // a restart began meanwhile: this worker is already replaced
    }
    std::string lost = "node " + std::to_string(node) + " lost: " + why;
    if (const auto& p = nodes_[node].progress; p && !p->status.empty()) lost += "; last seen at " + p->status;
    if (tasks_ && failure_.empty() && !tasks_->done()) {
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
        for (uint32_t i = 0; i < nodes_.size(); ++i) dispatch(i);
        cv_.notify_all();
        return;
      }
      fail(lost + " — " + *verdict);
    } else if (can_restart()) {
      if (!restart_) restart_ = lost;  // execute() restarts every worker
    } else {
      const bool first = failure_.empty();
      fail(m_.job.max_restarts > 0 && restarts_used_ >= m_.job.max_restarts && first
               ? lost + " (no restart left: [job] max_restarts = " + std::to_string(m_.job.max_restarts) + ")"
               : lost);
      // Said now: the teardown may take seconds (a node that cannot be reached is waited for).
      if (first) printer_.err(failure_ + "; stopping the run");
    }
  }
  cv_.notify_all();
}

// How a node's worker ended, as its provider saw it (worker_exit, ABI 1.2): the signal or exit
// status and the worker's last words ("task 17 (slot 0) of app 'x' died of SIGSEGV"), then the
// connection's own reason. The connection drops a moment before the worker can be reaped, so
// the provider is asked for up to 500 ms (a remote agent notices within 100 ms, then its line crosses the network); a worker still running (a lease that ran out on a
// stopped one) or a provider that cannot tell leaves the reason as it was.
std::string PoolRun::describe_loss(const std::string& node_id, const std::string& reason) {
  const sf_provider_hooks* h = provider_->hooks<sf_provider_hooks>();
  if (!h || !h->worker_exit) return reason;
  sf_worker_exit e{};
  e.struct_size = sizeof e;
  int32_t known = 0;
  for (const auto until = Clock::now() + std::chrono::milliseconds(500);;) {
    known = provider_->invoke(&sf_provider_hooks::worker_exit, "worker_exit", node_id.c_str(), &e);
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

void PoolRun::on_signal(int sig) {
  int count = ++signals_;
  if (count == 1) {
    signal_exit_ = 128 + sig;
    printer_.err(std::string(sig == SIGINT ? "interrupted" : "terminated") +
                 ": tearing the pool down (Ctrl-C again to force)");
    {
      std::lock_guard<std::mutex> lock(mu_);
      fail(std::string("cancelled by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM"));
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
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);  // only ever held briefly
    for (auto& n : nodes_) ids.push_back(n.id);
  }
  std::vector<const char*> cids;
  for (auto& s : ids) cids.push_back(s.c_str());
  if (provider_) provider_->invoke(&sf_provider_hooks::terminate, "terminate", cids.data(), cids.size());
  std::fflush(nullptr);
  _exit(kExitInterrupted);
}

void PoolRun::wait_joined() {
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline = Clock::now() + std::chrono::milliseconds(opt_.join_timeout_ms);
  auto* h = provider_->hooks<sf_provider_hooks>();
  const bool alive_hook = h->worker_alive != nullptr;
  for (;;) {
    bool all = std::all_of(nodes_.begin(), nodes_.end(), [](const NodeState& n) { return n.hello.has_value(); });
    if (all) return;
    if (!wait_for(lock, [&] {
          return std::all_of(nodes_.begin(), nodes_.end(), [](const NodeState& n) { return n.hello.has_value(); });
        }, std::min(deadline, Clock::now() + std::chrono::milliseconds(100)))) {
      if (!failure_.empty()) return;
      if (Clock::now() >= deadline) {
        std::string missing;
        for (size_t i = 0; i < nodes_.size(); ++i)
          if (!nodes_[i].hello) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
        fail("nodes " + missing + " did not join the pool within " + std::to_string(opt_.join_timeout_ms) + " ms");
        return;
      }
      if (alive_hook)
        for (size_t i = 0; i < nodes_.size(); ++i)
          if (!nodes_[i].hello &&
              provider_->invoke(&sf_provider_hooks::worker_alive, "worker_alive", nodes_[i].id.c_str()) == 0) {
            fail("node " + std::to_string(i) + ": the worker exited before joining the pool");
            return;
          }
    }
  }
}

void PoolRun::send_jobs() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.empty()) return;
  const std::string head_addr = nodes_[0].address;
  const std::string store_addr = nodes_[0].hello->store_addr;
  // local_rank: workers sharing one machine address
  std::map<std::string, uint32_t> per_addr;
  for (auto& n : nodes_) per_addr[n.address]++;
  std::map<std::string, uint32_t> seen;
  std::map<std::string, std::string> config = job_config(m_, opt_.verbose);
  if (restarts_used_ > 0) config["job.restart"] = std::to_string(restarts_used_);
  // The communicator's own timeout is the backstop behind the host's watchdog, which names the
  // laggard: it must not fire first.
  if (m_.job.collective_timeout_given) {
    const double s = std::max(2 * m_.job.collective_timeout_s, m_.job.collective_timeout_s + 30);
    config["job.collective_timeout"] = std::to_string(s);
  }
  if (opt_.resume) config["job.resume"] = "true";
  const NodePlugins plugins = node_plugins(m_, catalog_, frameworks_, app_, config);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    msg::Job j;
    j.id.node = static_cast<uint32_t>(i);
    j.id.total_nodes = static_cast<uint32_t>(nodes_.size());
    j.id.head_addr = head_addr;
    j.id.private_ip = nodes_[i].address;
    j.id.local_rank = seen[nodes_[i].address]++;
    j.id.local_world_size = per_addr[nodes_[i].address];
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
    nodes_[i].conn->send_msg(msg::Type::Job, j);
  }
}

void PoolRun::wait_ready() {
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline = Clock::now() + std::chrono::milliseconds(opt_.join_timeout_ms);
  bool ok = wait_for(lock, [&] {
    return std::all_of(nodes_.begin(), nodes_.end(), [](const NodeState& n) { return n.ready || n.result || n.closed; });
  }, deadline);
  if (!ok && failure_.empty()) fail("not every node became ready within " + std::to_string(opt_.join_timeout_ms) + " ms");
}

void PoolRun::dispatch(uint32_t node) {
  NodeState& n = nodes_[node];
  if (!n.ready || n.closed || !failure_.empty()) return;
  try {
    while (auto batch = tasks_->next_batch(node)) n.conn->send_msg(msg::Type::TaskBatch, *batch);
  } catch (const PluginError& e) {
    fail(std::string("task backend: ") + e.what());
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
    fail(*failed);
    return;
  }
  dispatch(node);
}

void PoolRun::execute() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!failure_.empty()) return;
  if (m_.job.mode == JobMode::map) {
    wait_for(lock, [&] { return tasks_->done(); }, std::nullopt);
    return;
  }
  bool single = m_.job.mode == JobMode::single && m_.job.command.empty();
  auto all_done = [&] {
    if (single) return nodes_[0].result.has_value();
    return std::all_of(nodes_.begin(), nodes_.end(), [&](const NodeState& n) { return node_done(n); });
  };
  std::optional<std::string> hang;
  for (;;) {
    const bool woke = wait_for(lock, [&] {
      return restart_ || all_done() || (held_failure_ && Clock::now() - held_failure_->at >= kHoldFailure) ||
             (hang = collective_hang());
    }, std::nullopt);
    if (!woke) return;  // failed, or cancelled
    if (hang && !restart_ && !all_done()) {
      printer_.err("collective watchdog: " + *hang + "; stopping the run");  // now, not after the teardown
      fail(*hang);
      return;
    }
    if (restart_ && failure_.empty()) {
      const std::string why = *restart_;
      lock.unlock();
      restart_workers(why);
      lock.lock();
      if (!failure_.empty()) return;
      continue;
    }
    if (held_failure_) fail(held_failure_->why);  // an app failed, and no node was lost
    return;
  }
}

// Every worker stops (the lost one is gone already), and a new one starts on every node: same
// ranks, a new rendezvous store and communicator, the job sent again with job.restart = K so
// that a train job resumes from its last checkpoint. The nodes themselves stay.
void PoolRun::restart_workers(const std::string& why) {
  const auto t0 = Clock::now();
  uint32_t k;
  {
    std::lock_guard<std::mutex> lock(mu_);
    k = ++restarts_used_;
    restart_.reset();
    held_failure_.reset();
    stopping_for_restart_ = true;
    for (auto& n : nodes_)
      if (n.conn && !n.closed) n.conn->send_msg(msg::Type::Shutdown, msg::Shutdown{"restart"});
  }
  printer_.err(why + "; restart " + std::to_string(k) + "/" + std::to_string(m_.job.max_restarts) +
               ": a new worker on every node, the job resumes from its last checkpoint");
  // Wait until every worker is gone: its connection closed, and (where the provider can tell)
  // its process ended.
  auto* h = provider_->hooks<sf_provider_hooks>();
  const auto stop_wait = net::shutdown_wait(opt_.lease_ms);  // a worker's stop grace ends 6 s before
  const auto deadline = t0 + stop_wait;
  const bool can_replace = h->struct_size >= offsetof(sf_provider_hooks, replace_node) + sizeof h->replace_node &&
                           h->replace_node;
  std::set<size_t> unreachable;  // the provider still sees their workers run, long after they lost the host
  for (;;) {
    std::vector<size_t> running;
    std::vector<std::string> ids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_.empty()) return;
      for (size_t i = 0; i < nodes_.size(); ++i) {
        ids.push_back(nodes_[i].id);
        if (nodes_[i].conn && !nodes_[i].closed) running.push_back(i);
      }
    }
    if (running.empty() && h->worker_alive)  // the provider is asked without mu_: it may take a while
      for (size_t i = 0; i < ids.size(); ++i)
        if (provider_->invoke(&sf_provider_hooks::worker_alive, "worker_alive", ids[i].c_str()) == 1) running.push_back(i);
    if (running.empty()) break;
    if (Clock::now() >= deadline) {
      // Their connections closed long ago (none is open: those go first), yet the provider cannot
      // see the workers end: their machines are out of reach (a Slurm node whose slurmd died with
      // it keeps its step's srun waiting). A provider that can gives them other machines below.
      bool all_closed = true;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t i : running) all_closed = all_closed && (!nodes_[i].conn || nodes_[i].closed);
      }
      if (can_replace && all_closed) {
        unreachable.insert(running.begin(), running.end());
        break;
      }
      std::string list;
      for (size_t i : running) list += (list.empty() ? "" : ", ") + std::to_string(i);
      throw std::runtime_error("restart " + std::to_string(k) + ": the workers of node" + (running.size() > 1 ? "s " : " ") +
                               list + " did not stop");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
    stopping_for_restart_ = false;
    held_failure_.reset();  // what the stopped workers said as they went
    for (auto& n : nodes_) {
      if (n.conn) n.conn->abort();
      NodeState fresh;
      fresh.id = std::move(n.id);
      fresh.address = std::move(n.address);
      n = std::move(fresh);
    }
  }
  for (uint32_t i = 0; i < nodes_.size(); ++i) {
    std::string why;
    if (unreachable.count(i)) {
      replace_node(i, k, "its worker was out of reach for " + std::to_string(stop_wait.count() / 1000) + " s after it lost the host");
      continue;
    }
    try {
      launch_worker(i);
      continue;
    } catch (const PluginError& e) {
      // Only a node whose machine or session is gone (an ssh host down, an instance reclaimed)
      // is moved; any other failure ends the run as it says.
      if (e.status() != SF_ERR_GONE)
        throw std::runtime_error("restart " + std::to_string(k) + "/" + std::to_string(m_.job.max_restarts) +
                                 " failed: node " + std::to_string(i) + ": " + e.what());
      why = e.what();
    }
    replace_node(i, k, why);
  }
  wait_joined();
  send_jobs();
  wait_ready();
  printer_.err("restart " + std::to_string(k) + "/" + std::to_string(m_.job.max_restarts) + ": every node ready again in " +
               std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()) + " ms");
}

void PoolRun::teardown() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (auto& n : nodes_)
      if (n.conn && !n.closed) {
        n.cancelled = !n.result.has_value();
        n.conn->send_msg(msg::Type::Shutdown, msg::Shutdown{failure_.empty() ? "done" : failure_});
      }
    // Give workers a moment to run their exit hooks, flush output and leave on their own.
    auto deadline = Clock::now() + std::chrono::seconds(5);
    // ... for longer while their output is still being written: a slow or stalled reader of
    // ours holds it, and a worker leaves once it is delivered (docs/architecture.md, "Output").
    while (!cv_.wait_until(lock, deadline, [&] {
      return std::all_of(nodes_.begin(), nodes_.end(), [](const NodeState& n) { return !n.conn || n.closed; });
    }) && signals_ == 0 && printer_.output_idle() < std::chrono::seconds(1))
      deadline = Clock::now() + std::chrono::seconds(1);
  }
  bool provisioned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    provisioned = provisioned_;
  }
  if (provisioned && provider_) {
    std::vector<const char*> ids;
    for (auto& n : nodes_) ids.push_back(n.id.c_str());
    sf_status st = provider_->invoke(&sf_provider_hooks::terminate, "terminate", ids.data(), ids.size());
    if (st != SF_OK) {
      const char* msg = provider_->plugin().descriptor->last_error(provider_->self());
      printer_.err(std::string("provider terminate failed: ") + (msg ? msg : "") + " — check for leftover nodes");
    }
  }
  if (server_) server_->close();
  rejections_.flush();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& n : nodes_)
    if (n.conn) n.conn->abort();
}

int PoolRun::report() {
  std::lock_guard<std::mutex> lock(mu_);
  if (m_.job.mode == JobMode::map && failure_.empty()) {
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
  } else if (m_.job.command.empty() && failure_.empty()) {
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].result && (m_.job.mode != JobMode::single || i == 0))
        printer_.out("[node " + std::to_string(i) + "] => " + nodes_[i].result->value);
  }
  if (!m_.job.command.empty()) {
    std::string failed;
    for (size_t i = 0; i < nodes_.size(); ++i)
      // A command the teardown itself stopped (SIGTERM after another node failed, or Ctrl-C;
      // SIGKILL when it ignored that) did not fail: the run's failure is reported once, below.
      if (nodes_[i].result && nodes_[i].result->exit_code != 0 &&
          !(nodes_[i].cancelled && (nodes_[i].result->exit_code == -SIGTERM || nodes_[i].result->exit_code == -SIGKILL)))
        failed += (failed.empty() ? "" : ", ") + std::string("node ") + std::to_string(i) + " (" +
                  (nodes_[i].result->exit_code < 0 ? "signal " + std::to_string(-nodes_[i].result->exit_code)
                                                   : "exit " + std::to_string(nodes_[i].result->exit_code)) +
                  ")";
    if (!failed.empty()) {
      printer_.err("command failed on " + failed);
      if (failure_.empty()) failure_ = "command failed";
    }
  }
  printer_.flush();
  if (signal_exit_) return signal_exit_ == 128 + SIGINT ? kExitInterrupted : signal_exit_;
  if (!failure_.empty()) {
    printer_.err("job failed: " + failure_);
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
    has_deadline_ = true;
    deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(m_.job.timeout_s * 1000));
  }
  auto step = [&](auto&& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_.empty()) return;
    }
    try {
      fn();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu_);
      fail(e.what());
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
  mark("torn_down");
  if (opt_.timings) printer_.err(timings_line(phases_, tasks_ ? tasks_->batch_rtt_us() : std::vector<double>{}));
  bool ok;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ok = failure_.empty();
  }
  client_exit(ok);
  int code = report();
  signals.cancel();
  guard.reset();
  io_.stop();
  io_thread.join();
  return code;
}

}  // namespace

int run_job(const Manifest& manifest, const Catalog& catalog, const RunOptions& options) {
  PoolRun run(manifest, catalog, options);
  return run.run();
}

}  // namespace skyforge
