// A provider makes a pool's nodes, runs skyforge's bootstrap script and worker on each, and
// tears everything down again (docs/plugins.md, "Writing a provider"). This one makes each node
// a private directory on this machine, <work_root>/my_provider-<pool id>/node-<i>/, and runs the
// node's processes there, each in a session of its own (processes.hpp). A provider for machines
// elsewhere keeps the same shape: provision makes the machines, bootstrap and start_worker run
// commands on them, terminate gives them back.
//
// The host calls provision and start_worker from its main thread, bootstrap from one thread per
// node at once, and terminate, worker_alive and worker_exit from any thread at any time: every
// hook takes mu_, and bootstrap holds it only while it starts the script.
#include <skyforge/sdk.hpp>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "processes.hpp"

namespace {

namespace fs = std::filesystem;
using skyforge::Error;

constexpr auto kTermGrace = std::chrono::seconds(3);  // at teardown: SIGTERM, then SIGKILL
constexpr size_t kQuotedLines = 10;                   // of a failed bootstrap's output, in its error

// A file descriptor, closed with its owner.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

struct Node {
  std::string id;        // "node-<index>": the handle the host passes to every hook
  fs::path dir;          // the worker's working directory: <pool directory>/<id>
  pid_t worker = -1;     // its worker's session (unreaped until it is ended); -1: none
  pid_t bootstrap = -1;  // its running bootstrap's session; -1: none
  bool gone = false;     // torn down, or being torn down
};

// [provider] work_root: where pool directories go; "" is $TMPDIR, else /tmp.
fs::path work_root(const std::string& option) {
  std::string root = option;
  if (root.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    root = tmp && *tmp ? tmp : "/tmp";
  }
  return fs::absolute(root);
}

// The pool id becomes a directory name: only what cannot climb out of work_root.
void check_pool_id(const std::string& id) {
  const bool ok = !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
  });
  if (!ok) throw Error("my_provider: pool id '" + id + "' must be 1-64 of [A-Za-z0-9._-]", SF_ERR_INVALID);
}

void make_private_dir(const fs::path& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0)
    throw Error("my_provider: cannot create " + dir.string() + ": " + std::strerror(errno) +
                (errno == EEXIST ? " (a pool with this id, or one's leftover: remove it)" : ""));
}

Fd open_log(const fs::path& path) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (fd.get() < 0) throw Error("my_provider: cannot open " + path.string() + ": " + std::strerror(errno));
  return fd;
}

// The last non-empty line of a file ("" when there is none).
std::string last_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

// Starts a node's process; its errors as the hook `hook` reports them.
pid_t spawn(const std::string& hook, const std::string& node_id, const my_provider::Launch& launch) {
  try {
    return my_provider::spawn_session(launch);
  } catch (const std::invalid_argument& e) {
    throw Error("my_provider: " + hook + " " + node_id + ": " + e.what(), SF_ERR_INVALID);
  } catch (const std::runtime_error& e) {
    throw Error("my_provider: " + hook + " " + node_id + ": " + e.what());
  }
}

class MyProvider : public skyforge::Provider {
 public:
  // Runs for `skyforge validate` too: check options here, start nothing.
  explicit MyProvider(const skyforge::Context& ctx) : Provider(ctx), root_(work_root(ctx.options.get("work_root"))) {}

  // The host terminates the pool before it destroys the provider; this is the last resort.
  ~MyProvider() override {
    try {
      terminate({});
    } catch (const std::exception& e) {
      host().warn(std::string("my_provider: cleanup at exit: ") + e.what());
    }
  }

