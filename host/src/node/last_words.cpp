// The worker's diagnostic lines and its fatal-signal handler (last_words.hpp).
#include "last_words.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "crash_context.hpp"

namespace skyforge {

constinit thread_local int64_t t_task = -1;
constinit thread_local int32_t t_slot = -1;
constinit thread_local bool t_in_run = false;
char g_app_name[128] = "";
int g_diag_fd = 2;

namespace {

// A fatal signal in an in-process app (SIGSEGV, SIGABRT, ...) kills the worker and, with it, the
// node's connection. Before it goes, one line on the worker's stderr says which task of which
// app was running; providers hand that line to the host (sf_worker_exit.last_words), which
// prints it with the signal. Async-signal-safe: fixed buffers, write(2), then the default action.
void on_fatal_signal(int sig) {
  char buf[512];
  size_t n = 0;
  auto put = [&](const char* text) {
    for (; *text && n < sizeof buf - 1; ++text) buf[n++] = *text;
  };
  auto put_num = [&](uint64_t v) {
    char digits[24];
    int d = 0;
    do digits[d++] = static_cast<char>('0' + v % 10);
    while ((v /= 10) != 0 && d < 24);
    while (d > 0 && n < sizeof buf - 1) buf[n++] = digits[--d];
  };
  const char* name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGABRT ? "SIGABRT" : sig == SIGBUS ? "SIGBUS"
                     : sig == SIGFPE ? "SIGFPE" : sig == SIGILL ? "SIGILL" : "a fatal signal";
  put("skyforge-worker: ");
  if (t_task >= 0) {
    put("task ");
    put_num(static_cast<uint64_t>(t_task));
    put(" (slot ");
    put_num(static_cast<uint64_t>(t_slot));
    put(") of app '");
    put(g_app_name);
    put("'");
  } else if (t_in_run) {
    put("run() of app '");
    put(g_app_name);
    put("'");
  } else if (const size_t d = describe_plugin_crash(sig, buf + n, sizeof buf - 1 - n); d > 0) {
    // Any other call into a plugin (create, a framework's hooks, a backend's probe, destroy):
    // "plugin 'foo' (libfoo.so) crashed in around_app_enter() with SIGSEGV (signal 11)".
    n += d;
    buf[n++] = '\n';
    ssize_t rc = ::write(g_diag_fd, buf, n);
    (void)rc;
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  } else {
    put("the worker");
  }
  put(" died of ");
  put(name);
  put(" (signal ");
  put_num(static_cast<uint64_t>(sig));
  put(")\n");
  ssize_t rc = ::write(g_diag_fd, buf, n);
  (void)rc;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void diag(const std::string& line) {
  std::string l = "skyforge-worker: " + line + "\n";
  ssize_t rc = ::write(g_diag_fd, l.data(), l.size());
  (void)rc;
}

void install_last_words() {
  g_diag_fd = fcntl(2, F_DUPFD_CLOEXEC, 3);
  if (g_diag_fd < 0) g_diag_fd = 2;
  struct sigaction fatal {};
  fatal.sa_handler = on_fatal_signal;
  fatal.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigemptyset(&fatal.sa_mask);
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) sigaction(sig, &fatal, nullptr);
}

}  // namespace skyforge
