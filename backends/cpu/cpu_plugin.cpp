// The `cpu` compute backend plugin: a thin ComputeBackend over the engine library.
#include "cpu_engine.hpp"

namespace {

class CpuBackend : public skyforge::ComputeBackend {
 public:
  explicit CpuBackend(const skyforge::Context& ctx) : ComputeBackend(ctx) {
    const int64_t t = options().get_int("threads", 0);
    if (t < 0 || t > 4096)
      throw skyforge::Error("option 'threads': expected 0 (every usable core) or a positive count, got " +
                                std::to_string(t),
                            SF_ERR_INVALID);
    opts_.default_threads = static_cast<uint32_t>(t);
  }
  std::unique_ptr<skyforge::Engine> create_engine(const skyforge::ModelSpec& spec,
                                                  const skyforge::Communicator& comm) override {
    return skyforge::cpu::make_engine(spec, comm, opts_);
  }

 private:
  skyforge::cpu::EngineOptions opts_;
};

}  // namespace

SKYFORGE_PLUGIN(CpuBackend, "cpu", "0.1.0",
                "Reference compute backend: Keras-style layers on OpenBLAS + OpenMP, data-parallel")
