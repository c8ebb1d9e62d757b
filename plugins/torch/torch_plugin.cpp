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

#include "address.hpp"
#include "fanout.hpp"
#include "rendezvous.hpp"
#include "torch_node.hpp"

namespace {

namespace st = skyforge::torch;
namespace fw = skyforge::fw;

class Torch : public skyforge::Framework {
 public:
  explicit Torch(const skyforge::Context& ctx)
      : Framework(ctx),
        backend_(st::backend_option(options(), "torch")),
        rendezvous_(fw::rendezvous_options(options(), "torch", "master_port")) {}

  void around_app_enter(const skyforge::InstanceInfo& info, const skyforge::Env& env) override {
    nproc_ = st::export_node_environment(host(), info, env, options(), backend_, rendezvous_, "torch").nproc;
    // Gloo and NCCL bind to the interface the hostname resolves to unless told: on a pool of
    // several hosts whose names resolve to 127.0.x.x, each rank would offer its peers a loopback
    // address. The interface that holds the node's pool address is the one its peers reach.
    // Gloo takes an interface's name; NCCL a prefix unless it starts with "=".
    if (const std::string ifname = fw::interface_of(info.private_ip); !ifname.empty()) {
      if (!env.get("GLOO_SOCKET_IFNAME")) env.set("GLOO_SOCKET_IFNAME", ifname);
      if (!env.get("NCCL_SOCKET_IFNAME")) env.set("NCCL_SOCKET_IFNAME", "=" + ifname);
    }
  }

  std::vector<std::string> launcher(const skyforge::InstanceInfo&, std::vector<std::string> argv) override {
    // torchrun and `accelerate launch` start their processes themselves.
    if (nproc_ <= 1 || fw::is_torchrun(argv) || fw::is_accelerate_launch(argv)) return argv;
    return fw::fanout_argv(std::move(argv));
  }

 private:
  std::string backend_;
  fw::RendezvousOptions rendezvous_;
  uint32_t nproc_ = 1;
};

}  // namespace

SKYFORGE_PLUGIN(Torch, "torch", "0.2.0",
                "PyTorch distributed environment: MASTER_ADDR/PORT, RANK, WORLD_SIZE, torchrun's variables and PET_*")