  skyforge::Provisioned provision(const skyforge::PoolSpec& spec) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (std::any_of(nodes_.begin(), nodes_.end(), [](const Node& n) { return !n.gone; }))
      throw Error("my_provider: this instance still holds pool '" + pool_id_ + "'; terminate it first");
    check_pool_id(spec.pool_id);
    if (spec.nodes == 0) throw Error("my_provider: a pool needs at least one node", SF_ERR_INVALID);
    nodes_.clear();
    nodes_.reserve(spec.nodes);  // bootstrap threads hold Node pointers: no reallocation later
    pool_id_ = spec.pool_id;
    pool_dir_ = root_ / ("my_provider-" + pool_id_);
    skyforge::Provisioned out;
    out.control_address = "127.0.0.1";  // where workers reach the host
    try {
      fs::create_directories(root_);
      make_private_dir(pool_dir_);
      pool_dir_made_ = true;
      for (uint32_t i = 0; i < spec.nodes; ++i) {
        Node& n = nodes_.emplace_back();
        n.id = "node-" + std::to_string(i);
        n.dir = pool_dir_ / n.id;
        make_private_dir(n.dir);
        out.nodes.push_back({n.id, "127.0.0.1"});  // the address other nodes reach it at
      }
    } catch (const std::exception& e) {
      std::vector<std::string> problems;
      teardown_locked(lock, {}, problems);  // a failed provision leaves nothing either
      throw Error(e.what() + (problems.empty() ? "" : "; cleaning up also failed: " + join(problems)));
    }
    host().debug("my_provider: pool " + pool_id_ + ": " + std::to_string(spec.nodes) + " node(s) under " +
                 pool_dir_.string());
    return out;
  }

  // Runs skyforge's bootstrap script (what the image needs: packages, files, environment) in the
  // node's directory; each line of its output goes to `log`, and a failure quotes the last ones.
  void bootstrap(const std::string& node_id, const std::string& script, sf_sink log) override {
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC) != 0) throw Error("my_provider: bootstrap " + node_id + ": pipe: " + std::strerror(errno));
    Fd read_end(ends[0]), write_end(ends[1]);
    Node* n;
    pid_t pid;
    {
      std::lock_guard<std::mutex> lock(mu_);
      n = &require(node_id, "bootstrap");
      const fs::path path = n->dir / "bootstrap.sh";
      std::ofstream file(path);
      if (!(file << script).flush()) throw Error("my_provider: bootstrap " + node_id + ": cannot write " + path.string());
      pid = spawn("bootstrap", node_id,
                  {{"bash", "--noprofile", "--norc", "-euo", "pipefail", path.string()}, {}, n->dir, write_end.get()});
      n->bootstrap = pid;
    }
    write_end = Fd();  // its processes hold the only write ends now: the pipe ends with them
    std::deque<std::string> tail;
    const my_provider::Ended how = my_provider::forward_lines(read_end.get(), pid, [&](const std::string& line) {
      const std::string with_newline = line + "\n";
      if (log.write) log.write(log.ctx, with_newline.data(), with_newline.size());  // the host copies it
      tail.push_back(line);
      if (tail.size() > kQuotedLines) tail.pop_front();
    });
    bool interrupted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      n->bootstrap = -1;
      interrupted = n->gone;
    }
    bootstrap_ended_.notify_all();
    if (interrupted) throw Error("my_provider: bootstrap " + node_id + ": the pool is being torn down", SF_ERR_CANCELLED);
    if (how.exit_code != 0) {
      std::string message = "my_provider: bootstrap " + node_id + " failed (" + my_provider::describe(how) + ")";
      for (const auto& line : tail) message += "\n  | " + line;
      throw Error(message);
    }
  }

  // Starts skyforge-worker: `argv` as given (the worker's path, then --connect, --node, ...,
  // --remove-work-dir), `env` over this process's environment (it holds the pool secret: never
  // put it on a command line or in a log), in the node's directory, which becomes the worker's
  // work directory. Its output goes to worker.log there. A restart (after the previous worker
  // ended) starts another one in the same directory.
  void start_worker(const std::string& node_id, const std::vector<std::string>& argv,
                    const std::map<std::string, std::string>& env) override {
    std::lock_guard<std::mutex> lock(mu_);
    Node& n = require(node_id, "start_worker");
    if (n.worker > 0) {
      if (!my_provider::ended(n.worker))
        throw Error("my_provider: start_worker " + node_id + ": its worker (pid " + std::to_string(n.worker) +
                    ") is still running");
      my_provider::end_sessions({n.worker}, std::chrono::milliseconds(0));  // what it left behind
      n.worker = -1;
    }
    const Fd log = open_log(n.dir / "worker.log");
    n.worker = spawn("start_worker", node_id, {argv, env, n.dir, log.get()});
  }

  int worker_alive(const std::string& node_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Node* n = find(node_id);
    if (!n || n->worker < 0) return -1;
    return my_provider::ended(n->worker) ? 0 : 1;
  }

  // Why a node's connection ended: how its worker did, and the last line it wrote.
  int worker_exit(const std::string& node_id, WorkerExit& out) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Node* n = find(node_id);
    if (!n || n->worker < 0) return -1;
    const auto how = my_provider::ended(n->worker);
    if (!how) return 0;
    if (how->exit_code < 0 && how->signal == 0) return -1;
    out.exit_code = how->exit_code;
    out.signal = how->signal;
    out.last_words = last_line(n->dir / "worker.log");
    return 1;
  }

  // Leaves nothing of the listed nodes (every node when the list is empty): no process, no
  // directory; the pool directory goes with its last node. Safe to call again, and after a
  // provision that failed half-way.
  void terminate(const std::vector<std::string>& node_ids) override {
    std::unique_lock<std::mutex> lock(mu_);
    std::vector<std::string> problems;
    teardown_locked(lock, node_ids, problems);
    if (!problems.empty()) throw Error("my_provider: pool " + pool_id_ + ": could not remove " + join(problems));
  }

 private:
  Node* find(const std::string& id) {
    for (Node& n : nodes_)
      if (n.id == id) return &n;
    return nullptr;
  }
  Node& require(const std::string& id, const std::string& hook) {
    Node* n = find(id);
    if (!n) throw Error("my_provider: " + hook + ": unknown node '" + id + "'", SF_ERR_INVALID);
    if (n->gone) throw Error("my_provider: " + hook + ": node '" + id + "' has been torn down");
    return *n;
  }
  static std::string join(const std::vector<std::string>& items) {
    std::string out;
    for (const auto& item : items) out += (out.empty() ? "" : "; ") + item;
    return out;
  }

  void teardown_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& ids,
                       std::vector<std::string>& problems) {
    std::vector<Node*> targets;
    for (Node& n : nodes_)
      if (!n.gone && (ids.empty() || std::find(ids.begin(), ids.end(), n.id) != ids.end())) {
        n.gone = true;  // no hook starts anything there from now on
        targets.push_back(&n);
      }
    // A running bootstrap is killed and reaped by its own thread, which says it was interrupted.
    for (Node* n : targets)
      if (n->bootstrap > 0) ::kill(-n->bootstrap, SIGKILL);
    bootstrap_ended_.wait(lock, [&] {
      return std::none_of(targets.begin(), targets.end(), [](const Node* n) { return n->bootstrap > 0; });
    });
    std::vector<pid_t> workers;
    for (Node* n : targets)
      if (n->worker > 0) workers.push_back(std::exchange(n->worker, -1));
    my_provider::end_sessions(workers, kTermGrace);
    for (Node* n : targets) remove(n->dir, problems);
    const bool all_gone = std::all_of(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.gone; });
    if (all_gone && pool_dir_made_ && remove(pool_dir_, problems)) pool_dir_made_ = false;
  }
  static bool remove(const fs::path& dir, std::vector<std::string>& problems) {
    std::error_code ec;
    fs::remove_all(dir, ec);  // a worker that lost the host may have removed it already
    if (ec) problems.push_back(dir.string() + ": " + ec.message());
    return !ec;
  }

  const fs::path root_;
  std::mutex mu_;
  std::condition_variable bootstrap_ended_;
  std::string pool_id_;
  fs::path pool_dir_;
  bool pool_dir_made_ = false;
  std::vector<Node> nodes_;
};

}  // namespace

SKYFORGE_PLUGIN(MyProvider, "my_provider", "0.1.0",
                "Template provider: each node a local process in a private directory of its own")
