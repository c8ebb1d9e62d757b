// The cuda engine (docs/compute-backends.md, "The cuda engine (in progress)"): the GPU
// data-parallel engine, written once against the device layer (device.hpp) and the kernels'
// launch API (kernels/include/skyforge/kernels/launch.hpp, docs/kernels.md). Built twice:
//   skyforge_cuda_engine_host  g++, host memory, OpenBLAS, the pool's communicator, kernels over
//                              Thrust's OpenMP system: what tests/cuda_backend runs;
//   skyforge_cuda_engine_gpu   the same engine.cpp with CUDA memory, cuBLAS, NCCL and the nvcc
//                              kernels (when CMake's SKYFORGE_CUDA is on).
// Layers come from the SDK's layer schema (skyforge/layer_schema.hpp, docs/layers.md).
//
// Parameters: one flat device buffer in the cpu backend's layout (layer order, each layer's
// kernel before its bias, batch_normalization's gamma before beta), initialised on the host from
// skyforge::Rng(seed) in that order, exactly as the cpu backend does, then uploaded and broadcast
// from rank 0.
#pragma once

#include "device.hpp"

#include <skyforge/engine_state.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace skyforge::cuda {

struct EngineOptions {
  size_t bucket_bytes = 4u << 20;     // gradient allreduce bucket size
  double collective_timeout_s = 300;  // CUDA build: a collective not done by then aborts NCCL
};

struct Layer;

class CudaEngine : public Engine {
 public:
  // host: the pool's services (the CUDA build's NCCL rendezvous); may be empty for one node.
  CudaEngine(const ModelSpec& spec, const Communicator& comm, const Host& host = Host{},
             const EngineOptions& opt = {});
  ~CudaEngine() override;

  StepResult train_step(const float* x, const int32_t* y, uint32_t batch) override;
  StepResult eval_step(const float* x, const int32_t* y, uint32_t batch) override;
  void predict(const float* x, uint32_t batch, float* logits) override;
  uint64_t param_count() const override { return n_params_; }
  void get_params(float* out, uint64_t count) const override;
  void set_params(const float* in, uint64_t count) override;
  std::string state_dict() const override;  // skyforge/engine_state.hpp: the backend-neutral layout
  void load_state(std::string_view bytes) override;
  // Bound data (abi.h, ABI 1.8): the set in device memory, each batch gathered there, results
  // summed on the device until take_results (docs/compute-backends.md, "Bound data").
  uint64_t bind_data(const float* x, const int32_t* y, uint64_t n) override;
  void release_data(uint64_t data) override;
  StepResult train_step_indexed(uint64_t data, const uint64_t* idx, uint32_t batch, bool deferred) override;
  StepResult eval_step_indexed(uint64_t data, const uint64_t* idx, uint32_t batch, bool deferred) override;
  StepResult take_results() override;

  uint64_t step() const { return step_; }
  const char* build() const { return Device::build_name(); }

 private:
  struct BoundSet {
    Buffer<float> x;
    Buffer<int32_t> y;
    uint64_t n = 0;
  };
  void ensure_capacity(uint32_t batch);
  void check_batch(const void* x, const int32_t* y, uint32_t batch, const char* what) const;
  // The batch into x_ and labels_: copied from the host, or gathered from a bound set.
  void stage(const float* x, const int32_t* y, uint32_t batch, const char* what);
  void stage(uint64_t data, const uint64_t* idx, uint32_t batch, const char* what);
  const float* forward(const float* x, uint32_t batch, bool training);
  // The staged batch's step: forward, loss, and with `train` the backward, the gradient
  // allreduce and the update. Deferred: its sums go to pending_ and nothing waits for it.
  StepResult run(uint32_t batch, bool train, bool deferred);

  Communicator comm_;
  EngineOptions eopt_;
  mutable std::unique_ptr<Device> dev_;
  std::vector<uint32_t> input_shape_;
  std::vector<std::unique_ptr<Layer>> layers_;
  size_t first_trainable_ = 0;
  uint32_t classes_ = 0;
  uint64_t seed_ = 0;
  size_t n_params_ = 0;
  Buffer<float> params_, grads_, slots_;
  size_t n_slots_ = 0;
  std::string optimizer_;
  kernels::AdamConfig adam_;
  kernels::SgdConfig sgd_;
  uint64_t step_ = 0;
  uint32_t capacity_ = 0;
  Buffer<float> x_, gbuf_[2], loss_, hit_;
  Buffer<int32_t> labels_;
  Buffer<uint64_t> idx_;
  Buffer<double> ws_;
  Buffer<double> sums_;     // this step's loss sum, correct count and samples (global after the allreduce)
  Buffer<double> pending_;  // the deferred steps' sums since the last take_results
  std::map<uint64_t, BoundSet> data_;
  uint64_t next_data_ = 1;
  std::string arch_;  // schema::architecture_text: what a loaded state must match
  EngineState shape_of_state() const;  // this engine's state, sized, with no values
};

std::unique_ptr<Engine> make_engine(const ModelSpec& spec, const Communicator& comm, const Host& host = Host{},
                                    const EngineOptions& opt = {});

}  // namespace skyforge::cuda
