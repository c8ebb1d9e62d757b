// A node's session, for providers whose nodes are reached through a command on this machine
// (`ssh host ...`, `srun -w node ...`): one process per node from bootstrap to teardown, running
// the agent script below with bash on the node. Every such session pays a start (a login shell,
// a job step), so a node opens one.
//
// The agent reads from its stdin, in turn:
//   1. a length line and that many bytes: a setup script (the provider's: the node's files, and
//      bootstrap.sh, which bootstrap_file() writes); it runs it, then bootstrap.sh with
//      SKYFORGE_STAGE_ROOT set, and prints the marker line with the exit status;
//   2. the worker's environment, "KEY=VALUE" lines and an empty line (so the pool secret never
//      appears on a command line or in a log), then its argv, "+word" lines and a "." line.
// It then runs the worker in a session of its own under a watchdog: when stdin closes (this
// machine's client killed, this machine gone, the connection lost, teardown) or it gets SIGHUP,
// the worker's process group gets SIGTERM, SIGKILL 5 s later, and the session ends. A worker
// that ends by itself is reported by an exit line ("<marker>-exit STATUS") and the agent waits
// for the next one (2. again: a restart, [job] max_restarts) until stdin closes. However the
// session ends, the node's directory goes with it. Everything the session prints comes back
// into an unlinked file: the bootstrap's lines are relayed, a worker's last one is its last words.
// What the agent makes on the node (its directory, 0700; setup.sh, bootstrap.sh, the pid files)
// is made under umask 077; bootstrap.sh and the workers run with the login's own umask.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "spawn.hpp"

namespace skyforge::providers {

// The agent, for `bash --norc --noprofile -c`. `dir_words`: the node's directory as shell words
// (made if missing, its parent removed too when empty at the end); `stage_words`: where the
// host's files lie on the node under their absolute paths (SKYFORGE_STAGE_ROOT); they may use
// "$D", the node's directory. `marker`: the line prefix that ends the bootstrap's output.
std::string agent_script(const std::string& dir_words, const std::string& stage_words, const std::string& marker);

// Setup-script lines that write `script` to "$D/bootstrap.sh" (a quoted here-document).
std::string bootstrap_file(const std::string& script);

// Thrown by NodeSession::start_worker when the session has ended (the machine, its sshd or the
// connection gone): no worker can start on that node again; a provider reports it as SF_ERR_GONE.
struct SessionGone : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A fresh random marker for agent_script.
std::string session_marker();

class NodeSession {
 public:
  NodeSession() = default;
  NodeSession(const NodeSession&) = delete;
  NodeSession& operator=(const NodeSession&) = delete;
  ~NodeSession() { stop(std::chrono::milliseconds(2000)); }

  // Starts `argv` (it runs agent_script on the node) with stdin a pipe and its output in an
  // unlinked file under $TMPDIR. Throws std::runtime_error.
  void start(Spawner& spawner, const std::vector<std::string>& argv);
  // Sends `setup`, then hands the bootstrap's output lines to `on_line` until the marker.
  // Returns its exit status, or nullopt when the session ended first (then `tail` holds the last
  // line it printed and exit_status() says how it ended).
  std::optional<int> run_bootstrap(const std::string& setup, const std::string& marker,
                                   const std::function<void(std::string_view)>& on_line, std::string& tail);
  // Sends a worker's environment and argv: the first after the bootstrap, another once the last
  // one has ended. Throws std::runtime_error when the session is gone or a worker still runs.
  void start_worker(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);

  bool started() const { return pid_ > 0; }
  // The current worker (the session, before the first): 1 running, 0 ended, -1 never started.
  int alive();
  // The current worker's exit code (exit_code()) once it has ended, or the session's when the
  // session ended first (the agent's `exit` carries its worker's status; 255 from ssh itself).
  std::optional<int> exit_status();
  std::string last_words();             // the last line the current worker printed ("" if none)
  // Closes its stdin (the agent stops the worker), SIGTERM to the local client's group, reaped
  // within `grace` (SIGKILL after). Idempotent.
  void stop(std::chrono::milliseconds grace);

 private:
  void reap_locked(bool block);
  void scan_locked();  // the log since scan_, for the current worker's exit line

  std::mutex mu_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  Fd input_;
  Fd log_;  // read side: read() while bootstrapping, pread() after
  off_t worker_output_ = 0;  // where the current worker's output begins in the log
  std::string marker_;
  bool worker_started_ = false;
  std::optional<int> worker_exit_;  // from its exit line
  off_t worker_end_ = -1;           // where that line begins
  off_t scan_ = 0;                  // the log is scanned up to here
  off_t line_start_ = 0;            // the line being scanned began here
  std::string line_head_;           // and began with these bytes (enough to match the exit line)
};

// Shared by the providers that shell out.
std::string trim(const std::string& s);             // without its leading and trailing white space
std::string first_line(const std::string& text);    // the first non-empty line, trimmed
std::string last_line(const std::string& text);     // the last non-empty line, trimmed
std::vector<std::string> lines_of(const std::string& text);  // trimmed lines
std::string route_source(const std::string& peer);  // this machine's address towards `peer`; "" if none
int reap_within(pid_t pid, std::chrono::milliseconds grace);  // SIGKILL to its group after grace
std::string random_hex(size_t bytes);

}  // namespace skyforge::providers
