// The `torch` framework plugin: on every node, before the app or command starts, it exports the
// environment a PyTorch distributed program expects (torch.distributed env:// init, torchrun's
// worker variables, and torchrun's PET_* arguments so that a bare `torchrun` works unchanged).
//
// MASTER_PORT: the `master_port` option, or (0, the default) a port the head node finds free
// when the pool starts and publishes on the pool's rendezvous store; the other nodes read it
// from there. Never a fixed number, so two pools on one machine never collide.
#include <skyforge/sdk.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <stdexcept>

#include "torch_env.hpp"

namespace {

namespace st = skyforge::torch;

// A TCP port that is free on every address of this machine right now. The wildcard bind (IPv6
// dual-stack when available) is deliberate: rank 0's TCPStore listens on the wildcard, so the
// port must be free on all addresses, which only a wildcard bind checks. As with torchrun's
// standalone mode, the port is released before torch binds it: only another process binding
// the same ephemeral port in that short window could take it.
uint16_t pick_free_port() {
  std::string why;
  for (int family : {AF_INET6, AF_INET}) {
    int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      int off = 0;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      len = sizeof(sockaddr_in6);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      len = sizeof(sockaddr_in);
    }
    uint16_t port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                      : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    } else {
      why = std::strerror(errno);
    }
    ::close(fd);
    if (port != 0) return port;
  }
  throw skyforge::Error("torch: cannot find a free TCP port for MASTER_PORT on the head node: " + why);
}

uint16_t parse_port_text(const std::string& text, const std::string& key) {
  unsigned value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value == 0 || value > 65535)
    throw skyforge::Error("torch: rendezvous key " + key + " holds '" + text + "', not a TCP port");
  return uint16_t(value);
}

class Torch : public skyforge::Framework {
 public:
  explicit Torch(const skyforge::Context& ctx) : Framework(ctx) {
    // Validated here so that a bad value fails when the host loads the plugin, before any node.
    try {
      backend_ = options().get("backend", "auto");
      st::resolve_backend(backend_, 0);
      master_port_ = st::parse_master_port(options().get_int("master_port", 0));
    } catch (const std::invalid_argument& e) {
      throw skyforge::Error(std::string("torch: ") + e.what(), SF_ERR_INVALID);
    }
    int64_t timeout_s = options().get_int("rendezvous_timeout", 120);
    if (timeout_s <= 0)
      throw skyforge::Error("torch: rendezvous_timeout: expected a positive number of seconds, got " +
                                std::to_string(timeout_s),
                            SF_ERR_INVALID);
    timeout_ms_ = timeout_s * 1000;
  }

  void around_app_enter(const skyforge::InstanceInfo& info, const skyforge::Env& env) override {
    if (info.head_addr.empty()) throw skyforge::Error("torch: the pool has no head address");
    st::Ranks ranks;
    try {
      ranks = st::compute_ranks(st::Placement{.node = info.node,
                                              .nodes = info.total_nodes,
                                              .machine_slot = info.local_rank,
                                              .machine_nodes = info.local_world_size,
                                              .nproc_per_node = 1,
                                              .local_proc = 0});
    } catch (const std::invalid_argument& e) {
      throw skyforge::Error(std::string("torch: ") + e.what(), SF_ERR_INVALID);
    }
    st::Rendezvous rdzv{info.head_addr, master_port(info), info.pool_id};
    for (const auto& [key, value] : st::environment(ranks, rdzv, st::resolve_backend(backend_, info.accelerators)))
      env.set(key, value);
  }

 private:
  uint16_t master_port(const skyforge::InstanceInfo& info) const {
    if (master_port_ != 0) return master_port_;
    const std::string key = "torch/" + info.pool_id + "/master_port";
    // Exactly one caller on the head picks the port, however often the hook runs there.
    if (info.is_head && host().kv_add(key + "/claim", 1) == 1) {
      uint16_t port = pick_free_port();
      host().kv_set(key, std::to_string(port));
      host().log(SF_LOG_DEBUG, "torch: MASTER_PORT " + std::to_string(port) + " published as " + key);
      return port;
    }
    try {
      return parse_port_text(host().kv_get(key, timeout_ms_), key);
    } catch (const skyforge::Error& e) {
      if (e.status() != SF_ERR_TIMEOUT) throw;
      throw skyforge::Error("torch: the head node did not publish MASTER_PORT (" + key + ") within " +
                                std::to_string(timeout_ms_ / 1000) + " s; raise the rendezvous_timeout option " +
                                "or set master_port",
                            SF_ERR_TIMEOUT);
    }
  }

  std::string backend_;
  uint16_t master_port_ = 0;
  int64_t timeout_ms_ = 120000;
};

}  // namespace

SKYFORGE_PLUGIN(Torch, "torch", "0.1.0",
                "PyTorch distributed environment: MASTER_ADDR/PORT, RANK, WORLD_SIZE, torchrun's variables and PET_*")
