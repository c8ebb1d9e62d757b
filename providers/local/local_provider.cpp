#include "local_provider.hpp"

#include "gpus.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include "cgroup.hpp"
#include "netns.hpp"
#include "spawn.hpp"

namespace skyforge::local {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kTermGrace = std::chrono::seconds(3);  // SIGTERM -> SIGKILL, for all nodes together
constexpr auto kKillWait = std::chrono::seconds(2);   // after SIGKILL, for the kernel to finish
constexpr size_t kTailLines = 12;                     // output quoted when a bootstrap fails
constexpr size_t kMaxLine = 64 * 1024;                // a longer line is passed on in pieces

bool valid_pool_id(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
  });
}

void write_all(int fd, const std::string& data, const std::string& path) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error("local provider: cannot write " + path + ": " + std::strerror(errno));
    off += size_t(n);
  }
}

Fd open_file(const fs::path& p, int flags, mode_t mode) {
  Fd fd(::open(p.c_str(), flags | O_CLOEXEC | O_NOFOLLOW, mode));
  if (!fd) throw Error("local provider: cannot open " + p.string() + ": " + std::strerror(errno));
  return fd;
}

void make_private_dir(const fs::path& p) {
  if (::mkdir(p.c_str(), 0700) != 0)
    throw Error("local provider: cannot create " + p.string() + ": " + std::strerror(errno) +
                (errno == EEXIST ? " (another pool with this id, or a leftover: remove it)" : ""));
  ::chmod(p.c_str(), 0700);  // regardless of umask
}

// True once no process of group `pg` is left; reaps every child of ours in it on the way.
bool group_gone(pid_t pg, pid_t worker, bool& worker_reaped, int& worker_status) {
  int st = 0;
  pid_t r;
  while ((r = ::waitpid(-pg, &st, WNOHANG)) > 0)
    if (r == worker) {
      worker_reaped = true;
      worker_status = st;
    }
  return ::kill(-pg, 0) != 0 && errno == ESRCH;
}

}  // namespace

LocalConfig LocalConfig::from(const Options& o) {
  LocalConfig c;
  std::string iso = o.get("isolation", "none");
  if (iso == "none") c.isolation = Isolation::none;
  else if (iso == "netns") c.isolation = Isolation::netns;
  else throw Error("local provider: option 'isolation': expected \"none\" or \"netns\", got \"" + iso + "\"",
                   SF_ERR_INVALID);
  std::string root = o.get("work_root", "");
  if (root.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    root = (tmp && *tmp) ? tmp : "/tmp";
  }
  c.work_root = fs::path(root);
  if (c.work_root.is_relative()) c.work_root = fs::absolute(c.work_root);
  c.keep_workdirs = o.get_bool("keep_workdirs", false);
  return c;
}

LocalProvider::LocalProvider(const Context& ctx) : Provider(ctx), config_(LocalConfig::from(ctx.options)) {
  // Fail at plugin creation, before anything starts, when isolation cannot work here.
  if (config_.isolation == Isolation::netns) NetnsPool::check_supported();
}

LocalProvider::~LocalProvider() {
  try {
    terminate({});
  } catch (const std::exception& e) {
    host().warn(std::string("local provider: cleanup at exit: ") + e.what());
  } catch (...) {
  }
}

LocalProvider::Node* LocalProvider::find(const std::string& id) {
  for (auto& n : nodes_)
    if (n->id == id) return n.get();
  return nullptr;
}
const LocalProvider::Node* LocalProvider::find(const std::string& id) const {
  for (auto& n : nodes_)
    if (n->id == id) return n.get();
  return nullptr;
}

LocalProvider::Node& LocalProvider::require(const std::string& id, const char* op) {
  Node* n = find(id);
  if (!n) throw Error(std::string("local provider: ") + op + ": unknown node '" + id + "'", SF_ERR_INVALID);
  if (n->gone) throw Error(std::string("local provider: ") + op + ": node '" + id + "' has been terminated");
  return *n;
}

