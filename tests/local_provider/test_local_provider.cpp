// Tests of the local provider, driving the class directly with real processes, real
// directories and (as root) real network namespaces, bridges and veth pairs.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "cgroup.hpp"
#include "gpus.hpp"
#include "local_provider.hpp"
#include "netns.hpp"
#include "provider_options.hpp"
#include "spawn.hpp"
#include "../support/read_text.hpp"

namespace fs = std::filesystem;
using skyforge::local::LocalProvider;
using namespace std::chrono_literals;
using skyforge::test::read_text;

namespace {

// Orphaned grandchildren of a worker are re-parented to this process (not to an init that may
// not reap), so the provider's group reaping can be checked for zombies too.
class Subreaper : public ::testing::Environment {
 public:
  void SetUp() override { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }
};
const auto* const kSubreaper = ::testing::AddGlobalTestEnvironment(new Subreaper);

std::string unique_pool_id() {
  static std::atomic<int> n{0};
  return "t" + std::to_string(::getpid()) + "x" + std::to_string(n++);
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

bool wait_for(const std::function<bool()>& cond, std::chrono::milliseconds limit = 5000ms) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return cond();
}

bool process_exists(pid_t pid) { return fs::exists("/proc/" + std::to_string(pid)); }

// Every process (zombies included) whose process group is `pg`.
std::vector<pid_t> group_members(pid_t pg) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::string stat = read_text(e.path() / "stat");
    auto rp = stat.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream in(stat.substr(rp + 2));
    std::string state;
    long ppid = 0, pgrp = 0;
    in >> state >> ppid >> pgrp;
    if (pgrp == pg) out.push_back(std::stoi(name));
  }
  return out;
}

// Collects what a provider writes to a bootstrap log sink.
struct Lines {
  std::vector<std::string> lines;
  sf_sink sink() {
    return sf_sink{this, [](void* c, const char* d, size_t n) {
                     std::string l(d, n);
                     if (!l.empty() && l.back() == '\n') l.pop_back();
                     static_cast<Lines*>(c)->lines.push_back(l);
                   }};
  }
};

class LocalProviderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string base = fs::temp_directory_path() / "skyforge-local-test-XXXXXX";
    std::vector<char> buf(base.begin(), base.end());
    buf.push_back('\0');
    ASSERT_NE(::mkdtemp(buf.data()), nullptr);
    root_ = buf.data();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  std::unique_ptr<LocalProvider> make(std::map<std::string, std::string> opts = {}) {
    if (!opts.count("work_root")) opts["work_root"] = root_.string();
    skyforge::Context ctx{skyforge::Host(), skyforge::test::options(opts)};
    return std::make_unique<LocalProvider>(ctx);
  }
  skyforge::Provisioned provision(LocalProvider& p, uint32_t nodes) {
    skyforge::PoolSpec spec;
    spec.nodes = nodes;
    spec.pool_id = unique_pool_id();
    return p.provision(spec);
  }
  fs::path root_;
};

// ---- without isolation ----------------------------------------------------------------------

TEST_F(LocalProviderTest, ProvisionMakesPrivateDirectoriesAndIds) {
  auto p = make();
  auto pool = provision(*p, 3);
  ASSERT_EQ(pool.nodes.size(), 3u);
  EXPECT_EQ(pool.control_address, "127.0.0.1");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(pool.nodes[i].id, "node-" + std::to_string(i));
    EXPECT_EQ(pool.nodes[i].address, "127.0.0.1");
    fs::path d = p->node_dir(pool.nodes[i].id);
    EXPECT_TRUE(fs::is_directory(d)) << d;
    EXPECT_EQ(d.parent_path(), p->pool_dir());
  }
  struct stat sb {};
  ASSERT_EQ(::stat(p->pool_dir().c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0700u);
  EXPECT_EQ(p->pool_dir().filename().string().rfind("skyforge-", 0), 0u);
  fs::path dir = p->pool_dir();
  p->terminate({"node-0", "node-1", "node-2"});
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_NO_THROW(p->terminate({"node-0", "node-1", "node-2"}));  // idempotent
  EXPECT_NO_THROW(p->terminate({}));
  EXPECT_EQ(p->worker_alive("node-0"), 0);
  EXPECT_EQ(p->worker_alive("node-9"), -1);
}

TEST_F(LocalProviderTest, TerminateBeforeProvisionAndAfterFailedProvisionIsFine) {
  auto p = make();
  EXPECT_NO_THROW(p->terminate({}));
  EXPECT_NO_THROW(p->terminate({"node-0"}));
  skyforge::PoolSpec bad;
  bad.nodes = 2;
  bad.pool_id = "../escape";
  EXPECT_THROW(p->provision(bad), skyforge::Error);
  bad.pool_id = unique_pool_id();
  bad.nodes = 0;
  EXPECT_THROW(p->provision(bad), skyforge::Error);
  EXPECT_TRUE(fs::is_empty(root_));
}

