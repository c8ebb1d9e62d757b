#include "worker.hpp"
#include "lent.hpp"

#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "communicator.hpp"
#include "crash_context.hpp"
#include "env.hpp"
#include "io_loop.hpp"
#include "loader.hpp"
#include "output_pump.hpp"
#include "protocol.hpp"
#include "reaper.hpp"
#include "services.hpp"
#include "store.hpp"

extern char** environ;

namespace skyforge {
namespace {

constexpr int kSpinUs = 50;

// The running command app's pid, for signal handlers (async-signal-safe use only). The command
// runs in the worker's own process group (docs/architecture.md, "Processes"): whoever ends the
// worker's group — the provider's terminate, the worker itself — ends the command and whatever
// it started, and the kernel kills the command when the worker dies (PR_SET_PDEATHSIG).
std::atomic<pid_t> g_child_pid{0};
// Whether this worker leads its process group (it makes itself the leader at start): only then
// is every other member of the group its own to kill.
bool g_own_group = false;
int g_diag_fd = 2;

// What this thread is running, for the fatal-signal handler's last words: the map task and its
// slot, or the app's run(). Plain thread_locals of the executable: static TLS, safe to read in a
// signal handler.
thread_local int64_t t_task = -1;
thread_local int32_t t_slot = -1;
thread_local bool t_in_run = false;
char g_app_name[128] = "";  // the native app's name, set before it runs

// A fatal signal in an in-process app (SIGSEGV, SIGABRT, ...) kills the worker and, with it, the
// node's connection. Before it goes, one line on the worker's stderr says which task of which
// app was running; providers hand that line to the host (sf_worker_exit.last_words), which
// prints it with the signal. Async-signal-safe: fixed buffers, write(2), then the default action.
void on_fatal_signal(int sig) {
  char buf[512];
  size_t n = 0;
  auto put = [&](const char* text) {
    for (; *text && n < sizeof buf - 1; ++text) buf[n++] = *text;
  };
  auto put_num = [&](uint64_t v) {
    char digits[24];
    int d = 0;
    do digits[d++] = static_cast<char>('0' + v % 10);
    while ((v /= 10) != 0 && d < 24);
    while (d > 0 && n < sizeof buf - 1) buf[n++] = digits[--d];
  };
  const char* name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGABRT ? "SIGABRT" : sig == SIGBUS ? "SIGBUS"
                     : sig == SIGFPE ? "SIGFPE" : sig == SIGILL ? "SIGILL" : "a fatal signal";
  put("skyforge-worker: ");
  if (t_task >= 0) {
    put("task ");
    put_num(static_cast<uint64_t>(t_task));
    put(" (slot ");
    put_num(static_cast<uint64_t>(t_slot));
    put(") of app '");
    put(g_app_name);
    put("'");
  } else if (t_in_run) {
    put("run() of app '");
    put(g_app_name);
    put("'");
  } else if (const size_t d = describe_plugin_crash(sig, buf + n, sizeof buf - 1 - n); d > 0) {
    // Any other call into a plugin (create, a framework's hooks, a backend's probe, destroy):
    // "plugin 'foo' (libfoo.so) crashed in around_app_enter() with SIGSEGV (signal 11)".
    n += d;
    buf[n++] = '\n';
    ssize_t rc = ::write(g_diag_fd, buf, n);
    (void)rc;
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  } else {
    put("the worker");
  }
  put(" died of ");
  put(name);
  put(" (signal ");
  put_num(static_cast<uint64_t>(sig));
  put(")\n");
  ssize_t rc = ::write(g_diag_fd, buf, n);
  (void)rc;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void diag(const std::string& line) {
  std::string l = "skyforge-worker: " + line + "\n";
  ssize_t rc = ::write(g_diag_fd, l.data(), l.size());
  (void)rc;
}

// Every other member of this worker's process group: what a command app started, orphans
// included (they keep the group unless they leave it on purpose). Read from /proc.
std::vector<pid_t> group_members() {
  std::vector<pid_t> out;
  if (!g_own_group) return out;
  const pid_t self = ::getpid(), group = ::getpgrp();
  std::error_code ec;
  try {  // /proc changes under the walk: keep what was read
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      const pid_t pid = static_cast<pid_t>(std::stol(name));
      if (pid == self) continue;
      std::ifstream in(entry.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      // pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so parse after the last ')'.
      const auto close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(stat.substr(close + 1));
      std::string state;
      long ppid = 0, pgrp = 0;
      if (rest >> state >> ppid >> pgrp && pgrp == group && state != "Z") out.push_back(pid);
    }
  } catch (const std::exception&) {
  }
  return out;
}

// `sig` to the command app and every other member of the group, once, and to every other
// descendant of the worker (what left the group: `setsid`, a double fork; reaper.hpp).
void signal_group(int sig) {
  if (pid_t c = g_child_pid.load(); c > 0) ::kill(c, sig);
  for (pid_t p : group_members()) ::kill(p, sig);
  reaper::signal_descendants(sig);
}

// Every descendant of the worker, whatever its group or session (the worker is a child subreaper:
// orphans come to it), killed and reaped; the worker does not go on before they are gone.
void kill_descendants() {
  if (!reaper::kill_descendants(5000)) diag("some of the job's processes outlived 5 s of SIGKILL (stuck in the kernel?)");
}

// SIGKILL to every other member of the group until none is left (a member may fork while we
// look), then reap the worker's own children among them.
void kill_children() {
  if (pid_t c = g_child_pid.load(); c > 0) ::kill(c, SIGKILL);
  for (int round = 0; round < 100; ++round) {
    const auto left = group_members();
    if (left.empty()) break;
    for (pid_t p : left) ::kill(p, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(round < 10 ? 1 : 10));
  }
  kill_descendants();
}

extern "C" void on_terminate_signal(int sig) {
  // The provider asked us to go. With a command app running, take the whole process group with
  // us — the command and everything it started, in the group or not (reaper.hpp: an
  // async-signal-safe /proc walk); this process goes with them.
  if (pid_t c = g_child_pid.load(); c > 0) ::kill(c, SIGKILL);
  reaper::kill_descendants(2000);
  if (g_child_pid.load() > 0 && g_own_group) ::kill(0, SIGKILL);
  _exit(128 + sig);
}

std::pair<std::string, uint16_t> split_host_port(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("bad address '" + s + "', expected host:port");
  return {s.substr(0, colon), static_cast<uint16_t>(std::stoul(s.substr(colon + 1)))};
}

class Worker {
 public:
  explicit Worker(const WorkerArgs& a) : args_(a), services_([this](int32_t level, const std::string& m) {
    if (level == SF_LOG_STATUS) {  // what the app is doing: quoted by the host if this node is lost
      // Sent with the heartbeat's Progress, and at once when the last went out 100 ms ago or more,
      // else when those 100 ms are over, so that "last seen" is at most that old.
      const auto now = std::chrono::steady_clock::now();
      bool send = false, later = false;
      std::chrono::steady_clock::time_point due;
      {
        std::lock_guard<std::mutex> lock(status_mu_);
        status_ = m.substr(0, 256);
        if (now - status_sent_ >= kStatusEvery) {
          status_sent_ = now;
          send = true;
        } else if (!status_due_) {
          status_due_ = true;
          later = true;
          due = status_sent_ + kStatusEvery;
        }
      }
      if (send) boost::asio::post(io_, [this] { send_progress(); });
      if (later) boost::asio::post(io_, [this, due] { send_status_at(due); });
      return;
    }
    if (level < min_log_level_) return;
    send_log(3, std::string(level >= SF_LOG_ERROR ? "error: " : level >= SF_LOG_WARN ? "warning: " : "") + m + "\n");
  }) {}

  int run();

 private:
  void on_frame(msg::Type type, std::string&& payload);
  void on_close(const std::string& reason);
  void send_log(int stream, std::string text);
  bool wait_job();
  void setup_plugins(EnvMap& env);
  msg::RunResult run_app(EnvMap& env);
  int run_command(const std::vector<std::string>& argv, const EnvMap& env);
  void run_tasks();
  // around_app_exit of every entered plugin, in reverse; the failures, in call order.
  std::vector<std::string> exit_hooks(bool ok);
  void dead_man(const std::string& reason);
  void arm_stop_deadline(const std::string& reason);  // io thread, on the host's Shutdown
  std::chrono::milliseconds stop_grace() const;
  void leave_async();
  [[noreturn]] void leave();
  void renew_lease_file();
  void report_progress();  // msg::Progress every heartbeat interval, once there is a communicator or a status
  void send_progress();    // one msg::Progress now (io thread)
  void send_status_at(std::chrono::steady_clock::time_point due);  // a status held back, at `due` (io thread)
  std::shared_ptr<const sf_communicator> make_communicator();

  WorkerArgs args_;
  boost::asio::io_context io_;
  std::thread io_thread_;
  std::shared_ptr<net::Connection> conn_;
  std::unique_ptr<net::StoreServer> store_server_;
  Services services_;
  std::unique_ptr<Loader> loader_;
  std::vector<std::unique_ptr<PluginInstance>> frameworks_;  // [[plugins]] but compute backends
  std::vector<std::unique_ptr<PluginInstance>> compute_backends_;  // creation order
  PluginInstance* selected_backend_ = nullptr;  // of compute_backends_: the job's compute.backend
  size_t entered_ = 0;
  std::unique_ptr<PluginInstance> app_;
  sf_instance_info info_{};

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<msg::Job> job_;
  std::deque<msg::TaskBatch> batches_;
  std::atomic<size_t> queued_{0};  // batches_.size(), readable without mu_
  std::atomic<uint64_t> failed_tasks_{0};  // map jobs: tasks on this node that failed
  bool shutdown_ = false;
  std::atomic<bool> finishing_{false};
  std::atomic<int32_t> min_log_level_{SF_LOG_INFO};  // plugin logs below this stay on the node (debug: -v)
  // SKYFORGE_LEASE_FILE (a provider's dead-man switch, e.g. aws): touched every few seconds
  // while this worker holds the host's lease, aged to the epoch the moment it loses it.
  std::string lease_file_;
  std::unique_ptr<boost::asio::steady_timer> lease_timer_;
  // The job's communicator, for report_progress() (set by make_communicator()).
  std::mutex comm_mu_;
  std::shared_ptr<GlooCommunicator> comm_;
  std::unique_ptr<boost::asio::steady_timer> progress_timer_;
  // The app's last status line (SF_LOG_STATUS): where it is ("epoch 3/6, step 412/900").
  std::mutex status_mu_;
  std::string status_;
  static constexpr std::chrono::milliseconds kStatusEvery{100};
  std::chrono::steady_clock::time_point status_sent_{};
  bool status_due_ = false;  // a status waits for send_status_at
  std::unique_ptr<boost::asio::steady_timer> status_timer_;
  // After the host's Shutdown: a command gets stop_grace() after SIGTERM, then SIGKILL; a
  // native app that has not returned by then is left behind (the process ends).
  std::unique_ptr<boost::asio::steady_timer> stop_timer_;
  std::atomic<bool> ending_{false};  // claimed by whichever ends the worker: its normal end, or leave()
  std::atomic<const char*> phase_{"the job's setup"};  // what the main thread is doing, for leave()'s message
  OutputWindow out_window_{msg::kOutputWindow};  // the host's flow control of the job's output (msg::OutputAck)
};

void Worker::send_log(int stream, std::string text) {
  auto c = conn_;
  if (!c) {
    diag(text);
    return;
  }
  msg::Log l;
  l.node = args_.node;
  l.stream = static_cast<uint8_t>(stream);
  l.text = std::move(text);
  c->send_msg(msg::Type::Log, l);
}

void Worker::on_frame(msg::Type type, std::string&& payload) {
  std::lock_guard<std::mutex> lock(mu_);
  switch (type) {
    case msg::Type::Job:
      job_ = net::deserialize<msg::Job>(payload);
      break;
    case msg::Type::TaskBatch:
      batches_.push_back(net::deserialize<msg::TaskBatch>(payload));
      queued_.fetch_add(1, std::memory_order_release);
      break;
    case msg::Type::OutputAck:  // the host wrote this much of the job's output: the pump may go on
      out_window_.ack(net::deserialize<msg::OutputAck>(payload).bytes);
      return;
    case msg::Type::Shutdown:
      shutdown_ = true;
      if (g_child_pid.load() > 0) signal_group(SIGTERM);  // cancel a running command
      arm_stop_deadline(net::deserialize<msg::Shutdown>(payload).reason);
      break;
    default:
      diag("ignoring unexpected frame type " + std::to_string(static_cast<int>(type)));
      return;
  }
  cv_.notify_all();
}

void Worker::on_close(const std::string& reason) {
  out_window_.release();  // no acknowledgement will come: the pump must not wait for one
  if (finishing_) return;  // our own orderly close
  dead_man("lost the host (" + reason + ")");
}

// The pool's communicator (rank = node), built on the first communicator() call. The rendezvous
// is collective: it waits up to the collective timeout for every node to call it too.
std::shared_ptr<const sf_communicator> Worker::make_communicator() {
  const msg::Job& job = *job_;
  if (job.mode == JobMode::single && job.command.empty() && job.id.total_nodes > 1)
    throw std::runtime_error("communicator() needs the app running on every node, but with mode = \"single\" only "
                             "the head runs it (use mode = \"broadcast\")");
  GlooCommunicator::Options o;
  o.rank = job.id.node;
  o.size = job.id.total_nodes;
  o.address = job.id.private_ip.empty() ? args_.address : job.id.private_ip;
  o.prefix = "gloo/0/";  // one communicator per pool (job); the store lives as long as the pool
  auto cfg = job.config.find("job.collective_timeout");
  auto env = job.env.find("SKYFORGE_COLLECTIVE_TIMEOUT");
  const char* env_value = env != job.env.end() ? env->second.c_str() : std::getenv("SKYFORGE_COLLECTIVE_TIMEOUT");
  o.timeout = GlooCommunicator::parse_timeout(cfg != job.config.end() ? cfg->second.c_str() : nullptr, env_value);
  net::StoreClient* store = services_.store();
  if (!store) throw std::runtime_error("the rendezvous store is not connected");
  auto comm = std::make_shared<GlooCommunicator>(*store, o);
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    comm_ = comm;
  }
  const sf_communicator* table = comm->table();
  return std::shared_ptr<const sf_communicator>(std::move(comm), table);
}

// The host is gone: nobody will tear this node down, so do it ourselves, now. Under a node agent
// (ssh, slurm, aws: SKYFORGE_NODE_AGENT) the node's directory is the agent's: it removes it when
// the host's session drops, and until then keeps it for the worker a restart sends next.
void Worker::dead_man(const std::string& reason) {
  diag("node " + std::to_string(args_.node) + ": " + reason + "; shutting down");
  const char* agent = std::getenv("SKYFORGE_NODE_AGENT");
  if (!lease_file_.empty()) {
    const struct timespec epoch[2] = {{0, 0}, {0, 0}};
    ::utimensat(AT_FDCWD, lease_file_.c_str(), epoch, 0);  // the machine's switch acts now, not after its ttl
  }
  kill_children();
  if (args_.remove_work_dir && !args_.work_dir.empty() && !(agent && std::string(agent) == "1")) {
    std::error_code ec;
    std::filesystem::path wd(args_.work_dir);
    if (chdir("/") == 0) {
      std::filesystem::remove_all(wd, ec);
      std::filesystem::remove(wd.parent_path(), ec);  // the pool dir, once its last node is gone
    }
  }
  _exit(3);
}

// The host's Shutdown (a restart, the run's end or its failure) ends this worker before the
// host's wait for it runs out (lease + 10 s), whatever its app is doing. The grace is that wait
// less 6 s (8 s with the default 4 s lease): a command gets SIGTERM at once and SIGKILL when the
// grace is over (torchrun escalates the same way); a native app still inside run(), its tasks,
// its plugins' setup or exit hooks by then cannot be stopped from outside its thread, so the
// worker goes without it: every frame sent so far is delivered, the connection closed and the
// process ends (status 4). The node's directory stays (a restart's next worker resumes from
// the checkpoints in it), and the lease file is left alone (the machine is not being given up).
std::chrono::milliseconds Worker::stop_grace() const { return net::stop_grace(args_.lease_ms); }

void Worker::arm_stop_deadline(const std::string& reason) {
  if (stop_timer_ || finishing_) return;
  const bool sigterm_sent = g_child_pid.load() > 0;
  stop_timer_ = std::make_unique<boost::asio::steady_timer>(io_, stop_grace());
  stop_timer_->async_wait([this, reason, sigterm_sent](const boost::system::error_code& ec) {
    if (ec || finishing_) return;
    const std::string grace = std::to_string((stop_grace().count() + 500) / 1000) + " s";
    if (g_child_pid.load() > 0) {
      // SIGKILL only: run_command() reaps its child (a waitpid here would race with it), and
      // the normal end of the worker kills and reaps whatever the group still holds.
      send_log(3, "warning: the command did not end within " + grace + " of the host's shutdown (" + reason + ")" +
                      (sigterm_sent ? " and its SIGTERM" : "") + "; SIGKILL\n");
      signal_group(SIGKILL);
      stop_timer_->expires_after(std::chrono::seconds(2));
      stop_timer_->async_wait([this](const boost::system::error_code& e) {
        if (!e && !finishing_) {
          send_log(3, "warning: the worker did not end 2 s after its command was killed; it ends now\n");
          leave_async();
        }
      });
      return;
    }
    const std::string phase = phase_.load();
    const bool in_app = phase == "run()" || phase == "the tasks";
    send_log(3, "warning: " + phase + (in_app ? std::string(" of app '") + g_app_name + "'" : "") + " did not end within " +
                    grace + " of the host's shutdown (" + reason + "); the worker ends without it\n");
    leave_async();
  });
}

// leave() on a thread of its own: the close it waits for needs the io thread.
void Worker::leave_async() {
  if (ending_.exchange(true)) return;  // the worker's normal end got there first
  try {
    std::thread([this] { leave(); }).detach();
  } catch (const std::system_error&) {
    leave();  // no thread to be had: the close waits its 2 s out and the process ends anyway
  }
}

// The end of a worker whose app will not return: children killed, the frames sent so far
// delivered, the connection closed, exit status 4.
void Worker::leave() {
  finishing_ = true;  // the close below is ours: no dead-man exit, which would remove the node's directory
  kill_children();
  if (auto c = conn_) {
    c->close();
    c->wait_closed(2000);
  }
  _exit(4);
}

void Worker::report_progress() {
  send_progress();
  if (finishing_) return;
  if (!progress_timer_) progress_timer_ = std::make_unique<boost::asio::steady_timer>(io_);
  progress_timer_->expires_after(std::chrono::milliseconds(std::max(50, args_.heartbeat_ms)));
  progress_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) report_progress();
  });
}

