// A plugin that crashes is named, with the hook it crashed in (crash_context.hpp; issue 33,
// item 15). In a forked child of this test: the crash reporter's line, its nesting, and that the
// process still dies of the signal. Through the real binaries on the local provider: `validate`
// and `run` report a plugin that crashes in create() as a manifest problem at its entry (exit 2,
// nothing started), a crash in a client hook kills `run` with the signal after naming the plugin
// and hook, and a crash on a node is named in the node's loss.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <functional>
#include <string>

#include "crash_context.hpp"
#include "loader.hpp"
#include "run_fixture.hpp"
#include "services.hpp"

using namespace skyforge;
using namespace skyforge::test;

namespace {

// No core files from the crashes these tests make on purpose (inherited by every child).
const bool g_no_cores = [] {
  rlimit none{0, 0};
  return ::setrlimit(RLIMIT_CORE, &none) == 0;
}();

std::string fixture_lib(const std::string& name) { return std::string(FIXTURES) + "/" + name + "/lib" + name + ".so"; }

void segfault() {
  volatile int* volatile p = nullptr;
  *p = 1;
}

struct Died {
  int signal = 0;     // the signal it died of, 0 when it exited
  int exit_code = -1;
  std::string report;  // what the crash reporter wrote
};

// Runs `body` in a child whose crash reporter writes to a pipe.
Died in_child(const std::function<void()>& body) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    set_crash_report_fd(fds[1]);
    install_crash_reporter("testhost");
    body();
    ::_exit(0);
  }
  ::close(fds[1]);
  Died d;
  char buf[1024];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) d.report.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status)) d.signal = WTERMSIG(status);
  if (WIFEXITED(status)) d.exit_code = WEXITSTATUS(status);
  return d;
}

TEST(CrashReport, NamesTheInnermostPluginCallAndDiesOfTheSignal) {
  Died d = in_child([] {
    PluginCallScope outer("app", "/opt/plugins/app/libapp.so", "run");
    PluginCallScope inner("foo", "/opt/plugins/foo/libfoo.so", "create");
    segfault();
  });
  EXPECT_EQ(d.signal, SIGSEGV);
  EXPECT_EQ(d.report, "testhost: plugin 'foo' (libfoo.so) crashed in create() with SIGSEGV (signal 11)\n");
}

TEST(CrashReport, AScopeThatEndedIsNotBlamed) {
  Died d = in_child([] {
    PluginCallScope outer("app", "/opt/plugins/app/libapp.so", "run");
    { PluginCallScope inner("foo", "/opt/plugins/foo/libfoo.so", "create"); }
    std::abort();
  });
  EXPECT_EQ(d.signal, SIGABRT);
  EXPECT_EQ(d.report, "testhost: plugin 'app' (libapp.so) crashed in run() with SIGABRT (signal 6)\n");
  d = in_child([] {
    { PluginCallScope done("foo", "/opt/plugins/foo/libfoo.so", "create"); }
    std::raise(SIGFPE);
  });
  EXPECT_EQ(d.signal, SIGFPE);
  EXPECT_EQ(d.report, "testhost: died of SIGFPE (signal 8) outside any call into a plugin\n");
}

TEST(CrashReport, AStackOverflowInAPluginIsStillNamed) {
  Died d = in_child([] {
    rlimit small{1 << 20, 1 << 20};  // a 1 MiB stack: the recursion ends quickly
    ::setrlimit(RLIMIT_STACK, &small);
    PluginCallScope in("deep", "/p/libdeep.so", "bootstrap");
    std::function<int(int)> recurse = [&](int n) {
      volatile char pad[4096];
      pad[0] = static_cast<char>(n);
      return recurse(n + 1) + pad[0];
    };
    recurse(0);
  });
  EXPECT_EQ(d.signal, SIGSEGV);
  EXPECT_EQ(d.report, "testhost: plugin 'deep' (libdeep.so) crashed in bootstrap() with SIGSEGV (signal 11)\n");
}

// The loader marks create(): every plugin instance comes from Loader::create.
TEST(CrashReport, TheLoaderMarksCreate) {
  Died d = in_child([] {
    Services services([](int32_t, const std::string&) {});
    Loader loader(services.table());
    loader.create(loader.load(fixture_lib("crash_in_create"), "crash_in_create"), {});
  });
  EXPECT_EQ(d.signal, SIGSEGV);
  EXPECT_EQ(d.report,
            "testhost: plugin 'crash_in_create' (libcrash_in_create.so) crashed in create() with SIGSEGV (signal 11)\n");
}