Provisioned LocalProvider::provision(const PoolSpec& spec) {
  std::lock_guard<std::mutex> lock(mu_);
  bool live = std::any_of(nodes_.begin(), nodes_.end(), [](auto& n) { return !n->gone || n->bootstraps_running; });
  if (live || (net_ && net_->has_bridge()) || (pool_dir_made_ && !config_.keep_workdirs))
    throw Error("local provider: this instance still holds pool '" + pool_id_ + "'; terminate it first");
  if (!valid_pool_id(spec.pool_id))
    throw Error("local provider: pool id '" + spec.pool_id + "' must be 1-64 of [A-Za-z0-9._-]", SF_ERR_INVALID);
  if (spec.nodes == 0) throw Error("local provider: a pool needs at least one node", SF_ERR_INVALID);
  if (config_.isolation == Isolation::netns && spec.nodes > NetnsPool::kMaxNodes)
    throw Error("local provider: isolation = \"netns\" supports at most " + std::to_string(NetnsPool::kMaxNodes) +
                    " nodes per pool; " + std::to_string(spec.nodes) + " were asked for",
                SF_ERR_INVALID);

  AcceleratorSpec accelerator;
  try {
    accelerator = parse_accelerator(spec.accelerator);
  } catch (const std::invalid_argument& e) {
    throw Error(std::string("local provider: [pool] ") + e.what(), SF_ERR_INVALID);
  }
  const VisibleGpus visible = visible_gpus(std::getenv("CUDA_VISIBLE_DEVICES"));
  const GpuPlacement gpus = place_gpus(accelerator, spec.accelerator, spec.nodes, visible);
  if (!gpus.warning.empty()) host().warn(gpus.warning);

  // Orphans of a node's processes (what a command started, once its worker is gone) come to
  // this process rather than to init, so stop_groups' waitpid(-group) reaps them: a zombie
  // still counts as a member of its group, and init may take a second or more to reap it.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);

  nodes_.clear();
  net_.reset();
  pool_cgroup_.clear();
  cgroup_why_.clear();
  pool_id_ = spec.pool_id;
  pool_dir_ = config_.work_root / ("skyforge-" + pool_id_);
  pool_dir_made_ = false;

  Provisioned out;
  try {
    std::error_code ec;
    fs::create_directories(config_.work_root, ec);
    if (ec) throw Error("local provider: cannot create work_root " + config_.work_root.string() + ": " + ec.message());
    make_private_dir(pool_dir_);
    pool_dir_made_ = true;
    if (config_.isolation == Isolation::netns) {
      net_ = std::make_unique<NetnsPool>(pool_id_);
      net_->create_bridge(spec.nodes);
      out.control_address = net_->gateway();
    } else {
      out.control_address = "127.0.0.1";
    }
    for (uint32_t i = 0; i < spec.nodes; ++i) {
      auto n = std::make_unique<Node>();
      n->index = i;
      n->id = "node-" + std::to_string(i);
      n->dir = pool_dir_ / n->id;
      n->gpus = gpus.per_node[i];
      n->gpus_pci_order = visible.pci_order;
      Node& ref = *n;
      nodes_.push_back(std::move(n));
      make_private_dir(ref.dir);
      ref.dir_made = true;
      if (net_) {
        ref.net_made = true;  // partial pieces are tracked inside NetnsPool
        net_->add_node(i);
        ref.address = net_->node_address(i);
      } else {
        ref.address = "127.0.0.1";
      }
      out.nodes.push_back({ref.id, ref.address});
    }
    make_cgroups();
  } catch (const std::exception& e) {
    std::vector<Node*> all;
    for (auto& n : nodes_) all.push_back(n.get());
    std::vector<std::string> problems;
    teardown_locked(all, problems);
    std::string msg = e.what();
    if (!problems.empty()) {
      msg += "; cleaning up after it also failed:";
      for (auto& p : problems) msg += "\n  " + p;
    }
    throw Error(msg);
  }
  host().debug("local provider: pool " + pool_id_ + ": " + std::to_string(spec.nodes) + " node(s) under " +
              pool_dir_.string() +
              (net_ ? ", network " + net_->subnet() + " on bridge " + net_->bridge_name() : std::string()) +
              (pool_cgroup_.empty() ? "; no cgroup (" + cgroup_why_ + "): each worker reaps what its job started"
                                    : "; processes in cgroup " + pool_cgroup_.string()));
  return out;
}

