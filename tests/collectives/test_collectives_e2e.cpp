// The pool communicator end to end: the real `skyforge` binary, real workers on the local
// provider, the collective_check app (fixtures/collective_check.cpp) on every node. Each test
// runs under its own TMPDIR and checks that nothing is left behind, as tests/e2e does, and
// that no shared-memory segment of the communicator stays in /dev/shm. Local nodes share
// this host, so the communicator runs on shared memory; in network namespaces, or with
// SKYFORGE_COMM_SHM=0, on Gloo/TCP.
#include <gtest/gtest.h>

#include <dirent.h>

#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "process.hpp"
#include "run_fixture.hpp"

using namespace skyforge::test;

namespace {

// The communicator's segments now in /dev/shm (each lives only while a communicator is built).
std::set<std::string> shm_segments() {
  std::set<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind("skyforge-comm-", 0) == 0) out.insert(e->d_name);
    ::closedir(d);
  }
  return out;
}

class Collectives : public SkyforgeRunTest {
 protected:
  Collectives() : SkyforgeRunTest("skyforge-coll") {}
  void SetUp() override {
    shm_before_ = shm_segments();
    SkyforgeRunTest::SetUp();
  }
  void TearDown() override {
    SkyforgeRunTest::TearDown();
    // New segments that stay (another run on this host may hold one for a few ms: look twice).
    std::set<std::string> segments;
    for (const auto& n : shm_segments())
      if (!shm_before_.count(n)) segments.insert(n);
    if (!segments.empty()) std::this_thread::sleep_for(std::chrono::seconds(2));
    for (const auto& n : shm_segments())
      if (segments.count(n)) ADD_FAILURE() << "left in /dev/shm: " << n;
  }
  Output run(const std::vector<std::string>& args, double timeout_s = 150) { return skyforge(args, timeout_s); }
  // A manifest running collective_check on `nodes` nodes; `env` goes to [image] env.
  std::string manifest(int nodes, const std::string& env = "", const std::string& extra = "",
                       const std::string& extra_job = "") {
    return "[pool]\nnodes = " + std::to_string(nodes) + "\n" + extra + (env.empty() ? "" : "[image]\nenv = { " + env + " }\n") +
           "[job]\napp = \"collective_check\"\nplugin_path = [\"" + COLL_FIXTURES + "\"]\n" + extra_job;
  }
  // `skyforge run` of manifest(nodes, env, extra, extra_job), written to `file`: the run must
  // fail, within 30 s, its stderr holding each of `says`.
  Output run_failing(const std::string& file, int nodes, const std::string& env,
                     const std::vector<std::string>& says, const std::string& extra = "",
                     const std::string& extra_job = "") {
    Output o = run({"run", write(file, manifest(nodes, env, extra, extra_job)).string()}, 60);
    EXPECT_EQ(o.exit_code, 1) << o.out << o.err;
    EXPECT_LT(o.seconds, 30);
    for (const auto& part : says) EXPECT_TRUE(contains(o.err, part));
    return o;
  }
  // Every node's "ok" line; returns the hashes seen. Every node must report `transport`.
  std::set<std::string> expect_ok(const Output& o, int nodes, const std::string& transport) {
    std::set<std::string> hashes;
    for (int i = 0; i < nodes; ++i) {
      std::smatch m;
      std::regex line("\\[node " + std::to_string(i) + "\\] => ok rank=" + std::to_string(i) + " size=" +
                      std::to_string(nodes) + " checks=(\\d+) hash=([0-9a-f]{16}) transport=(\\w+)");
      EXPECT_TRUE(std::regex_search(o.out, m, line)) << "node " << i << ":\n" << o.out << o.err;
      if (!m.empty()) {
        EXPECT_GT(std::stoi(m[1]), 50);
        hashes.insert(m[2]);
        EXPECT_EQ(m[3], transport) << "node " << i;
      }
    }
    return hashes;
  }

  std::set<std::string> shm_before_;
};

TEST_F(Collectives, TwoNodes) {
  Output o = run({"run", write("c2.toml", manifest(2)).string()});
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_EQ(expect_ok(o, 2, "shm").size(), 1u) << "every rank must hold the same allreduce bits\n" << o.out;
}

// The same on Gloo/TCP: SKYFORGE_COMM_SHM=0 on the nodes.
TEST_F(Collectives, TwoNodesWithSharedMemorySwitchedOff) {
  Output o = run({"run", write("c2off.toml", manifest(2, "SKYFORGE_COMM_SHM = \"0\"")).string()});
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_EQ(expect_ok(o, 2, "gloo").size(), 1u) << "every rank must hold the same allreduce bits\n" << o.out;
}