void Worker::send_status_at(std::chrono::steady_clock::time_point due) {
  if (!status_timer_) status_timer_ = std::make_unique<boost::asio::steady_timer>(io_);
  status_timer_->expires_at(due);
  status_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    {
      std::lock_guard<std::mutex> lock(status_mu_);
      status_due_ = false;
      status_sent_ = std::chrono::steady_clock::now();
    }
    send_progress();
  });
}

void Worker::send_progress() {
  std::shared_ptr<GlooCommunicator> comm;
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    comm = comm_;
  }
  if (finishing_) return;
  msg::Progress m;
  if (comm) {
    const GlooCommunicator::Progress p = comm->progress();
    m.entered = p.entered;
    m.done = p.done;
    m.op = p.op;
    m.bytes = p.bytes;
    m.since_ms = p.since_ms;
  }
  {
    std::lock_guard<std::mutex> lock(status_mu_);
    m.status = status_;
  }
  if (comm || !m.status.empty())
    if (auto c = conn_) c->send_msg(msg::Type::Progress, m);
}

void Worker::renew_lease_file() {
  ::utimensat(AT_FDCWD, lease_file_.c_str(), nullptr, 0);
  lease_timer_->expires_after(std::chrono::seconds(5));
  lease_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) renew_lease_file();
  });
}

