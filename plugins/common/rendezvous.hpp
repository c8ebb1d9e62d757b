// Rendezvous helpers shared by the framework plugins, over the pool's store (Host kv_*).
//
// Ports are never fixed numbers: a node that needs a listening port (torch's MASTER_PORT and
// jax's coordinator port on the head, every TensorFlow worker's port) finds one free on its own
// machine when the pool starts and publishes it under a key that contains the pool id, so two
// pools on one machine never collide and every node of a pool reads the same value.
#pragma once

#include <skyforge/sdk.hpp>

#include <cstdint>
#include <functional>
#include <string>

namespace skyforge::fw {

// A TCP port free on every address of this machine right now (wildcard bind, IPv6 dual-stack
// when available, then IPv4). `who` prefixes the error ("torch", "jax", ...).
uint16_t pick_free_port(const std::string& who);

// "12345" -> 12345; anything else (0, > 65535, junk) throws skyforge::Error naming `key`.
uint16_t parse_port_text(const std::string& text, const std::string& key, const std::string& who);

// The value under `key`: the first caller anywhere in the pool that claims `key + "/claim"`
// (kv_add == 1) computes it with make() and publishes it; everybody else waits up to
// timeout_ms for it. A timeout becomes an Error(SF_ERR_TIMEOUT) whose message names the key
// and ends with `hint`.
std::string publish_once(const Host& host, const std::string& key, int64_t timeout_ms,
                         const std::function<std::string()>& make, const std::string& who, const std::string& hint);

// The options every rendezvous reads, validated when the plugin loads: a port (`port_name`;
// 0 = automatic, 1..65535) and `rendezvous_timeout` in seconds (> 0, default 120). A bad value
// throws Error(SF_ERR_INVALID) naming the option, prefixed by `who`.
struct RendezvousOptions {
  uint16_t port = 0;
  int64_t timeout_ms = 120000;
};
RendezvousOptions rendezvous_options(const Options& o, const std::string& who, const std::string& port_name);

// A port the head node listens on: `opts.port` when non-zero, otherwise a free port the head
// picks (publish_once under `key`, only the head may claim it) and the other nodes read.
uint16_t head_port(const Host& host, const InstanceInfo& info, const std::string& key, const RendezvousOptions& opts,
                   const std::string& who, const std::string& what);

}  // namespace skyforge::fw
