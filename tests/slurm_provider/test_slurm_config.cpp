// The slurm provider's configuration and parsing, checked without a cluster (the real-cluster
// tests are in test_slurm_e2e.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <unistd.h>
#include <sys/stat.h>
#include <functional>

#include "provider_options.hpp"
#include "slurm_provider.hpp"

namespace skyforge::slurm {
namespace {

using test::error_of;
using test::options;

// The stage directories' program, run for real with sh as the nodes run it.
struct StageDirs : ::testing::Test {
  void SetUp() override {
    std::string t = std::filesystem::temp_directory_path().string() + "/sf-stage-XXXXXX";
    ASSERT_NE(::mkdtemp(t.data()), nullptr);
    root = t;
    ASSERT_EQ(::chmod(root.c_str(), 01777), 0);  // like /tmp
  }
  void TearDown() override { std::filesystem::remove_all(root); }
  // sh -c PROGRAM sh POOL DIRS...: exit status, stderr in `err`.
  int run(const std::string& pool, const std::vector<std::string>& dirs) {
    std::string program;
    for (char c : stage_dirs_program()) program += c == '\'' ? std::string("'\\''") : std::string(1, c);
    std::string cmd = "sh -c '" + program + "' sh '" + pool + "'";
    for (const auto& d : dirs) cmd += " '" + d + "'";
    cmd += " 2>" + root + "/err";
    const int st = std::system(cmd.c_str());
    std::ifstream f(root + "/err");
    err.assign(std::istreambuf_iterator<char>(f), {});
    return WEXITSTATUS(st);
  }
  std::string root, err;
};

TEST_F(StageDirs, MakesThePoolsDirectoryPrivate) {
  const std::string pool = root + "/skyforge-0123456789ab";
  ASSERT_EQ(run(pool, {pool + "/stage/usr/bin", pool + "/stage/opt"}), 0) << err;
  struct stat st {};
  ASSERT_EQ(::lstat(pool.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  ASSERT_EQ(::lstat((pool + "/stage/usr/bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);
  EXPECT_EQ(run(pool, {pool + "/stage/lib"}), 0) << "ours already (another node on a shared stage_dir): " << err;
}

TEST_F(StageDirs, RefusesADirectoryThatIsNotOursAlone) {
  const std::string pool = root + "/skyforge-0123456789ab";
  ASSERT_EQ(::mkdir(pool.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(pool.c_str(), 0777), 0);  // planted, open to all (an attacker's would also be theirs)
  EXPECT_EQ(run(pool, {pool + "/stage/x"}), 1);
  EXPECT_NE(err.find("is not this user's own 0700 directory"), std::string::npos) << err;
  EXPECT_NE(err.find("mode 777"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(pool + "/stage"));
  std::filesystem::remove(pool);
  ASSERT_EQ(::mkdir((root + "/elsewhere").c_str(), 0700), 0);
  ASSERT_EQ(::symlink((root + "/elsewhere").c_str(), pool.c_str()), 0);  // a symlink to a directory of ours
  EXPECT_EQ(run(pool, {pool + "/stage/x"}), 1) << err;
  EXPECT_FALSE(std::filesystem::exists(root + "/elsewhere/stage"));
  if (::geteuid() == 0) {  // another owner: chown is root's
    std::filesystem::remove(pool);
    ASSERT_EQ(::mkdir(pool.c_str(), 0700), 0);
    ASSERT_EQ(::chown(pool.c_str(), 65534, 65534), 0);
    EXPECT_EQ(run(pool, {pool + "/stage/x"}), 1);
    EXPECT_NE(err.find("owner nobody"), std::string::npos) << err;
  }
}

TEST(SlurmOptions, BecomeSbatchOptions) {
  auto c = SlurmConfig::from(options({{"partition", "gpu"}, {"time_limit", "1:30:00"}, {"account", "ml"}, {"qos", "high"},
                                      {"constraint", "a100"}, {"gres", "gpu:1"}, {"extra_sbatch_args", "--exclusive\n--mem=16G"}}));
  auto a = sbatch_args(c, 4, "abc123", "sleep 1");
  const std::vector<std::string> want = {"--parsable", "--job-name=skyforge-abc123", "--nodes=4", "--ntasks-per-node=1",
                                         "--output=/dev/null", "--error=/dev/null", "--partition=gpu", "--time=1:30:00",
                                         "--account=ml", "--qos=high", "--constraint=a100", "--gres=gpu:1", "--exclusive",
                                         "--mem=16G", "--wrap=sleep 1"};
  EXPECT_EQ(a, want);
  auto d = SlurmConfig::from(options({}));
  EXPECT_EQ(d.queue_timeout_s, 600);
  EXPECT_EQ(d.stage_dir, "/tmp");
  EXPECT_EQ(sbatch_args(d, 2, "p", "x").size(), 7u) << "no option the manifest did not set";
}

// Spare nodes are allocated beside the pool's, and a node that fails must not end the job.
TEST(SlurmOptions, SpareNodesComeWithTheAllocationAndNoKill) {
  auto c = SlurmConfig::from(options({{"spare_nodes", "1"}}));
  EXPECT_EQ(c.spare_nodes, 1u);
  auto a = sbatch_args(c, 2, "p", "x");
  EXPECT_NE(std::find(a.begin(), a.end(), "--nodes=3"), a.end());
  EXPECT_NE(std::find(a.begin(), a.end(), "--no-kill"), a.end());
  auto none = sbatch_args(SlurmConfig::from(options({})), 2, "p", "x");
  EXPECT_EQ(std::find(none.begin(), none.end(), "--no-kill"), none.end());
}

TEST(SlurmOptions, BadValuesAreRefusedNamingTheOption) {
  EXPECT_NE(error_of([] { SlurmConfig::from(options({{"time_limit", "an hour"}})); }).find("option 'time_limit'"), std::string::npos);
  EXPECT_NE(error_of([] { SlurmConfig::from(options({{"queue_timeout", "0"}})); }).find("option 'queue_timeout'"), std::string::npos);
  EXPECT_NE(error_of([] { SlurmConfig::from(options({{"stage_dir", "tmp"}})); }).find("option 'stage_dir'"), std::string::npos);
  EXPECT_NE(error_of([] { SlurmConfig::from(options({{"spare_nodes", "-1"}})); }).find("option 'spare_nodes'"), std::string::npos);
  EXPECT_NE(error_of([] { SlurmConfig::from(options({{"spare_nodes", "65"}})); }).find("option 'spare_nodes'"), std::string::npos);
  EXPECT_NE(error_of([] { SlurmConfig::from(options({{"extra_sbatch_args", "exclusive"}})); }).find("extra_sbatch_args"),
            std::string::npos);
  for (const char* ok : {"30", "1:00:00", "2-12:00:00", "UNLIMITED"})
    EXPECT_EQ(error_of([&] { SlurmConfig::from(options({{"time_limit", ok}})); }), "") << ok;
}

TEST(SlurmNodes, AddressesFromScontrol) {
  auto m = node_addresses(
      "NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.201.0.2 NodeHostName=n1 Version=22.05.8\n"
      "NodeName=n2 Arch=x86_64 NodeAddr=10.201.0.3 NodeHostName=n2\n");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m["n1"], "10.201.0.2");
  EXPECT_EQ(m["n2"], "10.201.0.3");
}

}  // namespace
}  // namespace skyforge::slurm