bool Worker::wait_job() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return job_.has_value() || shutdown_; });
  return job_.has_value() && !shutdown_;
}

// A library path of the host's machine, as this node sees it: under SKYFORGE_STAGE_ROOT where
// the provider staged the host's files (abi.h, sf_pool_spec::stage_files), else as it is.
std::string staged_path(const std::string& path) {
  const char* root = std::getenv("SKYFORGE_STAGE_ROOT");
  if (!root || !*root || path.empty() || path[0] != '/') return path;
  std::string p = std::string(root) + path;
  std::error_code ec;
  return std::filesystem::exists(p, ec) ? p : path;
}

void Worker::setup_plugins(EnvMap& env) {
  const msg::Job& job = *job_;
  loader_ = std::make_unique<Loader>(services_.table());
  for (const auto& f : job.frameworks) {
    const LoadedPlugin& p = loader_->load(staged_path(f.library), f.name);
    if (p.kind == SF_KIND_COMPUTE_BACKEND) {
      // No around_app hooks: created with its options, lent to the app through the
      // compute_backend service, destroyed after the app.
      // (The loader refused it at load unless its compute hooks are all there.)
      compute_backends_.push_back(loader_->create(p, f.options));
      auto& b = compute_backends_.back();
      services_.add_compute_backend(p.name, b->hooks<sf_compute_hooks>(), b->self());
      if (auto sel = job.config.find("compute.backend"); sel != job.config.end() && sel->second == p.name)
        selected_backend_ = b.get();
      continue;
    }
    frameworks_.push_back(loader_->create(p, f.options));
  }
  if (!job.app.name.empty()) {
    std::snprintf(g_app_name, sizeof g_app_name, "%s", job.app.name.c_str());
    const LoadedPlugin& p = loader_->load(staged_path(job.app.library), job.app.name, SF_KIND_APP);
    app_ = loader_->create(p, job.app.options);
  }
  info_ = *services_.instance();
  // Enter in manifest order; exit_hooks() leaves in reverse, failures included.
  for (auto& fw : frameworks_) {
    if (fw->plugin().kind != SF_KIND_FRAMEWORK) {
      ++entered_;
      continue;
    }
    ++entered_;
    sf_env e = env.c_view();
    fw->call_optional(&sf_framework_hooks::around_app_enter, "around_app_enter", &info_, &e);
  }
}

