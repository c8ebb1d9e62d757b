// End-to-end tests: the real `skyforge` binary, real worker processes on the local provider,
// real plugins from the build tree. Each test runs under its own TMPDIR, so "nothing left
// behind" is checked precisely: no process whose cwd is there, no directory left there.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>

#include "process.hpp"
#include "run_fixture.hpp"

using namespace skyforge::test;

namespace {

class E2E : public SkyforgeRunTest {
 protected:
  E2E() : SkyforgeRunTest("skyforge-e2e") {}
  Output run(const std::vector<std::string>& args, double timeout_s = 60) { return skyforge(args, timeout_s); }
  std::unique_ptr<Child> start(const std::vector<std::string>& args) { return start_skyforge(args); }
  // Worker processes of this test's pools.
  std::vector<pid_t> workers() {
    std::vector<pid_t> w;
    for (pid_t p : processes_under(root_))
      if (comm_of(p) == "skyforge-worker") w.push_back(p);
    return w;
  }
  bool wait_workers(size_t n, double timeout_s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
    while (std::chrono::steady_clock::now() < deadline) {
      if (workers().size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

};

std::string command_manifest(int nodes, const std::string& sh, const std::string& extra_job = "",
                             const std::string& plugins = "") {
  return "[pool]\nnodes = " + std::to_string(nodes) + "\n" + plugins + "\n[job]\ncommand = [\"sh\", \"-c\", \"" + sh +
         "\"]\n" + extra_job;
}

int count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

TEST_F(E2E, BroadcastNativeAppRunsOnEveryNode) {
  auto m = write("hello.toml", "[pool]\nprovider = \"local\"\nnodes = 4\n[job]\napp = \"hello\"\n");
  Output o = run({"run", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(contains(o.out, "[node " + std::to_string(i) + "] => node " + std::to_string(i) + "/4"));
}

TEST_F(E2E, SingleModeRunsOnTheHeadOnly) {
  auto m = write("single.toml", "[pool]\nnodes = 3\n[job]\napp = \"hello\"\nmode = \"single\"\n");
  Output o = run({"run", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(count(o.out, "] => node "), 1) << o.out;
  EXPECT_TRUE(contains(o.out, "[node 0] => node 0/3"));
}

TEST_F(E2E, MapReturnsResultsInInputOrderAcrossAllSlots) {
  auto m = write("map.toml",
                 "[pool]\nnodes = 2\nconcurrency = 2\n[job]\napp = \"hello\"\nmode = \"map\"\ntasks = 40\n");
  Output o = run({"run", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::regex line(R"(\[task (\d+)\] => (\d+)\^2=(\d+))");
  int expect = 0;
  for (std::sregex_iterator it(o.out.begin(), o.out.end(), line), end; it != end; ++it, ++expect) {
    EXPECT_EQ(std::stoi((*it)[1]), expect);
    EXPECT_EQ(std::stoi((*it)[2]), expect);
    EXPECT_EQ(std::stol((*it)[3]), long(expect) * expect);
  }
  EXPECT_EQ(expect, 40) << o.out;
}

TEST_F(E2E, MapTaskErrorNamesNodeSlotAndMessage) {
  auto m = write("boom.toml",
                 "[pool]\nnodes = 2\n[job]\napp = \"hello\"\nmode = \"map\"\ninputs = [\"1\", \"boom\", \"3\"]\n");
  Output o = run({"run", m.string()});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(task 1 failed on node \d slot \d: .*boom)"))) << o.err;
}

TEST_F(E2E, CommandAppStreamsPrefixedLinesWithTorchEnvironment) {
  auto m = write("cmd.toml", command_manifest(2, "echo rank=$RANK world=$WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT", "",
                                              "[[plugins]]\nname = \"torch\"\n"));
  Output o = run({"run", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::smatch a, b;
  ASSERT_TRUE(std::regex_search(o.out, a, std::regex(R"(\[node 0\] rank=0 world=2 master=([0-9.]+:\d+))"))) << o.out;
  ASSERT_TRUE(std::regex_search(o.out, b, std::regex(R"(\[node 1\] rank=1 world=2 master=([0-9.]+:\d+))"))) << o.out;
  EXPECT_EQ(a[1], b[1]) << "every rank must agree on MASTER_ADDR:MASTER_PORT";
}

TEST_F(E2E, StderrIsStreamedAndHeadPolicyKeepsOnlyTheHead) {
  auto m = write("head.toml", command_manifest(3, "echo out-$SKYFORGE_NODE; echo err-$SKYFORGE_NODE >&2",
                                               "stdout = \"head\"\n"));
  Output o = run({"run", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(contains(o.out, "[node 0] out-0"));
  EXPECT_EQ(o.out.find("out-1"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("out-2"), std::string::npos) << o.out;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(contains(o.err, "[node " + std::to_string(i) + "] err-" + std::to_string(i)));
}

TEST_F(E2E, NonZeroExitFailsTheRunAndNamesTheNode) {
  auto m = write("fail.toml", command_manifest(3, "if [ $SKYFORGE_NODE = 1 ]; then exit 3; fi"));
  Output o = run({"run", m.string()});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_TRUE(contains(o.err, "node 1"));
  EXPECT_TRUE(contains(o.err, "exit 3"));
}

TEST_F(E2E, EnvPassesAVariableByNameToEveryNodesJob) {
  auto m = write("env.toml", command_manifest(2, "echo token=$SF_TEST_TOKEN"));
  extra_env_["SF_TEST_TOKEN"] = "s3cr3t";
  Output o = run({"run", "--env", "SF_TEST_TOKEN", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(contains(o.out, "[node 0] token=s3cr3t"));
  EXPECT_TRUE(contains(o.out, "[node 1] token=s3cr3t"));
  o = run({"run", "--env", "SF_TEST_NOT_SET", m.string()});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "--env SF_TEST_NOT_SET: not set in this environment"));
}

TEST_F(E2E, NodesTheTeardownStoppedAreNotReportedAsFailed) {
  auto m = write("onefails.toml", command_manifest(3, "if [ $SKYFORGE_NODE = 1 ]; then exit 3; fi; exec sleep 30"));
  Output o = run({"run", m.string()});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_TRUE(contains(o.err, "command failed on node 1 (exit 3)"));
  EXPECT_EQ(o.err.find("signal 15"), std::string::npos) << o.err;
  EXPECT_LT(o.seconds, 20) << "the others were stopped, not waited for";
}

TEST_F(E2E, BadManifestIsRefusedBeforeAnythingStarts) {
  auto m = write("bad.toml", "[pool]\nnodes = 0\n[job]\napp = \"hello\"\n");
  Output o = run({"run", m.string()});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "bad.toml:2:"));
  EXPECT_TRUE(contains(o.err, "nodes"));
  auto m2 = write("missing.toml", "[pool]\nnodes = 1\n[job]\napp = \"no_such_app\"\n");
  o = run({"validate", m2.string()});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "missing.toml:4:"));
  EXPECT_TRUE(contains(o.err, "no_such_app"));
  EXPECT_TRUE(contains(o.err, "searched"));
}

TEST_F(E2E, APluginRefusingItsOptionsIsAManifestErrorAtThatOption) {
  const std::string path = std::string("plugin_path = [\"") + E2E_FIXTURES + "\"]\n";
  auto m = write("refused.toml", "[pool]\nnodes = 1\n\n[[plugins]]\nname = \"trace_a\"\nconfig_keys = \"a b\"\n\n[job]\n" +
                                     path + "command = [\"true\"]\n");
  for (const std::string cmd : {"validate", "run"}) {
    Output o = run({cmd, m.string()});
    EXPECT_EQ(o.exit_code, 2) << cmd << ": " << o.err;
    EXPECT_NE(o.err.find("refused.toml:6:15: [[plugins]] trace_a: "), std::string::npos) << cmd << ": " << o.err;
    EXPECT_NE(o.err.find("separate keys with commas"), std::string::npos) << cmd << ": " << o.err;
  }
}

TEST_F(E2E, ValidateAndPluginsAndHelp) {
  auto m = write("ok.toml", "[pool]\nnodes = 2\n[job]\napp = \"hello\"\n");
  Output o = run({"validate", m.string()});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("valid"), std::string::npos);
  o = run({"plugins"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(provider\s+local\s+\S+\s+1\.\d+\s+/\S+\.so)"))) << o.out;
  EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(framework\s+torch\s)"))) << o.out;
  EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(app\s+hello\s)"))) << o.out;
  for (std::string cmd : {"run", "validate", "plugins"}) {
    o = run({cmd, "--help"});
    EXPECT_EQ(o.exit_code, 0) << cmd;
    EXPECT_TRUE(contains(o.out, "usage: skyforge " + cmd));
  }
  o = run({"--help"});
  EXPECT_EQ(o.exit_code, 0);
}

TEST_F(E2E, PluginsWithAManifestSearchesItsPluginPathToo) {
  auto m = write("fixtures.toml", std::string("[pool]\nnodes = 1\n[job]\nplugin_path = [\"") + E2E_FIXTURES +
                                      "\"]\ncommand = [\"true\"]\n");
  Output o = run({"plugins"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_FALSE(std::regex_search(o.out, std::regex(R"(framework\s+trace_a\s)"))) << o.out;
  o = run({"plugins", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(framework\s+trace_a\s)"))) << o.out;
  EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(provider\s+local\s)"))) << o.out;
  auto bad = write("broken.toml", "[pool]\nnodes = \"two\"\n");
  o = run({"plugins", bad.string()});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "broken.toml:2:"));
}

TEST_F(E2E, FrameworkHooksEnterInManifestOrderAndExitInReverseEvenOnFailure) {
  const std::string plugins = std::string("[[plugins]]\nname = \"trace_a\"\n[[plugins]]\nname = \"trace_b\"\n");
  const std::string path = std::string("plugin_path = [\"") + E2E_FIXTURES + "\"]\n";
  for (int code : {0, 5}) {
    auto m = write("order.toml", command_manifest(1, "echo app $TRACE; exit " + std::to_string(code), path, plugins));
    Output o = run({"run", m.string()});
    EXPECT_EQ(o.exit_code, code == 0 ? 0 : 1) << o.err;
    std::string want = std::string("[node 0] enter trace_a\n[node 0] enter trace_b\n[node 0] app >trace_a>trace_b\n") +
                       "[node 0] exit trace_b " + (code ? "failed" : "ok") + "\n[node 0] exit trace_a " +
                       (code ? "failed" : "ok") + "\n";
    EXPECT_EQ(o.out, want);
  }
}

TEST_F(E2E, JobConfigIsTheSameOnTheClientAndOnEveryNode) {
  // host().config(key): job.timeout was missing everywhere, and a framework plugin could not
  // tell a command app from a native one before around_app_enter (job.kind).
  const std::string keys = "job.kind,job.mode,job.timeout,pool.nodes,pool.provider,job.app";
  const std::string plugins = "[[plugins]]\nname = \"trace_a\"\nconfig_keys = \"" + keys + "\"\n";
  const std::string path = std::string("plugin_path = [\"") + E2E_FIXTURES + "\"]\n";
  auto m = write("config.toml", command_manifest(2, "true", path + "timeout = 30\n", plugins));
  Output o = run({"run", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  for (const std::string where : {"client ", "[node 0] node ", "[node 1] node "}) {
    for (const std::string kv : {"job.kind=command", "job.mode=broadcast", "job.timeout=30", "pool.nodes=2",
                                 "pool.provider=local", "job.app=(none)"})
      EXPECT_NE(o.out.find(where + kv + "\n"), std::string::npos) << where << kv << "\n" << o.out;
  }
  auto app = write("app.toml", "[pool]\nnodes = 1\n" + plugins + "[job]\n" + path + "app = \"hello\"\n");
  o = run({"run", app.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(contains(o.out, "client job.kind=app\n"));
  EXPECT_TRUE(contains(o.out, "[node 0] node job.app=hello\n"));
  EXPECT_TRUE(contains(o.out, "client job.timeout=(none)\n"));
}

TEST_F(E2E, AFailedTaskOrAThrowingExitHookFailsTheNodesRun) {
  const std::string path = std::string("plugin_path = [\"") + E2E_FIXTURES + "\"]\n";
  // A map task that fails: the node's around_app_exit hears it.
  auto m = write("maptrace.toml", "[pool]\nnodes = 1\n[[plugins]]\nname = \"trace_a\"\n[job]\n" + path +
                                      "app = \"hello\"\nmode = \"map\"\ninputs = [\"1\", \"boom\", \"3\"]\n");
  Output o = run({"run", m.string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(contains(o.out, "[node 0] exit trace_a failed"));
  // An exit hook that throws fails the run, names the plugin and the hook, and the other exit
  // hooks still run.
  auto e = write("exitthrow.toml", command_manifest(1, "true", path,
                                                    "[[plugins]]\nname = \"trace_a\"\n[[plugins]]\nname = "
                                                    "\"trace_b\"\nfail_exit = true\n"));
  o = run({"run", e.string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(contains(o.err, "plugin 'trace_b' around_app_exit: trace_b refuses to exit cleanly"));
  EXPECT_TRUE(contains(o.out, "[node 0] exit trace_a ok"));
}

// A native app that kills its worker: the run names the node, the signal (or exit status), the
// task, its slot and the app (the provider's worker_exit and the worker's last words), and the
// pool is torn down as on any failure.
TEST_F(E2E, AWorkerKilledByItsAppIsNamedWithTheSignalTheTaskAndTheApp) {
  const std::string path = std::string("plugin_path = [\"") + E2E_FIXTURES + "\"]\n";
  auto map = [&](const std::string& name, const std::string& crash) {
    return write(name, "[pool]\nnodes = 2\n[job]\n" + path +
                           "app = \"crashy\"\nmode = \"map\"\ninputs = [\"a\", \"b\", \"c\", \"d\", \"e\", \"" + crash +
                           "\", \"g\"]\n[tasks]\nbatch_size = 1\n");
  };
  Output o = run({"run", map("segv.toml", "segv").string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(contains(o.err,
                       " lost: its worker was killed by SIGSEGV (Segmentation fault); its last words: "
                       "skyforge-worker: task 5 (slot 0) of app 'crashy' died of SIGSEGV (signal 11)"));
  EXPECT_EQ(o.err.find("connection reset by peer\n"), std::string::npos) << o.err;  // not the bare reason

  o = run({"run", map("abort.toml", "abort").string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(contains(o.err,
                       " lost: its worker was killed by SIGABRT (Aborted); its last words: "
                       "skyforge-worker: task 5 (slot 0) of app 'crashy' died of SIGABRT (signal 6)"));

  o = run({"run", map("exit.toml", "exit3").string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(contains(o.err, " lost: its worker exited with status 3"));

  // run() of a broadcast app: every node dies, the first one reported names run().
  auto b = write("run.toml", "[pool]\nnodes = 1\n[job]\n" + path + "app = \"crashy\"\n[job.options]\nrun = \"segv\"\n");
  o = run({"run", b.string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(contains(o.err,
                       "node 0 lost: its worker was killed by SIGSEGV (Segmentation fault); its last words: "
                       "skyforge-worker: run() of app 'crashy' died of SIGSEGV (signal 11)"));
}

// A restart ([job] max_restarts) whose surviving node's native app never returns: the worker
// goes without it 8 s after the host's shutdown (the host's wait for every worker to stop,
// lease + 10 s, less 6 s), so that wait holds, the restart goes on, and the run ends as the app
// says.
TEST_F(E2E, ARestartGoesOnWhenASurvivorsAppNeverReturns) {
  const std::string path = std::string("plugin_path = [\"") + E2E_FIXTURES + "\"]\n";
  const fs::path marker = root_ / "killed";
  auto m = write("stall.toml", "[pool]\nnodes = 2\n[job]\n" + path +
                                   "app = \"crashy\"\nmode = \"broadcast\"\nmax_restarts = 1\n[job.options]\nrun = "
                                   "\"kill-once-stall\"\nmarker = \"" + marker.string() + "\"\n");
  const auto t0 = std::chrono::steady_clock::now();
  Output o = run({"run", m.string()});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(fs::exists(marker.string() + ".stalled"));  // one node really stalled
  EXPECT_TRUE(contains(o.err, "lost: its worker was killed by SIGKILL"));
  EXPECT_TRUE(contains(o.err,
                       "warning: run() of app 'crashy' did not end within 8 s of the host's shutdown (restart); "
                       "the worker ends without it"));
  EXPECT_TRUE(contains(o.err, "restart 1/1: every node ready again"));
  EXPECT_EQ(o.err.find("did not stop"), std::string::npos) << o.err;
  std::printf("kill -> stalled survivor left -> run done: %.1f s\n", seconds);

  // A command that ignores SIGTERM gets SIGKILL 8 s later; the restart goes on. Node 1 kills
  // its worker once; node 0 then stalls once, ignoring SIGTERM (its `sleep` too).
  const std::string k = (root_ / "k").string(), st = (root_ / "s").string();
  auto c = write("stallcmd.toml",
                 command_manifest(2,
                                  "trap '' TERM; if [ $SKYFORGE_NODE = 1 ]; then mkdir " + k +
                                      " 2>/dev/null && kill -9 $PPID; exit 0; fi; while [ ! -d " + k +
                                      " ]; do sleep 0.1; done; if mkdir " + st +
                                      " 2>/dev/null; then while :; do sleep 1; done; fi",
                                  "max_restarts = 1\n"));
  o = run({"run", c.string()});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(fs::exists(st));
  EXPECT_TRUE(contains(o.err,
                       "warning: the command did not end within 8 s of the host's shutdown (restart) and its "
                       "SIGTERM; SIGKILL"));
  EXPECT_TRUE(contains(o.err, "restart 1/1: every node ready again"));
}

// A compute backend that says it cannot run (sf_compute_hooks::probe; the cuda backend without
// a driver): on the local provider the client asks before anything starts, and `run` exits 2 at
// the manifest value that selects it; a node asks again before its job starts.
TEST_F(E2E, AComputeBackendThatCannotRunHereStopsTheRunBeforeAnythingStarts) {
  const std::string path = std::string("plugin_path = [\"") + E2E_FIXTURES + "\"]\n";
  auto manifest = [&](const std::string& name, const std::string& picky_options) {
    return write(name, "[pool]\nnodes = 2\n"
                       "[[plugins]]\nname = \"keras\"\nbackend = \"picky\"\n"  // lines 3-5
                       "[[plugins]]\nname = \"picky\"\n" + picky_options +
                       "[job]\n" + path + "command = [\"sh\", \"-c\", \"echo ran\"]\n");
  };
  auto m = manifest("picky.toml", "missing = \"frobnicator\"\n");
  Output o = run({"validate", m.string()});
  EXPECT_EQ(o.exit_code, 0) << o.err;  // validate does not ask: the manifest is fine
  o = run({"run", m.string()});
  EXPECT_EQ(o.exit_code, 2) << o.err;
  EXPECT_EQ(o.err, m.string() + ":5:11: compute backend 'picky' cannot run on this machine, where the `local` provider "
                                "starts the nodes: plugin 'picky' probe: picky: this machine has no frobnicator "
                                "(nothing was started)\n");
  EXPECT_EQ(o.out, "");
  o = run({"env", m.string()});  // env starts the pool as run would: it stops alike
  EXPECT_EQ(o.exit_code, 2) << o.err;
  EXPECT_TRUE(contains(o.err, ":5:11: compute backend 'picky' cannot run on this machine"));

  // The client's machine has it, the nodes do not (what an ssh or slurm pool meets): each node
  // refuses before its job starts, naming itself and the reason; the command never runs.
  auto n = manifest("picky-nodes.toml", "missing = \"frobnicator\"\non = \"nodes\"\n");
  o = run({"run", n.string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(contains(o.err, "plugin 'picky' probe: picky: this machine has no frobnicator"));
  EXPECT_EQ(o.out.find("ran"), std::string::npos) << o.out;

  // Nothing missing: the probe passes and the command runs on both nodes.
  o = run({"run", manifest("picky-ok.toml", "").string()});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(count(o.out, "] ran"), 2) << o.out;
}

// A node asks its compute backend after the framework hooks have entered and their environment
// is the process's: a hook chooses the node's devices (mig sets CUDA_VISIBLE_DEVICES), and the
// CUDA runtime a probe calls reads that variable once. The fixture's probe passes only when
// TRACE, which trace_a's around_app_enter sets, is in the worker's environment.
TEST_F(E2E, ANodeProbesItsComputeBackendInTheEnvironmentTheFrameworkHooksMade) {
  const std::string path = std::string("plugin_path = [\"") + E2E_FIXTURES + "\"]\n";
  auto m = write("picky-hooks.toml", "[pool]\nnodes = 2\n"
                                     "[[plugins]]\nname = \"trace_a\"\n"
                                     "[[plugins]]\nname = \"keras\"\nbackend = \"picky\"\n"
                                     "[[plugins]]\nname = \"picky\"\nmissing = \"frobnicator\"\non = \"nodes\"\n"
                                     "unless_env = \"TRACE\"\n"
                                     "[job]\n" + path + "app = \"hello\"\n");
  Output o = run({"run", m.string()});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.err.find("probe"), std::string::npos) << o.err;
  EXPECT_EQ(count(o.out, "enter trace_a"), 2) << o.out;
}

// `[pool] accelerator` on the local provider: each node's worker (and so its command and a
// compute backend in it) sees only its own share of the machine's GPUs. Without a GPU here, the
// machine's list is what CUDA_VISIBLE_DEVICES restricts it to, which the provider honours.
TEST_F(E2E, EachLocalNodeSeesOnlyItsOwnGpus) {
  extra_env_["CUDA_VISIBLE_DEVICES"] = "GPU-a,GPU-b,GPU-c,GPU-d";
  auto m = write("gpus.toml", "[pool]\nnodes = 2\naccelerator = \"A100:2\"\n[job]\ncommand = [\"true\"]\n");
  for (int node = 0; node < 2; ++node) {
    Output o = run({"env", "--node", std::to_string(node), m.string()});
    ASSERT_EQ(o.exit_code, 0) << o.err;
    EXPECT_TRUE(
        contains(o.out, node == 0 ? "\nCUDA_VISIBLE_DEVICES=GPU-a,GPU-b\n" : "\nCUDA_VISIBLE_DEVICES=GPU-c,GPU-d\n"));
  }
  auto too_many = write("gpus3.toml", "[pool]\nnodes = 3\naccelerator = \"A100:2\"\n[job]\ncommand = [\"true\"]\n");
  Output o = run({"run", too_many.string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(contains(o.err,
                       "local provider: [pool] accelerator = \"A100:2\" asks for 2 GPUs per node, 6 for 3 nodes; "
                       "this machine offers 4 (CUDA_VISIBLE_DEVICES=GPU-a,GPU-b,GPU-c,GPU-d)"));

  // A machine that offers no GPU: the run goes on with a warning, CUDA_VISIBLE_DEVICES untouched.
  extra_env_["CUDA_VISIBLE_DEVICES"] = "";
  o = run({"run", m.string()});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(contains(o.err,
                       "asks for 2 GPUs per node, and this machine offers none (CUDA_VISIBLE_DEVICES=); "
                       "CUDA_VISIBLE_DEVICES left as it is"));
}

TEST_F(E2E, PoolSecretIsNeverVisibleToTheCommandOrInTheWorkersEnviron) {
  // The command's own environment, and the worker's (its parent) as /proc shows it.
  auto m = write("secret.toml", command_manifest(2,
      "echo own=$(env | grep -c ^SKYFORGE_POOL_SECRET=); "
      "echo worker=$(tr '\\\\0' '\\\\n' < /proc/$PPID/environ | grep -a -c -E '^SKYFORGE_POOL_SECRET=.+')"));
  Output o = run({"run", m.string()});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(count(o.out, "own=0"), 2) << o.out;
  EXPECT_EQ(count(o.out, "worker=0"), 2) << o.out;
}

TEST_F(E2E, ImageEnvAndFilesReachEveryNode) {
  write("data.txt", "payload-line\n");
  auto m = write("image.toml",
                 "[pool]\nnodes = 2\n[image]\nenv = { FOO = \"bar baz\" }\n"
                 "files = [{ source = \"data.txt\", target = \"in/data.txt\" }]\n"
                 "[job]\ncommand = [\"sh\", \"-c\", \"echo foo=$FOO; cat in/data.txt\"]\n");
  Output o = run({"run", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(contains(o.out, "[node " + std::to_string(i) + "] foo=bar baz"));
    EXPECT_TRUE(contains(o.out, "[node " + std::to_string(i) + "] payload-line"));
  }
}

// ---- teardown on every exit path ------------------------------------------------------------

TEST_F(E2E, SigintTearsThePoolDown) {
  auto m = write("sleep.toml", command_manifest(2, "echo up; exec sleep 120"));
  auto c = start({"run", m.string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 30));
  ASSERT_TRUE(c->wait_for_output("[node 0] up", 30));
  c->signal(SIGINT);
  Output o = c->wait(30);
  EXPECT_EQ(o.exit_code, 130) << o.err;
  EXPECT_LT(o.seconds, 20);
}

TEST_F(E2E, SigtermTearsThePoolDown) {
  auto m = write("sleep.toml", command_manifest(2, "echo up; exec sleep 120"));
  auto c = start({"run", m.string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 30));
  c->signal(SIGTERM);
  Output o = c->wait(30);
  EXPECT_EQ(o.exit_code, 143) << o.err;
}

TEST_F(E2E, SecondSigintForces) {
  // A command that ignores SIGTERM would hold a graceful teardown; the second Ctrl-C must not wait.
  auto m = write("stubborn.toml", command_manifest(2, "trap '' TERM; echo up; while :; do sleep 1; done"));
  auto c = start({"run", m.string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 30));
  c->signal(SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  c->signal(SIGINT);
  Output o = c->wait(30);
  EXPECT_EQ(o.exit_code, 130) << o.err;
}

TEST_F(E2E, WorkerKilledIsReportedLostAndPoolIsCleaned) {
  auto m = write("sleep.toml", command_manifest(2, "echo up; exec sleep 120"));
  auto c = start({"run", m.string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 30));
  ASSERT_TRUE(wait_workers(2, 10));
  ::kill(workers()[0], SIGKILL);
  Output o = c->wait(30);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_TRUE(contains(o.err, "lost"));
}

TEST_F(E2E, CommandAppInheritsOnlyTheStandardDescriptors) {
  // The worker's pool connection, node 0's store listener and its store connections: none of
  // them may reach the job. `ls` lists the shell's own table (the command app's process).
  auto m = write("fds.toml", command_manifest(2, "ls /proc/$$/fd"));
  Output o = run({"run", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::regex line(R"(\[node (\d)\] (\d+)\n)");
  std::map<int, std::set<int>> fds;
  for (std::sregex_iterator it(o.out.begin(), o.out.end(), line), end; it != end; ++it)
    fds[std::stoi((*it)[1])].insert(std::stoi((*it)[2]));
  ASSERT_EQ(fds.size(), 2u) << o.out;
  for (const auto& [node, open] : fds) EXPECT_EQ(open, (std::set<int>{0, 1, 2})) << "node " << node << ":\n" << o.out;
}

TEST_F(E2E, CommandAppCannotSpeakOnItsNodesControlConnection) {
  // Before the fix, fd 7 of node 1's command was its authenticated connection: junk written there
  // reached the host's deserialiser and failed the run.
  auto m = write("junk.toml", command_manifest(2,
      "if [ $SKYFORGE_NODE = 1 ]; then for fd in 3 4 5 6 7 8 9; do (printf JUNK >&$fd) 2>/dev/null; done; fi; sleep 1"));
  Output o = run({"run", m.string()});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.err.find("bad frame"), std::string::npos) << o.err;
}

TEST_F(E2E, KilledWorkerTakesItsCommandsDescendantsAlong) {
  // `sleep` is the shell's child, the worker's grandchild: it lives in the worker's process group,
  // which the provider's terminate ends. The loss is seen when the connection closes, not when
  // the lease runs out (no orphan holds the socket open).
  auto m = write("orphan.toml", command_manifest(3, "echo up; sleep 300; true"));
  auto c = start({"run", m.string()});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c->wait_for_output("[node " + std::to_string(i) + "] up", 30));
  ASSERT_TRUE(wait_workers(3, 10));
  pid_t victim = 0;
  for (pid_t w : workers()) {
    std::ifstream env("/proc/" + std::to_string(w) + "/environ");
    std::string e((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    if (e.find(std::string("SKYFORGE_NODE=1") + '\0') != std::string::npos) victim = w;
  }
  if (victim == 0) victim = workers()[1];
  ::kill(victim, SIGKILL);
  Output o = c->wait(30);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_TRUE(contains(o.err, "lost"));
  EXPECT_EQ(o.err.find("lease expired"), std::string::npos) << o.err;
  auto left = wait_no_processes_under(root_, 1);
  EXPECT_TRUE(left.empty()) << left.size() << " processes outlived the run, e.g. " << comm_of(left[0]);
}

TEST_F(E2E, CommandThatLeftTheGroupDiesWithItsWorker) {
  // A command that makes itself a session of its own escapes every group kill: the kernel ends
  // it when its worker dies (PR_SET_PDEATHSIG).
  auto m = write("setsid.toml", command_manifest(2, "echo up; exec setsid sleep 300"));
  auto c = start({"run", m.string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 30));
  ASSERT_TRUE(c->wait_for_output("[node 0] up", 30));
  ASSERT_TRUE(wait_workers(2, 10));
  std::vector<pid_t> sleepers;
  for (int tries = 0; tries < 100 && sleepers.size() < 2; ++tries) {
    sleepers.clear();
    for (pid_t p : processes_under(root_))
      if (comm_of(p) == "sleep") sleepers.push_back(p);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(sleepers.size(), 2u);
  for (pid_t w : workers()) ::kill(w, SIGKILL);
  c->wait(30);
  for (pid_t p : sleepers) {
    bool gone = false;
    for (int tries = 0; tries < 100 && !gone; ++tries) {
      std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
      std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
      const auto close = text.rfind(')');  // "pid (comm) state ...": a zombie is dead too
      gone = close == std::string::npos || text.compare(close + 2, 1, "Z") == 0 || comm_of(p) != "sleep";
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(gone) << "sleep " << p << " outlived its worker";
  }
}

TEST_F(E2E, StoppedWorkerIsDeclaredLostWithinFiveSeconds) {
  auto m = write("sleep.toml", command_manifest(2, "echo up; exec sleep 120"));
  auto c = start({"run", m.string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 30));
  ASSERT_TRUE(wait_workers(2, 10));
  auto t0 = std::chrono::steady_clock::now();
  ::kill(workers()[1], SIGSTOP);
  ASSERT_TRUE(c->wait_for_output("lost", 10));
  double lost_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LE(lost_after, 5.0);
  Output o = c->wait(30);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_TRUE(contains(o.err, "lease expired"));
}

TEST_F(E2E, HostKilledWorkersExitOnTheirOwn) {
  auto m = write("sleep.toml", command_manifest(2, "echo up; exec sleep 120"));
  auto c = start({"run", m.string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 30));
  ASSERT_TRUE(wait_workers(2, 10));
  c->signal(SIGKILL);
  c->wait(10);
  // Each worker's dead-man switch: it kills its command and removes its work dir.
  EXPECT_TRUE(wait_no_processes_under(root_, 8).empty());
}

// SKYFORGE_LEASE_FILE, the file a provider's dead-man switch watches (aws): each worker keeps it
// fresh while it holds the host's lease and ages it to the epoch the moment it loses it.
TEST_F(E2E, TheLeaseFileIsFreshWhileTheHostLivesAndAgedWhenItDies) {
  const fs::path lease = root_ / "lease";
  std::ofstream(lease) << "";
  const struct timespec old[2] = {{1000, 0}, {1000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, lease.c_str(), old, 0), 0);
  extra_env_["SKYFORGE_LEASE_FILE"] = lease.string();
  auto m = write("sleep.toml", command_manifest(1, "echo up; exec sleep 120"));
  auto c = start({"run", m.string()});
  ASSERT_TRUE(c->wait_for_output("[node 0] up", 30));
  auto mtime = [&] {
    struct stat sb {};
    ::stat(lease.c_str(), &sb);
    return sb.st_mtime;
  };
  EXPECT_GE(mtime(), ::time(nullptr) - 10) << "the worker renews it";
  c->signal(SIGKILL);
  c->wait(10);
  EXPECT_TRUE(wait_no_processes_under(root_, 10).empty());
  EXPECT_EQ(mtime(), 0) << "a worker that lost its host ages the lease file to the epoch";
}

TEST_F(E2E, HostFrozenWorkersLeaseRunsOut) {
  auto m = write("sleep.toml", command_manifest(2, "echo up; exec sleep 120"));
  auto c = start({"run", m.string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 30));
  ASSERT_TRUE(wait_workers(2, 10));
  c->signal(SIGSTOP);  // no heartbeats, but the TCP connection stays open
  auto left = wait_no_processes_under(root_, 10);
  EXPECT_TRUE(left.empty()) << left.size() << " processes outlived the host's lease";
  c->signal(SIGKILL);
  c->signal(SIGCONT);
  c->wait(10);
}

TEST_F(E2E, JobTimeoutFailsAndCleansUp) {
  auto m = write("timeout.toml", command_manifest(2, "exec sleep 120", "timeout = 1.5\n"));
  Output o = run({"run", m.string()});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_TRUE(contains(o.err, "timeout"));
}

TEST_F(E2E, NetnsIsolationGivesEachNodeItsOwnAddress) {
  if (geteuid() != 0) GTEST_SKIP() << "isolation = \"netns\" needs root (CAP_NET_ADMIN)";
  if (system("ip netns list >/dev/null 2>&1") != 0) GTEST_SKIP() << "ip netns is not available";
  auto m = write("netns.toml", "[pool]\nnodes = 3\n[provider]\nisolation = \"netns\"\n[job]\napp = \"hello\"\n");
  Output o = run({"run", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::regex ip(R"(\[node (\d)\] => .* ip=([0-9.]+))");
  std::set<std::string> ips;
  for (std::sregex_iterator it(o.out.begin(), o.out.end(), ip), end; it != end; ++it) ips.insert((*it)[2]);
  EXPECT_EQ(ips.size(), 3u) << o.out;
  EXPECT_EQ(ips.count("127.0.0.1"), 0u) << o.out;
}

}  // namespace

// A flood on the control port (1,000 junk connections, then 300 held open with a partial frame:
// slow loris) leaves the running job alone, and the host's stderr gets a few lines, not 1,000:
// the first rejections verbatim, then a summary with the count.
TEST_F(E2E, AConnectionFloodIsSummarisedAndTheJobGoesOn) {
  auto m = write("flood.toml", command_manifest(2, "echo up; sleep 3; echo done"));
  auto c = start({"run", m.string()});
  ASSERT_TRUE(c->wait_for_output("[node 0] up", 30));
  ASSERT_TRUE(wait_workers(2, 10));
  std::string connect;  // the worker's --connect ADDRESS:PORT is the host's control port
  {
    std::ifstream in("/proc/" + std::to_string(workers()[0]) + "/cmdline");
    std::string args((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = args.find(std::string("--connect") + '\0');
    ASSERT_NE(at, std::string::npos);
    connect = args.substr(at + 10, args.find('\0', at + 10) - (at + 10));
  }
  const size_t colon = connect.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(connect.substr(colon + 1))));
  ASSERT_EQ(::inet_pton(AF_INET, connect.substr(0, colon).c_str(), &addr.sin_addr), 1) << connect;
  auto dial = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  };
  rlimit files{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_cur < 2048 && files.rlim_max > files.rlim_cur) {
    files.rlim_cur = std::min<rlim_t>(files.rlim_max, 2048);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &files), 0);
  }
  for (int i = 0; i < 1000; ++i) {
    const int fd = dial();
    ASSERT_GE(fd, 0) << "connection " << i << ": " << std::strerror(errno);
    const char junk[] = "GET / HTTP/1.0\r\n\r\n";
    (void)!::write(fd, junk, sizeof junk - 1);
    ::close(fd);
  }
  std::vector<int> held;  // slow loris: half a frame header, then nothing
  for (int i = 0; i < 300; ++i)
    if (const int fd = dial(); fd >= 0) {
      (void)!::write(fd, "\x00\x00", 2);
      held.push_back(fd);
    }
  EXPECT_EQ(held.size(), 300u);
  Output o = c->wait(60);
  for (int fd : held) ::close(fd);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(contains(o.out, "[node 0] done"));
  EXPECT_TRUE(contains(o.out, "[node 1] done"));
  size_t lines = 0;
  for (size_t at = o.err.find("rejected"); at != std::string::npos; at = o.err.find("rejected", at + 1)) ++lines;
  EXPECT_GE(lines, 4u) << o.err;  // three verbatim, at least the final summary
  EXPECT_LE(lines, 3u + 1 + 1) << "a line per connection again?\n" << o.err;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(rejected \d+ more connections \(\d+ in all; the last from )"))) << o.err;
}