TEST_F(Collectives, ThreeNodes) {
  Output o = run({"run", write("c3.toml", manifest(3)).string()});
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_EQ(expect_ok(o, 3, "shm").size(), 1u) << "every rank must hold the same allreduce bits\n" << o.out;
}

TEST_F(Collectives, OneNodeIsLocal) {
  Output o = run({"run", write("c1.toml", manifest(1)).string()});
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_EQ(expect_ok(o, 1, "local").size(), 1u);
}

TEST_F(Collectives, ThreeNodesInNetworkNamespaces) {
  if (geteuid() != 0) GTEST_SKIP() << "isolation = \"netns\" needs root (CAP_NET_ADMIN)";
  if (system("ip netns list >/dev/null 2>&1") != 0) GTEST_SKIP() << "ip netns is not available";
  Output o = run({"run", write("netns.toml", manifest(3, "", "[provider]\nisolation = \"netns\"\n")).string()});
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  // Each node in its own network namespace is another host: Gloo/TCP over their addresses.
  EXPECT_EQ(expect_ok(o, 3, "gloo").size(), 1u) << o.out;
}

// A node that fails before the collective: the run fails at once (not after the collective
// timeout, 300 s by default), naming the node; the others, blocked in the rendezvous, are torn down.
TEST_F(Collectives, NodeThrowingBeforeTheCollectiveFailsTheRunNamingIt) {
  run_failing("throw.toml", 3, "COLL_MODE = \"throw\"", {"node 1 failed", "gives up before the collective on purpose"});
}

TEST_F(Collectives, NodeExitingBeforeTheCollectiveFailsTheRunNamingIt) {
  Output o = run_failing("exit.toml", 3, "COLL_MODE = \"exit\"", {});
  EXPECT_TRUE(std::regex_search(o.err, std::regex("node \\d"))) << o.err;
}

// A node that fails after joining (shared memory mapped, segment already unlinked): the run
// fails at once naming it; its peer's next collective fails instead of hanging.
TEST_F(Collectives, NodeThrowingAfterJoiningFailsTheRunNamingIt) {
  run_failing("throw_after.toml", 2, "COLL_MODE = \"throw_after\"", {"node 1 failed", "gives up after joining on purpose"});
}

// A node that never calls communicator() (but does not fail): the others' rendezvous gives up
// after the collective timeout with a message naming the missing node.
TEST_F(Collectives, NodeSkippingTheCollectiveIsNamedAfterTheTimeout) {
  run_failing("skip.toml", 3, "COLL_MODE = \"skip\", SKYFORGE_COLLECTIVE_TIMEOUT = \"3\"",
              {"node 1 did not join the communicator within 3 s"});
}

// A node that joins, then stalls: the others' allreduce times out with a clear error.
TEST_F(Collectives, StalledPeerTimesOutWithAClearError) {
  run_failing("stall.toml", 2, "COLL_MODE = \"stall\", SKYFORGE_COLLECTIVE_TIMEOUT = \"3\"",
              {"node 0 failed", "allreduce failed on node 0", "within 3 s"});
}

