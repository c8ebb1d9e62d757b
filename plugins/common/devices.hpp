// Devices on this node and where the node sits, as the framework plugins see them (torch, jax,
// huggingface).
#pragma once

#include <skyforge/sdk.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

#include <skyforge/accelerator.hpp>
#include "placement.hpp"

namespace skyforge::fw {

// What the mig plugin found (SKYFORGE_LOCAL_DEVICES, when it ran first), else the accelerator
// spec's count, else the host's count.
inline uint32_t local_devices(const InstanceInfo& info, const Env& env) {
  if (auto d = env.get("SKYFORGE_LOCAL_DEVICES")) {
    try {
      return static_cast<uint32_t>(std::stoul(*d));
    } catch (const std::exception&) {
    }
  }
  try {
    if (!info.accelerator.empty()) return parse_accelerator(info.accelerator).count;
  } catch (const std::invalid_argument&) {
  }
  return info.accelerators;
}

// This node's place in the pool and on its machine, running nproc_per_node processes.
inline Placement placement(const InstanceInfo& info, uint32_t nproc_per_node) {
  return Placement{.node = info.node,
                   .nodes = info.total_nodes,
                   .machine_slot = info.local_rank,
                   .machine_nodes = info.local_world_size,
                   .nproc_per_node = nproc_per_node};
}

}  // namespace skyforge::fw