TEST_F(LocalProviderTest, PoolDirectoryCollisionIsRefusedAndLeavesItAlone) {
  auto p = make();
  skyforge::PoolSpec spec;
  spec.nodes = 1;
  spec.pool_id = unique_pool_id();
  fs::create_directory(root_ / ("skyforge-" + spec.pool_id));
  fs::path marker = root_ / ("skyforge-" + spec.pool_id) / "mine";
  std::ofstream(marker) << "x";
  try {
    p->provision(spec);
    FAIL() << "provision reused an existing directory";
  } catch (const skyforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("File exists"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(marker));
}

TEST_F(LocalProviderTest, WorkerGetsEnvironmentWorkDirSessionAndNoLeakedFds) {
  auto p = make();
  auto pool = provision(*p, 2);
  // An fd without O_CLOEXEC in the host must not reach the worker.
  int leaky = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(leaky, 0);
  const std::string secret = "s3cr3t-token-value";
  p->start_worker("node-1",
                  {"/bin/sh", "-c", "echo \"$SECRET_VAR\" > out; pwd > cwd; echo to-log; exec sleep 100"},
                  {{"SECRET_VAR", secret}});
  ::close(leaky);
  fs::path dir = p->node_dir("node-1");
  ASSERT_TRUE(wait_for([&] { return trim(read_text(dir / "cwd")) == dir.string(); })) << read_text(dir / "cwd");
  EXPECT_EQ(trim(read_text(dir / "out")), secret);
  EXPECT_TRUE(wait_for([&] { return read_text(dir / "worker.log").find("to-log") != std::string::npos; }));
  pid_t pid = p->worker_pid("node-1");
  ASSERT_GT(pid, 0);
  EXPECT_EQ(::getsid(pid), pid) << "the worker must lead its own session";
  EXPECT_EQ(::getpgid(pid), pid);
  // The host's PATH etc. are inherited too.
  ASSERT_TRUE(wait_for([&] { return read_text("/proc/" + std::to_string(pid) + "/cmdline").rfind("sleep", 0) == 0; }));
  std::string environ = read_text("/proc/" + std::to_string(pid) + "/environ");
  EXPECT_NE(environ.find("SECRET_VAR=" + secret), std::string::npos);
  if (const char* path = std::getenv("PATH")) {
    EXPECT_NE(environ.find(std::string("PATH=") + path), std::string::npos);
  }
  EXPECT_EQ(read_text("/proc/" + std::to_string(pid) + "/cmdline").find(secret), std::string::npos);
  // Right after exec the dynamic loader and sleep's own startup hold an fd of their own for a
  // moment (a shared library, the locale archive); a leaked fd stays for the process's life.
  std::set<std::string> fds;
  std::string links;
  auto only_std_fds = [&] {
    fds.clear();
    links.clear();
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
      fds.insert(e.path().filename());
      links += e.path().filename().string() + " -> " + fs::read_symlink(e.path(), ec).string() + "\n";
    }
    return fds == std::set<std::string>{"0", "1", "2"};
  };
  EXPECT_TRUE(wait_for(only_std_fds)) << links;
  EXPECT_EQ(p->worker_alive("node-1"), 1);
  EXPECT_EQ(p->worker_alive("node-0"), 0);  // never started

  auto t0 = std::chrono::steady_clock::now();
  p->terminate({"node-0", "node-1"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "sleep dies on SIGTERM: no grace period needed";
  EXPECT_FALSE(process_exists(pid));
  EXPECT_FALSE(fs::exists(p->pool_dir()));
}

TEST_F(LocalProviderTest, WorkerAliveGoesFromOneToZeroAndKeepsTheExitCode) {
  auto p = make();
  provision(*p, 1);
  p->start_worker("node-0", {"sh", "-c", "sleep 0.3; exit 7"}, {});
  EXPECT_EQ(p->worker_alive("node-0"), 1);
  ASSERT_TRUE(wait_for([&] { return p->worker_alive("node-0") == 0; }));
  pid_t pid = p->worker_pid("node-0");
  EXPECT_FALSE(process_exists(pid)) << "reaped, not a zombie";
  EXPECT_EQ(p->worker_exit_code("node-0"), 7);
  EXPECT_EQ(p->worker_alive("nope"), -1);
  p->terminate({});
}

// worker_exit (ABI 1.2): how the worker ended and the last line of its stderr (worker.log).
TEST_F(LocalProviderTest, WorkerExitGivesTheSignalOrStatusAndTheLastLineOfItsStderr) {
  auto p = make();
  provision(*p, 2);
  p->start_worker("node-0", {"sh", "-c", "echo first >&2; echo 'dying now' >&2; sleep 0.2; kill -SEGV $$"}, {});
  p->start_worker("node-1", {"sh", "-c", "sleep 0.2; exit 7"}, {});
  skyforge::Provider::WorkerExit e;
  EXPECT_EQ(p->worker_exit("node-0", e), 0);  // still running
  ASSERT_TRUE(wait_for([&] { return p->worker_exit("node-0", e) == 1; }));
  EXPECT_EQ(e.signal, SIGSEGV);
  EXPECT_EQ(e.exit_code, -1);
  EXPECT_EQ(e.last_words, "dying now");
  skyforge::Provider::WorkerExit f;
  ASSERT_TRUE(wait_for([&] { return p->worker_exit("node-1", f) == 1; }));
  EXPECT_EQ(f.signal, 0);
  EXPECT_EQ(f.exit_code, 7);
  EXPECT_EQ(f.last_words, "");
  EXPECT_EQ(p->worker_exit("node-9", f), -1);
  p->terminate({});
}

TEST_F(LocalProviderTest, TerminateKillsAGroupThatIgnoresSigterm) {
  auto p = make();
  provision(*p, 1);
  // The shell and its background child both ignore SIGTERM (ignored signals survive exec).
  p->start_worker("node-0", {"/bin/sh", "-c", "trap '' TERM; sleep 1000 & echo $! > grandchild; wait; sleep 1000"},
                  {});
  fs::path dir = p->node_dir("node-0");
  ASSERT_TRUE(wait_for([&] { return !trim(read_text(dir / "grandchild")).empty(); }));
  pid_t worker = p->worker_pid("node-0");
  pid_t grandchild = std::stoi(read_text(dir / "grandchild"));
  EXPECT_EQ(::getpgid(grandchild), worker);
  auto t0 = std::chrono::steady_clock::now();
  p->terminate({"node-0"});
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 2900ms) << "SIGTERM gets its grace period";
  EXPECT_LT(took, 6s);
  EXPECT_FALSE(process_exists(worker));
  EXPECT_FALSE(process_exists(grandchild));
  EXPECT_TRUE(group_members(worker).empty());
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_FALSE(fs::exists(p->pool_dir()));
  EXPECT_EQ(p->worker_exit_code("node-0"), 128 + SIGKILL);
  EXPECT_NO_THROW(p->terminate({"node-0"}));
}

TEST_F(LocalProviderTest, DestructorTearsDownWhatIsLeft) {
  pid_t pid;
  fs::path dir;
  {
    auto p = make();
    provision(*p, 1);
    p->start_worker("node-0", {"sleep", "100"}, {});
    pid = p->worker_pid("node-0");
    dir = p->pool_dir();
  }
  EXPECT_FALSE(process_exists(pid));
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(LocalProviderTest, KeepWorkdirsKeepsThem) {
  auto p = make({{"keep_workdirs", "true"}});
  provision(*p, 1);
  p->bootstrap("node-0", "echo kept > kept.txt", Lines().sink());
  fs::path dir = p->node_dir("node-0");
  std::string failure;  // with the directory kept, a failed bootstrap names its log, which stays
  try {
    p->bootstrap("node-0", "echo broken; exit 4", Lines().sink());
  } catch (const skyforge::Error& e) {
    failure = e.what();
  }
  EXPECT_NE(failure.find("(full log: " + (dir / "bootstrap.log").string() + ")"), std::string::npos) << failure;
  p->terminate({});
  EXPECT_EQ(trim(read_text(dir / "kept.txt")), "kept");
  EXPECT_NE(read_text(dir / "bootstrap.log").find("broken"), std::string::npos);
}

TEST_F(LocalProviderTest, StartWorkerErrorsAreClear) {
  auto p = make();
  provision(*p, 1);
  try {
    p->start_worker("node-0", {"/nonexistent/skyforge-worker"}, {{"SKYFORGE_POOL_SECRET", "hush"}});
    FAIL();
  } catch (const skyforge::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cannot execute '/nonexistent/skyforge-worker'"), std::string::npos) << m;
    EXPECT_NE(m.find("No such file"), std::string::npos) << m;
    EXPECT_EQ(m.find("hush"), std::string::npos) << "secrets never appear in messages";
  }
  EXPECT_THROW(p->start_worker("node-5", {"true"}, {}), skyforge::Error);
  EXPECT_THROW(p->start_worker("node-0", {}, {}), skyforge::Error);
  p->start_worker("node-0", {"sleep", "100"}, {});
  EXPECT_THROW(p->start_worker("node-0", {"sleep", "100"}, {}), skyforge::Error) << "one worker per node";
  p->terminate({});
  EXPECT_THROW(p->start_worker("node-0", {"true"}, {}), skyforge::Error) << "terminated";
}

// ---- bootstrap --------------------------------------------------------------------------------

TEST_F(LocalProviderTest, BootstrapStreamsEveryLineInOrder) {
  auto p = make();
  provision(*p, 2);
  Lines out;
  p->bootstrap("node-1", "echo one\necho two >&2\npwd\nprintf 'no newline at the end'", out.sink());
  ASSERT_EQ(out.lines.size(), 4u);
  EXPECT_EQ(out.lines[0], "one");
  EXPECT_EQ(out.lines[1], "two");
  EXPECT_EQ(out.lines[2], p->node_dir("node-1").string());
  EXPECT_EQ(out.lines[3], "no newline at the end");
  EXPECT_TRUE(fs::exists(p->node_dir("node-1") / "bootstrap.sh"));
  EXPECT_NE(read_text(p->node_dir("node-1") / "bootstrap.log").find("two"), std::string::npos);
  p->terminate({});
}

TEST_F(LocalProviderTest, BootstrapFailureQuotesTheStatusAndLastLines) {
  auto p = make();
  provision(*p, 1);
  Lines out;
  try {
    p->bootstrap("node-0", "echo preparing\necho 'apt: package not found' >&2\nexit 3\necho unreachable", out.sink());
    FAIL();
  } catch (const skyforge::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("node-0"), std::string::npos) << m;
    EXPECT_NE(m.find("exit status 3"), std::string::npos) << m;
    EXPECT_NE(m.find("apt: package not found"), std::string::npos) << m;
    EXPECT_EQ(m.find("unreachable"), std::string::npos) << m;
    // The log goes with the work directory at teardown: no path to a file that will be gone.
    EXPECT_EQ(m.find("full log: /"), std::string::npos) << m;
    EXPECT_NE(m.find("keep_workdirs = true keeps it"), std::string::npos) << m;
  }
  EXPECT_EQ(out.lines, (std::vector<std::string>{"preparing", "apt: package not found"}));
  // set -e, -u and pipefail are in force.
  EXPECT_THROW(p->bootstrap("node-0", "false\necho after", Lines().sink()), skyforge::Error);
  EXPECT_THROW(p->bootstrap("node-0", "echo \"$SKYFORGE_SURELY_UNSET_VAR\"", Lines().sink()), skyforge::Error);
  EXPECT_THROW(p->bootstrap("node-0", "false | true", Lines().sink()), skyforge::Error);
  try {
    p->bootstrap("node-0", "kill -9 $$", Lines().sink());
    FAIL();
  } catch (const skyforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("killed by signal 9"), std::string::npos) << e.what();
  }
  p->terminate({});
}