std::vector<std::string> Worker::exit_hooks(bool ok) {
  std::vector<std::string> errors;
  while (entered_ > 0) {
    auto& fw = frameworks_[--entered_];
    if (fw->plugin().kind != SF_KIND_FRAMEWORK) continue;
    try {
      fw->call_optional(&sf_framework_hooks::around_app_exit, "around_app_exit", &info_, ok ? SF_OK : SF_ERR);
    } catch (const std::exception& e) {
      errors.emplace_back(e.what());  // every exit hook still runs
    }
  }
  return errors;
}

int Worker::run_command(const std::vector<std::string>& argv_in, const EnvMap& env) {
  std::vector<std::string> argv = argv_in;
  for (auto& fw : frameworks_) {  // launcher hooks, manifest order
    if (fw->plugin().kind != SF_KIND_FRAMEWORK) continue;
    if (!fw->hooks<sf_framework_hooks>()->launcher) continue;
    std::vector<const char*> in;
    for (auto& a : argv) in.push_back(a.c_str());
    sf_argv cin{in.size(), in.data()};
    std::vector<std::string> out;
    sf_sink sink{&out, [](void* ctx, const char* d, size_t n) {
                   lent([&] { static_cast<std::vector<std::string>*>(ctx)->emplace_back(d, n); });
                 }};
    fw->call(&sf_framework_hooks::launcher, "launcher", &info_, &cin, sink);
    if (out.empty()) throw std::runtime_error("plugin '" + fw->plugin().name + "' launcher returned no command");
    argv = std::move(out);
  }
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<std::string> envs = env.entries();
  std::vector<char*> cenv;
  for (auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  // Everything the child needs is prepared here: between fork() and exec() only
  // async-signal-safe calls (no allocation: another thread may hold the malloc lock).
  const std::string exec_error = std::string("cannot run '") + cargv[0] + "': ";
  pid_t parent = getpid();
  // Signals stay blocked across fork() until the child has reset their dispositions: a SIGTERM
  // the teardown sends to the group in between would otherwise run this worker's handler in the
  // child, which exits 143 — a command that "failed" instead of one the teardown stopped.
  sigset_t all, saved;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  pid_t pid = fork();
  if (pid != 0) pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Stays in the worker's process group (see g_child_pid); dies with the worker.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    // Only 0-2 cross exec: no pool connection, store socket or plugin descriptor reaches the job,
    // whatever was opened without O_CLOEXEC (a library's, a plugin's).
    if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
      for (int fd = 3; fd < 65536; ++fd) {
        const int flags = ::fcntl(fd, F_GETFD);
        if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
      }
    }
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (chdir(info_.work_dir) != 0) _exit(127);
    execvpe(cargv[0], cargv.data(), cenv.data());
    const char* why = strerrordesc_np(errno);  // a constant string: no locale, no allocation
    ssize_t rc = ::write(2, exec_error.data(), exec_error.size());
    rc = ::write(2, why ? why : "error", why ? std::strlen(why) : 5);
    rc = ::write(2, "\n", 1);
    (void)rc;
    _exit(127);
  }
  g_child_pid = pid;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, 0);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  }
  g_child_pid = 0;
  kill_children();  // whatever the command left behind in the group
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return 1;
}