// Each node's processes in a cgroup of their own (cgroup.hpp), so that teardown ends whatever
// they started, `setsid` or double fork, and even after their worker was killed with SIGKILL.
// Where cgroup v2 cannot be used, the pool goes on without: the worker, a child subreaper, still
// kills every descendant it inherited (docs/architecture.md, "Processes").
void LocalProvider::make_cgroups() {
  const fs::path base = cgroup::usable_base(cgroup_why_);
  if (base.empty()) return;
  // A host killed with SIGKILL never tore its pools down: their cgroups (empty once the workers'
  // dead-man switches have run) go now. Only ours by name, only when their host is gone, only empty.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    const auto dash = name.rfind('-');
    if (name.rfind("skyforge-", 0) != 0 || dash == std::string::npos || dash + 1 >= name.size() ||
        name.find_first_not_of("0123456789", dash + 1) != std::string::npos)
      continue;
    const long owner = std::strtol(name.c_str() + dash + 1, nullptr, 10);
    if (owner <= 0 || ::kill(pid_t(owner), 0) == 0 || errno != ESRCH) continue;  // its host lives
    if (cgroup::populated(e.path())) continue;
    if (cgroup::remove(e.path()).empty())
      host().debug("local provider: removed cgroup " + e.path().string() + " of a host that is gone");
  }
  const fs::path pool = base / ("skyforge-" + pool_id_ + "-" + std::to_string(::getpid()));
  try {
    cgroup::make(pool);
    pool_cgroup_ = pool;
    for (auto& n : nodes_) {
      cgroup::make(pool / n->id);
      n->cgroup = pool / n->id;
      cgroup::make(n->cgroup / "worker");
      cgroup::make(n->cgroup / "bootstrap");
    }
  } catch (const std::exception& e) {
    cgroup_why_ = e.what();
    host().warn("local provider: " + cgroup_why_ +
                "; going on without cgroups (what a job starts outside its worker's process group may outlive a "
                "worker killed with SIGKILL)");
    if (std::string p = cgroup::remove(pool); !p.empty()) host().warn("local provider: " + p);
    for (auto& n : nodes_) n->cgroup.clear();
    pool_cgroup_.clear();
  }
}

namespace {
// cgroup.procs of a node's leaf, for the child to move itself into (SpawnSpec::cgroup_procs_fd).
Fd open_cgroup_procs(const fs::path& node_cgroup, const char* leaf) {
  if (node_cgroup.empty()) return Fd();
  return open_file(node_cgroup / leaf / "cgroup.procs", O_WRONLY, 0);
}
}  // namespace

void LocalProvider::reap_orphans(const std::vector<pid_t>& seen, const Node& n) {
  // Orphans of the node came to this process (a child subreaper): reap those that are ours and
  // dead now, but never the worker or a bootstrap (reap_worker and bootstrap() wait for those).
  for (pid_t pid : seen) {
    if (pid == n.worker || std::find(n.groups.begin(), n.groups.end(), pid) != n.groups.end()) continue;
    int st;
    ::waitpid(pid, &st, WNOHANG);
  }
}