TEST_F(LocalProviderTest, BootstrapDaemonDoesNotBlockAndDiesAtTerminate) {
  auto p = make();
  provision(*p, 1);
  Lines out;
  auto t0 = std::chrono::steady_clock::now();
  // The background sleep keeps the output pipe open; bootstrap must return when bash exits.
  p->bootstrap("node-0", "sleep 1000 &\necho $! > daemon.pid\necho started", out.sink());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_EQ(out.lines, (std::vector<std::string>{"started"}));
  pid_t daemon = std::stoi(read_text(p->node_dir("node-0") / "daemon.pid"));
  EXPECT_TRUE(process_exists(daemon));
  p->terminate({});
  EXPECT_FALSE(process_exists(daemon));
}

// ---- cgroups: what left the worker's process group ------------------------------------------
// A `setsid` child and a double-forked daemon (cwd /) escape every process-group kill. Each
// node's processes live in a cgroup of their own, which teardown kills as one and removes. The
// processes are found by a mark in their environment (`SF_REAP_MARK=<unique>`), wherever their
// working directory is.

std::string unique_mark() {
  static std::atomic<int> n{0};
  return std::to_string(::getpid()) + "-" + std::to_string(n++) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

// Live processes whose environment holds SF_REAP_MARK=<mark> (a zombie's environment reads empty).
std::vector<pid_t> marked(const std::string& mark) {
  std::string needle = "SF_REAP_MARK=" + mark;
  needle.push_back('\0');
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    if (read_text(e.path() / "environ").find(needle) != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

// Starts two escapees in the background: `setsid sleep 1000 &` and a double fork into `/`.
const char* kEscapees =
    "setsid sleep 1000 & "
    "sh -c 'cd /; setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > \"$0\"' \"$PWD/daemon.pid\" & ";

#define REQUIRE_CGROUP(p)                                                                          \
  do {                                                                                             \
    if ((p).pool_cgroup().empty()) GTEST_SKIP() << "no cgroup v2 here: " << (p).cgroup_off_reason(); \
  } while (0)

TEST_F(LocalProviderTest, CgroupKillsWhatLeftTheGroupAfterTheWorkerWasKilled) {
  auto p = make();
  provision(*p, 2);
  REQUIRE_CGROUP(*p);
  const fs::path pool_cg = p->pool_cgroup(), node_cg = p->node_cgroup("node-1");
  EXPECT_TRUE(fs::is_directory(node_cg / "worker"));
  EXPECT_EQ(node_cg.parent_path(), pool_cg);
  const std::string mark = unique_mark();
  p->start_worker("node-1", {"/bin/sh", "-c", std::string(kEscapees) + "exec sleep 1000"}, {{"SF_REAP_MARK", mark}});
  const pid_t worker = p->worker_pid("node-1");
  // The worker (sleep, once exec'd) and the two escapees.
  ASSERT_TRUE(wait_for([&] { return marked(mark).size() == 3 && fs::exists(p->node_dir("node-1") / "daemon.pid"); }))
      << marked(mark).size();
  EXPECT_TRUE(wait_for([&] { return read_text(node_cg / "worker" / "cgroup.procs").find(std::to_string(worker)) != std::string::npos; }));
  ::kill(worker, SIGKILL);
  ASSERT_TRUE(wait_for([&] { return p->worker_alive("node-1") == 0; }));
  auto escapees = marked(mark);
  ASSERT_EQ(escapees.size(), 2u) << "the escapees outlive their worker until teardown";
  for (pid_t e : escapees) EXPECT_NE(::getpgid(e), worker) << "left the worker's group";
  p->terminate({});
  EXPECT_TRUE(marked(mark).empty());
  for (pid_t e : escapees) EXPECT_FALSE(process_exists(e)) << e << " (reaped, not a zombie either)";
  EXPECT_FALSE(fs::exists(node_cg));
  EXPECT_FALSE(fs::exists(pool_cg)) << "the test's cgroups are removed";
}

TEST_F(LocalProviderTest, CgroupOfABootstrapIsKilledAtTerminate) {
  auto p = make();
  provision(*p, 1);
  REQUIRE_CGROUP(*p);
  const std::string mark = unique_mark();
  Lines out;
  p->bootstrap("node-0", "export SF_REAP_MARK=" + mark + "\n" + kEscapees + "\necho started", out.sink());
  ASSERT_TRUE(wait_for([&] { return fs::exists(p->node_dir("node-0") / "daemon.pid") && marked(mark).size() == 2; }))
      << marked(mark).size();
  const fs::path pool_cg = p->pool_cgroup();
  p->terminate({});
  EXPECT_TRUE(marked(mark).empty());
  EXPECT_FALSE(fs::exists(pool_cg));
}

TEST_F(LocalProviderTest, CgroupLeftoversOfAnEarlierWorkerGoBeforeTheNextStarts) {
  // A restart ([job] max_restarts) starts the node's worker again: what the last one left goes first.
  auto p = make();
  provision(*p, 1);
  REQUIRE_CGROUP(*p);
  const std::string mark = unique_mark();
  p->start_worker("node-0", {"/bin/sh", "-c", std::string(kEscapees) + "while [ ! -s daemon.pid ]; do sleep 0.01; done"}, {{"SF_REAP_MARK", mark}});
  ASSERT_TRUE(wait_for([&] { return p->worker_alive("node-0") == 0; }));
  ASSERT_TRUE(wait_for([&] { return marked(mark).size() == 2; })) << marked(mark).size();
  const std::string mark2 = unique_mark();
  p->start_worker("node-0", {"sleep", "1000"}, {{"SF_REAP_MARK", mark2}});
  EXPECT_TRUE(marked(mark).empty());
  EXPECT_EQ(marked(mark2).size(), 1u);
  p->terminate({});
  EXPECT_TRUE(marked(mark2).empty());
}

TEST_F(LocalProviderTest, CgroupsOfAHostThatIsGoneAreRemovedByTheNextPool) {
  // A host killed with SIGKILL never tears down: its empty cgroups go at the next provision.
  std::string why;
  const fs::path base = skyforge::local::cgroup::usable_base(why);
  if (base.empty()) GTEST_SKIP() << "no cgroup v2 here: " << why;
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const fs::path stale = base / ("skyforge-" + unique_pool_id() + "-" + std::to_string(dead));
  const fs::path live = base / ("skyforge-" + unique_pool_id() + "-" + std::to_string(::getpid()));
  skyforge::local::cgroup::make(stale);
  skyforge::local::cgroup::make(stale / "node-0");
  skyforge::local::cgroup::make(live);
  auto p = make();
  provision(*p, 1);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live)) << "its host (this process) lives";
  p->terminate({});
  EXPECT_EQ(skyforge::local::cgroup::remove(live), "");
  EXPECT_EQ(skyforge::local::cgroup::remove(stale), "");
}

TEST_F(LocalProviderTest, CgroupOffByEnvironmentForTestsAndSystemsWhereItMustNotBeUsed) {
  ::setenv("SKYFORGE_CGROUP", "off", 1);
  auto p = make();
  provision(*p, 1);
  ::unsetenv("SKYFORGE_CGROUP");
  EXPECT_TRUE(p->pool_cgroup().empty());
  EXPECT_TRUE(p->node_cgroup("node-0").empty());
  EXPECT_EQ(p->cgroup_off_reason(), "SKYFORGE_CGROUP=off");
  p->start_worker("node-0", {"sleep", "1000"}, {});
  p->terminate({});
}

// ---- network namespaces ------------------------------------------------------------------------

std::string run_out(const std::vector<std::string>& argv) { return skyforge::providers::run_command(argv).out; }

// Why netns tests cannot run here, or "" when they can.
std::string netns_unavailable() {
  if (::geteuid() != 0) return "isolation = \"netns\" tests need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)";
  if (skyforge::providers::find_program("ip").empty()) return "iproute2 (`ip`) is not installed";
  std::string probe = "skyforge-probe-" + std::to_string(::getpid());
  auto r = skyforge::providers::run_command({"ip", "netns", "add", probe});
  if (r.status != 0) return "`ip netns add` does not work here: " + r.err;
  skyforge::providers::run_command({"ip", "netns", "del", probe});
  return "";
}

#define REQUIRE_NETNS()                                  \
  do {                                                   \
    std::string why = netns_unavailable();               \
    if (!why.empty()) GTEST_SKIP() << why;               \
  } while (0)

// A listening TCP socket created inside the named network namespace (it stays there).
int listen_in_netns(const std::string& ns, uint16_t& port) {
  int fd = -1;
  std::thread t([&] {
    int nsfd = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (nsfd < 0 || ::setns(nsfd, CLONE_NEWNET) != 0) return;
    ::close(nsfd);
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 4) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(fd);
      fd = -1;
      return;
    }
    port = ntohs(a.sin_port);
  });
  t.join();
  return fd;
}

