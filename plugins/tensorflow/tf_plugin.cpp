// The `tensorflow` framework plugin: TF_CONFIG for MultiWorkerMirroredStrategy. Every node finds
// a free port on its own machine, publishes "address:port" on the pool's rendezvous store
// (tensorflow/<pool>/worker/<node>) and reads every other node's, so each node's TF_CONFIG lists
// the whole cluster in node order (tf_env.hpp).
#include <skyforge/sdk.hpp>

#include <stdexcept>

#include "address.hpp"
#include "rendezvous.hpp"
#include "tf_env.hpp"

namespace {

namespace stf = skyforge::tensorflow;
namespace fw = skyforge::fw;

class TensorFlow : public skyforge::Framework {
 public:
  explicit TensorFlow(const skyforge::Context& ctx)
      : Framework(ctx), rendezvous_(fw::rendezvous_options(options(), "tensorflow", "port")) {}

  void around_app_enter(const skyforge::InstanceInfo& info, const skyforge::Env& env) override {
    const std::string address = !info.private_ip.empty() ? info.private_ip : info.head_addr;
    if (address.empty()) throw skyforge::Error("tensorflow: node " + std::to_string(info.node) + " has no address");
    std::vector<std::string> workers(info.total_nodes);
    const std::string hint = "a node did not publish its TF_CONFIG address; raise the rendezvous_timeout option";
    // Our own entry first (nobody waits on us while we wait on them), then everyone else's.
    workers[info.node] = fw::publish_once(
        host(), stf::worker_key(info.pool_id, info.node), rendezvous_.timeout_ms,
        [&] { return fw::host_port(address, rendezvous_.port ? rendezvous_.port : fw::pick_free_port("tensorflow")); },
        "tensorflow", hint);
    for (uint32_t n = 0; n < info.total_nodes; ++n)
      if (n != info.node)
        workers[n] =
            fw::publish_once(host(), stf::worker_key(info.pool_id, n), rendezvous_.timeout_ms, nullptr, "tensorflow", hint);
    try {
      env.set("TF_CONFIG", stf::tf_config(workers, info.node));
    } catch (const std::invalid_argument& e) {
      throw skyforge::Error(std::string("tensorflow: ") + e.what(), SF_ERR_INVALID);
    }
  }

 private:
  fw::RendezvousOptions rendezvous_;
};

}  // namespace

SKYFORGE_PLUGIN(TensorFlow, "tensorflow", "0.1.0", "TF_CONFIG for tf.distribute.MultiWorkerMirroredStrategy")