void Worker::run_tasks() {
  const uint32_t slots = std::max<uint32_t>(1, job_->id.concurrency);
  auto* h = app_->hooks<sf_app_hooks>();
  std::vector<std::thread> threads;
  for (uint32_t slot = 0; slot < slots; ++slot) {
    threads.emplace_back([this, slot, h] {
      Services::SlotScope in_slot(slot);  // instance_info() on this thread says `slot`
      t_slot = static_cast<int32_t>(slot);
      for (;;) {
        msg::TaskBatch batch;
        // A short spin before sleeping: the host usually answers a result with the next batch
        // within tens of microseconds, and a futex wake-up costs about as much again.
        for (auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinUs);
             queued_.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < until;)
          cpu_relax();
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return !batches_.empty() || shutdown_; });
          if (batches_.empty()) return;
          batch = std::move(batches_.front());
          batches_.pop_front();
          queued_.fetch_sub(1, std::memory_order_relaxed);
        }
        auto t0 = std::chrono::steady_clock::now();
        msg::TaskResults out;
        out.first = batch.first;
        out.results.reserve(batch.inputs.size());
        for (const auto& input : batch.inputs) {
          msg::TaskResult r;
          r.slot = slot;
          sf_sink sink = {&r.value, [](void* ctx, const char* d, size_t n) {
                            lent([&] { static_cast<std::string*>(ctx)->append(d, n); });
                          }};
          t_task = static_cast<int64_t>(batch.task(out.results.size()));
          sf_status st = h->task(app_->self(), input.data(), input.size(), slot, sink);
          t_task = -1;
          if (st != SF_OK) {
            failed_tasks_.fetch_add(1, std::memory_order_relaxed);
            r.ok = false;
            const char* m = app_->plugin().descriptor->last_error(app_->self());
            r.value = (m && *m) ? m : "task failed with status " + std::to_string(st);
          }
          out.results.push_back(std::move(r));
        }
        out.elapsed_ns = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
        conn_->send_msg(msg::Type::TaskResults, out);
      }
    });
  }
  for (auto& t : threads) t.join();
}

