// Network isolation for the local provider: one Linux bridge per pool in the root namespace,
// one network namespace per node joined to it by a veth pair. Built with iproute2 (`ip`).
//
// Addressing: each pool leases a /24 from 10.200.0.0/16. The bridge holds .1 (the control
// address the workers connect back to), node i holds .(2+i). The lease is the bridge's address
// itself: under an exclusive flock on a machine-wide lock file, the allocator reads every IPv4
// address and route on the machine (`ip -o -4 addr`, `ip -4 route show table all`) and every
// link name, picks the first /24 that overlaps none of them and whose names are free, and puts
// the address on the new bridge before releasing the lock. A concurrent pool then sees that
// address and moves on; a pool that died without cleaning up keeps its subnet out of use until
// its bridge is deleted, so a leftover can never be handed out twice.
//
// Names (IFNAMSIZ: at most 15 characters): "sf" + 4 hex digits of a hash of the pool id + the
// subnet's third octet in hex, then "-br" for the bridge and "-<i>" for node i's host-side veth
// ("sf3a9c07-br", "sf3a9c07-12"). The subnet is unique while the pool lives, so are the names.
// Inside a node's namespace the veth is "eth0". Namespaces are "skyforge-<pool_id>-node-<i>".
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "spawn.hpp"

namespace skyforge::local {

using providers::CommandResult;
using providers::describe_status;
using providers::environment_with;
using providers::exit_code;
using providers::Fd;
using providers::find_program;
using providers::run_command;
using providers::spawn;
using providers::SpawnSpec;

class NetnsPool {
 public:
  static constexpr uint32_t kMaxNodes = 253;  // .2 .. .254

  // Throws skyforge::Error unless this process may create namespaces and links
  // (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2 is installed.
  static void check_supported();

  explicit NetnsPool(std::string pool_id);
  ~NetnsPool();
  NetnsPool(const NetnsPool&) = delete;
  NetnsPool& operator=(const NetnsPool&) = delete;

  // Leases a /24 and creates the pool's bridge on it. `nodes` is how many veth names must be free.
  void create_bridge(uint32_t nodes);
  // Creates node i's namespace and veth; records each piece as soon as it exists.
  void add_node(uint32_t i);

  // Best-effort removals; each returns the problems it met (empty: all gone). Idempotent.
  std::vector<std::string> remove_node(uint32_t i);
  std::vector<std::string> remove_bridge();
  bool has_bridge() const { return bridge_made_; }

  // A descriptor of node i's namespace (for setns), O_CLOEXEC.
  Fd open_netns(uint32_t i) const;

  std::string gateway() const;                 // "10.200.S.1"
  std::string subnet() const;                  // "10.200.S.0/24"
  std::string node_address(uint32_t i) const;  // "10.200.S.(2+i)"
  // Every link of the pool (bridge, veths) starts with this: "sf" and 4 hex digits of the pool id.
  static std::string link_prefix(const std::string& pool_id);
  std::string bridge_name() const;
  std::string veth_name(uint32_t i) const;
  std::string netns_name(uint32_t i) const;

 private:
  struct NodeNet {
    bool netns = false;
    bool veth = false;
  };
  CommandResult ip(const std::vector<std::string>& args) const;
  // The reaper: a shell in a session of its own, started before the bridge exists, that waits
  // on a pipe only this process writes. When this process ends without saying "done" (a
  // SIGKILL, a crash), it removes every namespace, veth and the bridge the pool may have made:
  // nothing is left for `ip` to list, whatever way the host went.
  void arm_reaper(uint32_t nodes);
  void disarm_reaper(bool done);
  void ip_or_throw(const std::vector<std::string>& args, const std::string& what) const;

  std::string pool_id_;
  std::string ip_path_;
  std::string tag_;  // link_prefix(pool_id)
  int octet_ = -1;   // third octet of the leased /24
  bool bridge_made_ = false;
  std::vector<NodeNet> nodes_;
  pid_t reaper_ = -1;
  Fd reaper_in_;
};

}  // namespace skyforge::local
