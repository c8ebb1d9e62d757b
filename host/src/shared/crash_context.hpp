// Which plugin crashed (LLVM's PrettyStackTrace idea, docs/plugins.md "When a plugin crashes"):
// every call into a plugin's code — its library's load, its entry, create(), a hook, last_error(),
// destroy() — runs inside a PluginCallScope (the loader sets it: Loader::load, Loader::create,
// PluginInstance::invoke/call/check and its destructor), which keeps a record on the calling
// thread. A fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) then reads the record of the
// thread it hit and says, on stderr, `skyforge: plugin 'foo' (libfoo.so) crashed in create() with
// SIGSEGV (signal 11)`, and the process still dies of the signal (exit status, core dumps).
// Everything a signal handler touches here is async-signal-safe: static TLS, fixed buffers,
// write(2), sigaction(2), raise(3).
#pragma once

#include <cstddef>

namespace skyforge {

// One call into a plugin in progress on this thread. The strings outlive the call.
struct PluginCallRecord {
  const char* plugin = "";    // the plugin's name (plugin.toml's, before its descriptor is read)
  const char* library = "";   // its library's path
  const char* hook = "";      // "create", "provision", ...; "" while the library itself loads
  const PluginCallRecord* outer = nullptr;  // the call this one is nested in, if any
};

// Marks the calling thread as inside `hook` of `plugin` for the scope's life. Nested scopes
// stack: the innermost is the one a crash names. `hook` "" means the library is being loaded
// (its static initialisers run).
class PluginCallScope {
 public:
  PluginCallScope(const char* plugin, const char* library, const char* hook) noexcept;
  ~PluginCallScope();
  PluginCallScope(const PluginCallScope&) = delete;
  PluginCallScope& operator=(const PluginCallScope&) = delete;

 private:
  PluginCallRecord record_;
};

// The innermost plugin call in progress on this thread, or null. Async-signal-safe.
const PluginCallRecord* current_plugin_call() noexcept;

// "SIGSEGV", "SIGBUS", ... ("a fatal signal" for others). Async-signal-safe.
const char* fatal_signal_name(int sig) noexcept;

// Writes `plugin 'foo' (libfoo.so) crashed in create() with SIGSEGV (signal 11)` (the library
// as its file name; no newline) into buf, NUL-terminated and truncated to cap, and returns its
// length; returns 0 and writes nothing when no plugin call is in progress on this thread.
// Async-signal-safe.
size_t describe_plugin_crash(int sig, char* buf, size_t cap) noexcept;

// Installs (once per process) handlers of SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT that write
// `<program>: <describe_plugin_crash>` — or `<program>: died of SIGSEGV (signal 11) outside any
// call into a plugin` — and a newline to the report fd, then die of the same signal with its
// default action. The calling thread gets an alternate signal stack, so a plugin that overflows
// the stack there is still named. `program` must live forever (a literal).
void install_crash_reporter(const char* program) noexcept;

// Where the report is written: stderr (2) unless set (a forked check's pipe).
void set_crash_report_fd(int fd) noexcept;

}  // namespace skyforge