msg::RunResult Worker::run_app(EnvMap& env) {
  msg::RunResult result;
  result.node = args_.node;
  const msg::Job& job = *job_;
  if (!job.command.empty()) {
    phase_ = "the command";
    result.exit_code = run_command(job.command, env);
    result.ok = result.exit_code == 0;
    if (!result.ok)
      result.error = result.exit_code < 0 ? "command killed by signal " + std::to_string(-result.exit_code)
                                          : "command exited with status " + std::to_string(result.exit_code);
    return result;
  }
  if (job.mode == JobMode::map) {
    phase_ = "the tasks";
    run_tasks();
    return result;
  }
  if (job.mode == JobMode::single && job.id.node != 0) return result;  // only the head runs it
  if (!app_->hooks<sf_app_hooks>()->run) throw std::runtime_error("app '" + app_->plugin().name + "' has no run() hook");
  sf_sink sink = {&result.value,
                  [](void* ctx, const char* d, size_t n) { lent([&] { static_cast<std::string*>(ctx)->append(d, n); }); }};
  t_in_run = true;
  phase_ = "run()";
  app_->call(&sf_app_hooks::run, "run", sink);
  t_in_run = false;
  return result;
}

int Worker::run() {
  // Lead a process group of our own (providers start workers in a session of their own, which
  // already makes them leaders): the command app joins it, and ending the group ends the node.
  g_own_group = ::getpgrp() == ::getpid() || ::setpgid(0, 0) == 0;
  // The command's orphans come to us, so kill_children kills and reaps them, in the group or not
  // (and, once we are gone, to the next reaper up: the local provider's host is one).
  reaper::become_subreaper();
  g_diag_fd = fcntl(2, F_DUPFD_CLOEXEC, 3);
  if (g_diag_fd < 0) g_diag_fd = 2;
  struct sigaction sa {};
  sa.sa_handler = on_terminate_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  struct sigaction fatal {};
  fatal.sa_handler = on_fatal_signal;
  fatal.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigemptyset(&fatal.sa_mask);
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) sigaction(sig, &fatal, nullptr);
  if (args_.work_dir.empty()) args_.work_dir = std::filesystem::current_path().string();

  auto guard = boost::asio::make_work_guard(io_);
  if (const char* lease = std::getenv("SKYFORGE_LEASE_FILE"); lease && *lease) {
    lease_file_ = lease;
    lease_timer_ = std::make_unique<boost::asio::steady_timer>(io_);
    boost::asio::post(io_, [this] { renew_lease_file(); });
  }
  io_thread_ = std::thread([this] { io_.run(); });
  auto stop_io = [&] {
    guard.reset();
    io_.stop();
    if (io_thread_.joinable()) io_thread_.join();
  };

  net::ConnectionOptions opts;
  opts.lease_ms = args_.lease_ms;
  opts.heartbeat_ms = args_.heartbeat_ms;
  msg::Hello hello;
  hello.node = args_.node;
  hello.pid = getpid();
  char hn[256] = {0};
  gethostname(hn, sizeof hn - 1);
  hello.hostname = hn;
  hello.private_ip = args_.address;
  try {
    if (args_.node == 0) {
      // The head runs the pool's rendezvous store (docs/architecture.md).
      store_server_ = std::make_unique<net::StoreServer>(io_, args_.address, 0, args_.secret);
      hello.store_addr = args_.address + ":" + std::to_string(store_server_->port());
    }
    conn_ = net::connect(io_, args_.host, args_.port, args_.secret, args_.node, opts, 15000);
  } catch (const std::exception& e) {
    diag(std::string("node ") + std::to_string(args_.node) + ": cannot join the pool: " + e.what());
    stop_io();
    return 2;
  }
  conn_->start([this](msg::Type t, std::string&& p) { on_frame(t, std::move(p)); },
               [this](const std::string& reason) { on_close(reason); });
  conn_->send_msg(msg::Type::Hello, hello);

  OutputPump pump([this](int stream, std::string&& text) { send_log(stream, std::move(text)); }, &out_window_);
  g_diag_fd = pump.diag_fd();

  msg::RunResult result;
  result.node = args_.node;
  bool have_job = false;
  try {
    have_job = wait_job();
    if (have_job) {
      services_.set_instance(job_->id, args_.work_dir);
      services_.set_config(job_->config);
      if (auto it = job_->config.find("log.verbose"); it != job_->config.end() && it->second == "true")
        min_log_level_ = SF_LOG_DEBUG;
      auto [store_host, store_port] = split_host_port(job_->id.store_addr);
      services_.set_store_connector([this, store_host = store_host, store_port = store_port] {
        return net::StoreClient::connect(store_host, store_port, args_.secret, args_.node, 15000);
      });
      services_.set_communicator_factory([this] { return make_communicator(); });
      EnvMap env = EnvMap::from_environ(environ);
      for (const auto& [k, v] : job_->env) env.set(k, v);
      env.set("SKYFORGE_NODE", std::to_string(job_->id.node));
      env.set("SKYFORGE_TOTAL_NODES", std::to_string(job_->id.total_nodes));
      env.set("SKYFORGE_HEAD_ADDR", job_->id.head_addr);
      env.set("SKYFORGE_POOL_ID", job_->id.pool_id);
      env.set("SKYFORGE_WORK_DIR", args_.work_dir);
      // The rest of instance_info(), for a command's runtime API (python/skyforge, docs/runtime-api.md).
      env.set("SKYFORGE_PRIVATE_IP", job_->id.private_ip);
      env.set("SKYFORGE_LOCAL_RANK", std::to_string(job_->id.local_rank));
      env.set("SKYFORGE_LOCAL_WORLD_SIZE", std::to_string(job_->id.local_world_size));
      env.set("SKYFORGE_ACCELERATORS", std::to_string(job_->id.accelerators));
      env.set("SKYFORGE_ACCELERATOR", job_->id.accelerator);
      env.set("SKYFORGE_CONCURRENCY", std::to_string(job_->id.concurrency));
      // The address this node reaches the client's machine at (what it connected to).
      env.set("SKYFORGE_CLIENT_ADDR", args_.host);
      if (!env.get("PYTHONUNBUFFERED")) env.set("PYTHONUNBUFFERED", "1");  // live output from Python
      // [image] pip packages are installed by the bootstrap script into the node's work dir.
      const std::string site = args_.work_dir + "/.skyforge/site";
      if (std::filesystem::is_directory(site)) {
        const char* old = env.get("PYTHONPATH");
        env.set("PYTHONPATH", old && *old ? site + ":" + old : site);
      }
      phase_ = "the plugins' setup";
      setup_plugins(env);
      if (job_->command.empty()) env.apply_to_process();  // native apps read the same environment
      // The selected compute backend says now, before the app or command runs, when it cannot
      // run on this node (no driver, no device): abi.h, sf_compute_hooks::probe. Not sooner: the
      // framework hooks choose the node's devices (mig sets CUDA_VISIBLE_DEVICES), and a CUDA
      // runtime reads that variable once, when first called, which a probe may be.
      if (selected_backend_) {
        phase_ = "the compute backend's probe";
        selected_backend_->call_optional(&sf_compute_hooks::probe, "probe");
      }
      conn_->send(msg::Type::Ready, std::string());
      boost::asio::post(io_, [this] { report_progress(); });  // then every heartbeat interval
      result = run_app(env);
    }
  } catch (const std::exception& e) {
    result.ok = false;
    result.error = e.what();
  }
  if (have_job) {
    // around_app_exit hears whether this node's part failed: its app or command, or in a map job
    // any of its tasks. A failing exit hook fails the node (after every exit hook has run).
    phase_ = "the exit hooks";
    std::vector<std::string> errors = exit_hooks(result.ok && failed_tasks_.load() == 0);
    for (size_t i = 0; i < errors.size(); ++i) {
      if (i == 0 && result.ok) {
        result.ok = false;
        result.error = errors[0];
      } else {
        send_log(3, "error: " + errors[i] + "\n");
      }
    }
  }
  if (have_job) conn_->send_msg(msg::Type::RunResult, result);

  // Stay until the host says goodbye: it may still be gathering other nodes' results.
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return shutdown_; });
  }
  if (ending_.exchange(true))  // leave() has the worker already: it ends the process
    for (;;) ::pause();
  finishing_ = true;
  kill_children();
  frameworks_.clear();
  app_.reset();
  // Compute backends outlive the app (its engines came from them), in reverse creation order;
  // then the communicator they may have used.
  services_.clear_compute_backends();
  while (!compute_backends_.empty()) compute_backends_.pop_back();
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    comm_.reset();
  }
  services_.reset_communicator();
  pump.finish();
  g_diag_fd = pump.diag_fd();
  conn_->close();
  conn_->wait_closed(3000);  // flush: the host reads every log line and the result
  if (store_server_) store_server_->close();
  services_.set_store(nullptr);
  stop_io();
  return result.ok ? 0 : 1;
}

}  // namespace

int worker_main(const WorkerArgs& args) {
  Worker w(args);
  return w.run();
}

}  // namespace skyforge
