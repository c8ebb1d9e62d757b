// Devices on this node, as the framework plugins count them (torch, jax, huggingface).
#pragma once

#include <skyforge/sdk.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "accelerator.hpp"

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

}  // namespace skyforge::fw