// Accepts one connection within 10 s, reads what the peer sends until EOF or a newline, and
// answers "pong\n".
std::string accept_one(int lfd) {
  pollfd p{lfd, POLLIN, 0};
  if (::poll(&p, 1, 10000) != 1) return "<no connection>";
  int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) return "<accept failed>";
  std::string got;
  char ch;
  while (::read(c, &ch, 1) == 1 && ch != '\n') got.push_back(ch);
  ssize_t w = ::write(c, "pong\n", 5);
  (void)w;
  ::close(c);
  return got;
}

std::set<std::string> link_names() {
  std::set<std::string> names;
  std::istringstream in(run_out({"ip", "-o", "link", "show"}));
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string idx, name;
    ls >> idx >> name;
    names.insert(name.substr(0, name.find_first_of("@:")));
  }
  return names;
}

TEST_F(LocalProviderTest, NetnsNodesGetTheirOwnAddressesAndReachEachOtherAndTheHost) {
  REQUIRE_NETNS();
  auto p = make({{"isolation", "netns"}});
  auto pool = provision(*p, 3);
  std::string subnet = p->subnet();
  ASSERT_EQ(subnet.rfind("10.200.", 0), 0u) << subnet;
  std::string prefix = subnet.substr(0, subnet.size() - std::string("0/24").size());
  EXPECT_EQ(pool.control_address, prefix + "1");
  std::vector<std::string> netns;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(pool.nodes[i].address, prefix + std::to_string(2 + i));
    netns.push_back(p->netns_name(pool.nodes[i].id));
    Lines out;
    p->bootstrap(pool.nodes[i].id, "ip -o -4 addr show", out.sink());
    std::string all;
    for (auto& l : out.lines) all += l + "\n";
    EXPECT_NE(all.find("inet " + pool.nodes[i].address + "/24"), std::string::npos) << all;
    for (int j = 0; j < 3; ++j)
      if (j != i) {
        EXPECT_EQ(all.find("inet " + prefix + std::to_string(2 + j) + "/"), std::string::npos) << all;
      }
  }

  // Node 1 -> a listener in node 0's namespace, with bash's /dev/tcp.
  uint16_t port = 0;
  int lfd = listen_in_netns(netns[0], port);
  ASSERT_GE(lfd, 0);
  std::string got;
  std::thread acceptor([&] { got = accept_one(lfd); });
  Lines out;
  p->bootstrap("node-1",
               "exec 3<>/dev/tcp/" + pool.nodes[0].address + "/" + std::to_string(port) +
                   "\necho hello-from-node-1 >&3\nread -r reply <&3\necho \"got $reply\"",
               out.sink());
  acceptor.join();
  ::close(lfd);
  EXPECT_EQ(got, "hello-from-node-1");
  EXPECT_EQ(out.lines, (std::vector<std::string>{"got pong"}));

  // The host (root namespace) -> a listener in node 2's namespace.
  lfd = listen_in_netns(netns[2], port);
  ASSERT_GE(lfd, 0);
  acceptor = std::thread([&] { got = accept_one(lfd); });
  int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, pool.nodes[2].address.c_str(), &a.sin_addr);
  ASSERT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  ASSERT_EQ(::write(c, "from-host\n", 10), 10);
  char reply[5] = {};
  EXPECT_EQ(::read(c, reply, 5), 5);
  ::close(c);
  acceptor.join();
  ::close(lfd);
  EXPECT_EQ(got, "from-host");
  EXPECT_EQ(std::string(reply, 5), "pong\n");

  // A worker runs inside its node's namespace, and reaches the host at the control address.
  uint16_t host_port = 0;
  int hfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ::inet_pton(AF_INET, pool.control_address.c_str(), &a.sin_addr);
  a.sin_port = 0;
  ASSERT_EQ(::bind(hfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(hfd, 4), 0);
  socklen_t len = sizeof a;
  ::getsockname(hfd, reinterpret_cast<sockaddr*>(&a), &len);
  host_port = ntohs(a.sin_port);
  acceptor = std::thread([&] { got = accept_one(hfd); });
  p->start_worker("node-2",
                  {"bash", "-c",
                   "ip -o -4 addr show dev eth0 > addr; exec 3<>/dev/tcp/" + pool.control_address + "/" +
                       std::to_string(host_port) + "; echo \"worker $NODE_TAG\" >&3; exec sleep 100"},
                  {{"NODE_TAG", "two"}});
  acceptor.join();
  ::close(hfd);
  EXPECT_EQ(got, "worker two");
  EXPECT_NE(read_text(p->node_dir("node-2") / "addr").find(pool.nodes[2].address + "/24"), std::string::npos);

  std::string bridge = p->bridge_name();
  EXPECT_TRUE(link_names().count(bridge));
  EXPECT_LE(bridge.size(), 15u);
  p->terminate({"node-0", "node-1", "node-2"});
  std::string ns_list = run_out({"ip", "netns", "list"});
  for (auto& n : netns) EXPECT_EQ(ns_list.find(n), std::string::npos) << ns_list;
  auto links = link_names();
  EXPECT_FALSE(links.count(bridge));
  std::string tag = bridge.substr(0, bridge.size() - 3);  // veths share the bridge's prefix
  for (auto& l : links) EXPECT_NE(l.rfind(tag, 0), 0u) << "left behind: " << l;
  std::string addrs = run_out({"ip", "-o", "-4", "addr", "show"});
  EXPECT_EQ(addrs.find(pool.control_address + "/24"), std::string::npos);
  EXPECT_NO_THROW(p->terminate({"node-0", "node-1", "node-2"}));
}

