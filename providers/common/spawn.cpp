#include "spawn.hpp"

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <stdexcept>

extern char** environ;

namespace skyforge::providers {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

// What the child reports through the error pipe when a step before exec fails.
struct ChildError {
  int step;
  int err;
};
enum Step { kSetns = 1, kSetsid, kChdir, kDup, kExec, kDeathSignal, kCgroup };

const char* step_name(int step) {
  switch (step) {
    case kSetns: return "cannot enter the node's network namespace";
    case kSetsid: return "cannot start a new session";
    case kChdir: return "cannot change to the work directory";
    case kDup: return "cannot set up standard streams";
    case kExec: return "cannot execute";
    case kDeathSignal: return "cannot set the parent-death signal";
    case kCgroup: return "cannot join the node's cgroup";
    default: return "failed before exec";
  }
}

[[noreturn]] void child_fail(int pipe_fd, int step) {
  ChildError e{step, errno};
  ssize_t n = ::write(pipe_fd, &e, sizeof e);
  (void)n;
  ::_exit(127);
}

// Makes `src` the child's fd `target` without close-on-exec.
bool wire(int src, int target) {
  if (src == target) {
    int flags = ::fcntl(src, F_GETFD);
    return flags >= 0 && ::fcntl(src, F_SETFD, flags & ~FD_CLOEXEC) == 0;
  }
  return ::dup2(src, target) == target;
}

// Async-signal-safe from here to exec: no allocation, no locks.
[[noreturn]] void child_main(const SpawnSpec& s, char* const* argv, char* const* envp, int devnull, int err_pipe,
                             pid_t parent) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &dfl, nullptr);  // EINVAL for libc-internal ones

  if (s.cgroup_procs_fd >= 0 && ::write(s.cgroup_procs_fd, "0", 1) != 1) child_fail(err_pipe, kCgroup);
  if (s.parent_death_signal > 0) {
    if (::prctl(PR_SET_PDEATHSIG, s.parent_death_signal) != 0) child_fail(err_pipe, kDeathSignal);
    if (::getppid() != parent) ::_exit(127);  // the parent died before the signal was armed
  }
  if (s.netns_fd >= 0 && ::setns(s.netns_fd, CLONE_NEWNET) != 0) child_fail(err_pipe, kSetns);
  if (s.new_session && ::setsid() < 0) child_fail(err_pipe, kSetsid);
  if (!s.cwd.empty() && ::chdir(s.cwd.c_str()) != 0) child_fail(err_pipe, kChdir);

  int in = s.stdin_fd >= 0 ? s.stdin_fd : devnull;
  int out = s.stdout_fd >= 0 ? s.stdout_fd : devnull;
  int err = s.stderr_fd >= 0 ? s.stderr_fd : out;
  if (!wire(in, 0) || !wire(out, 1) || !wire(err, 2)) child_fail(err_pipe, kDup);

  // Nothing but 0-2 survives exec; the error pipe stays open until exec succeeds.
  if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    struct rlimit rl {};
    long max = (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) ? long(rl.rlim_cur) : 65536;
    for (long fd = 3; fd < max; ++fd) {
      int flags = ::fcntl(int(fd), F_GETFD);
      if (flags >= 0) ::fcntl(int(fd), F_SETFD, flags | FD_CLOEXEC);
    }
  }

  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execvpe(argv[0], argv, envp);
  child_fail(err_pipe, kExec);
}

}  // namespace

pid_t spawn(const SpawnSpec& s) {
  if (s.argv.empty()) throw std::runtime_error("spawn: empty command");
  std::vector<char*> argv, envp;
  for (const auto& a : s.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : s.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  Fd devnull(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!devnull) throw std::runtime_error(std::string("cannot open /dev/null: ") + std::strerror(errno));
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  Fd err_r(p[0]), err_w(p[1]);

  // Block every signal across fork so that no host handler runs in the child before it has
  // reset the dispositions; the child unblocks just before exec.
  const pid_t parent = ::getpid();
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = ::fork();
  if (pid == 0) child_main(s, argv.data(), envp.data(), devnull.get(), err_w.get(), parent);
  int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(fork_errno));
  err_w.reset();

  ChildError e{};
  ssize_t n;
  do n = ::read(err_r.get(), &e, sizeof e);
  while (n < 0 && errno == EINTR);
  if (n == ssize_t(sizeof e)) {
    int st;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    std::string what = std::string(step_name(e.step));
    if (e.step == kExec) what += " '" + s.argv[0] + "'";
    if (e.step == kChdir) what += " '" + s.cwd + "'";
    throw std::runtime_error(what + ": " + std::strerror(e.err));
  }
  return pid;
}

struct Spawner::Impl {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool stop = false;
  std::thread thread;
};

