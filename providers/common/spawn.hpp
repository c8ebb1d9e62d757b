// Process helpers of the providers: spawning children safely from a multi-threaded host (no fd
// leaks, clean signal state, own session, optional network namespace) and running helper
// commands (`ip ...`, `ssh ...`, `sbatch ...`) with their output captured or streamed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace skyforge::providers {

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// What a spawned child gets. Everything is prepared in the parent; between fork and exec the
// child only makes async-signal-safe system calls.
struct SpawnSpec {
  std::vector<std::string> argv;            // argv[0] is searched in PATH when it has no '/'
  std::vector<std::string> env;             // complete environment, "KEY=VALUE"
  std::string cwd;                          // empty: inherit
  int netns_fd = -1;                        // >= 0: setns(CLONE_NEWNET) into it first
  int stdin_fd = -1;                        // -1: /dev/null
  int stdout_fd = -1;                       // -1: /dev/null
  int stderr_fd = -1;                       // -1: same as stdout
  bool new_session = true;                  // setsid(): own session and process group
  int parent_death_signal = 0;              // > 0: delivered to the child when this thread's
                                            // process dies (PR_SET_PDEATHSIG), kill -9 included
  int cgroup_procs_fd = -1;                 // >= 0: a cgroup's cgroup.procs (open for writing)
                                            // the child moves itself into first
};

// fork + exec. The child: unblocks all signals and resets their dispositions, joins the
// network namespace, starts a new session, chdirs, wires fds 0-2, marks every other fd
// close-on-exec, then execs. Returns the child's pid once exec has succeeded; throws
// std::runtime_error quoting the failing step and errno (the child is reaped) otherwise.
pid_t spawn(const SpawnSpec& spec);

// spawn() from one thread that lives as long as this object. PR_SET_PDEATHSIG fires when the
// *thread* that forked the child ends, so a child spawned from a short-lived worker thread would
// get its parent_death_signal the moment that thread returns; spawned from here, it gets it when
// this process dies (kill -9 included) or this object goes.
class Spawner {
 public:
  Spawner();
  ~Spawner();
  Spawner(const Spawner&) = delete;
  Spawner& operator=(const Spawner&) = delete;
  pid_t spawn(const SpawnSpec& spec);  // as providers::spawn, forked from this object's thread

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The calling process's environment with `overrides` applied (replacing or adding keys).
std::vector<std::string> environment_with(const std::map<std::string, std::string>& overrides);

struct CommandResult {
  int status = -1;  // exit code; 128+N when killed by signal N
  bool timed_out = false;  // killed (with its process group) when the timeout ran out
  std::string out;
  std::string err;
};

struct CommandOptions {
  int netns_fd = -1;
  std::string input;  // written to its stdin, which is then closed; empty: stdin_fd
  int stdin_fd = -1;  // its stdin when there is no input (a file to send); -1: /dev/null
  std::chrono::milliseconds timeout{0};  // > 0: SIGKILL to its process group after this long
  // Each complete line of stdout and stderr (without its newline), as it comes; the output is
  // then not kept in CommandResult.
  std::function<void(std::string_view line)> on_line;
  std::map<std::string, std::string> env;  // added to the environment (LC_ALL=C always is)
};

// Runs argv to completion in a session of its own, capturing stdout and stderr, with LC_ALL=C so
// that messages are stable. Throws std::runtime_error when it cannot start.
CommandResult run_command(const std::vector<std::string>& argv, const CommandOptions& options);
CommandResult run_command(const std::vector<std::string>& argv, int netns_fd = -1);

// Exit status of a waitpid() status word as a shell would report it.
int exit_code(int wstatus);
// "exit status 3" / "killed by signal 9 (Killed)"
std::string describe_status(int wstatus);

// `s` as one word for a POSIX shell: in single quotes, each ' written as '\''.
std::string shell_quote(std::string_view s);

// First executable named `name` in PATH, then /usr/sbin and /sbin; empty when none.
std::string find_program(const std::string& name);

}  // namespace skyforge::providers