TEST_F(LocalProviderTest, NetnsConcurrentPoolsGetDifferentSubnetsAndNames) {
  REQUIRE_NETNS();
  auto a = make({{"isolation", "netns"}});
  auto b = make({{"isolation", "netns"}});
  skyforge::Provisioned pa, pb;
  std::thread ta([&] { pa = provision(*a, 2); });
  std::thread tb([&] { pb = provision(*b, 2); });
  ta.join();
  tb.join();
  ASSERT_EQ(pa.nodes.size(), 2u);
  ASSERT_EQ(pb.nodes.size(), 2u);
  EXPECT_NE(a->subnet(), b->subnet());
  EXPECT_NE(a->bridge_name(), b->bridge_name());
  EXPECT_NE(pa.control_address, pb.control_address);
  EXPECT_NE(a->netns_name("node-0"), b->netns_name("node-0"));
  std::string ba = a->bridge_name(), bb = b->bridge_name();
  a->terminate({});
  b->terminate({});
  auto links = link_names();
  EXPECT_FALSE(links.count(ba));
  EXPECT_FALSE(links.count(bb));
}

TEST_F(LocalProviderTest, NetnsFailureHalfWayUndoesEverything) {
  REQUIRE_NETNS();
  skyforge::PoolSpec spec;
  spec.nodes = 3;
  spec.pool_id = unique_pool_id();
  // Only this pool's links and namespaces: other tests may make their own meanwhile (ctest -j).
  const std::string prefix = skyforge::local::NetnsPool::link_prefix(spec.pool_id);
  auto pool_links = [&] {
    std::set<std::string> mine;
    for (const auto& l : link_names())
      if (l.rfind(prefix, 0) == 0) mine.insert(l);
    return mine;
  };
  auto pool_namespaces = [&] {
    std::set<std::string> mine;
    std::istringstream in(run_out({"ip", "netns", "list"}));
    for (std::string line; std::getline(in, line);)
      if (line.find(spec.pool_id) != std::string::npos) mine.insert(line.substr(0, line.find(' ')));
    return mine;
  };
  ASSERT_TRUE(pool_links().empty());
  ASSERT_TRUE(pool_namespaces().empty());
  // Node 1's namespace name is already taken: provision gets as far as node 0, then fails.
  std::string squatter = "skyforge-" + spec.pool_id + "-node-1";
  ASSERT_EQ(skyforge::providers::run_command({"ip", "netns", "add", squatter}).status, 0);
  auto p = make({{"isolation", "netns"}});
  try {
    p->provision(spec);
    ADD_FAILURE() << "provision should have failed";
  } catch (const skyforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find(squatter + " already exists"), std::string::npos) << e.what();
  }
  skyforge::providers::run_command({"ip", "netns", "del", squatter});
  EXPECT_EQ(pool_links(), std::set<std::string>{});
  EXPECT_EQ(pool_namespaces(), std::set<std::string>{});
  EXPECT_TRUE(fs::is_empty(root_));
  EXPECT_NO_THROW(p->terminate({}));
}

