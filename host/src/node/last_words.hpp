// The worker's own lines on its stderr: diag() for what it says while it runs, and its last
// words when a fatal signal kills it (which task of which app was running), which providers
// hand to the host (sf_worker_exit.last_words) to print with the signal.
#pragma once

#include <cstdint>
#include <string>

namespace skyforge {

// What this thread is running, for the last words: the map task and its slot, or the app's
// run(). Plain thread_locals of the executable, constant-initialised: static TLS, safe to read
// in a signal handler.
extern constinit thread_local int64_t t_task;
extern constinit thread_local int32_t t_slot;
extern constinit thread_local bool t_in_run;
extern char g_app_name[128];  // the native app's name, set before it runs
// Where diag() and the last words go: a duplicate of stderr, then the output pump's (run()).
extern int g_diag_fd;

// "skyforge-worker: <line>" on g_diag_fd.
void diag(const std::string& line);

// Duplicates stderr as g_diag_fd, and makes SIGSEGV, SIGABRT, SIGBUS, SIGFPE and SIGILL write the
// last words before they take their default action.
void install_last_words();

}  // namespace skyforge
