// GPU placement of the `local` provider (docs/providers.md): one share of this machine's GPUs
// per node, by node index, as CUDA_VISIBLE_DEVICES — the way torchrun's users set
// LOCAL_RANK-indexed devices, decided once by the provider so that a node's worker (and a
// compute backend inside it, which uses its device 0) sees only its own.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <skyforge/accelerator.hpp>

namespace skyforge::local {

// The GPUs this machine offers to the pool, and where that list came from (for messages).
struct VisibleGpus {
  std::vector<std::string> ids;  // what CUDA_VISIBLE_DEVICES may hold: indices or GPU-/MIG- uuids
  std::string source;            // "CUDA_VISIBLE_DEVICES=…" or "/proc/driver/nvidia/gpus lists N"
  bool pci_order = false;        // ids are indices in PCI bus order (the driver's list): a worker
                                 // given some needs CUDA_DEVICE_ORDER=PCI_BUS_ID
};

// CUDA_VISIBLE_DEVICES' entries when it is set (the user's restriction, honoured as CUDA honours
// it: the list ends at its first empty entry), else one index per entry of the NVIDIA driver's
// `driver_gpus` directory (/proc/driver/nvidia/gpus: one per GPU, named by PCI bus id, so the
// indices count in PCI order, nvidia-smi's), else none.
VisibleGpus visible_gpus(const char* cuda_visible_devices,
                         const std::filesystem::path& driver_gpus = "/proc/driver/nvidia/gpus");

struct GpuPlacement {
  std::vector<std::string> per_node;  // node i's CUDA_VISIBLE_DEVICES; "" leaves it as inherited
  std::string warning;                // set when GPUs were asked for and the machine offers none
};

// Node i's CUDA_VISIBLE_DEVICES for `nodes` nodes asking for spec.count GPUs each: entries
// [i * count, (i + 1) * count) of `gpus`, comma-separated. Nothing is set when the spec names no
// accelerator or a MIG profile (the `mig` framework plugin places MIG devices), nor — with a
// warning, as the `mig` plugin does — when the machine offers no GPU at all (a manifest written
// for a GPU machine still runs its CPU parts here; the cuda backend's probe refuses on its own).
// Throws Error(SF_ERR_INVALID) naming the spec, what it needs and what the machine offers when
// it offers some but too few.
GpuPlacement place_gpus(const AcceleratorSpec& spec, const std::string& spec_text, uint32_t nodes,
                        const VisibleGpus& gpus);

}  // namespace skyforge::local
