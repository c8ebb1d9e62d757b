// The slurm provider's configuration and parsing, checked without a cluster (the real-cluster
// tests are in test_slurm_e2e.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "slurm_provider.hpp"

namespace skyforge::slurm {
namespace {

Options options(std::map<std::string, std::string> kv) {
  std::vector<sf_kv> v;
  for (auto& [k, val] : kv) v.push_back({k.c_str(), val.c_str()});
  return Options(v.data(), v.size());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
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
