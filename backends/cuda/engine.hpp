// The cuda engine (docs/compute-backends.md, "The cuda engine"): the GPU
// data-parallel engine, written once against the device layer (device.hpp) and the kernels'
// launch API (kernels/include/skyforge/kernels/launch.hpp, docs/kernels.md). Built twice:
//   skyforge_cuda_engine_host  g++, host memory, OpenBLAS, the pool's communicator, kernels over
//                              Thrust's OpenMP system: what tests/cuda_backend runs;
//   skyforge_cuda_engine_gpu   the same engine.cpp with CUDA memory, cuBLAS, NCCL and the nvcc
//                              kernels (when CMake's SKYFORGE_CUDA is on).
// Layers come from the SDK's layer schema (skyforge/layer_schema.hpp, docs/layers.md).
//
// The model is the schema's graph (schema::graph): layers run in its order, a fan-out's
// gradients are summed, flatten and reshape are views. Parameters: one flat device buffer in
// the schema's layout (run order, each layer's kernel before its bias, batch_normalization's
// gamma before beta), initialised on the host as the cpu backend does (initial_weights.hpp),
// then uploaded and broadcast from rank 0.
#pragma once

#include "device.hpp"

#include <skyforge/engine_state.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace skyforge::cuda {

// The device's options (DeviceOptions: TF32, cuDNN's convolution algorithms, the collective
// timeout) and the engine's own. Each field's initializer is its one default; the plugin's
// options set them (plugin_options.hpp).
struct EngineOptions : DeviceOptions {
  size_t bucket_bytes = 4u << 20;  // gradient allreduce bucket size
  // A bound-data step of a shape seen before runs as a graph captured at its second
  // occurrence (docs/compute-backends.md, "Graphs"); false: every step eager.
  bool graphs = true;
};

// How the engine's bound-data steps ran (tests and the bench read it).
struct GraphStats {
  uint64_t eager = 0;     // steps run call by call (first of a shape, or graphs off)
  uint64_t captured = 0;  // graphs captured
  uint64_t replayed = 0;  // steps run as a graph
  size_t kept = 0;        // graphs held now
};

struct Layer;

