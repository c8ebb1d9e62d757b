// The `torch` framework plugin: on every node, before the app or command starts, it exports the
// environment a PyTorch distributed program expects (torch.distributed env:// init, torchrun's
// worker variables, and torchrun's PET_* arguments so that a bare `torchrun` works unchanged).
//
// MASTER_PORT: the `master_port` option, or (0, the default) a port the head node finds free
// when the pool starts and publishes on the pool's rendezvous store; the other nodes read it
// from there. Never a fixed number, so two pools on one machine never collide.
//
// nproc_per_node > 1: a command that is torchrun (or `python -m torch.distributed.run`) is left
// alone — torchrun reads PET_NPROC_PER_NODE and starts the processes itself (so is
// `accelerate launch`, which the huggingface plugin handles). Any other command
// is started nproc_per_node times by the shared fan-out launcher (plugins/common/fanout.hpp),
// copy i with RANK = node * nproc + i and LOCAL_RANK = machine_slot * nproc + i.
#include <skyforge/sdk.hpp>

#include <stdexcept>

#include <skyforge/accelerator.hpp>
#include "address.hpp"
#include "devices.hpp"
#include "fanout.hpp"
#include "rendezvous.hpp"
#include "torch_env.hpp"

namespace {

namespace st = skyforge::torch;
namespace fw = skyforge::fw;

class Torch : public skyforge::Framework {
 public:
  explicit Torch(const skyforge::Context& ctx) : Framework(ctx) {
    // Validated here so that a bad value fails when the host loads the plugin, before any node.
    try {
      backend_ = options().get("backend", "auto");
      st::resolve_backend(backend_, 0);
      st::resolve_nproc(options().get_int("nproc_per_node", 1), 0);
    } catch (const std::invalid_argument& e) {
      throw skyforge::Error(std::string("torch: ") + e.what(), SF_ERR_INVALID);
    }
    master_port_ = fw::port_option(options(), "torch", "master_port");
    timeout_ms_ = fw::timeout_ms_option(options(), "torch");
  }

  void around_app_enter(const skyforge::InstanceInfo& info, const skyforge::Env& env) override {
    if (info.head_addr.empty()) throw skyforge::Error("torch: the pool has no head address");
    st::Ranks ranks;
    try {
      nproc_ = st::resolve_nproc(options().get_int("nproc_per_node", 1), fw::local_devices(info, env));
      ranks = st::compute_ranks(fw::placement(info, nproc_));
    } catch (const std::invalid_argument& e) {
      throw skyforge::Error(std::string("torch: ") + e.what(), SF_ERR_INVALID);
    }
    uint16_t port = fw::head_port(host(), info, "torch/" + info.pool_id + "/master_port", master_port_, timeout_ms_,
                                  "torch", "MASTER_PORT (or set the master_port option)");
    st::Rendezvous rdzv{info.head_addr, port, info.pool_id};
    for (auto [key, value] : st::environment(ranks, rdzv, st::resolve_backend(backend_, info.accelerators))) {
      if (key == fw::kFanoutAdd) value = fw::add_words(env.get(key).value_or(""), fw::split_words(value));
      env.set(key, value);
    }
    for (const auto& [key, value] : st::default_environment(ranks))
      if (!env.get(key)) env.set(key, value);
    // Gloo and NCCL bind to the interface the hostname resolves to unless told: on a pool of
    // several hosts whose names resolve to 127.0.x.x, each rank would offer its peers a loopback
    // address. The interface that holds the node's pool address is the one its peers reach.
    if (const std::string ifname = fw::interface_of(info.private_ip); !ifname.empty())
      for (const char* key : {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"})
        if (!env.get(key)) env.set(key, ifname);
  }

  std::vector<std::string> launcher(const skyforge::InstanceInfo&, std::vector<std::string> argv) override {
    // torchrun and `accelerate launch` start their processes themselves.
    if (nproc_ <= 1 || fw::is_torchrun(argv) || fw::is_accelerate_launch(argv)) return argv;
    return fw::fanout_argv(std::move(argv));
  }

 private:
  std::string backend_;
  uint16_t master_port_ = 0;
  int64_t timeout_ms_ = 120000;
  uint32_t nproc_ = 1;
};

}  // namespace

SKYFORGE_PLUGIN(Torch, "torch", "0.2.0",
                "PyTorch distributed environment: MASTER_ADDR/PORT, RANK, WORLD_SIZE, torchrun's variables and PET_*")