// The host's collective watchdog (label faults): every node reports its collectives with its
// heartbeat; a node inside collective #N for [job] collective_timeout while another never
// entered it stops the run, naming the laggard and what it last did — long before the
// communicator's own timeout (then twice the watchdog's plus 30 s).
class Watchdog : public Collectives {
 protected:
  // The worker of `node` under this test's root (its argv has "--node N"), once it runs; 0 if
  // none does within 30 s.
  pid_t wait_worker_of(int node) const {
    for (int i = 0; i < 3000; ++i) {
      for (pid_t p : processes_under(root_)) {
        std::ifstream in("/proc/" + std::to_string(p) + "/cmdline");
        std::string args((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (comm_of(p) == "skyforge-worker" &&
            args.find(std::string("--node") + '\0' + std::to_string(node) + '\0') != std::string::npos)
          return p;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return 0;
  }
  // A 2-node netns pool in a minute-long allreduce loop, and a shell command run in node 1's
  // network namespace once it is well inside the loop (`in_ns`: the script for `sh -c`, no
  // single quotes); then `said` must show in the run's output within `within` s, and the run
  // must fail. Returns the run and how long after the command `said` showed.
  struct Found {
    Output run;
    double seconds = 0;
  };
  Found inject_into_node_1(const std::string& name, const std::string& extra_job, const std::string& in_ns,
                           const std::string& said, double within) {
    Found r;
    auto c = start_skyforge({"run", write(name, manifest(2, "COLL_MODE = \"loop\", COLL_SECONDS = \"60\"",
                                                         "[provider]\nisolation = \"netns\"\n", extra_job)).string()});
    const pid_t victim = wait_worker_of(1);
    EXPECT_GT(victim, 0);
    if (victim <= 0) return r;
    std::this_thread::sleep_for(std::chrono::seconds(1));  // well inside the allreduce loop
    const auto at = std::chrono::steady_clock::now();
    const std::string cmd = "nsenter -t " + std::to_string(victim) + " -n sh -c '" + in_ns + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    if (::testing::Test::HasFailure()) return r;
    EXPECT_TRUE(c->wait_for_output(said, within));
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - at).count();
    r.run = c->wait(60);
    EXPECT_EQ(r.run.exit_code, 1) << r.run.out << r.run.err;
    return r;
  }
};

TEST_F(Watchdog, ANodeThatNeverEntersTheFirstCollectiveIsNamed) {
  auto c = start_skyforge({"run", write("stall.toml", manifest(2, "COLL_MODE = \"stall\"", "", "collective_timeout = 2\n")).string()});
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(c->wait_for_output("collective watchdog: node 1 never entered", 30));
  const double named = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Output o = c->wait(60);
  EXPECT_EQ(o.exit_code, 1) << o.out << o.err;
  EXPECT_TRUE(contains(o.err,
                       "node 1 never entered allreduce #1 (node 0 waiting 2 s, [job] collective_timeout = 2 s); "
                       "node 1 has made no collective call yet"));
  std::printf("[ figure ] a node that never enters a collective: named %.2f s after the run started (collective_timeout 2 s)\n",
              named);
  EXPECT_LT(named, 10);
}

TEST_F(Watchdog, ANodeThatStopsCallingIsNamedWithItsLastCollective) {
  Output o = run({"run", write("stall6.toml", manifest(3, "COLL_MODE = \"stall_after\", COLL_NODE = \"2\"", "",
                                                       "collective_timeout = 2\n")).string()},
                 60);
  EXPECT_EQ(o.exit_code, 1) << o.out << o.err;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(node 2 never entered allreduce #6 \(nodes 0,1 waiting [23] s, \[job\] collective_timeout = 2 s\); node 2's last was allreduce #5, [23] s ago)")))
      << o.err;
  EXPECT_LT(o.seconds, 20);
}

// A node whose link is cut (every interface in its network namespace set down): its heartbeats
// stop, and the lease names it within 5 s.
TEST_F(Watchdog, ANodeWhoseLinkIsCutIsNamed) {
  if (geteuid() != 0) GTEST_SKIP() << "isolation = \"netns\" needs root (CAP_NET_ADMIN)";
  if (system("ip netns list >/dev/null 2>&1") != 0) GTEST_SKIP() << "ip netns is not available";
  // (ip, not /sys/class/net: sysfs shows the mount namespace's view, which nsenter -n keeps)
  const Found f = inject_into_node_1("cut.toml", "",
                                     "for i in $(ip -o link show | cut -d: -f2 | cut -d@ -f1); do "
                                     "[ $i = lo ] || ip link set dev $i down || exit 1; done",
                                     "node 1 lost", 30);
  EXPECT_TRUE(contains(f.run.err, "node 1 lost"));
  std::printf("[ figure ] a node whose link is cut: named %.1f s after the cut\n", f.seconds);
  EXPECT_LT(f.seconds, 10);
}

// A node whose link `tc netem` delays by 3 s: its heartbeats still come (late, but within the
// lease), while its peers sit in each allreduce waiting for it; the watchdog names it. Needs the
// kernel's sch_netem, which some kernels (this project's CI VMs among them) do not have: then
// the test says so and skips.
TEST_F(Watchdog, ANodeSlowedByNetemIsNamed) {
  if (geteuid() != 0) GTEST_SKIP() << "isolation = \"netns\" needs root (CAP_NET_ADMIN)";
  if (system("ip netns add sf-netem-probe 2>/dev/null && ip netns exec sf-netem-probe tc qdisc add dev lo root netem "
             "delay 1ms >/dev/null 2>&1; r=$?; ip netns del sf-netem-probe 2>/dev/null; exit $r") != 0)
    GTEST_SKIP() << "tc netem is not available in this kernel (no sch_netem)";
  const Found f = inject_into_node_1("netem.toml", "collective_timeout = 2\n",
                                     "for i in $(ip -o link show | cut -d: -f2 | cut -d@ -f1); do "
                                     "[ $i = lo ] || tc qdisc add dev $i root netem delay 3000ms || exit 1; done",
                                     "node 1 never entered allreduce", 60);
  std::printf("[ figure ] a node slowed by netem (3 s): named %.1f s after the delay began\n", f.seconds);
}

// A node whose link to its peers is throttled to 8 kbit/s (HTB + a u32 filter in its network
// namespace: traffic to the other nodes slowed, to the host not, so its heartbeats stay on time):
// every allreduce now takes seconds, every node sits in the same one, and the watchdog stops
// the run after [job] collective_timeout saying a link is slow or down, long before Gloo's own
// timeout. This kernel has HTB but no sch_netem; the test needs only what it uses.
TEST_F(Watchdog, ANodeWhoseLinkIsThrottledIsFound) {
  if (geteuid() != 0) GTEST_SKIP() << "isolation = \"netns\" needs root (CAP_NET_ADMIN)";
  if (system("ip netns add sf-htb-probe 2>/dev/null && ip netns exec sf-htb-probe tc qdisc add dev lo root handle 1: htb "
             ">/dev/null 2>&1 && ip netns exec sf-htb-probe tc filter add dev lo protocol ip parent 1: prio 1 u32 match "
             "ip dst 127.0.0.1/32 flowid 1:1 >/dev/null 2>&1; r=$?; ip netns del sf-htb-probe 2>/dev/null; exit $r") != 0)
    GTEST_SKIP() << "tc htb or the u32 classifier is not available in this kernel";
  // To the host (the default gateway, the bridge's .1): full speed; to the rest of the subnet
  // (the other nodes): 8 kbit/s.
  const Found f = inject_into_node_1("htb.toml", "collective_timeout = 2\n",
                                     "gw=$(ip -4 route show default | cut -d\" \" -f3) && [ -n \"$gw\" ] && "
                                     "tc qdisc add dev eth0 root handle 1: htb default 1 r2q 1000 && "
                                     "tc class add dev eth0 parent 1: classid 1:1 htb rate 10gbit quantum 60000 && "
                                     "tc class add dev eth0 parent 1: classid 1:2 htb rate 8kbit ceil 8kbit quantum 1514 && "
                                     "tc filter add dev eth0 protocol ip parent 1: prio 1 u32 match ip dst $gw/32 flowid 1:1 && "
                                     "tc filter add dev eth0 protocol ip parent 1: prio 2 u32 match ip dst ${gw%.*}.0/24 flowid 1:2",
                                     "collective watchdog: ", 60);
  const Output& o = f.run;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(every node has been in allreduce #\d+ for [234] s and none has finished it \(\[job\] collective_timeout = 2 s\): a link between nodes may be down)")))
      << o.err;
  EXPECT_EQ(o.err.find("lost"), std::string::npos) << o.err;  // the heartbeats kept coming: no node was lost
  std::smatch said;
  std::regex_search(o.err, said, std::regex("collective watchdog: [^\n]*"));
  std::printf("[ figure ] a node whose link to its peers is throttled to 8 kbit/s: found %.1f s after the throttle began\n%s\n",
              f.seconds, said.str().c_str());
  EXPECT_LT(f.seconds, 15);
}

// mode = "single" runs the app on the head only: no group to join, so communicator() fails at
// once instead of waiting out the timeout for nodes that never run the app.
TEST_F(Collectives, SingleModeHasNoCommunicator) {
  run_failing("single.toml", 2, "", {"node 0 failed", "with mode = \"single\" only the head runs it"}, "",
              "mode = \"single\"\n");
}

// Compute backends listed in [[plugins]] are created on every node with their options, found
// by name through compute_backend(), and destroyed after the app in reverse creation order.
TEST_F(Collectives, ComputeBackendsAreLentByNameAndDestroyedAfterTheApp) {
  const fs::path trace = root_ / "trace.txt";
  std::string m = "[pool]\nnodes = 1\n"
                  "[[plugins]]\nname = \"coll_backend_a\"\ntag = \"alpha\"\n"
                  "[[plugins]]\nname = \"coll_backend_b\"\n"
                  "[image]\nenv = { COLL_MODE = \"backend\", COLL_TRACE_FILE = \"" + trace.string() + "\" }\n"
                  "[job]\napp = \"collective_check\"\nplugin_path = [\"" + COLL_FIXTURES + "\"]\n";
  Output o = run({"run", write("backend.toml", m).string()}, 60);
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_TRUE(contains(o.out, "[coll_backend_a] coll_backend_a tag=alpha"));
  EXPECT_TRUE(contains(o.out, "[coll_backend_b] coll_backend_b tag=none"));
  EXPECT_TRUE(contains(o.out,
                       "[] error(2): compute_backend(selected): no compute backend is selected (loaded: "
                       "'coll_backend_a', 'coll_backend_b'; pass a name)"));
  EXPECT_TRUE(contains(o.out,
                       "[no_such_backend] error(2): compute_backend(no_such_backend): no compute backend named "
                       "'no_such_backend' (loaded: 'coll_backend_a', 'coll_backend_b')"));
  std::ifstream in(trace);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "destroy app\ndestroy coll_backend_b\ndestroy coll_backend_a\n");
}

}  // namespace
