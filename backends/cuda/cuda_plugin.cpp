// The `cuda` compute backend plugin (docs/compute-backends.md, "The cuda engine"): a thin
// ComputeBackend over the engine's CUDA build. The only .so of the project that loads the CUDA
// runtime, cuBLAS and NCCL; its constructor touches none of them (so `skyforge validate` and
// `skyforge plugins` work on any machine), probe() says what is missing before a run starts.
#include "engine.hpp"

namespace {

class CudaBackend : public skyforge::ComputeBackend {
 public:
  explicit CudaBackend(const skyforge::Context& ctx) : ComputeBackend(ctx) {
    const int64_t mb = options().get_int("bucket_cap_mb", 4);
    if (mb < 1 || mb > 4096)
      throw skyforge::Error("option 'bucket_cap_mb': expected 1 to 4096 (MiB), got " + std::to_string(mb),
                            SF_ERR_INVALID);
    opts_.bucket_bytes = static_cast<size_t>(mb) << 20;
  }
  void probe() override { skyforge::cuda::Device::probe(); }
  std::unique_ptr<skyforge::Engine> create_engine(const skyforge::ModelSpec& spec,
                                                  const skyforge::Communicator& comm) override {
    return skyforge::cuda::make_engine(spec, comm, host(), opts_);
  }

 private:
  skyforge::cuda::EngineOptions opts_;
};

}  // namespace

SKYFORGE_PLUGIN(CudaBackend, "cuda", "0.1.0",
                "GPU data-parallel compute backend: CUDA kernels + cuBLAS, gradients over NCCL")