void LocalProvider::empty_cgroup(const fs::path& dir, const Node& n) {
  std::vector<pid_t> seen;
  const auto deadline = Clock::now() + kKillWait;
  while (cgroup::populated(dir)) {
    auto now = cgroup::procs(dir);
    seen.insert(seen.end(), now.begin(), now.end());
    cgroup::kill(dir);
    if (Clock::now() >= deadline) {
      host().warn("local provider: cgroup " + dir.string() + " of " + n.id + " still has processes after SIGKILL");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  reap_orphans(seen, n);
}

void LocalProvider::bootstrap(const std::string& node_id, const std::string& script, sf_sink log) {
  Node* n;
  pid_t pid;
  Fd rd;
  fs::path log_path;
  Fd log_file;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = &require(node_id, "bootstrap");
    fs::path script_path = n->dir / "bootstrap.sh";
    {
      Fd f = open_file(script_path, O_WRONLY | O_CREAT | O_TRUNC, 0700);
      write_all(f.get(), script, script_path.string());
    }
    log_path = n->dir / "bootstrap.log";
    log_file = open_file(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw Error(std::string("local provider: pipe2: ") + std::strerror(errno));
    rd.reset(p[0]);
    Fd wr(p[1]);
    Fd ns;
    if (net_) ns = net_->open_netns(n->index);
    SpawnSpec s;
    s.argv = {"bash", "--noprofile", "--norc", "-e", "-u", "-o", "pipefail", script_path.string()};
    Fd cg = open_cgroup_procs(n->cgroup, "bootstrap");
    s.cgroup_procs_fd = cg.get();
    s.env = environment_with({});
    s.cwd = n->dir.string();
    s.netns_fd = ns.get();
    s.stdout_fd = wr.get();
    s.stderr_fd = wr.get();
    try {
      pid = spawn(s);
    } catch (const std::exception& e) {
      throw Error("local provider: bootstrap of " + node_id + ": " + e.what());
    }
    n->groups.push_back(pid);
    n->bootstraps_running++;
  }
  ::fcntl(rd.get(), F_SETFL, ::fcntl(rd.get(), F_GETFL) | O_NONBLOCK);

  std::deque<std::string> tail;
  std::string pending;
  auto emit = [&](std::string line) {
    line.push_back('\n');
    if (log.write) log.write(log.ctx, line.data(), line.size());
    ssize_t w = ::write(log_file.get(), line.data(), line.size());
    (void)w;
    line.pop_back();
    tail.push_back(std::move(line));
    if (tail.size() > kTailLines) tail.pop_front();
  };
  auto consume = [&](const char* data, size_t size) {
    pending.append(data, size);
    size_t start = 0, nl;
    while ((nl = pending.find('\n', start)) != std::string::npos) {
      emit(pending.substr(start, nl - start));
      start = nl + 1;
    }
    pending.erase(0, start);
    if (pending.size() >= kMaxLine) {
      emit(pending);
      pending.clear();
    }
  };

  bool exited = false, eof = false, stolen = false;
  int st = 0;
  char buf[8192];
  for (;;) {
    pollfd p{rd.get(), POLLIN, 0};
    int k = eof ? 0 : ::poll(&p, 1, exited ? 0 : 100);
    if (k < 0 && errno != EINTR) break;
    if (k > 0) {
      for (;;) {
        ssize_t r = ::read(rd.get(), buf, sizeof buf);
        if (r > 0) consume(buf, size_t(r));
        else if (r == 0) {
          eof = true;
          break;
        } else if (errno != EINTR) break;
      }
    }
    if (!exited) {
      pid_t r = ::waitpid(pid, &st, eof ? 0 : WNOHANG);
      if (r == pid) exited = true;
      else if (r < 0 && errno == ECHILD) exited = stolen = true;  // reaped by terminate()
    } else if (k == 0) {
      break;  // exited and drained; background processes keeping the pipe open are not waited for
    }
    if (exited && eof) break;
  }
  if (!pending.empty()) emit(pending);

  bool terminated;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n->bootstraps_running--;
    terminated = n->gone;
    bool dummy_reaped = false;
    int dummy_status = 0;
    if (group_gone(pid, -1, dummy_reaped, dummy_status))
      n->groups.erase(std::remove(n->groups.begin(), n->groups.end(), pid), n->groups.end());
  }
  if (terminated || stolen)
    throw Error("local provider: bootstrap of " + node_id + " was interrupted: the pool is being terminated",
                SF_ERR_CANCELLED);
  if (exit_code(st) != 0) {
    std::string msg = "local provider: bootstrap of " + node_id + " failed (" + describe_status(st) + ")";
    if (tail.empty()) msg += " with no output";
    else {
      msg += "; last lines of output:";
      for (const auto& l : tail) msg += "\n  | " + l;
    }
    // The work directory goes at teardown unless kept: say so rather than point at a file that
    // will be gone by the time the message is read.
    msg += config_.keep_workdirs ? "\n(full log: " + log_path.string() + ")"
                                 : "\n(the full log, " + log_path.filename().string() +
                                       ", goes with the node's work directory at teardown; [provider] keep_workdirs = "
                                       "true keeps it)";
    throw Error(msg);
  }
}

void LocalProvider::start_worker(const std::string& node_id, const std::vector<std::string>& argv,
                                 const std::map<std::string, std::string>& env) {
  std::lock_guard<std::mutex> lock(mu_);
  Node& n = require(node_id, "start_worker");
  if (argv.empty()) throw Error("local provider: start_worker " + node_id + ": empty command", SF_ERR_INVALID);
  for (const auto& [k, v] : env)
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos)
      throw Error("local provider: start_worker " + node_id + ": invalid environment variable name '" + k + "'",
                  SF_ERR_INVALID);
  if (n.worker > 0) {
    reap_worker(n, false);
    if (!n.worker_reaped)
      throw Error("local provider: start_worker " + node_id + ": a worker (pid " + std::to_string(n.worker) +
                  ") is already running there");
  }
  // What an earlier worker of this node left in its cgroup (a worker killed with SIGKILL, before
  // a restart) goes before the next one starts.
  if (!n.cgroup.empty()) empty_cgroup(n.cgroup / "worker", n);
  Fd cg = open_cgroup_procs(n.cgroup, "worker");
  Fd out = open_file(n.dir / "worker.log", O_WRONLY | O_CREAT | O_APPEND, 0600);
  Fd ns;
  if (net_) ns = net_->open_netns(n.index);
  SpawnSpec s;
  s.argv = argv;
  std::map<std::string, std::string> node_env = env;
  if (!n.gpus.empty()) {
    node_env["CUDA_VISIBLE_DEVICES"] = n.gpus;  // its own share only
    if (n.gpus_pci_order) node_env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  }
  s.env = environment_with(node_env);  // values (the pool secret among them) never reach argv or a log
  s.cwd = n.dir.string();
  s.netns_fd = ns.get();
  s.stdout_fd = out.get();
  s.stderr_fd = out.get();
  s.cgroup_procs_fd = cg.get();
  pid_t pid;
  try {
    pid = spawn(s);
  } catch (const std::exception& e) {
    throw Error("local provider: start_worker " + node_id + ": " + e.what());
  }
  n.worker = pid;
  n.worker_reaped = false;
  n.worker_status = 0;
  n.groups.push_back(pid);
}

