// Pure rank arithmetic and environment of the `torch` framework plugin (no I/O, no SDK).
//
// Vocabulary (torchrun's): a *node* is one skyforge node, which runs one torchrun-like worker
// group of `nproc_per_node` processes. Several skyforge nodes may share one *machine* (the local
// provider does exactly that); LOCAL_RANK and LOCAL_WORLD_SIZE count torch processes on the
// machine, so `torch.cuda.set_device(LOCAL_RANK)` gives every process on it its own device.
// When each node has a machine to itself (every cloud/ssh/slurm pool), that is exactly
// torchrun's `LOCAL_RANK in [0, nproc_per_node)`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "placement.hpp"

namespace skyforge::torch {

using Placement = fw::Placement;

struct Ranks {
  uint32_t rank = 0;              // RANK, ROLE_RANK
  uint32_t world_size = 1;        // WORLD_SIZE, ROLE_WORLD_SIZE
  uint32_t local_rank = 0;        // LOCAL_RANK
  uint32_t local_world_size = 1;  // LOCAL_WORLD_SIZE
  uint32_t group_rank = 0;        // GROUP_RANK, NODE_RANK
  uint32_t group_world_size = 1;  // GROUP_WORLD_SIZE, nnodes
  uint32_t nproc_per_node = 1;
};

// The ranks of torch process `local_proc` (0 .. nproc_per_node-1) of node p.node. With
// nproc_per_node > 1 the plugin computes the environment of process 0 and the fan-out launcher
// (plugins/common/fanout.hpp) adds the process index to RANK, LOCAL_RANK and ROLE_RANK, so the
// ranks are node * nproc + i. Throws std::invalid_argument when the placement is inconsistent
// (node >= nodes, local_proc >= nproc_per_node, ...).
Ranks compute_ranks(const Placement& p, uint32_t local_proc = 0);

// "auto" -> "nccl" with accelerators, "gloo" without; "gloo"/"nccl" stay; anything else throws
// std::invalid_argument.
std::string resolve_backend(std::string_view option, uint32_t accelerators);

struct Rendezvous {
  std::string master_addr;
  uint16_t master_port = 0;
  std::string run_id;  // TORCHELASTIC_RUN_ID: the pool id
};

using EnvList = std::vector<std::pair<std::string, std::string>>;

// Every variable the plugin sets, in a stable order: torch's env:// init, what torchrun gives
// each worker, torchrun's own PET_* arguments (static rendezvous on MASTER_ADDR:MASTER_PORT),
// and with nproc_per_node > 1 the fan-out launcher's SKYFORGE_FANOUT_NPROC / _ADD.
EnvList environment(const Ranks& r, const Rendezvous& rdzv, std::string_view backend);

// Variables torchrun sets only when the environment does not have them already
// (TORCH_NCCL_ASYNC_ERROR_HANDLING=1; OMP_NUM_THREADS=1 with several processes per node).
EnvList default_environment(const Ranks& r);

// The variables the fan-out launcher adds the process index to.
inline const std::vector<std::string>& fanout_rank_variables() {
  static const std::vector<std::string> v = {"RANK", "LOCAL_RANK", "ROLE_RANK"};
  return v;
}

// nproc_per_node option: > 0 as is; 0 means one process per local device (`local_devices`,
// at least 1). Negative values throw std::invalid_argument.
uint32_t resolve_nproc(int64_t option, uint32_t local_devices);

// Validates a `master_port` option value: 0 (automatic) or 1..65535.
uint16_t parse_master_port(int64_t value);

}  // namespace skyforge::torch
