// The worker's process group, its command app's fork and exec, and the signals that end them
// (processes.hpp).
#include "processes.hpp"

#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "last_words.hpp"
#include "reaper.hpp"

namespace skyforge {

std::atomic<pid_t> g_child_pid{0};

namespace {

// Whether this worker leads its process group (it makes itself the leader at start): only then
// is every other member of the group its own to kill.
bool g_own_group = false;

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

// Every descendant of the worker, whatever its group or session (the worker is a child subreaper:
// orphans come to it), killed and reaped; the worker does not go on before they are gone.
void kill_descendants() {
  if (!reaper::kill_descendants(5000)) diag("some of the job's processes outlived 5 s of SIGKILL (stuck in the kernel?)");
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

}  // namespace

void take_charge_of_processes() {
  // Lead a process group of our own (providers start workers in a session of their own, which
  // already makes them leaders): the command app joins it, and ending the group ends the node.
  g_own_group = ::getpgrp() == ::getpid() || ::setpgid(0, 0) == 0;
  // The command's orphans come to us, so kill_children kills and reaps them, in the group or not
  // (and, once we are gone, to the next reaper up: the local provider's host is one).
  reaper::become_subreaper();
  struct sigaction sa {};
  sa.sa_handler = on_terminate_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

void signal_group(int sig) {
  if (pid_t c = g_child_pid.load(); c > 0) ::kill(c, sig);
  for (pid_t p : group_members()) ::kill(p, sig);
  reaper::signal_descendants(sig);
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

int run_in_group(const std::vector<std::string>& argv, const std::vector<std::string>& env, const char* work_dir) {
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  for (auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
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
    if (chdir(work_dir) != 0) _exit(127);
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

}  // namespace skyforge