void LocalProvider::reap_worker(Node& n, bool block) {
  if (n.worker <= 0 || n.worker_reaped) return;
  int st = 0;
  pid_t r;
  do r = ::waitpid(n.worker, &st, block ? 0 : WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == n.worker) {
    n.worker_reaped = true;
    n.worker_status_known = true;
    n.worker_status = st;
  } else if (r < 0 && errno == ECHILD) {
    n.worker_reaped = true;  // someone else reaped it; status unknown
    n.worker_status = 0;
  }
}

int LocalProvider::worker_alive(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Node* n = find(node_id);
  if (!n) return -1;
  if (n->worker <= 0) return 0;
  reap_worker(*n, false);
  return n->worker_reaped ? 0 : 1;
}

namespace {
// The last non-empty line of a file, from its last 4 KiB ("" when unreadable).
std::string last_line(const fs::path& path) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.get() < 0) return "";
  const off_t size = ::lseek(f.get(), 0, SEEK_END);
  if (size <= 0) return "";
  const off_t from = std::max<off_t>(0, size - 4096);
  std::string tail(static_cast<size_t>(size - from), '\0');
  const ssize_t got = ::pread(f.get(), tail.data(), tail.size(), from);
  tail.resize(got > 0 ? static_cast<size_t>(got) : 0);
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) tail.pop_back();
  const size_t nl = tail.rfind('\n');
  return nl == std::string::npos ? (from == 0 ? tail : "") : tail.substr(nl + 1);
}
}  // namespace

