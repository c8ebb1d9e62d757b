#include "placement.hpp"

#include <stdexcept>
#include <string>

namespace skyforge::fw {

void check_placement(const Placement& p) {
  if (p.nodes == 0) throw std::invalid_argument("a pool has at least one node");
  if (p.node >= p.nodes)
    throw std::invalid_argument("node " + std::to_string(p.node) + " is outside a pool of " + std::to_string(p.nodes));
  if (p.machine_nodes == 0 || p.machine_slot >= p.machine_nodes)
    throw std::invalid_argument("local rank " + std::to_string(p.machine_slot) + " is outside a local world of " +
                                std::to_string(p.machine_nodes));
  if (p.nproc_per_node == 0) throw std::invalid_argument("nproc_per_node must be at least 1");
}

}  // namespace skyforge::fw
