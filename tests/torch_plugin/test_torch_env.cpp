#include <gtest/gtest.h>

#include <map>
#include <set>
#include <stdexcept>

#include "../support/env_map.hpp"
#include "torch_env.hpp"

using namespace skyforge::torch;
using skyforge::test::as_map;

namespace {

TEST(TorchRanks, OneProcessPerNodeOneNodePerMachineIsTorchrunsLayout) {
  for (uint32_t node = 0; node < 4; ++node) {
    Ranks r = compute_ranks({.node = node, .nodes = 4});
    EXPECT_EQ(r.rank, node);
    EXPECT_EQ(r.world_size, 4u);
    EXPECT_EQ(r.group_rank, node);
    EXPECT_EQ(r.group_world_size, 4u);
    EXPECT_EQ(r.local_rank, 0u);
    EXPECT_EQ(r.local_world_size, 1u);
    EXPECT_EQ(r.nproc_per_node, 1u);
  }
}

TEST(TorchRanks, NodesSharingAMachineGetDistinctLocalRanks) {
  // The local provider: 4 nodes on one machine; each process must pick its own device.
  std::set<uint32_t> local;
  for (uint32_t node = 0; node < 4; ++node) {
    Ranks r = compute_ranks({.node = node, .nodes = 4, .machine_slot = node, .machine_nodes = 4});
    EXPECT_EQ(r.rank, node);
    EXPECT_EQ(r.local_world_size, 4u);
    local.insert(r.local_rank);
  }
  EXPECT_EQ(local, (std::set<uint32_t>{0, 1, 2, 3}));
}

TEST(TorchRanks, SeveralProcessesPerNodeCoverEveryRankExactlyOnce) {
  // The shape issue 4's nproc_per_node needs: 3 nodes x 4 processes, two nodes on one machine.
  const uint32_t nodes = 3, nproc = 4;
  const uint32_t slot[] = {0, 1, 0}, on_machine[] = {2, 2, 1};
  std::set<uint32_t> ranks;
  for (uint32_t node = 0; node < nodes; ++node) {
    std::set<uint32_t> local;
    for (uint32_t p = 0; p < nproc; ++p) {
      Ranks r = compute_ranks({.node = node, .nodes = nodes, .machine_slot = slot[node],
                               .machine_nodes = on_machine[node], .nproc_per_node = nproc}, p);
      EXPECT_EQ(r.world_size, nodes * nproc);
      EXPECT_EQ(r.group_rank, node);
      EXPECT_EQ(r.group_world_size, nodes);
      EXPECT_EQ(r.rank / nproc, node) << "ranks of a node are contiguous, as torchrun assigns them";
      EXPECT_EQ(r.local_world_size, on_machine[node] * nproc);
      EXPECT_LT(r.local_rank, r.local_world_size);
      EXPECT_TRUE(ranks.insert(r.rank).second) << "rank " << r.rank << " given twice";
      local.insert(r.local_rank);
    }
    EXPECT_EQ(local.size(), nproc);
  }
  EXPECT_EQ(ranks.size(), nodes * nproc);
  EXPECT_EQ(*ranks.rbegin(), nodes * nproc - 1);
}

TEST(TorchRanks, InconsistentPlacementsAreRefused) {
  EXPECT_THROW(compute_ranks({.node = 0, .nodes = 0}), std::invalid_argument);
  EXPECT_THROW(compute_ranks({.node = 4, .nodes = 4}), std::invalid_argument);
  EXPECT_THROW(compute_ranks({.node = 0, .nodes = 1, .machine_slot = 1, .machine_nodes = 1}), std::invalid_argument);
  EXPECT_THROW(compute_ranks({.node = 0, .nodes = 1, .machine_slot = 0, .machine_nodes = 0}), std::invalid_argument);
  EXPECT_THROW(compute_ranks({.node = 0, .nodes = 1, .nproc_per_node = 0}), std::invalid_argument);
  EXPECT_THROW(compute_ranks({.node = 0, .nodes = 1, .nproc_per_node = 2}, 2), std::invalid_argument);
  EXPECT_THROW(compute_ranks({.node = 0, .nodes = 1u << 20, .nproc_per_node = 1u << 13}), std::invalid_argument);
}

TEST(TorchBackend, AutoFollowsAcceleratorsAndExplicitChoicesWin) {
  EXPECT_EQ(resolve_backend("auto", 0), "gloo");
  EXPECT_EQ(resolve_backend("auto", 8), "nccl");
  EXPECT_EQ(resolve_backend("", 1), "nccl");
  EXPECT_EQ(resolve_backend("gloo", 8), "gloo");
  EXPECT_EQ(resolve_backend("nccl", 0), "nccl");
  EXPECT_THROW(resolve_backend("mpi", 0), std::invalid_argument);
}

TEST(TorchMasterPort, ZeroIsAutomaticAndOnlyTcpPortsAreAccepted) {
  EXPECT_EQ(parse_master_port(0), 0);
  EXPECT_EQ(parse_master_port(29500), 29500);
  EXPECT_EQ(parse_master_port(65535), 65535);
  EXPECT_THROW(parse_master_port(-1), std::invalid_argument);
  EXPECT_THROW(parse_master_port(65536), std::invalid_argument);
}

TEST(TorchEnvironment, HasEverythingEnvInitTorchrunAndABareTorchrunRead) {
  Ranks r = compute_ranks({.node = 1, .nodes = 2, .machine_slot = 1, .machine_nodes = 2});
  auto env = as_map(environment(r, Rendezvous{"10.0.0.5", 41234, "pool-abc"}, "gloo"));
  const std::map<std::string, std::string> expected = {
      {"MASTER_ADDR", "10.0.0.5"},   {"MASTER_PORT", "41234"},       {"WORLD_SIZE", "2"},
      {"RANK", "1"},                 {"LOCAL_RANK", "1"},            {"LOCAL_WORLD_SIZE", "2"},
      {"NODE_RANK", "1"},            {"GROUP_RANK", "1"},            {"GROUP_WORLD_SIZE", "2"},
      {"ROLE_NAME", "default"},      {"ROLE_RANK", "1"},             {"ROLE_WORLD_SIZE", "2"},
      {"TORCHELASTIC_RUN_ID", "pool-abc"}, {"TORCHELASTIC_RESTART_COUNT", "0"},
      {"TORCHELASTIC_MAX_RESTARTS", "0"},  {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"PET_NNODES", "2"},           {"PET_NODE_RANK", "1"},
      {"PET_NPROC_PER_NODE", "1"},   {"PET_MASTER_ADDR", "10.0.0.5"}, {"PET_MASTER_PORT", "41234"},
      {"PET_RDZV_BACKEND", "static"}, {"PET_RDZV_ENDPOINT", "10.0.0.5:41234"}, {"PET_RDZV_ID", "pool-abc"},
      {"PET_MAX_RESTARTS", "0"},
      {"SKYFORGE_TORCH_BACKEND", "gloo"},
  };
  EXPECT_EQ(env, expected);
  // "True" would make rank 0 a client of an agent store that does not exist (no torchrun agent).
  EXPECT_NE(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
  EXPECT_EQ(as_map(default_environment(r)),
            (std::map<std::string, std::string>{{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}}));
}

// The exact variables of process 0 of each node for several (node, nodes, nproc) shapes; the
// fan-out launcher adds the process index i to RANK, LOCAL_RANK and ROLE_RANK.
TEST(TorchEnvironment, ExactVariablesForSeveralShapes) {
  struct Case {
    uint32_t node, nodes, slot, on_machine, nproc;
    const char *rank, *world, *local, *local_world;
  };
  const Case cases[] = {
      {0, 1, 0, 1, 1, "0", "1", "0", "1"},  {2, 3, 0, 1, 1, "2", "3", "0", "1"},
      {1, 2, 0, 1, 8, "8", "16", "0", "8"}, {2, 3, 2, 3, 2, "4", "6", "4", "6"},
      {0, 4, 0, 2, 4, "0", "16", "0", "8"}, {3, 4, 1, 2, 4, "12", "16", "4", "8"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE("node " + std::to_string(c.node) + "/" + std::to_string(c.nodes) + " nproc " + std::to_string(c.nproc));
    Ranks r = compute_ranks({.node = c.node, .nodes = c.nodes, .machine_slot = c.slot, .machine_nodes = c.on_machine,
                             .nproc_per_node = c.nproc});
    auto env = as_map(environment(r, Rendezvous{"h", 1234, "p"}, "nccl"));
    EXPECT_EQ(env["RANK"], c.rank);
    EXPECT_EQ(env["ROLE_RANK"], c.rank);
    EXPECT_EQ(env["WORLD_SIZE"], c.world);
    EXPECT_EQ(env["ROLE_WORLD_SIZE"], c.world);
    EXPECT_EQ(env["LOCAL_RANK"], c.local);
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], c.local_world);
    EXPECT_EQ(env["NODE_RANK"], std::to_string(c.node));
    EXPECT_EQ(env["GROUP_RANK"], std::to_string(c.node));
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], std::to_string(c.nodes));
    EXPECT_EQ(env["PET_NNODES"], std::to_string(c.nodes));
    EXPECT_EQ(env["PET_NODE_RANK"], std::to_string(c.node));
    EXPECT_EQ(env["PET_NPROC_PER_NODE"], std::to_string(c.nproc));
    if (c.nproc > 1) {
      EXPECT_EQ(env["SKYFORGE_FANOUT_NPROC"], std::to_string(c.nproc));
      EXPECT_EQ(env["SKYFORGE_FANOUT_ADD"], "RANK LOCAL_RANK ROLE_RANK");
      EXPECT_EQ(as_map(default_environment(r))["OMP_NUM_THREADS"], "1");
    } else {
      EXPECT_EQ(env.count("SKYFORGE_FANOUT_NPROC"), 0u);
      EXPECT_EQ(as_map(default_environment(r)).count("OMP_NUM_THREADS"), 0u);
    }
  }
}

TEST(TorchNproc, ZeroMeansOnePerLocalDevice) {
  EXPECT_EQ(resolve_nproc(1, 8), 1u);
  EXPECT_EQ(resolve_nproc(4, 0), 4u);
  EXPECT_EQ(resolve_nproc(0, 8), 8u);
  EXPECT_EQ(resolve_nproc(0, 0), 1u);
  EXPECT_THROW(resolve_nproc(-1, 0), std::invalid_argument);
}

}  // namespace
