// Pure environment of the `jax` framework plugin (no I/O, no SDK).
//
// JAX itself reads JAX_COORDINATOR_ADDRESS (and JAX_LOCAL_DEVICE_IDS) in
// jax.distributed.initialize(); the number of processes and this process's id it only gets
// from arguments or from a cluster environment it detects (jax._src.clusters.ClusterEnv
// subclasses: Slurm, Open MPI, ...). The plugin therefore also writes a tiny `sitecustomize`
// module (sitecustomize_source) into the node's work dir and puts it on PYTHONPATH: when jax's
// cluster module is imported it registers a `skyforge` ClusterEnv that reads JAX_NUM_PROCESSES
// and JAX_PROCESS_ID, so a bare `jax.distributed.initialize()` forms the pool's world.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "placement.hpp"

namespace skyforge::jax {

using EnvList = std::vector<std::pair<std::string, std::string>>;

using Placement = fw::Placement;  // nproc_per_node: JAX processes per node

struct Settings {
  std::string coordinator_host;  // the head's address
  uint16_t coordinator_port = 0;
  uint32_t local_devices = 0;    // accelerators on the node (0: CPU)
  uint32_t cpu_devices = 0;      // option: JAX_NUM_CPU_DEVICES per process on CPU (0: JAX's default, 1)
  bool per_process_devices = false;  // a device list per process is set elsewhere (mig): no JAX_LOCAL_DEVICE_IDS
  std::string hook_dir;          // where sitecustomize.py lives; empty: no hook
  std::string pythonpath;        // PYTHONPATH the command would otherwise get
};

// Throws std::invalid_argument on an inconsistent placement.
EnvList environment(const Placement& p, const Settings& s);

// The variables the fan-out launcher adds the process index to (nproc_per_node > 1).
std::vector<std::string> fanout_variables(const Placement& p, const Settings& s);

// The sitecustomize.py the plugin writes into Settings::hook_dir.
const std::string& sitecustomize_source();

}  // namespace skyforge::jax
