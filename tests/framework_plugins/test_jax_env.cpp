// The jax plugin's pure environment for several (node, nodes, nproc) shapes.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>

#include "../support/env_map.hpp"
#include "jax_env.hpp"

using namespace skyforge::jax;
using skyforge::test::as_map;

namespace {

Settings cpu(uint16_t port = 41000) {
  Settings s;
  s.coordinator_host = "10.0.0.1";
  s.coordinator_port = port;
  return s;
}

TEST(JaxEnv, OneProcessPerNodeOnCpu) {
  for (uint32_t node = 0; node < 3; ++node) {
    auto env = as_map(environment({.node = node, .nodes = 3}, cpu()));
    const std::map<std::string, std::string> expected = {
        {"JAX_COORDINATOR_ADDRESS", "10.0.0.1:41000"},
        {"JAX_NUM_PROCESSES", "3"},
        {"JAX_PROCESS_ID", std::to_string(node)},
        {"JAX_LOCAL_DEVICE_COUNT", "1"},
    };
    EXPECT_EQ(env, expected);
  }
}

TEST(JaxEnv, CpuDevicesOptionSetsJaxNumCpuDevices) {
  Settings s = cpu();
  s.cpu_devices = 4;
  auto env = as_map(environment({.node = 1, .nodes = 2}, s));
  EXPECT_EQ(env["JAX_NUM_CPU_DEVICES"], "4");
  EXPECT_EQ(env["JAX_LOCAL_DEVICE_COUNT"], "4");
  s.local_devices = 8;  // a GPU node: the CPU option does not apply
  env = as_map(environment({.node = 1, .nodes = 2}, s));
  EXPECT_EQ(env.count("JAX_NUM_CPU_DEVICES"), 0u);
  EXPECT_EQ(env["JAX_LOCAL_DEVICE_COUNT"], "8");
}

TEST(JaxEnv, OneProcessPerGpuGivesContiguousIdsAndOneDeviceEach) {
  // 2 nodes x 4 processes; process i of node n is n*4+i after the fan-out adds i.
  Settings s = cpu();
  s.local_devices = 4;
  for (uint32_t node = 0; node < 2; ++node) {
    auto env = as_map(environment({.node = node, .nodes = 2, .nproc_per_node = 4}, s));
    EXPECT_EQ(env["JAX_NUM_PROCESSES"], "8");
    EXPECT_EQ(env["JAX_PROCESS_ID"], std::to_string(node * 4));
    EXPECT_EQ(env["JAX_LOCAL_DEVICE_COUNT"], "1");
    EXPECT_EQ(env["JAX_LOCAL_DEVICE_IDS"], "0");
    EXPECT_EQ(env["SKYFORGE_FANOUT_NPROC"], "4");
    EXPECT_EQ(env["SKYFORGE_FANOUT_ADD"], "JAX_PROCESS_ID JAX_LOCAL_DEVICE_IDS");
  }
}

TEST(JaxEnv, NodesSharingAMachineGetTheirOwnDeviceIds) {
  Settings s = cpu();
  s.local_devices = 8;
  auto env = as_map(environment({.node = 1, .nodes = 2, .machine_slot = 1, .machine_nodes = 2, .nproc_per_node = 4}, s));
  EXPECT_EQ(env["JAX_LOCAL_DEVICE_IDS"], "4");
  EXPECT_EQ(env["JAX_PROCESS_ID"], "4");
}

TEST(JaxEnv, MigDevicesPerProcessLeaveDeviceIdsAlone) {
  Settings s = cpu();
  s.local_devices = 2;
  s.per_process_devices = true;
  auto env = as_map(environment({.node = 0, .nodes = 1, .nproc_per_node = 2}, s));
  EXPECT_EQ(env.count("JAX_LOCAL_DEVICE_IDS"), 0u);
  EXPECT_EQ(env["SKYFORGE_FANOUT_ADD"], "JAX_PROCESS_ID");
}

TEST(JaxEnv, HookGoesFirstOnPythonpathAndIpv6IsBracketed) {
  Settings s = cpu();
  s.coordinator_host = "fd00::5";
  s.hook_dir = "/w/.skyforge/jax";
  s.pythonpath = "/opt/lib";
  auto env = as_map(environment({.node = 0, .nodes = 1}, s));
  EXPECT_EQ(env["JAX_COORDINATOR_ADDRESS"], "[fd00::5]:41000");
  EXPECT_EQ(env["PYTHONPATH"], "/w/.skyforge/jax:/opt/lib");
  s.pythonpath.clear();
  EXPECT_EQ(as_map(environment({.node = 0, .nodes = 1}, s))["PYTHONPATH"], "/w/.skyforge/jax");
}

TEST(JaxEnv, InconsistentPlacementsAreRefused) {
  EXPECT_THROW(environment({.node = 2, .nodes = 2}, cpu()), std::invalid_argument);
  EXPECT_THROW(environment({.node = 0, .nodes = 0}, cpu()), std::invalid_argument);
  EXPECT_THROW(environment({.node = 0, .nodes = 1, .nproc_per_node = 0}, cpu()), std::invalid_argument);
  EXPECT_THROW(environment({.node = 0, .nodes = 1, .machine_slot = 1, .machine_nodes = 1}, cpu()),
               std::invalid_argument);
}

TEST(JaxEnv, SitecustomizeRegistersAClusterEnvLazily) {
  const std::string& py = sitecustomize_source();
  EXPECT_NE(py.find("jax._src.clusters"), std::string::npos);
  EXPECT_NE(py.find("JAX_NUM_PROCESSES"), std::string::npos);
  EXPECT_NE(py.find("JAX_PROCESS_ID"), std::string::npos);
  EXPECT_FALSE(std::regex_search(py, std::regex(R"((^|\n)\s*(import|from)\s+jax)"))) << "must not import jax eagerly";
}

}  // namespace
