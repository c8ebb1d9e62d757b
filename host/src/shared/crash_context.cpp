#include "crash_context.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace skyforge {
namespace {

// Static TLS (initial-exec): reading it in a signal handler allocates nothing.
thread_local const PluginCallRecord* t_call __attribute__((tls_model("initial-exec"))) = nullptr;

const char* volatile g_program = "skyforge";
volatile int g_report_fd = 2;

constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

// A bounded writer into a caller's buffer (always NUL-terminated).
struct Out {
  char* buf;
  size_t cap;
  size_t n = 0;
  void put(const char* s) {
    for (; s && *s && n + 1 < cap; ++s) buf[n++] = *s;
    if (cap) buf[n] = '\0';
  }
  void put_num(uint64_t v) {
    char digits[24];
    int d = 0;
    do digits[d++] = static_cast<char>('0' + v % 10);
    while ((v /= 10) != 0 && d < 24);
    while (d > 0 && n + 1 < cap) buf[n++] = digits[--d];
    if (cap) buf[n] = '\0';
  }
};

const char* file_name(const char* path) {
  const char* base = path;
  for (const char* p = path; p && *p; ++p)
    if (*p == '/' && p[1]) base = p + 1;
  return base;
}

void on_fatal_signal(int sig) {
  const int saved_errno = errno;
  char buf[1024];
  Out out{buf, sizeof buf};
  out.put(g_program);
  out.put(": ");
  if (const size_t d = describe_plugin_crash(sig, buf + out.n, sizeof buf - out.n); d > 0) {
    out.n += d;
  } else {
    out.put("died of ");
    out.put(fatal_signal_name(sig));
    out.put(" (signal ");
    out.put_num(static_cast<uint64_t>(sig));
    out.put(") outside any call into a plugin");
  }
  if (out.n + 1 < sizeof buf) buf[out.n++] = '\n';
  for (size_t off = 0; off < out.n;) {
    const ssize_t w = ::write(g_report_fd, buf + off, out.n - off);
    if (w > 0) off += static_cast<size_t>(w);
    else if (w < 0 && errno == EINTR) continue;
    else break;
  }
  errno = saved_errno;
  // SA_RESETHAND restored the default action on entry and SA_NODEFER leaves the signal
  // unblocked: raising it again ends the process as the signal would have, core included.
  ::raise(sig);
}

}  // namespace

PluginCallScope::PluginCallScope(const char* plugin, const char* library, const char* hook) noexcept {
  record_.plugin = plugin ? plugin : "";
  record_.library = library ? library : "";
  record_.hook = hook ? hook : "";
  record_.outer = t_call;
  // The record is complete before the thread's pointer names it (a signal may come at any time).
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  t_call = &record_;
}

PluginCallScope::~PluginCallScope() { t_call = record_.outer; }

const PluginCallRecord* current_plugin_call() noexcept { return t_call; }

const char* fatal_signal_name(int sig) noexcept {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    default: return "a fatal signal";
  }
}

size_t describe_plugin_crash(int sig, char* buf, size_t cap) noexcept {
  const PluginCallRecord* c = t_call;
  if (!c || cap == 0) return 0;
  Out out{buf, cap};
  out.put("plugin '");
  out.put(c->plugin);
  out.put("' (");
  out.put(file_name(c->library));
  out.put(") crashed ");
  if (*c->hook) {
    out.put("in ");
    out.put(c->hook);
    out.put("()");
  } else {
    out.put("while its library was loaded (its static initialisers)");
  }
  out.put(" with ");
  out.put(fatal_signal_name(sig));
  out.put(" (signal ");
  out.put_num(static_cast<uint64_t>(sig));
  out.put(")");
  return out.n;
}

void install_crash_reporter(const char* program) noexcept {
  static bool installed = false;
  if (installed) return;
  installed = true;
  if (program && *program) g_program = program;
  // An alternate stack for this thread: a plugin that overflows the stack is still named.
  static char alt_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  ::sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sa.sa_flags = SA_RESETHAND | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : kFatalSignals) ::sigaction(sig, &sa, nullptr);
}

void set_crash_report_fd(int fd) noexcept { g_report_fd = fd; }

}  // namespace skyforge
