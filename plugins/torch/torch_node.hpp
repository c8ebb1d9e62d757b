// What the torch and huggingface plugins do alike (header-only, over the SDK): check the torch
// options when the plugin loads, and export torch.distributed's environment on a node. Both
// publish MASTER_PORT under the same key of the pool's store, so torch and huggingface side by
// side agree.
#pragma once

#include <skyforge/sdk.hpp>

#include <stdexcept>
#include <string>

#include "devices.hpp"
#include "export_env.hpp"
#include "rendezvous.hpp"
#include "torch_env.hpp"

namespace skyforge::torch {

// The `backend` option, with `backend` and `nproc_per_node` checked so that a bad value fails
// when the host loads the plugin, before any node. Errors are Error(SF_ERR_INVALID) prefixed
// by `who`.
inline std::string backend_option(const Options& options, const std::string& who) {
  try {
    std::string backend = options.get("backend", "auto");
    resolve_backend(backend, 0);
    resolve_nproc(options.get_int("nproc_per_node", 1), 0);
    return backend;
  } catch (const std::invalid_argument& e) {
    throw Error(who + ": " + e.what(), SF_ERR_INVALID);
  }
}

// A node's part of the pool, as export_node_environment computed it.
struct Node {
  uint32_t nproc = 1;
  Ranks ranks;
  Rendezvous rendezvous;
};

// Exports the node's torch.distributed environment: ranks for nproc_per_node processes, the
// head's address and MASTER_PORT (the `master_port` option, else the port the head publishes),
// then torchrun's defaults where the environment has none. Errors are prefixed by `who`.
inline Node export_node_environment(const Host& host, const InstanceInfo& info, const Env& env,
                                    const Options& options, const std::string& backend,
                                    const fw::RendezvousOptions& rendezvous, const std::string& who) {
  if (info.head_addr.empty()) throw Error(who + ": the pool has no head address");
  Node node;
  try {
    node.nproc = resolve_nproc(options.get_int("nproc_per_node", 1), fw::local_devices(info, env));
    node.ranks = compute_ranks(fw::placement(info, node.nproc));
  } catch (const std::invalid_argument& e) {
    throw Error(who + ": " + e.what(), SF_ERR_INVALID);
  }
  const uint16_t port = fw::head_port(host, info, "torch/" + info.pool_id + "/master_port", rendezvous, who,
                                      "MASTER_PORT (or set the master_port option)");
  node.rendezvous = Rendezvous{info.head_addr, port, info.pool_id};
  fw::export_environment(env, environment(node.ranks, node.rendezvous, resolve_backend(backend, info.accelerators)));
  for (const auto& [key, value] : default_environment(node.ranks))
    if (!env.get(key)) env.set(key, value);
  return node;
}

}  // namespace skyforge::torch
