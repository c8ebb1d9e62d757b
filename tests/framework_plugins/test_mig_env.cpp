// The mig plugin's device mapping against recorded `nvidia-smi -L` listings (data/).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "../support/env_map.hpp"
#include "mig_env.hpp"

using namespace skyforge::mig;
using skyforge::test::as_map;

namespace {

std::string listing(const std::string& name) {
  std::ifstream f(std::string(FW_TEST_DATA) + "/" + name);
  EXPECT_TRUE(f.good()) << name;
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(MigParse, A100WithTwo3g40gbInstances) {
  auto gpus = parse_nvidia_smi_list(listing("a100_80gb_2x3g.40gb.txt"));
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].index, 0u);
  EXPECT_EQ(gpus[0].name, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(gpus[0].uuid, "GPU-6513270e-269e-4d37-b2a7-4de452e6b438");
  ASSERT_EQ(gpus[0].migs.size(), 2u);
  EXPECT_EQ(gpus[0].migs[0].profile, "3g.40gb");
  EXPECT_EQ(gpus[0].migs[0].uuid, "MIG-d23f0824-128b-4f33-8c5c-7fd0a6a3a450");
  EXPECT_EQ(gpus[0].migs[1].index, 1u);
  EXPECT_EQ(gpus[0].migs[1].uuid, "MIG-9531985d-5d9d-49f8-9818-e811892f902b");
}

TEST(MigParse, EightH100sWithoutMig) {
  auto gpus = parse_nvidia_smi_list(listing("h100_8gpu.txt"));
  ASSERT_EQ(gpus.size(), 8u);
  for (uint32_t i = 0; i < 8; ++i) {
    EXPECT_EQ(gpus[i].index, i);
    EXPECT_EQ(gpus[i].name, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(gpus[i].uuid.rfind("GPU-", 0), 0u);
    EXPECT_TRUE(gpus[i].migs.empty());
  }
}

TEST(MigParse, LegacyDriverUuidsAndNoDevices) {
  auto gpus = parse_nvidia_smi_list(listing("a100_40gb_r470_legacy.txt"));
  ASSERT_EQ(gpus.size(), 2u);
  ASSERT_EQ(gpus[1].migs.size(), 2u);
  EXPECT_EQ(gpus[1].migs[1].uuid, "MIG-GPU-830e07bc-1e39-4f10-92bd-4acefaecbd38/2/0");
  EXPECT_EQ(gpus[1].migs[1].profile, "3g.20gb");
  EXPECT_TRUE(parse_nvidia_smi_list(listing("no_devices.txt")).empty());
  EXPECT_TRUE(parse_nvidia_smi_list("").empty());
  EXPECT_THROW(parse_nvidia_smi_list("  MIG 1g.5gb Device 0: (UUID: MIG-x)\n"), std::invalid_argument);
}

TEST(MigDevices, ProfileSelectsExactlyThoseInstances) {
  auto gpus = parse_nvidia_smi_list(listing("a100_mixed_3gpu.txt"));
  auto d = machine_devices(gpus, "1g.10gb");
  ASSERT_EQ(d.size(), 7u) << "1g.10gb+me is another profile";
  EXPECT_EQ(d[0], "MIG-92276658-1e27-41c0-8a6a-63ec24ede6a4");
  EXPECT_EQ(machine_devices(gpus, "4g.40gb"), (std::vector<std::string>{"MIG-c7a2ea20-b2f1-4c94-ae05-319acb5c7427"}));
  try {
    machine_devices(gpus, "3g.40gb");
    FAIL() << "no 3g.40gb on this box";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("1g.10gb, 1g.10gb+me, 2g.20gb, 4g.40gb"), std::string::npos) << e.what();
  }
  EXPECT_THROW(machine_devices(parse_nvidia_smi_list(listing("h100_8gpu.txt")), "1g.10gb"), std::invalid_argument);
}

TEST(MigDevices, WithoutAProfileWholeGpusAndTheMigDevicesOfMigGpus) {
  auto gpus = parse_nvidia_smi_list(listing("a100_mixed_3gpu.txt"));
  auto d = machine_devices(gpus, "");
  ASSERT_EQ(d.size(), 7u + 1u + 3u);
  EXPECT_EQ(d[7], "GPU-ec66a787-95e7-41d1-b731-af10506bf2ef");
  EXPECT_EQ(machine_devices(parse_nvidia_smi_list(listing("h100_8gpu.txt")), "").size(), 8u);
}

TEST(MigShare, NodesOnOneMachineGetEqualContiguousDisjointShares) {
  std::vector<std::string> d = {"a", "b", "c", "d", "e", "f", "g", "h"};
  EXPECT_EQ(node_share(d, 0, 2), (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(node_share(d, 1, 2), (std::vector<std::string>{"e", "f", "g", "h"}));
  // 8 over 3: two each, "g" and "h" unused, so every node runs as many processes.
  EXPECT_EQ(node_share(d, 0, 3), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(node_share(d, 1, 3), (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(node_share(d, 2, 3), (std::vector<std::string>{"e", "f"}));
  EXPECT_EQ(node_share(d, 0, 1), d);
  EXPECT_THROW(node_share({"a"}, 1, 2), std::invalid_argument);
  EXPECT_THROW(node_share(d, 2, 2), std::invalid_argument);
}

TEST(MigEnv, A100TwoMigDevicesOneNodeTwoProcesses) {
  auto gpus = parse_nvidia_smi_list(listing("a100_80gb_2x3g.40gb.txt"));
  auto env = as_map(environment(node_share(machine_devices(gpus, "3g.40gb"), 0, 1), 1));
  const std::string a = "MIG-d23f0824-128b-4f33-8c5c-7fd0a6a3a450", b = "MIG-9531985d-5d9d-49f8-9818-e811892f902b";
  const std::map<std::string, std::string> expected = {
      {"CUDA_VISIBLE_DEVICES", a + "," + b}, {"SKYFORGE_MIG_DEVICES", a + " " + b},
      {"SKYFORGE_LOCAL_DEVICES", "2"},       {"SKYFORGE_FANOUT_DEVICES", a + " " + b},
      {"SKYFORGE_FANOUT_NPROC", "2"},
  };
  EXPECT_EQ(env, expected);
}

TEST(MigEnv, A100TwoMigDevicesTwoNodesOnTheMachineOneEach) {
  auto all = machine_devices(parse_nvidia_smi_list(listing("a100_80gb_2x3g.40gb.txt")), "3g.40gb");
  auto n0 = as_map(environment(node_share(all, 0, 2), 1));
  auto n1 = as_map(environment(node_share(all, 1, 2), 1));
  EXPECT_EQ(n0["CUDA_VISIBLE_DEVICES"], "MIG-d23f0824-128b-4f33-8c5c-7fd0a6a3a450");
  EXPECT_EQ(n1["CUDA_VISIBLE_DEVICES"], "MIG-9531985d-5d9d-49f8-9818-e811892f902b");
  EXPECT_EQ(n0.count("SKYFORGE_FANOUT_NPROC"), 0u) << "one process: no fan-out";
  EXPECT_EQ(n0["SKYFORGE_LOCAL_DEVICES"], "1");
}

TEST(MigEnv, EightGpusTwoWorkersPerDevice) {
  auto all = machine_devices(parse_nvidia_smi_list(listing("h100_8gpu.txt")), "");
  auto env = as_map(environment(all, 2));
  EXPECT_EQ(env["SKYFORGE_FANOUT_NPROC"], "16");
  EXPECT_EQ(env["SKYFORGE_LOCAL_DEVICES"], "16");
  auto words = [](const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string w; ss >> w;) out.push_back(w);
    return out;
  };
  auto per = words(env["SKYFORGE_FANOUT_DEVICES"]);
  ASSERT_EQ(per.size(), 16u);
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(per[i], all[i / 2]);
  EXPECT_EQ(words(env["SKYFORGE_MIG_DEVICES"]), all);
  EXPECT_THROW(environment({}, 1), std::invalid_argument);
  EXPECT_THROW(environment(all, 0), std::invalid_argument);
}

}  // namespace
