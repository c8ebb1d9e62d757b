// The worker's processes (docs/architecture.md, "Processes"): the process group it leads, the
// command app it starts in that group, and the signals that end them all. Whoever ends the
// worker's group (the provider's terminate, the worker itself) ends the command and whatever it
// started, and the kernel kills the command when the worker dies (PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <string>
#include <vector>

namespace skyforge {

// The running command app's pid, 0 when none (async-signal-safe use only in signal handlers).
extern std::atomic<pid_t> g_child_pid;

// Makes this worker lead a process group of its own (providers start workers in a session of
// their own, which already makes them leaders) and a child subreaper, and makes SIGTERM, SIGHUP
// and SIGINT end the worker with the command and everything it started. SIGPIPE is ignored.
void take_charge_of_processes();

// `sig` to the command app and every other member of the group, once, and to every other
// descendant of the worker (what left the group: `setsid`, a double fork; reaper.hpp).
void signal_group(int sig);

// SIGKILL to the command, every other member of the group until none is left, and every other
// descendant; the worker's own children among them reaped. Returns when they are gone.
void kill_children();

// Runs `argv` (PATH searched) with exactly the environment `env` ("K=V" entries) in `work_dir`,
// in the worker's group with only descriptors 0-2 open across exec, and waits for it. Returns its
// exit status, or -N when signal N ended it; whatever it left in the group is killed. Throws
// std::runtime_error when it cannot fork.
int run_in_group(const std::vector<std::string>& argv, const std::vector<std::string>& env, const char* work_dir);

}  // namespace skyforge