Spawner::Spawner() : impl_(std::make_unique<Impl>()) {
  impl_->thread = std::thread([impl = impl_.get()] {
    std::unique_lock<std::mutex> lock(impl->mu);
    for (;;) {
      impl->cv.wait(lock, [&] { return impl->stop || !impl->queue.empty(); });
      if (impl->queue.empty()) return;  // stop, and nothing left to do
      auto job = std::move(impl->queue.front());
      impl->queue.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  });
}

Spawner::~Spawner() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->thread.join();
}

pid_t Spawner::spawn(const SpawnSpec& spec) {
  std::packaged_task<pid_t()> task([&spec] { return providers::spawn(spec); });
  auto result = task.get_future();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->queue.emplace_back([&task] { task(); });
  }
  impl_->cv.notify_all();
  return result.get();  // rethrows what spawn threw
}

std::vector<std::string> environment_with(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    std::string key(kv.substr(0, eq));
    if (overrides.count(key)) continue;
    env.emplace_back(kv);
  }
  for (const auto& [k, v] : overrides) env.push_back(k + "=" + v);
  return env;
}

int exit_code(int st) {
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return -1;
}

std::string describe_status(int st) {
  if (WIFEXITED(st)) return "exit status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st))
    return "killed by signal " + std::to_string(WTERMSIG(st)) + " (" + ::strsignal(WTERMSIG(st)) + ")";
  return "status " + std::to_string(st);
}

CommandResult run_command(const std::vector<std::string>& argv, int netns_fd) {
  CommandOptions o;
  o.netns_fd = netns_fd;
  return run_command(argv, o);
}

CommandResult run_command(const std::vector<std::string>& argv, const CommandOptions& options) {
  auto pipe = [](Fd& r, Fd& w) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
    r.reset(p[0]);
    w.reset(p[1]);
  };
  Fd out_r, out_w, err_r, err_w, in_r, in_w;
  pipe(out_r, out_w);
  pipe(err_r, err_w);
  if (!options.input.empty()) pipe(in_r, in_w);
  std::map<std::string, std::string> env = options.env;
  env["LC_ALL"] = "C";
  SpawnSpec s;
  s.argv = argv;
  s.env = environment_with(env);
  s.netns_fd = options.netns_fd;
  s.stdin_fd = in_r ? in_r.get() : options.stdin_fd;
  s.stdout_fd = out_w.get();
  s.stderr_fd = err_w.get();
  pid_t pid = spawn(s);
  out_w.reset();
  err_w.reset();
  in_r.reset();
  if (in_w) ::fcntl(in_w.get(), F_SETFL, ::fcntl(in_w.get(), F_GETFL) | O_NONBLOCK);

  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + options.timeout;
  CommandResult r;
  pollfd fds[3] = {{out_r.get(), POLLIN, 0}, {err_r.get(), POLLIN, 0}, {in_w.get(), POLLOUT, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  std::string pending[2];  // partial lines, with on_line
  size_t written = 0;
  int open_fds = 2;
  char buf[4096];
  auto emit = [&](int i, bool flush) {
    size_t nl;
    while ((nl = pending[i].find('\n')) != std::string::npos) {
      options.on_line(std::string_view(pending[i]).substr(0, nl));
      pending[i].erase(0, nl + 1);
    }
    if (flush && !pending[i].empty()) {
      options.on_line(pending[i]);
      pending[i].clear();
    }
  };
  while (open_fds > 0) {
    int wait_ms = -1;
    if (options.timeout.count() > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        ::kill(-pid, SIGKILL);  // its own session: the group is everything it started
        r.timed_out = true;
        break;
      }
      wait_ms = int(std::min<long long>(left, 1000));
    }
    int k = ::poll(fds, 3, wait_ms);
    if (k < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[2].fd >= 0 && (fds[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t n = ::write(fds[2].fd, options.input.data() + written, options.input.size() - written);
      if (n > 0) written += size_t(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) written = options.input.size();  // it closed stdin
      if (written == options.input.size()) {
        in_w.reset();
        fds[2].fd = -1;
      }
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        if (options.on_line) {
          pending[i].append(buf, size_t(n));
          emit(i, false);
        } else {
          sinks[i]->append(buf, size_t(n));
        }
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;
        --open_fds;
        if (options.on_line) emit(i, true);
      }
    }
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  r.status = exit_code(st);
  return r;
}

std::string shell_quote(std::string_view s) {
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  std::string path = ::getenv("PATH") ? ::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    if (!dir.empty()) {
      std::string cand = dir + "/" + name;
      struct stat sb {};
      if (::stat(cand.c_str(), &sb) == 0 && S_ISREG(sb.st_mode) && ::access(cand.c_str(), X_OK) == 0) return cand;
    }
    start = end + 1;
  }
  return "";
}

}  // namespace skyforge::providers