int LocalProvider::worker_exit(const std::string& node_id, WorkerExit& out) {
  std::lock_guard<std::mutex> lock(mu_);
  Node* n = find(node_id);
  if (!n || n->worker <= 0) return -1;
  reap_worker(*n, false);
  if (!n->worker_reaped) return 0;
  if (!n->worker_status_known) return -1;
  if (WIFSIGNALED(n->worker_status)) {
    out.exit_code = -1;
    out.signal = WTERMSIG(n->worker_status);
  } else {
    out.exit_code = WIFEXITED(n->worker_status) ? WEXITSTATUS(n->worker_status) : -1;
    out.signal = 0;
  }
  out.last_words = last_line(n->dir / "worker.log");
  return 1;
}

// SIGTERM every group of the nodes and every process in their cgroups, give them kTermGrace
// together, SIGKILL what is left (cgroup.kill for the cgroups), reap.
void LocalProvider::stop_groups(std::vector<Node*>& nodes) {
  struct G {
    Node* node;
    pid_t pg;
    bool gone;
  };
  std::vector<G> groups;
  for (Node* n : nodes)
    for (pid_t pg : n->groups) groups.push_back({n, pg, false});
  struct C {
    Node* node;
    bool gone;
    std::vector<pid_t> seen;  // its members, to reap those that came to us as orphans
  };
  std::vector<C> cgroups;
  for (Node* n : nodes)
    if (!n->cgroup.empty()) cgroups.push_back({n, false, {}});
  if (groups.empty() && cgroups.empty()) return;
  auto poll_all = [&] {
    bool any = false;
    for (auto& g : groups)
      if (!g.gone) {
        g.gone = group_gone(g.pg, g.node->worker, g.node->worker_reaped, g.node->worker_status);
        any = any || !g.gone;
      }
    for (auto& c : cgroups)
      if (!c.gone) {
        auto now = cgroup::procs(c.node->cgroup);
        c.seen.insert(c.seen.end(), now.begin(), now.end());
        c.gone = !cgroup::populated(c.node->cgroup);
        any = any || !c.gone;
      }
    return any;
  };
  auto wait_until = [&](Clock::time_point deadline) {
    while (poll_all()) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  };
  if (!poll_all()) goto done;
  for (auto& g : groups)
    if (!g.gone) {
      ::kill(-g.pg, SIGTERM);
      ::kill(-g.pg, SIGCONT);  // a stopped group would never act on SIGTERM
    }
  for (auto& c : cgroups)
    if (!c.gone) {
      cgroup::signal(c.node->cgroup, SIGTERM);
      cgroup::signal(c.node->cgroup, SIGCONT);
    }
  if (!wait_until(Clock::now() + kTermGrace)) {
    for (auto& g : groups)
      if (!g.gone) ::kill(-g.pg, SIGKILL);
    for (auto& c : cgroups)
      if (!c.gone) cgroup::kill(c.node->cgroup);
    auto kill_until = Clock::now() + kKillWait;
    while (poll_all() && Clock::now() < kill_until) {
      for (auto& c : cgroups)  // without cgroup.kill, one by one: a process may fork meanwhile
        if (!c.gone) cgroup::kill(c.node->cgroup);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (auto& g : groups)
      if (!g.gone)
        host().warn("local provider: process group " + std::to_string(g.pg) + " of " + g.node->id +
                    " still has members after SIGKILL (zombies whose parent does not reap them?)");
    for (auto& c : cgroups)
      if (!c.gone)
        host().warn("local provider: cgroup " + c.node->cgroup.string() + " of " + c.node->id +
                    " still has processes after SIGKILL");
  }
done:
  for (auto& c : cgroups) reap_orphans(c.seen, *c.node);
  for (auto& g : groups)
    if (g.gone) g.node->groups.erase(std::remove(g.node->groups.begin(), g.node->groups.end(), g.pg),
                                     g.node->groups.end());
  for (Node* n : nodes) reap_worker(*n, false);
}

void LocalProvider::teardown_locked(const std::vector<Node*>& targets, std::vector<std::string>& problems) {
  std::vector<Node*> nodes(targets);
  stop_groups(nodes);
  for (Node* n : nodes) {
    n->gone = true;
    if (!n->cgroup.empty()) {
      if (std::string p = cgroup::remove(n->cgroup); p.empty()) n->cgroup.clear();
      else problems.push_back(p);
    }
    if (net_ && n->net_made) {
      auto p = net_->remove_node(n->index);
      if (p.empty()) n->net_made = false;
      problems.insert(problems.end(), p.begin(), p.end());
    }
    if (n->dir_made) {
      if (!config_.keep_workdirs) {
        std::error_code ec;
        fs::remove_all(n->dir, ec);
        if (ec) problems.push_back("work directory " + n->dir.string() + ": " + ec.message());
        else n->dir_made = false;
      } else {
        n->dir_made = false;
      }
    }
  }
  bool all_gone = std::all_of(nodes_.begin(), nodes_.end(), [](auto& n) { return n->gone; });
  if (!all_gone) return;
  if (net_) {
    auto p = net_->remove_bridge();
    problems.insert(problems.end(), p.begin(), p.end());
  }
  if (!pool_cgroup_.empty()) {
    if (std::string p = cgroup::remove(pool_cgroup_); p.empty()) pool_cgroup_.clear();
    else problems.push_back(p);
  }
  if (pool_dir_made_) {
    if (config_.keep_workdirs) {
      host().info("local provider: kept the pool's work directories in " + pool_dir_.string() +
                  " (keep_workdirs = true)");
      pool_dir_made_ = false;
    } else {
      std::error_code ec;
      fs::remove_all(pool_dir_, ec);
      if (ec) problems.push_back("pool directory " + pool_dir_.string() + ": " + ec.message());
      else pool_dir_made_ = false;
    }
  }
}

void LocalProvider::terminate(const std::vector<std::string>& node_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Node*> targets;
  if (node_ids.empty()) {
    for (auto& n : nodes_) targets.push_back(n.get());
  } else {
    for (const auto& id : node_ids)
      if (Node* n = find(id)) targets.push_back(n);
  }
  // Nodes already gone come along too: a retry of what failed before (a netns, a directory).
  std::vector<std::string> problems;
  teardown_locked(targets, problems);
  if (!problems.empty()) {
    std::string msg = "local provider: pool " + pool_id_ + ": could not remove everything:";
    for (auto& p : problems) msg += "\n  " + p;
    throw Error(msg);
  }
}

fs::path LocalProvider::pool_dir() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_dir_;
}
fs::path LocalProvider::node_dir(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Node* n = find(id);
  return n ? n->dir : fs::path();
}
pid_t LocalProvider::worker_pid(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Node* n = find(id);
  return n ? n->worker : -1;
}
std::optional<int> LocalProvider::worker_exit_code(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Node* n = find(id);
  if (!n || !n->worker_reaped) return std::nullopt;
  return exit_code(n->worker_status);
}
std::string LocalProvider::netns_name(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Node* n = find(id);
  return (n && net_) ? net_->netns_name(n->index) : "";
}
std::string LocalProvider::bridge_name() const {
  std::lock_guard<std::mutex> lock(mu_);
  return net_ ? net_->bridge_name() : "";
}
fs::path LocalProvider::node_cgroup(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Node* n = find(id);
  return n ? n->cgroup : fs::path();
}
fs::path LocalProvider::pool_cgroup() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_cgroup_;
}
std::string LocalProvider::cgroup_off_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cgroup_why_;
}
std::string LocalProvider::subnet() const {
  std::lock_guard<std::mutex> lock(mu_);
  return net_ ? net_->subnet() : "";
}

}  // namespace skyforge::local
