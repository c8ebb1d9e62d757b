// The ssh provider end to end: the real `skyforge` binary against real OpenSSH servers, one per
// network namespace (sshd_hosts.hpp). Each test makes its own two hosts and fails when a run
// leaves anything behind: a process (here or on a host), a node directory, a file in its TMPDIR.
#include <gtest/gtest.h>

#include <pwd.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "process.hpp"
#include "provider_e2e.hpp"
#include "provider_run_test.hpp"
#include "sshd_hosts.hpp"

namespace skyforge::test {
namespace {

class SshE2E : public ProviderRunTest {
 protected:
  SshE2E() : ProviderRunTest("skyforge-ssh-e2e") {}

  void SetUp() override {
    if (auto why = SshdHosts::unavailable(); !why.empty()) GTEST_SKIP() << "no real sshd hosts here: " << why;
    SkyforgeRunTest::SetUp();
    hosts_ = std::make_unique<SshdHosts>(root_ / "hosts", 2);
    remote_ = root_ / "remote";
  }
  void TearDown() override {
    if (!hosts_) return;
    if (!root_.empty()) {
      for (int i = 0; i < 100 && !processes_mentioning(tmp_.string()).empty(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      for (pid_t p : processes_mentioning(tmp_.string())) {
        ADD_FAILURE() << "process left behind: " << p << " (" << comm_of(p) << ")";
        ::kill(p, SIGKILL);
      }
      for (int i = 0; i < 100 && !entries_of(remote_ / "pools").empty(); ++i)  // the hosts' watchdogs
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      EXPECT_TRUE(entries_of(remote_ / "pools").empty()) << "a node directory was left on a host: "
                                                         << entries_of(remote_ / "pools")[0];
    }
    SkyforgeRunTest::TearDown();
    hosts_.reset();
  }

  // The [pool] and [provider] of an ssh pool on the test's hosts.
  std::string ssh_pool(int nodes, int slots = 1, const std::string& provider_extra = "",
                       const std::string& pool_extra = "") const {
    return "[pool]\nprovider = \"ssh\"\nnodes = " + std::to_string(nodes) + "\n" + pool_extra +
           "\n[provider]\nhosts = " + hosts_->hosts_toml() + "\nslots_per_host = " + std::to_string(slots) +
           "\nssh_config = \"" + hosts_->ssh_config().string() + "\"\nremote_dir = \"" + remote_.string() + "\"\n" +
           provider_extra + "\n";
  }
  // The store's files and their identity: a file copied again gets a new inode.
  std::map<std::string, ino_t> store() const {
    std::map<std::string, ino_t> files;
    std::error_code ec;
    for (auto& e : fs::directory_iterator(remote_ / "store", ec)) {
      struct stat sb {};
      ::stat(e.path().c_str(), &sb);
      files[e.path().filename().string()] = sb.st_ino;
    }
    return files;
  }
  std::unique_ptr<SshdHosts> hosts_;
  fs::path remote_;
};

TEST_F(SshE2E, HelloRunsOnEveryHostAndLeavesNothing) {
  Output o = run("hello.toml", ssh_pool(4, 2) + "[job]\napp = \"hello\"\nmode = \"broadcast\"\n" + outputs_round_trip());
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  for (int n = 0; n < 4; ++n)
    EXPECT_NE(o.out.find("hello from node " + std::to_string(n) + " of 4"), std::string::npos) << o.out;
  // Nodes 0-1 on the first host, 2-3 on the second: each reports its host's address.
  std::regex ip(R"(\[node (\d)\] => node \d/4 host=\S+ ip=(\S+) head=(\S+))");
  std::map<int, std::string> ips;
  for (std::sregex_iterator it(o.out.begin(), o.out.end(), ip), e; it != e; ++it) {
    ips[std::stoi((*it)[1])] = (*it)[2];
    EXPECT_EQ((*it)[3], hosts_->addresses()[0]) << "the head is node 0, on the first host";
  }
  ASSERT_EQ(ips.size(), 4u) << o.out;
  EXPECT_EQ(ips[0], hosts_->addresses()[0]);
  EXPECT_EQ(ips[1], hosts_->addresses()[0]);
  EXPECT_EQ(ips[2], hosts_->addresses()[1]);
  EXPECT_EQ(ips[3], hosts_->addresses()[1]);
  EXPECT_FALSE(store().empty()) << "the worker and the plugins were copied to the hosts' store";
  expect_outputs_back(o, 4);
}

TEST_F(SshE2E, SecondRunCopiesNothingAlreadyThere) {
  const std::string m = ssh_pool(2) + "[job]\napp = \"hello\"\n";
  ASSERT_EQ(run("a.toml", m).exit_code, 0);
  auto first = store();
  ASSERT_GE(first.size(), 3u) << "skyforge-worker, the hello plugin and its plugin.toml";
  Output o = run("b.toml", m);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(store(), first) << "same files, same inodes: nothing was copied again";
}

TEST_F(SshE2E, MapJobGivesTheResultsItGivesOnLocal) {
  expect_map_results_as_local(ssh_pool(2, 1, "", "concurrency = 2\n"));
}

// The main job, [pool] changed only: the same trained weights on both providers.
TEST_F(SshE2E, FashionMnistOnTwoHostsTrainsTheWeightsLocalTrains) { expect_fashion_mnist_as_local(ssh_pool(2)); }

// A real PyTorch DDP command app (the torch plugin's env:// rendezvous across the two hosts).
TEST_F(SshE2E, TorchDdpAcrossTwoHostsTrainsTheWeightsLocalTrains) {
  expect_torch_ddp_as_local(ssh_pool(2), FW_TEST_SCRIPTS);
}

// ---- what the host must refuse ----------------------------------------------------------------

TEST_F(SshE2E, ARefusedKeyFailsNamingTheHostAndTearsDownTheOthers) {
  // A client configuration with a key no host accepts.
  auto conf = write("stranger_config", "Host *\n  UserKnownHostsFile " + hosts_->known_hosts().string() +
                                           "\n  IdentityFile " + hosts_->stranger_key().string() +
                                           "\n  IdentitiesOnly yes\n  User root\n");
  std::string m = ssh_pool(2) + "[job]\napp = \"hello\"\n";
  m = std::regex_replace(m, std::regex("ssh_config = \"[^\"]*\""), "ssh_config = \"" + conf.string() + "\"");
  Output o = run("refused.toml", m, 60);
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("ssh host '" + hosts_->addresses()[0] + "'"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("refused the key"), std::string::npos) << o.err;
  EXPECT_LT(o.seconds, 15) << "within connect_timeout";
}

TEST_F(SshE2E, AChangedHostKeyFailsNamingTheHost) {
  // known_hosts says host 1 has another key (a reinstalled host, or someone in between).
  std::string known = read_text(hosts_->known_hosts());
  std::ifstream pub(hosts_->stranger_key().string() + ".pub");
  std::string type, key;
  pub >> type >> key;
  std::istringstream lines(known);
  std::string rewritten;
  for (std::string l; std::getline(lines, l);)
    rewritten += (l.rfind(hosts_->addresses()[1] + " ", 0) == 0 ? hosts_->addresses()[1] + " " + type + " " + key : l) + "\n";
  std::ofstream(hosts_->known_hosts()) << rewritten;
  Output o = run("changed.toml", ssh_pool(2) + "[job]\napp = \"hello\"\n", 60);
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("ssh host '" + hosts_->addresses()[1] + "'"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("host key has changed"), std::string::npos) << o.err;
}

TEST_F(SshE2E, AnUnknownHostKeyIsRefusedUnlessAcceptNew) {
  std::ofstream(hosts_->known_hosts()).close();  // nothing known
  Output strict = run("strict.toml", ssh_pool(2) + "[job]\napp = \"hello\"\n", 60);
  EXPECT_EQ(strict.exit_code, 1) << strict.err;
  EXPECT_NE(strict.err.find("not in known_hosts"), std::string::npos) << strict.err;
  Output accept = run("accept.toml", ssh_pool(2, 1, "strict_host_keys = \"accept-new\"\n") + "[job]\napp = \"hello\"\n", 60);
  EXPECT_EQ(accept.exit_code, 0) << accept.err;
  const std::string known = read_text(hosts_->known_hosts());
  for (const auto& a : hosts_->addresses()) EXPECT_NE(known.find(a), std::string::npos) << "recorded on first contact";
}

TEST_F(SshE2E, AnUnreachableHostFailsWithinConnectTimeoutNamingIt) {
  // Host 1's address on a port nothing listens on: refused at once, on the test's own bridge.
  std::string m = ssh_pool(2, 1, "connect_timeout = 5\n") + "[job]\napp = \"hello\"\n";
  const std::string h1 = hosts_->addresses()[1];
  m = std::regex_replace(m, std::regex("\"" + std::regex_replace(h1, std::regex("\\."), "\\.") + "\""), "\"" + h1 + ":2\"");
  Output o = run("unreachable.toml", m, 60);
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("ssh host '" + h1 + ":2'"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("unreachable"), std::string::npos) << o.err;
  EXPECT_LT(o.seconds, 5 + 5) << "connect_timeout and its margin";
}

TEST_F(SshE2E, TooFewHostsForTheNodesIsABadManifest) {
  Output o = run("small.toml", ssh_pool(3) + "[job]\napp = \"hello\"\n", 60);
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE(o.err.find("3 nodes asked for"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("room for 2"), std::string::npos) << o.err;
}

// ---- the pool secret, and what survives faults ---------------------------------------------

TEST_F(SshE2E, ThePoolSecretNeverAppearsOnACommandLine) {
  auto c = start_skyforge({"run", write("sleep.toml", ssh_pool(2) + "[job]\ncommand = [\"sh\", \"-c\", \"echo up; exec sleep 30\"]\n").string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 60));
  // Each worker got it in its environment (and wiped it there once read)...
  int workers = 0;
  for (pid_t p : processes_under(remote_)) {
    if (comm_of(p) != "skyforge-worker") continue;
    ++workers;
    std::ifstream f("/proc/" + std::to_string(p) + "/environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(env.find(std::string("SKYFORGE_POOL_SECRET=") + '\0'), std::string::npos);
  }
  EXPECT_EQ(workers, 2);
  // ...and no process on this machine (ssh clients, sshd, shells, workers) carries a secret's
  // 64 hex digits on its command line.
  std::regex secret("[0-9a-f]{64}");
  for (auto& e : fs::directory_iterator("/proc")) {
    std::ifstream f(e.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_FALSE(std::regex_search(cmd, secret)) << e.path() << ": " << cmd;
  }
  c->signal(SIGINT);
  EXPECT_EQ(c->wait(60).exit_code, 130);
}

// Another local user races for the ControlMaster sockets (issue 33): a process of `nobody`
// (mux_thief.cpp) watches the command lines and binds unix sockets where a client of the
// provider would look, in a TMPDIR as usual (1777): in the masters' directory, and the old
// predictable names $TMPDIR/skyforge-ssh-<pool>-h<i>. The sockets live in a private directory
// (0700, ours), so it can bind none of those, the old names are never looked at, and nothing of
// the run ever connects to it: the run works, and neither the sessions' input nor the pool
// secret reach it. (Before, it bound the old names before the masters did and took the sessions.)
TEST_F(SshE2E, AnotherUserCannotTakeTheControlSockets) {
  const passwd* nobody = ::getpwnam("nobody");
  ASSERT_NE(nobody, nullptr) << "no user `nobody` here";
  ASSERT_EQ(::chmod(root_.c_str(), 0711), 0);
  ASSERT_EQ(::chmod(tmp_.c_str(), 01777), 0);
  const fs::path report = root_ / "thief.report";
  Child thief({MUX_THIEF_BIN, tmp_.string(), report.string(), std::to_string(nobody->pw_uid),
               std::to_string(nobody->pw_gid)},
              {});
  for (int i = 0; i < 200 && read_text(report).find("ready") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  ASSERT_NE(read_text(report).find("ready uid=" + std::to_string(nobody->pw_uid)), std::string::npos) << read_text(report);

  Output o = run("hello.toml", ssh_pool(4, 2) + "[job]\napp = \"hello\"\nmode = \"broadcast\"\n");
  thief.signal(SIGTERM);
  const Output t = thief.wait(300);  // counted from its start
  const std::string r = read_text(report);
  EXPECT_EQ(t.exit_code, 0) << t.err << r;
  EXPECT_EQ(o.exit_code, 0) << o.err;
  for (int n = 0; n < 4; ++n)
    EXPECT_NE(o.out.find("hello from node " + std::to_string(n) + " of 4"), std::string::npos) << o.out;
  // It saw both masters' control paths, in a directory of the run's own, and tried them...
  const std::regex seen("seen " + tmp_.string() + "/skyforge-ssh-[A-Za-z0-9]{6}/h([01])\n");
  std::set<std::string> hosts;
  for (std::sregex_iterator it(r.begin(), r.end(), seen), e; it != e; ++it) hosts.insert((*it)[1]);
  EXPECT_EQ(hosts.size(), 2u) << r;
  EXPECT_TRUE(std::regex_search(r, std::regex("denied " + tmp_.string() + "/skyforge-ssh-[A-Za-z0-9]{6}/h0 Permission denied")))
      << r;
  // ...and held the old predictable names once the pool's id showed (the sessions' command lines)...
  EXPECT_TRUE(std::regex_search(r, std::regex("bound " + tmp_.string() + "/skyforge-ssh-[0-9a-f]{12}-h0\n"))) << r;
  // ...but bound nothing in the run's directory, and nothing connected to it.
  EXPECT_FALSE(std::regex_search(r, std::regex("bound " + tmp_.string() + "/skyforge-ssh-[A-Za-z0-9]{6}/"))) << r;
  EXPECT_EQ(r.find("connected "), std::string::npos) << r;
  EXPECT_EQ(r.find("stole "), std::string::npos) << r;
  EXPECT_EQ(r.find("secret"), std::string::npos) << r;
}

// What a node leaves on its host is the user's alone (issue 33): remote_dir (an older run's
// 0755 one too), its store and pools, the pool's and the node's directories 0700, the agent's
// files (setup.sh, bootstrap.sh, the pid files) 0600 — made under umask 077 — while the workers
// run with the login's own umask.
TEST_F(SshE2E, ANodesDirectoryAndFilesAreTheUsersAlone) {
  fs::create_directories(remote_ / "store");
  ASSERT_EQ(::chmod(remote_.c_str(), 0755), 0);
  ASSERT_EQ(::chmod((remote_ / "store").c_str(), 0755), 0);
  const mode_t login_umask = ::umask(022);
  ::umask(login_umask);
  auto c = start_skyforge({"run", write("sleep.toml", ssh_pool(2) + "[job]\ncommand = [\"sh\", \"-c\", \"echo up; exec sleep 30\"]\n").string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 60));
  auto octal = [](mode_t m) {
    char b[8];
    std::snprintf(b, sizeof b, "0%o", unsigned(m));
    return std::string(b);
  };
  auto mode = [](const fs::path& p) {
    struct stat sb {};
    EXPECT_EQ(::lstat(p.c_str(), &sb), 0) << p;
    return sb.st_mode;
  };
  for (const fs::path& d : {remote_, remote_ / "store", remote_ / "pools"}) EXPECT_EQ(octal(mode(d) & 07777), "0700") << d;
  const auto pools = entries_of(remote_ / "pools");
  ASSERT_EQ(pools.size(), 1u);
  const fs::path pool = remote_ / "pools" / pools[0];
  EXPECT_EQ(octal(mode(pool) & 07777), "0700") << pool;
  for (const char* node : {"node-0", "node-1"}) {
    const fs::path dir = pool / node;
    EXPECT_TRUE(S_ISDIR(mode(dir))) << dir;
    EXPECT_EQ(octal(mode(dir) & 07777), "0700") << dir;
    for (const char* f : {"setup.sh", "bootstrap.sh", "agent.pid", "worker.pid"}) {
      const mode_t m = mode(dir / f);
      EXPECT_TRUE(S_ISREG(m)) << dir / f;
      EXPECT_EQ(octal(m & 07777), "0600") << dir / f;
    }
    int staged = 0;
    for (auto& e : fs::recursive_directory_iterator(dir)) {  // links (into the store) not followed
      const mode_t m = mode(e.path());
      if (S_ISLNK(m)) {
        ++staged;
        continue;
      }
      EXPECT_EQ(m & 077, 0u) << e.path() << " is open to others: " << octal(m & 07777);
    }
    EXPECT_GE(staged, 1) << "the staged files";
  }
  int workers = 0;
  for (pid_t p : processes_under(remote_)) {
    if (comm_of(p) != "skyforge-worker") continue;
    ++workers;
    std::ifstream status("/proc/" + std::to_string(p) + "/status");
    std::string line, umask_of;
    while (std::getline(status, line))
      if (line.rfind("Umask:", 0) == 0) umask_of = line.substr(line.find_first_not_of(" \t", 6));
    char want[8];
    std::snprintf(want, sizeof want, "%04o", unsigned(login_umask));  // as /proc prints it
    EXPECT_EQ(umask_of, want) << "worker " << p;
  }
  EXPECT_EQ(workers, 2);
  c->signal(SIGINT);
  EXPECT_EQ(c->wait(60).exit_code, 130);
}

// A worker lost on its host ([job] max_restarts): the host's agent starts the next one in the same
// node directory, the job resumes from the head's last checkpoint, and the run ends with the
// weights and history of an uninterrupted run on the local provider, to the bit.
TEST_F(SshE2E, ALostWorkerRestartsOnItsHostAndTheRunEndsAsOnLocal) {
  expect_restarted_run_ends_as_local(
      ssh_pool(2), 120, [&](Child&) { kill_worker_of(remote_, 1); },
      expect_worker_restarted);
}

// A host that goes away ([job] max_restarts, a spare host listed): node 1's sshd is killed with
// its sessions mid-run; the restart finds no session to start a worker in, the provider moves
// node 1 to the third host (connected, checked, bootstrapped), and the run ends with the weights
// and history of an uninterrupted run on the local provider, to the bit.
TEST_F(SshE2E, ALostHostIsReplacedByASpareOneAtRestartAndTheRunEndsAsOnLocal) {
  hosts_.reset();
  hosts_ = std::make_unique<SshdHosts>(root_ / "hosts3", 3);
  expect_restarted_run_ends_as_local(
      ssh_pool(2), 120, [&](Child&) { hosts_->stop_sshd(1); },  // node 1's host
      [&](const Output& o) {
        EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(restart 1/1: node 1 cannot take a worker \(.*\); the 'ssh' provider gives it another machine)")))
            << o.err;
        EXPECT_NE(o.err.find("restart 1/1: node 1 replaced: now at " + hosts_->addresses()[2]), std::string::npos) << o.err;
        print_replacement(o.err);
        EXPECT_NE(o.out.find("[node 1] => "), std::string::npos) << o.out;
      });
}

// Without a spare host the restart fails saying what would have saved the run, and tears down.
TEST_F(SshE2E, ALostHostWithNoSpareFailsTheRestartSayingSo) {
  const fs::path out = root_ / "ssh";
  auto c = start_skyforge({"run", write("ssh.toml", faulty_training(ssh_pool(2), 1, out, 4)).string()});
  ASSERT_TRUE(wait_checkpoint(out, 1));
  hosts_->stop_sshd(1);
  Output o = c->wait(120);
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("no other host in `hosts` has a free slot"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("list a spare host to have a lost one replaced"), std::string::npos) << o.err;
}

TEST_F(SshE2E, AKilledHostLeavesNoWorkerAndNoNodeDirectory) {
  auto c = start_skyforge({"run", write("sleep.toml", ssh_pool(2) + "[job]\ncommand = [\"sh\", \"-c\", \"echo up; exec sleep 120\"]\n").string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 60));
  ASSERT_FALSE(processes_under(remote_).empty());
  c->signal(SIGKILL);
  c->wait(10);
  // Its ssh clients die with it; each host's watchdog stops its worker and removes the node's
  // directory (and, had the connections stayed up, each worker's lease would run out).
  auto left = wait_no_processes_under(remote_, 15);
  EXPECT_TRUE(left.empty()) << left.size() << " processes outlived the host on the hosts";
  for (int i = 0; i < 100 && !entries_of(remote_ / "pools").empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

TEST_F(SshE2E, AStoppedSshdFailsTheRunNamingItsNode) {
  auto c = start_skyforge({"run", write("sleep.toml", ssh_pool(2) + "[job]\ncommand = [\"sh\", \"-c\", \"echo up; exec sleep 120\"]\n").string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 60));
  const auto stopped = std::chrono::steady_clock::now();
  hosts_->stop_sshd(1);  // node 1's host
  Output o = c->wait(60);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("node 1"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("the ssh connection to host '" + hosts_->addresses()[1] + "' ended"), std::string::npos) << o.err;
  EXPECT_LT(took, 15) << "found within the heartbeat bound, the rest torn down";
  EXPECT_TRUE(wait_no_processes_under(remote_, 10).empty());
}

}  // namespace
}  // namespace skyforge::test
