// The processes of my_provider's nodes. Each starts in a session of its own, so that teardown
// finds whatever it started (a process that calls setsid() itself is the one way out), and stays
// unreaped until it is ended here (its zombie keeps the session's id from being reused). Linux
// (/proc), nothing of skyforge's: errors are std::invalid_argument / std::runtime_error, which
// the provider turns into its hooks' errors.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace my_provider {

struct Launch {
  std::vector<std::string> argv;           // argv[0]: a path, or a name looked up in $PATH
  std::map<std::string, std::string> env;  // set over this process's environment
  std::string cwd;                         // its working directory
  int output_fd = -1;                      // its stdout and stderr; stdin is /dev/null
};

// How a process ended: its exit status, or exit_code -1 and the signal that killed it (signal 0:
// unknown, it was not a child of this process).
struct Ended {
  int exit_code = -1;
  int signal = 0;
};

// Starts `launch` in a new session, with the default signal dispositions and an empty signal
// mask whatever this thread has; returns its pid (= its session and process group). Throws
// std::invalid_argument for an empty argv or a bad variable name, std::runtime_error when it
// cannot start (exec's reason: no such file, permission denied, ...).
pid_t spawn_session(const Launch& launch);

// How session leader `pid` ended, once it has; nullopt while it runs. Does not reap it.
std::optional<Ended> ended(pid_t pid);

// Passes each line `fd` delivers to `line` (without its '\n') until session `pid` has exited and
// its output is read; then ends the session (end_sessions) and returns how its leader ended.
Ended forward_lines(int fd, pid_t pid, const std::function<void(const std::string&)>& line);

// Ends sessions: SIGTERM to every process in them (and SIGCONT: a stopped one would never act on
// it), up to `grace` for their leaders to exit, then SIGKILL to whatever is left in them; reaps
// the leaders.
void end_sessions(const std::vector<pid_t>& leaders, std::chrono::milliseconds grace);

// "exit status N" / "signal N (Name)" / "an unknown status".
std::string describe(const Ended& how);

}  // namespace my_provider
