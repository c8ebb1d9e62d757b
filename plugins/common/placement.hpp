// Where a node sits in its pool and on its machine, as every framework plugin that sets ranks
// sees it (torch, huggingface, jax). Pure: no I/O, no SDK.
#pragma once

#include <cstdint>

namespace skyforge::fw {

// Vocabulary (torchrun's): a *node* is one skyforge node, which may run `nproc_per_node`
// framework processes; several nodes may share one *machine* (the local provider does).
struct Placement {
  uint32_t node = 0;            // this skyforge node, 0 = head
  uint32_t nodes = 1;           // nodes in the pool
  uint32_t machine_slot = 0;    // this node's index among the nodes on its machine (info.local_rank)
  uint32_t machine_nodes = 1;   // nodes on this machine (info.local_world_size)
  uint32_t nproc_per_node = 1;  // framework processes per node (one per GPU is common)
};

// Throws std::invalid_argument naming what is inconsistent (node >= nodes, ...).
void check_placement(const Placement& p);

}  // namespace skyforge::fw