TEST_F(LocalProviderTest, NetnsWithoutPrivilegesIsRefusedWithAClearMessage) {
  if (::geteuid() != 0) {
    // Already unprivileged: check directly.
    try {
      make({{"isolation", "netns"}});
      FAIL();
    } catch (const skyforge::Error& e) {
      EXPECT_NE(std::string(e.what()).find("isolation = \"none\""), std::string::npos) << e.what();
    }
    return;
  }
  // As root: drop to nobody in a child process and try there.
  int pfd[2];
  ASSERT_EQ(::pipe2(pfd, O_CLOEXEC), 0);
  std::string root = root_.string();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pfd[0]);
    std::string msg = "<no error>";
    if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) {
      msg = "<cannot drop privileges>";
    } else {
      try {
        LocalProvider lp(skyforge::Context{skyforge::Host(), skyforge::test::options({{"isolation", "netns"}, {"work_root", root}})});
      } catch (const skyforge::Error& e) {
        msg = e.what();
      }
    }
    ssize_t w = ::write(pfd[1], msg.data(), msg.size());
    (void)w;
    ::_exit(0);
  }
  ::close(pfd[1]);
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pfd[0], buf, sizeof buf)) > 0) msg.append(buf, size_t(n));
  ::close(pfd[0]);
  int st;
  ::waitpid(pid, &st, 0);
  EXPECT_NE(msg.find("needs root"), std::string::npos) << msg;
  EXPECT_NE(msg.find("isolation = \"none\""), std::string::npos) << msg;
}

}  // namespace