// ... and every hook called through PluginInstance::invoke/call.
TEST(CrashReport, TheLoaderMarksHooks) {
  Died d = in_child([] {
    Services services([](int32_t, const std::string&) {});
    Loader loader(services.table());
    auto fw = loader.create(loader.load(fixture_lib("crash_in_client_enter"), "crash_in_client_enter"), {});
    sf_cluster cluster{};
    fw->call(&sf_framework_hooks::around_client_enter, "around_client_enter", &cluster);
  });
  EXPECT_EQ(d.signal, SIGSEGV);
  EXPECT_EQ(d.report,
            "testhost: plugin 'crash_in_client_enter' (libcrash_in_client_enter.so) crashed in around_client_enter() "
            "with SIGSEGV (signal 11)\n");
}

class PluginCrashE2E : public SkyforgeRunTest {
 protected:
  PluginCrashE2E() : SkyforgeRunTest("skyforge-plugin-crash") {}
  fs::path manifest(const std::string& plugin, int nodes = 1) {
    return write(plugin + ".toml", "[pool]\nprovider = \"local\"\nnodes = " + std::to_string(nodes) +
                                       "\n\n[[plugins]]\nname = \"" + plugin + "\"\n\n[job]\nplugin_path = [\"" +
                                       FIXTURES + "\"]\ncommand = [\"true\"]\n");
  }
};

// Create() runs in `validate` and before `run` starts anything, in a child process: the crash is
// the manifest's problem at the plugin's entry (its name, line 6), and validate does not die of it.
TEST_F(PluginCrashE2E, ValidateAndRunReportAPluginCrashingInCreate) {
  const fs::path m = manifest("crash_in_create");
  const std::string want = m.string() +
                           ":6:8: [[plugins]] crash_in_create: plugin 'crash_in_create' (libcrash_in_create.so) "
                           "crashed in create() with SIGSEGV (signal 11)";
  for (const std::string cmd : {"validate", "run"}) {
    Output o = skyforge({cmd, m.string()}, 60);
    EXPECT_EQ(o.exit_code, 2) << cmd << ": " << o.err;
    EXPECT_NE(o.err.find(want), std::string::npos) << cmd << ": " << o.err;
    EXPECT_EQ(o.out.find("[node"), std::string::npos) << cmd << ": nothing ran: " << o.out;
  }
  // --no-load: the manifest against plugin.toml alone, no plugin code run.
  Output o = skyforge({"validate", "--no-load", m.string()}, 60);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("valid"), std::string::npos) << o.out;
}

// A crash on the client after the checks (a client hook) is a crash: `run` dies of the signal,
// its last line naming the plugin and the hook. around_client_enter comes before provision():
// nothing was started that a teardown would have had to stop (the fixture checks the TMPDIR and
// processes).
TEST_F(PluginCrashE2E, RunDiesOfTheSignalNamingThePluginAndHook) {
  const fs::path m = manifest("crash_in_client_enter");
  Output v = skyforge({"validate", m.string()}, 60);
  EXPECT_EQ(v.exit_code, 0) << "its create() is fine: " << v.err;
  Output o = skyforge({"run", m.string()}, 60);
  EXPECT_EQ(o.exit_code, 128 + SIGSEGV) << o.err;
  EXPECT_NE(o.err.find("skyforge: plugin 'crash_in_client_enter' (libcrash_in_client_enter.so) crashed in "
                       "around_client_enter() with SIGSEGV (signal 11)\n"),
            std::string::npos)
      << o.err;
}

// On a node: the worker's last words name the plugin and hook, and the host reports them as the
// node's loss.
TEST_F(PluginCrashE2E, ACrashOnANodeIsNamedInTheNodesLoss) {
  const fs::path m = manifest("crash_in_app_enter");
  Output o = skyforge({"run", m.string()}, 90);
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("node 0 lost: its worker was killed by SIGSEGV (Segmentation fault); its last words: "
                       "skyforge-worker: plugin 'crash_in_app_enter' (libcrash_in_app_enter.so) crashed in "
                       "around_app_enter() with SIGSEGV (signal 11)"),
            std::string::npos)
      << o.err;
}

}  // namespace
