// A node's job from start to end (worker_impl.hpp): join the pool (and, on the head, run its
// rendezvous store), wait for the Job, run it, report, and stay until the host's Shutdown; the
// host's frames; and the worker's end when it loses the host or its app outlives a Shutdown.
#include "worker.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <skyforge/config_keys.hpp>

#include "last_words.hpp"
#include "outputs_send.hpp"
#include "processes.hpp"
#include "worker_impl.hpp"

namespace skyforge {
namespace {

std::pair<std::string, uint16_t> split_host_port(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("bad address '" + s + "', expected host:port");
  return {s.substr(0, colon), static_cast<uint16_t>(std::stoul(s.substr(colon + 1)))};
}

}  // namespace

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
    case msg::Type::OutputsAck:  // ... and this much of the job's files
      files_window_.ack(net::deserialize<msg::OutputsAck>(payload).bytes);
      return;
    case msg::Type::Shutdown: {
      auto s = net::deserialize<msg::Shutdown>(payload);
      shutdown_ = true;
      send_outputs_ = s.outputs;
      if (g_child_pid.load() > 0) signal_group(SIGTERM);  // cancel a running command
      arm_stop_deadline(s.reason);
      break;
    }
    default:
      diag("ignoring unexpected frame type " + std::to_string(static_cast<int>(type)));
      return;
  }
  cv_.notify_all();
}

void Worker::on_close(const std::string& reason) {
  out_window_.release();  // no acknowledgement will come: the pump must not wait for one
  files_window_.release();
  if (finishing_) return;  // our own orderly close
  dead_man("lost the host (" + reason + ")");
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

bool Worker::wait_job() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return job_.has_value() || shutdown_; });
  return job_.has_value() && !shutdown_;
}

int Worker::run() {
  take_charge_of_processes();
  install_last_words();
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
      make_output_dir();
      services_.set_config(job_->config);
      if (auto it = job_->config.find(std::string(skyforge::config::keys::log_verbose.name));
          it != job_->config.end() && it->second == "true")
        min_log_level_ = SF_LOG_DEBUG;
      auto [store_host, store_port] = split_host_port(job_->id.store_addr);
      services_.set_store_connector([this, store_host = store_host, store_port = store_port] {
        return net::StoreClient::connect(store_host, store_port, args_.secret, args_.node, 15000);
      });
      services_.set_communicator_factory([this] { return make_communicator(); });
      EnvMap env = job_env();
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
  if (have_job && send_outputs_) send_job_outputs();  // the run's end: the job's files go back
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

// SKYFORGE_OUTPUT_DIR, private to the job's user. A restart's worker finds what its predecessor
// left there (the node's directory stays for it), so that the run's end sends it all.
void Worker::make_output_dir() {
  const std::filesystem::path dir = skyforge::config::output_dir_of(args_.work_dir);
  for (const std::filesystem::path& d : {dir.parent_path(), dir})  // .skyforge/ too: the node's directory is the user's alone
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST)
      throw std::runtime_error("cannot make the output directory " + d.string() + ": " + std::strerror(errno));
}

// What the job left in SKYFORGE_OUTPUT_DIR, and the files [job] outputs names, to the host;
// what does not go is said there. Its command and everything it started are gone by now.
void Worker::send_job_outputs() {
  phase_ = "sending the job's files";
  namespace keys = skyforge::config::keys;
  auto lookup = [this](const std::string& k) -> std::optional<std::string> {
    auto it = job_->config.find(k);
    return it == job_->config.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  try {
    OutputsPlan plan = plan_outputs(skyforge::config::output_dir_of(args_.work_dir), args_.work_dir,
                                    keys::job_outputs.find(lookup).value_or(std::vector<std::string>{}),
                                    keys::job_outputs_max_bytes.get(lookup));
    auto c = conn_;
    send_outputs(std::move(plan), [&c](msg::Type t, std::string p) { c->send(t, std::move(p)); }, files_window_,
                 [&c] { return c->is_closed(); });
  } catch (const std::exception& e) {
    send_log(3, std::string("error: the job's files were not sent: ") + e.what() + "\n");
  }
  if (conn_->is_closed()) dead_man("lost the host while sending the job's files");  // nobody else tears this node down
}

int worker_main(const WorkerArgs& args) {
  Worker w(args);
  return w.run();
}

}  // namespace skyforge
