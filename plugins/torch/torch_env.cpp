#include "torch_env.hpp"

#include <limits>
#include <stdexcept>

namespace skyforge::torch {

namespace {
uint32_t checked_mul(uint32_t a, uint32_t b, const char* what) {
  uint64_t r = uint64_t(a) * b;
  if (r > std::numeric_limits<uint32_t>::max()) throw std::invalid_argument(std::string(what) + " overflows");
  return uint32_t(r);
}
}  // namespace

Ranks compute_ranks(const Placement& p, uint32_t local_proc) {
  fw::check_placement(p);
  if (local_proc >= p.nproc_per_node)
    throw std::invalid_argument("process " + std::to_string(local_proc) + " is outside nproc_per_node " +
                                std::to_string(p.nproc_per_node));
  Ranks r;
  r.nproc_per_node = p.nproc_per_node;
  r.group_rank = p.node;
  r.group_world_size = p.nodes;
  r.world_size = checked_mul(p.nodes, p.nproc_per_node, "WORLD_SIZE");
  r.rank = p.node * p.nproc_per_node + local_proc;  // < world_size, cannot overflow
  r.local_world_size = checked_mul(p.machine_nodes, p.nproc_per_node, "LOCAL_WORLD_SIZE");
  r.local_rank = p.machine_slot * p.nproc_per_node + local_proc;
  return r;
}

std::string resolve_backend(std::string_view option, uint32_t accelerators) {
  if (option.empty() || option == "auto") return accelerators > 0 ? "nccl" : "gloo";
  if (option == "gloo" || option == "nccl") return std::string(option);
  throw std::invalid_argument("backend: expected auto, gloo or nccl, got '" + std::string(option) + "'");
}

uint16_t parse_master_port(int64_t value) {
  if (value < 0 || value > 65535)
    throw std::invalid_argument("master_port: expected 0 (automatic) or a TCP port 1..65535, got " +
                                std::to_string(value));
  return uint16_t(value);
}

EnvList environment(const Ranks& r, const Rendezvous& rdzv, std::string_view backend) {
  auto s = [](uint64_t v) { return std::to_string(v); };
  const std::string port = s(rdzv.master_port);
  EnvList env = {
      // What torch.distributed's env:// init reads.
      {"MASTER_ADDR", rdzv.master_addr},
      {"MASTER_PORT", port},
      {"WORLD_SIZE", s(r.world_size)},
      {"RANK", s(r.rank)},
      // What torchrun gives each worker it spawns.
      {"LOCAL_RANK", s(r.local_rank)},
      {"LOCAL_WORLD_SIZE", s(r.local_world_size)},
      {"GROUP_RANK", s(r.group_rank)},
      {"GROUP_WORLD_SIZE", s(r.group_world_size)},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", s(r.rank)},
      {"ROLE_WORLD_SIZE", s(r.world_size)},
      {"TORCHELASTIC_RUN_ID", rdzv.run_id},
      {"TORCHELASTIC_RESTART_COUNT", "0"},
      {"TORCHELASTIC_MAX_RESTARTS", "0"},
      // torchrun says "True" to workers whose store its agent hosts; without an agent, rank 0
      // must create the store itself, which is what "False" tells torch's env:// init.
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      // Read by Lightning and by many launch scripts.
      {"NODE_RANK", s(r.group_rank)},
      // torchrun's own arguments (--nnodes ... ), so a bare `torchrun train.py` on every node
      // forms this world with its static rendezvous on MASTER_ADDR:MASTER_PORT.
      {"PET_NNODES", s(r.group_world_size)},
      {"PET_NODE_RANK", s(r.group_rank)},
      {"PET_NPROC_PER_NODE", s(r.nproc_per_node)},
      {"PET_MASTER_ADDR", rdzv.master_addr},
      {"PET_MASTER_PORT", port},
      {"PET_RDZV_BACKEND", "static"},
      {"PET_RDZV_ENDPOINT", rdzv.master_addr + ":" + port},
      {"PET_RDZV_ID", rdzv.run_id},
      {"PET_MAX_RESTARTS", "0"},
      {"SKYFORGE_TORCH_BACKEND", std::string(backend)},
  };
  if (r.nproc_per_node > 1) {
    std::string add;
    for (const auto& v : fanout_rank_variables()) add += (add.empty() ? "" : " ") + v;
    env.emplace_back("SKYFORGE_FANOUT_NPROC", s(r.nproc_per_node));
    env.emplace_back("SKYFORGE_FANOUT_ADD", add);
  }
  return env;
}

EnvList default_environment(const Ranks& r) {
  EnvList env = {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}};
  if (r.nproc_per_node > 1) env.emplace_back("OMP_NUM_THREADS", "1");
  return env;
}

uint32_t resolve_nproc(int64_t option, uint32_t local_devices) {
  if (option < 0 || option > 65536)
    throw std::invalid_argument("nproc_per_node: expected 0 (one per local device) or a count, got " +
                                std::to_string(option));
  if (option > 0) return uint32_t(option);
  return local_devices > 0 ? local_devices : 1;
}

}  // namespace skyforge::torch