// ---- GPU placement (gpus.hpp): pure, then through provision + start_worker ----------------

TEST(LocalGpus, VisibleGpusHonourCudaVisibleDevicesElseCountTheDriversGpus) {
  using skyforge::local::visible_gpus;
  auto v = visible_gpus("GPU-a, GPU-b,3");
  EXPECT_EQ(v.ids, (std::vector<std::string>{"GPU-a", "GPU-b", "3"}));
  EXPECT_EQ(v.source, "CUDA_VISIBLE_DEVICES=GPU-a, GPU-b,3");
  EXPECT_FALSE(v.pci_order);  // the user's list, in the user's CUDA_DEVICE_ORDER
  EXPECT_EQ(visible_gpus("0,1,,2").ids, (std::vector<std::string>{"0", "1"}));  // CUDA stops at the gap
  EXPECT_TRUE(visible_gpus("").ids.empty());                                   // set but empty: none

  char tmpl[] = "/tmp/skyforge-gpus-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path driver = tmpl;
  for (const char* bus : {"0000:07:00.0", "0000:0f:00.0", "0000:47:00.0"}) fs::create_directory(driver / bus);
  v = visible_gpus(nullptr, driver);
  EXPECT_EQ(v.ids, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(v.source, driver.string() + " lists 3");
  EXPECT_TRUE(v.pci_order);  // the driver names its GPUs by PCI bus id
  fs::remove_all(driver);
  v = visible_gpus(nullptr, driver);
  EXPECT_TRUE(v.ids.empty());
  EXPECT_EQ(v.source, "CUDA_VISIBLE_DEVICES is unset and " + driver.string() + " does not exist (no NVIDIA driver)");
}

TEST(LocalGpus, EachNodeGetsItsOwnShareOrProvisionFailsNamingWhatIsMissing) {
  using skyforge::parse_accelerator;
  using skyforge::local::place_gpus;
  using skyforge::local::VisibleGpus;
  const VisibleGpus four{{"GPU-a", "GPU-b", "GPU-c", "GPU-d"}, "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b,GPU-c,GPU-d"};
  auto placed = place_gpus(parse_accelerator("A100:2"), "A100:2", 2, four);
  EXPECT_EQ(placed.per_node, (std::vector<std::string>{"GPU-a,GPU-b", "GPU-c,GPU-d"}));
  EXPECT_EQ(placed.warning, "");
  EXPECT_EQ(place_gpus(parse_accelerator("cuda"), "cuda", 3, four).per_node,
            (std::vector<std::string>{"GPU-a", "GPU-b", "GPU-c"}));
  // No accelerator, or MIG devices (the mig plugin places those): nothing is set.
  EXPECT_EQ(place_gpus(parse_accelerator(""), "", 2, four).per_node, (std::vector<std::string>{"", ""}));
  EXPECT_EQ(place_gpus(parse_accelerator("A100(mig=3g.40gb)"), "A100(mig=3g.40gb)", 2, VisibleGpus{}).per_node,
            (std::vector<std::string>{"", ""}));
  // A machine with no GPU at all: nothing is set, and the warning says why.
  placed = place_gpus(parse_accelerator("H100:8"), "H100:8", 1, VisibleGpus{{}, "CUDA_VISIBLE_DEVICES="});
  EXPECT_EQ(placed.per_node, (std::vector<std::string>{""}));
  EXPECT_EQ(placed.warning, "local provider: [pool] accelerator = \"H100:8\" asks for 8 GPUs per node, and this "
                            "machine offers none (CUDA_VISIBLE_DEVICES=); CUDA_VISIBLE_DEVICES left as it is");
  try {
    place_gpus(parse_accelerator("A100:2"), "A100:2", 3, four);
    ADD_FAILURE() << "6 GPUs out of 4";
  } catch (const skyforge::Error& e) {
    EXPECT_EQ(e.status(), SF_ERR_INVALID);
    EXPECT_STREQ(e.what(),
                 "local provider: [pool] accelerator = \"A100:2\" asks for 2 GPUs per node, 6 for 3 nodes; this "
                 "machine offers 4 (CUDA_VISIBLE_DEVICES=GPU-a,GPU-b,GPU-c,GPU-d)");
  }
}

