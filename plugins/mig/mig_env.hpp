// Pure device mapping of the `mig` framework plugin (no I/O, no SDK): parse `nvidia-smi -L`,
// pick the devices the manifest's accelerator spec asks for, share them among the skyforge
// nodes on the machine, and give each process of a node its own CUDA_VISIBLE_DEVICES.
//
//   accelerator = "A100(mig=3g.40gb)"  -> every MIG device of profile 3g.40gb, one process each
//   accelerator = "H100:8" (or "")     -> every whole GPU, one process each; a GPU in MIG mode
//                                         contributes its MIG devices instead (CUDA cannot use
//                                         it whole)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace skyforge::mig {

using EnvList = std::vector<std::pair<std::string, std::string>>;

struct MigDevice {
  uint32_t index = 0;   // "Device N" within its GPU
  std::string profile;  // "3g.40gb", "1g.10gb+me"
  std::string uuid;     // "MIG-..." (or "MIG-GPU-<uuid>/gi/ci" from R450/R460 drivers)
};

struct Gpu {
  uint32_t index = 0;
  std::string name;  // "NVIDIA A100-SXM4-80GB"
  std::string uuid;  // "GPU-..."
  std::vector<MigDevice> migs;
};

// Parses `nvidia-smi -L`. Lines it does not recognise are ignored; a MIG line before any GPU
// line throws std::invalid_argument.
std::vector<Gpu> parse_nvidia_smi_list(std::string_view text);

// The machine's devices to run on, in listing order (UUIDs, what CUDA_VISIBLE_DEVICES takes).
// mig_profile non-empty: exactly the MIG devices of that profile (throws std::invalid_argument
// naming what the machine has when there are none). Empty: whole GPUs, and the MIG devices of
// GPUs in MIG mode.
std::vector<std::string> machine_devices(const std::vector<Gpu>& gpus, std::string_view mig_profile);

// The contiguous share of `devices` for node `slot` of `nodes` on the machine: every node gets
// the same number, devices.size() / nodes (every node of a pool must run as many processes
// for the ranks to line up), the remainder stays unused. Throws std::invalid_argument when a
// node would get none.
std::vector<std::string> node_share(const std::vector<std::string>& devices, uint32_t slot, uint32_t nodes);

// The environment for a node running `per_device` processes on each of `devices`:
//   CUDA_VISIBLE_DEVICES      all of them, comma-separated (one process: just its device)
//   SKYFORGE_MIG_DEVICES      the same, space-separated
//   SKYFORGE_LOCAL_DEVICES    processes on the node (devices x per_device)
//   SKYFORGE_FANOUT_DEVICES   with more than one process: process i's device, in order
//   SKYFORGE_FANOUT_NPROC     with more than one process: their count
EnvList environment(const std::vector<std::string>& devices, uint32_t per_device);

}  // namespace skyforge::mig
