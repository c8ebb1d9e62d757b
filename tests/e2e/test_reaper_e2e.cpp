// What a command app starts outside its worker's process group — `setsid sleep &`, a daemon
// that double-forks into `/` — ends with the run (docs/architecture.md, "Processes"):
//  - cgroup v2 (where this process may make cgroups): each node's processes in a cgroup of
//    their own, killed and removed at teardown, even after the worker was killed with SIGKILL;
//  - without (SKYFORGE_CGROUP=off here): the worker, a child subreaper, kills every descendant
//    it inherited at the end of the job.
// The escapees are found by a mark in their environment, wherever their working directory is.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iterator>

#include "cgroup.hpp"
#include "process.hpp"
#include "run_fixture.hpp"
#include "../support/read_text.hpp"

using namespace skyforge::test;

namespace {

// Live processes whose environment holds SF_REAP_MARK=<mark> (a zombie's reads empty).
std::vector<pid_t> marked(const std::string& mark) {
  std::string needle = "SF_REAP_MARK=" + mark;
  needle.push_back('\0');
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    if (read_text(e.path() / "environ").find(needle) != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

// The pool cgroups a `skyforge` process (pid) made: skyforge-<pool>-<pid>.
std::vector<fs::path> pool_cgroups(const fs::path& base, pid_t skyforge) {
  std::vector<fs::path> out;
  std::error_code ec;
  const std::string suffix = "-" + std::to_string(skyforge);
  for (const auto& e : fs::directory_iterator(base, ec)) {
    const std::string n = e.path().filename();
    if (n.rfind("skyforge-", 0) == 0 && n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(e.path());
  }
  return out;
}

class Reaper : public SkyforgeRunTest {
 protected:
  Reaper() : SkyforgeRunTest("skyforge-reaper") {}
  void SetUp() override {
    SkyforgeRunTest::SetUp();
    static std::atomic<int> n{0};
    mark_ = std::to_string(::getpid()) + "-" + std::to_string(n++);
  }
  void TearDown() override {
    for (pid_t p : marked(mark_)) ::kill(p, SIGKILL);  // whatever a failed test left
    SkyforgeRunTest::TearDown();
  }
  // Every node starts both escapees, waits until the daemon's pid is written, says "up", then
  // runs `tail`.
  fs::path manifest(const std::string& tail) {
    return write("reap.toml",
                 "[pool]\nnodes = 2\n[job]\ncommand = [\"sh\", \"-c\", '''\n"
                 "export SF_REAP_MARK=" + mark_ + "\n"
                 "setsid sleep 1000 &\n"
                 "sh -c 'cd /; setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > \"$0\"' \"$PWD/daemon.pid\" &\n"
                 "while [ ! -s daemon.pid ]; do sleep 0.01; done\n"
                 "echo up\n" + tail + "\n'''\n]\n");
  }
  std::vector<pid_t> workers() {
    std::vector<pid_t> w;
    for (pid_t p : processes_under(root_))
      if (comm_of(p) == "skyforge-worker") w.push_back(p);
    return w;
  }
  bool wait_marked(size_t n) {
    for (int i = 0; i < 500; ++i) {
      if (marked(mark_).size() == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  std::string mark_;
};

TEST_F(Reaper, CgroupEndsEscapeesAfterANormalRunAndRemovesItsCgroups) {
  std::string why;
  const fs::path base = skyforge::local::cgroup::usable_base(why);
  if (base.empty()) GTEST_SKIP() << why;
  auto c = start_skyforge({"run", manifest("sleep 0.5").string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 30));
  EXPECT_EQ(pool_cgroups(base, c->pid()).size(), 1u) << "the pool's processes are in a cgroup";
  Output o = c->wait(60);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(marked(mark_).empty()) << marked(mark_).size() << " escapees outlived the run";
  EXPECT_TRUE(pool_cgroups(base, c->pid()).empty()) << "the run's cgroups are removed";
}

TEST_F(Reaper, CgroupEndsEscapeesAfterTheirWorkerWasKilled) {
  std::string why;
  const fs::path base = skyforge::local::cgroup::usable_base(why);
  if (base.empty()) GTEST_SKIP() << why;
  auto c = start_skyforge({"run", manifest("sleep 300").string()});
  ASSERT_TRUE(c->wait_for_output("[node 0] up", 30));
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 30));
  ASSERT_EQ(pool_cgroups(base, c->pid()).size(), 1u);
  // 2 nodes x (setsid sleep, the daemon's sleep, `sleep 300`); the command's own shell has no
  // mark in its environ (it was exported after exec).
  ASSERT_TRUE(wait_marked(6)) << marked(mark_).size();
  for (pid_t w : workers()) ::kill(w, SIGKILL);
  Output o = c->wait(60);
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("lost"), std::string::npos) << o.err;
  EXPECT_TRUE(marked(mark_).empty()) << marked(mark_).size() << " escapees outlived their workers";
  EXPECT_TRUE(pool_cgroups(base, c->pid()).empty()) << "the run's cgroups are removed";
}

TEST_F(Reaper, WithoutCgroupsTheWorkerEndsWhatItInheritedAtTheJobsEnd) {
  extra_env_["SKYFORGE_CGROUP"] = "off";
  std::string why;
  const fs::path base = skyforge::local::cgroup::usable_base(why);
  auto c = start_skyforge({"run", manifest("sleep 0.5").string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 30));
  if (!base.empty()) {
    EXPECT_TRUE(pool_cgroups(base, c->pid()).empty()) << "SKYFORGE_CGROUP=off makes none";
  }
  Output o = c->wait(60);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(marked(mark_).empty()) << marked(mark_).size() << " escapees outlived the run";
}

TEST_F(Reaper, WithoutCgroupsTheWorkerEndsWhatItInheritedWhenTheRunIsStopped) {
  // Ctrl-C: the host's shutdown reaches the worker, which kills its descendants before it goes.
  extra_env_["SKYFORGE_CGROUP"] = "off";
  auto c = start_skyforge({"run", manifest("sleep 300").string()});
  ASSERT_TRUE(c->wait_for_output("[node 0] up", 30));
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 30));
  ASSERT_TRUE(wait_marked(6)) << marked(mark_).size();
  c->signal(SIGINT);
  Output o = c->wait(60);
  EXPECT_EQ(o.exit_code, 130) << o.err;
  EXPECT_TRUE(marked(mark_).empty()) << marked(mark_).size() << " escapees outlived the run";
}

}  // namespace
