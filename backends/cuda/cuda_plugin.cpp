// The `cuda` compute backend plugin (docs/compute-backends.md, "The cuda engine"): a thin
// ComputeBackend over the engine's CUDA build. The only .so of the project that loads the CUDA
// runtime, cuBLAS and NCCL; its constructor touches none of them (so `skyforge validate` and
// `skyforge plugins` work on any machine), probe() says what is missing before a run starts.
#include "plugin_options.hpp"

#include <cstdlib>

namespace {

class CudaBackend : public skyforge::ComputeBackend {
 public:
  explicit CudaBackend(const skyforge::Context& ctx)
      : ComputeBackend(ctx), opts_(skyforge::cuda::read_plugin_options(options())) {}
  void probe() override { skyforge::cuda::Device::probe(); }
  std::unique_ptr<skyforge::Engine> create_engine(const skyforge::ModelSpec& spec,
                                                  const skyforge::Communicator& comm) override {
    skyforge::cuda::EngineOptions o = opts_;
    o.collective_timeout_s = collective_timeout_s();
    return skyforge::cuda::make_engine(spec, comm, host(), o);
  }

 private:
  // The pool's collective timeout (skyforge/config_keys.hpp, docs/runtime-api.md); NCCL gets the
  // same as the pool's communicator.
  double collective_timeout_s() const {
    namespace config = skyforge::config;
    const auto v = host().config(std::string(config::keys::job_collective_timeout.name));
    return config::collective_timeout_s(v ? v->c_str() : nullptr, std::getenv(config::kCollectiveTimeoutEnv));
  }

  skyforge::cuda::EngineOptions opts_;
};

}  // namespace

SKYFORGE_PLUGIN(CudaBackend, "cuda", "0.1.0",
                "GPU data-parallel compute backend: CUDA kernels + cuBLAS, gradients over NCCL")