// SKYFORGE_CUDA_PROFILE=1 (docs/compute-backends.md, "Profiling"): every train step runs eager
// and waits for the device at its end; the device time of each layer's forward and backward,
// the loss, the wait for the gradient allreduce and the optimizer (timing marks on the stream:
// CUDA events; wall clock in the host build) are summed and printed to stderr as mean
// microseconds per step when the engine is destroyed, with the algorithm of every conv2d
// window. Off otherwise: no marks, no waits.
struct CudaProfile;

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
  void step_batches(std::span<const uint32_t> batches) override;

  uint64_t step() const { return step_; }
  size_t device_bytes() const { return dev_->buffer_bytes(); }  // tests: what the engine holds
  GraphStats graph_stats() const {
    GraphStats g = stats_;
    g.kept = 0;
    for (const auto& [key, entry] : graphs_) g.kept += entry.graph != nullptr;
    return g;
  }
  const char* build() const { return Device::build_name(); }
  // Collectives the device has been given so far (tests: which path a step took).
  uint64_t collectives() const { return dev_->collectives_issued(); }
  // Where each layer's parameters start in the device's flat buffer, and its length with the
  // gaps that align them, in floats (tests).
  std::vector<size_t> param_offsets() const;
  size_t device_param_count() const { return n_device_; }

 private:
  struct BoundSet {
    Buffer<float> x;
    Buffer<int32_t> y;
    uint64_t n = 0;
  };
  void ensure_capacity(uint32_t batch);
  // A conv2d layer's im2col buffer (capacity_ rows), made at its first use: a layer that runs
  // on the device's own convolutions (cuDNN) never needs one. Outside captures only, which holds:
  // a window takes the same path every time, and every shape runs eager before it is captured.
  float* col_of(Layer& l);
  void check_batch(const void* x, const int32_t* y, uint32_t batch, const char* what) const;
  // A bound-data step's shape on this rank: a graph holds the set's pointers and the batch as
  // values, so both are part of its key. Data parallel, the graph is chosen by every rank's
  // shape (docs/compute-backends.md, "Graphs": capture is collective in NCCL): the caller's
  // step_batches, or else every rank's key gathered at each step.
  struct GraphKey {
    uint64_t data = 0;
    uint32_t batch = 0;
    uint8_t train = 0;
    uint8_t zero[3] = {};  // no indeterminate bytes in a gathered key
  };
  struct StepGraph {
    uint64_t data = 0;  // this rank's set: its graphs go with it (release_data)
    int seen = 0;       // eager runs so far: the second occurrence is captured
    // Buffers a later growth replaced (ensure_capacity), which the graph still points at
    // (declared before it: freed after it).
    std::vector<std::shared_ptr<Kept>> keep;
    std::unique_ptr<Device::Graph> graph;
    uint64_t* idx = nullptr;  // the index buffer the graph gathers from
  };
  // The key of this step's graph, the same on every rank: from `batches` (every rank's, as
  // step_batches gave them), or, when empty, gathered from every rank.
  std::string graph_key(uint64_t data, uint32_t batch, bool train, const std::vector<uint32_t>& batches);
  // The batch into x_ and labels_ from the host (a plain step).
  void stage(const float* x, const int32_t* y, uint32_t batch, const char* what);
  // A bound-data step: the indices go up, then gather + step run eager, captured or replayed.
  StepResult indexed(uint64_t data, const uint64_t* idx, uint32_t batch, bool train, bool deferred, const char* what);
  // The model graph's backward plan: which layers run one, the gradient slots (plan_gradients).
  void plan_gradients();
  // Input j of layer l in this step's forward (x: the model's input).
  const float* input_of(const Layer& l, size_t j, const float* x) const;
  const float* forward(const float* x, uint32_t batch, bool training);
  // Enqueues the staged batch's step: forward, loss, and with `train` the backward, the
  // gradient allreduce, the update and the device step counter. pend: its sums are added to
  // pending_ (every bound-data step: whether they stay there is not the graph's business, so a
  // step deferred on one rank and not on another still runs the same graph). Nothing here waits
  // for the device or depends on host state that changes from step to step, so it can be
  // captured as a graph.
  void enqueue(uint32_t batch, bool train, bool pend);
  StepResult read_sums();  // waits for the step
  // Throws SF_ERR_INVALID for `count` invalid embedding indices, saying what became of them.
  void check_indices(double count, const char* consequence) const;
  void check_refused();  // throws check_indices' error for refused steps, and clears it
  // Runs the part of a step that its peers take part in; a failure there fails the engine
  // (failure_) when data parallel. usable() throws once it has.
  template <class Step>
  void with_peers(const char* what, const Step& step);
  void usable() const;
  // SKYFORGE_CUDA_PROFILE: a timing mark when this step is profiled (see CudaProfile), else 0.
  size_t mark() const { return profiling_ ? dev_->mark() : 0; }
  void profile_step(uint32_t batch);  // waits for the step, adds its spans, clears the marks

  Communicator comm_;
  EngineOptions eopt_;
  mutable std::unique_ptr<Device> dev_;
  std::vector<uint32_t> input_shape_;
  std::vector<std::unique_ptr<Layer>> layers_;  // in run order (schema::Graph::order)
  size_t output_ = 0;                            // the output layer's position in layers_
  uint32_t classes_ = 0;
  uint64_t seed_ = 0;
  size_t n_params_ = 0;  // the model's parameters: param_count(), the state's layout
  // The device's layout of params_, grads_ and each optimizer slot: every layer's slice starts
  // at a multiple of kParamAlign floats (256 bytes: the alignment cudaMalloc gives, which
  // cuBLAS's and NCCL's vectorized paths want), zeros between.
  static constexpr size_t kParamAlign = 64;
  static size_t aligned(size_t n) { return (n + kParamAlign - 1) / kParamAlign * kParamAlign; }
  size_t n_device_ = 0;
  std::vector<float> to_device(const float* logical, size_t arrays) const;  // `arrays` layouts end to end
  void to_logical(const float* device, float* logical, size_t arrays) const;
  Buffer<float> params_, grads_, slots_;
  size_t n_slots_ = 0;
  std::string optimizer_;
  unsigned slots_per_param_ = 0;  // schema::slots_per_parameter
  kernels::AdamConfig adam_;      // adam, adamw
  kernels::SgdConfig sgd_;
  kernels::RmspropConfig rmsprop_;
  LrSchedule schedule_;           // every optimizer's rate, from state_'s step on the device
  kernels::ClipConfig clip_;      // clipping: clip_table_ holds the variables (clip.hpp), else empty
  Buffer<uint64_t> clip_table_;
  kernels::ClipLayout clip_layout_;
  Buffer<double> clip_ws_;
  uint64_t step_ = 0;
  uint32_t capacity_ = 0;
  Buffer<float> x_, loss_, hit_;
  // The backward's gradient buffers (batch x the widest layer each), shared by liveness: at
  // most n_gslots_ layer gradients are live at once (plan_gradients).
  std::vector<Buffer<float>> gslots_;
  size_t n_gslots_ = 0;
  size_t loss_slot_ = SIZE_MAX;  // the gslots_ entry the loss writes its gradient to (SIZE_MAX: none)
  Buffer<int32_t> labels_;
  Buffer<uint64_t> idx_;
  Buffer<double> ws_;
  Buffer<double> sums_;     // this step's loss sum, correct count, samples, invalid indices (kSums; global after the allreduce)
  Buffer<double> pending_;  // the deferred steps' sums since the last take_results
  Buffer<kernels::StepState> state_;  // the step counter, Adam's alpha, refused steps' count, on the device
  std::map<uint64_t, BoundSet> data_;
  uint64_t next_data_ = 1;
  std::map<std::string, StepGraph> graphs_;  // by graph_key; after data_ and the buffers: destroyed first
  std::vector<uint32_t> next_batches_;       // step_batches' for the next indexed step
  Buffer<double> pending_before_;            // pending_ before a step whose sums are returned
  GraphStats stats_;
  std::string arch_;  // schema::architecture_text: what a loaded state must match
  std::unique_ptr<CudaProfile> prof_;  // SKYFORGE_CUDA_PROFILE
  bool profiling_ = false;             // the step being enqueued is profiled
  bool embeds_ = false;                // an embedding layer: steps may meet invalid indices
  std::string failure_;                // a data-parallel step failed on this rank (with_peers)
  EngineState shape_of_state() const;  // this engine's state, sized, with no values
};

std::unique_ptr<Engine> make_engine(const ModelSpec& spec, const Communicator& comm, const Host& host = Host{},
                                    const EngineOptions& opt = {});

}  // namespace skyforge::cuda
