// The worker as its job's reaper (docs/architecture.md, "Processes"): a child subreaper, so that
// whatever a command app starts — in the worker's process group or not (`setsid`, a double fork)
// — stays among the worker's descendants while the worker lives, and is killed at the end of
// the job, at shutdown and when the lease is lost.
//
// Every function here is async-signal-safe (raw open/read/getdents64 on /proc, kill, waitpid,
// nanosleep; no allocation, no locks): the worker's SIGTERM handler uses them too.
#pragma once

#include <sys/types.h>

namespace skyforge::reaper {

// PR_SET_CHILD_SUBREAPER on this process: orphans among its descendants come to it.
void become_subreaper();

// `sig` once to every descendant of this process (children, their children, ... as /proc shows
// them now), `except` (> 0) and its descendants left alone. Returns how many were signalled.
int signal_descendants(int sig, pid_t except = -1);

// SIGKILL to every descendant, then reaps this process's children, again and again (a killed
// process's children come to this subreaper) until it has no child left or `limit_ms` has
// passed. True when none is left. Reaps every child of this process: call it only when no
// other thread waits for a particular child (or when that one is already reaped).
bool kill_descendants(int limit_ms);

}  // namespace skyforge::reaper
