// The `keras` framework plugin (docs/training.md, "keras" options; docs/keras-api.md).
//
// Native apps and the built-in [train] job: the `backend` option names the compute backend the
// host loads on every node (the SDK's keras::Sequential finds it through
// Host::compute_backend()); the seed is the same on every node — the option's, or one the head
// draws and publishes on the rendezvous store — so every replica starts from identical weights;
// with more than one node and data_parallel = true the model trains data-parallel.
// Command apps running Keras 3: backend = "jax" | "torch" | "tensorflow" exports KERAS_BACKEND.
//
// What the node's app or command sees:
//   KERAS_BACKEND              jax | torch | tensorflow (command apps only)
//   SKYFORGE_COMPUTE_BACKEND   the compute backend plugin (native apps)
//   SKYFORGE_SEED              the pool-wide seed
//   SKYFORGE_DATA_PARALLEL     1 when gradients are averaged across nodes, else 0
#include <skyforge/sdk.hpp>

#include <string>

namespace {

bool is_keras_backend(const std::string& b) { return b == "jax" || b == "torch" || b == "tensorflow"; }

class Keras : public skyforge::Framework {
 public:
  explicit Keras(const skyforge::Context& ctx)
      : Framework(ctx),
        backend_(options().get("backend", "cpu")),
        seed_(options().get_int("seed", -1)),
        data_parallel_(options().get_bool("data_parallel", true)) {
    if (seed_ < -1) throw skyforge::Error("option 'seed': expected -1 or a seed >= 0", SF_ERR_INVALID);
  }

  void around_app_enter(const skyforge::InstanceInfo& info, const skyforge::Env& env) override {
    if (is_keras_backend(backend_))
      env.set("KERAS_BACKEND", backend_);
    else
      env.set("SKYFORGE_COMPUTE_BACKEND", backend_);
    env.set("SKYFORGE_SEED", std::to_string(pool_seed(info)));
    env.set("SKYFORGE_DATA_PARALLEL", data_parallel_ && info.total_nodes > 1 ? "1" : "0");
  }

 private:
  // RNG synchronised from the head: one seed for the whole pool.
  uint64_t pool_seed(const skyforge::InstanceInfo& info) const {
    if (seed_ >= 0) return static_cast<uint64_t>(seed_);
    return host().shared_seed(info, "keras/seed");
  }

  std::string backend_;
  int64_t seed_;
  bool data_parallel_;
};

}  // namespace

SKYFORGE_PLUGIN(Keras, "keras", "0.1.0", "Keras: compute backend selection, DataParallel, pool-wide seed; KERAS_BACKEND")
