// Sessions for my_provider's nodes: start (posix_spawn), watch, forward output, end.
#include "processes.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>

extern char** environ;

namespace my_provider {

namespace {

// This process's environment with `over` set on top, as "KEY=value" strings.
std::vector<std::string> environment_with(const std::map<std::string, std::string>& over) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e; ++e) {
    const std::string_view kv(*e);
    const size_t eq = kv.find('=');
    if (eq != std::string_view::npos) vars.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  for (const auto& [key, value] : over) {
    if (key.empty() || key.find('=') != std::string::npos)
      throw std::invalid_argument("invalid environment variable name '" + key + "'");
    vars[key] = value;
  }
  std::vector<std::string> out;
  for (const auto& [key, value] : vars) out.push_back(key + "=" + value);
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

pid_t spawn_session(const Launch& launch) {
  if (launch.argv.empty()) throw std::invalid_argument("empty command");
  std::vector<std::string> argv_strings = launch.argv;
  std::vector<std::string> env_strings = environment_with(launch.env);
  std::vector<char*> argv = c_strings(argv_strings), envp = c_strings(env_strings);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addchdir_np(&actions, launch.cwd.c_str());
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, launch.output_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, launch.output_fd, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The host blocks and ignores signals on some of its threads: the child starts with neither.
  sigset_t none, every;
  sigemptyset(&none);
  sigfillset(&every);
  sigdelset(&every, SIGKILL);
  sigdelset(&every, SIGSTOP);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &every);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + launch.argv[0] + " in " + launch.cwd + ": " + std::strerror(rc));
  return pid;
}

namespace {
// How child `pid` ended, leaving it unreaped; nullopt while it runs (only with WNOHANG in `flags`).
std::optional<Ended> wait_unreaped(pid_t pid, int flags) {
  siginfo_t info{};
  int rc;
  while ((rc = ::waitid(P_PID, pid, &info, WEXITED | WNOWAIT | flags)) != 0 && errno == EINTR) {
  }
  if (rc != 0) return Ended{};                  // not a child of ours (any more): unknown
  if (info.si_pid != pid) return std::nullopt;  // still running
  if (info.si_code == CLD_EXITED) return Ended{info.si_status, 0};
  return Ended{-1, info.si_status};
}
}  // namespace

std::optional<Ended> ended(pid_t pid) { return wait_unreaped(pid, WNOHANG); }

Ended forward_lines(int fd, pid_t pid, const std::function<void(const std::string&)>& line) {
  std::string pending;
  char buf[4096];
  std::optional<Ended> how;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 100);
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n == 0) break;  // every writer has closed its end
      if (n > 0) {
        pending.append(buf, size_t(n));
        for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1))
          line(pending.substr(0, nl));
        continue;
      }
      if (errno != EINTR && errno != EAGAIN) break;
    } else if (ready == 0 && how) {
      break;  // it has exited and nothing more comes: what still holds the pipe is left to end_sessions
    }
    if (!how) how = ended(pid);
  }
  if (!pending.empty()) line(pending);
  if (!how) how = wait_unreaped(pid, 0);
  end_sessions({pid}, std::chrono::milliseconds(0));
  return *how;
}

namespace {

// The processes of session `sid` that have not exited, from /proc/<pid>/stat.
std::vector<pid_t> session_members(pid_t sid) {
  std::vector<pid_t> members;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat;
    std::getline(std::ifstream(entry.path() / "stat"), stat);
    const size_t comm_end = stat.rfind(')');  // the command name may hold spaces and parentheses
    if (comm_end == std::string::npos) continue;
    std::istringstream fields(stat.substr(comm_end + 1));
    char state = 0;
    pid_t parent = 0, group = 0, session = 0;
    if (fields >> state >> parent >> group >> session && session == sid && state != 'Z')
      members.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return members;
}

// `sig` to every process of each session: the leader's group and whatever left it.
bool signal_sessions(const std::vector<pid_t>& leaders, int sig) {
  bool any = false;
  for (pid_t sid : leaders)
    for (pid_t pid : session_members(sid)) {
      ::kill(pid, sig);
      any = true;
    }
  return any;
}

}  // namespace

void end_sessions(const std::vector<pid_t>& leaders, std::chrono::milliseconds grace) {
  if (leaders.empty()) return;
  signal_sessions(leaders, SIGTERM);
  signal_sessions(leaders, SIGCONT);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline &&
         !std::all_of(leaders.begin(), leaders.end(), [](pid_t pid) { return ended(pid).has_value(); }))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // Those left, and what exited leaders left behind; again while something forks meanwhile.
  for (int round = 0; round < 100 && signal_sessions(leaders, SIGKILL); ++round)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  for (pid_t pid : leaders) {
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

std::string describe(const Ended& how) {
  if (how.exit_code < 0 && how.signal == 0) return "an unknown status";
  if (how.exit_code >= 0) return "exit status " + std::to_string(how.exit_code);
  return "signal " + std::to_string(how.signal) + " (" + ::strsignal(how.signal) + ")";
}

}  // namespace my_provider
