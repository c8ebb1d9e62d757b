// skyforge `cpu` compute backend: the reference engine (docs/compute-backends.md).
//
// float32, NHWC, Keras semantics and defaults. GEMMs go through OpenBLAS (cblas_sgemm),
// convolutions through im2col + GEMM, everything else through OpenMP loops. The engine lives
// in this static library (skyforge_cpu_engine) so tests drive it without a host; the plugin
// (cpu_plugin.cpp) is a thin ComputeBackend around make_engine().
//
// Layout: every trainable parameter lives in one flat buffer (layers in the graph's run order,
// each layer's kernel before its bias, BN gamma before beta), its gradient in a parallel flat
// buffer. That makes get/set_params a copy, the optimizer one vectorised loop and gradient
// buckets contiguous slices (reverse run order = from the end of the buffer).
#pragma once

#include "graph_plan.hpp"

#include <skyforge/engine_state.hpp>
#include <skyforge/lr_schedule.hpp>
#include <skyforge/optimizer_schema.hpp>
#include <skyforge/sdk.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace skyforge::schema {
class LayerConfig;
}

namespace skyforge::cpu {

using Shape = std::vector<uint32_t>;  // one sample's shape, no batch axis
size_t numel(const Shape& s);
std::string shape_str(const Shape& s);

// Uniform float in [0, 1) from the pinned generator (24 random bits): identical everywhere.
float uniform01(Rng& rng);

// Threads and the fixed reduction split every kernel uses.
struct Exec {
  int threads = 1;  // OpenMP threads for elementwise / im2col / reduction loops
};

// Simple byte writer/reader for state_dict (native little-endian; size-checked).
class ByteWriter {
 public:
  void raw(const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
  template <class T>
  void put(const T& v) { raw(&v, sizeof(T)); }
  void floats(const float* p, size_t n) {
    put<uint64_t>(n);
    raw(p, n * sizeof(float));
  }
  std::string out;
};
class ByteReader {
 public:
  explicit ByteReader(std::string_view b) : b_(b) {}
  void raw(void* p, size_t n, const char* what);
  template <class T>
  T get(const char* what) {
    T v;
    raw(&v, sizeof(T), what);
    return v;
  }
  // Reads a length-prefixed float array that must hold exactly n values.
  void floats(float* p, size_t n, const char* what);
  size_t left() const { return b_.size() - pos_; }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

// gelu: Keras' exact x * Phi(x) (erf); gelu_tanh: its tanh approximation (approximate=True).
enum class Activation { linear, relu, softmax, gelu, gelu_tanh, tanh, sigmoid };

// One layer. Buffers are batch-major: x is batch * numel(in_shape), y batch * numel(out_shape).
class Layer {
 public:
  virtual ~Layer() = default;
  std::string type;
  size_t index = 0;  // position in the model (for messages)
  Shape in_shape, out_shape;

  // Trainable parameters, as a count; the engine binds them into its flat buffers.
  virtual size_t param_size() const { return 0; }
  void bind(float* params, float* grads) {
    p_ = params;
    g_ = grads;
  }
  // Preallocate scratch for up to `batch` samples (called when the batch capacity grows).
  virtual void reserve(uint32_t /*batch*/) {}
  virtual void forward(const float* x, float* y, uint32_t batch, bool training) = 0;
  // The run's seed and the optimizer step the next training forward belongs to (dropout's
  // masks are a function of both: docs/kernels.md, "Dropout").
  virtual void begin_step(uint64_t /*seed*/, uint64_t /*step*/) {}
  // Gradients: dy (mutable scratch, may be overwritten) -> dx (nullptr: not needed, the first
  // layer) and the layer's parameter gradients, which are OVERWRITTEN (not accumulated) with the
  // sum over the batch of dL/dparam. x and y are the buffers of the last training forward.
  virtual void backward(const float* x, const float* y, float* dy, float* dx, uint32_t batch) = 0;
  // The same for a layer of several inputs (add, concatenate): xs[k] is input k's buffer and
  // dxs[k] its gradient (nullptr: not needed), in the order the layer's `inputs` name them. A
  // layer of one input keeps forward/backward above, which these call.
  virtual void forward_inputs(std::span<const float* const> xs, float* y, uint32_t batch, bool training) {
    forward(xs[0], y, batch, training);
  }
  virtual void backward_inputs(std::span<const float* const> xs, const float* y, float* dy,
                               std::span<float* const> dxs, uint32_t batch) {
    backward(xs[0], y, dy, dxs[0], batch);
  }
  // Non-trainable state (BN moving statistics: mean, then variance) for state_dict, and the
  // reader of version-1 cpu states (ByteReader).
  virtual void moving(std::vector<std::vector<float>*>& /*out*/) {}
  virtual void load_state(ByteReader& /*r*/) {}
  // Fuses a ReLU layer that follows this one: the forward then applies max(., 0) to its output
  // and the backward masks dy by that output. Returns false when the layer cannot.
  virtual bool fuse_relu() { return false; }
  // The engine's communicator, for a layer whose training passes meet the other replicas
  // (batch_normalization with synchronized = true); the others ignore it.
  virtual void set_communicator(const Communicator& /*comm*/) {}
  // The output is the input's bytes, reshaped (flatten): the engine hands the input on, with
  // no forward, no buffer and no backward (the gradient is the same bytes too).
  virtual bool is_view() const { return false; }
  // Inputs the last forward could not use (embedding: values that are not indices), which it
  // treated as zeros: their count, and `first` describes the first one. The engine refuses the
  // step on every replica alike when any replica counted one (CpuEngine::compute).
  virtual uint64_t invalid_inputs(std::string& /*first*/) const { return 0; }
  // A short description that changes when the architecture does (state_dict compatibility).
  virtual std::string describe() const;

  void set_exec(const Exec& e) { exec_ = e; }
  float* params() { return p_; }
  float* grads() { return g_; }

 protected:
  float* p_ = nullptr;
  float* g_ = nullptr;
  Exec exec_;
};

// Builds layer `index` (its position in the listing) from its spec for its inputs' shapes `in`
// (one per input; a merge layer takes two or more); validates options and shapes, throwing
// Error(SF_ERR_INVALID) "layer <index> (<type>): ...". seed/rank feed dropout's generator. The
// layer's in_shape is its first input's.
std::unique_ptr<Layer> make_layer(const LayerSpec& spec, const std::vector<Shape>& in, size_t index, uint64_t seed,
                                  uint32_t rank);
inline std::unique_ptr<Layer> make_layer(const LayerSpec& spec, const Shape& in, size_t index, uint64_t seed,
                                         uint32_t rank) {
  return make_layer(spec, std::vector<Shape>{in}, index, seed, rank);
}
// add and concatenate (layers_merge.cpp), for make_layer: `config` parsed, `in` checked by the schema.
std::unique_ptr<Layer> make_merge_layer(const schema::LayerConfig& config, const std::vector<Shape>& in);

// Test hook: dropout with a frozen mask (a forward in training mode reuses the last mask
// instead of drawing a new one). Throws unless `layer` is a dropout layer.
void dropout_freeze_mask(Layer& layer, bool frozen);

// Sparse categorical cross-entropy from logits over `batch` rows of `classes`, stable
// log-softmax. Returns the SUM of per-sample losses (double); *correct counts argmax == label
// (first maximum wins). dlogits (may be nullptr) receives softmax - onehot per sample, i.e. the
// gradient of the summed loss. Labels must be in [0, classes) (checked by the caller).
double sparse_xent(const float* logits, const int32_t* labels, uint32_t batch, uint32_t classes, float* dlogits,
                   uint64_t* correct, const Exec& ex);

// ---- optimizers (Keras update rules) ------------------------------------------------------
// An optimizer's options as numbers, Keras' defaults from the optimizer schema
// (skyforge/optimizer_schema.hpp), which parse_optimizer checks them against.
struct OptimizerConfig {
  std::string name{schema::kDefaultOptimizer};  // "adam" | "adamw" | "sgd" | "rmsprop"
  double learning_rate = schema::default_real(name, "learning_rate");
  double momentum = schema::default_real("sgd", "momentum");  // sgd, rmsprop
  bool nesterov = false;  // sgd
  double beta_1 = schema::default_real("adam", "beta_1"), beta_2 = schema::default_real("adam", "beta_2"),
         epsilon = schema::default_real("adam", "epsilon");  // epsilon: adam, adamw, rmsprop
  double weight_decay = 0;                                   // adamw
  double rho = schema::default_real("rmsprop", "rho");        // rmsprop
  bool centered = false;                                      // rmsprop
  LrSchedule schedule;  // the learning rate of each update: learning_rate, or the schedule
  double clipnorm = 0, global_clipnorm = 0;  // 0: off
};
// Throws Error(SF_ERR_INVALID) naming the optimizer and the option.
OptimizerConfig parse_optimizer(const std::string& name, const Options& opts);

class Optimizer {
 public:
  // variables: each weight tensor's size (a kernel, a bias: Keras' variables), in the flat
  // buffer's order; clipnorm clips each alone. With n: one variable of n.
  Optimizer(OptimizerConfig cfg, std::vector<size_t> variables);
  Optimizer(OptimizerConfig cfg, size_t n) : Optimizer(std::move(cfg), std::vector<size_t>{n}) {}
  // One update of every parameter from grads * grad_scale (grad_scale turns a gradient sum into
  // a mean), clipped first when the config clips (then grads holds the clipped mean on return).
  // `iteration` counts updates already applied (Keras' optimizer.iterations): the schedule's step.
  void apply(float* params, float* grads, float grad_scale, uint64_t iteration, const Exec& ex);
  size_t slot_count() const { return slots_.size(); }
  float* slots() { return slots_.data(); }
  const float* slots_data() const { return slots_.data(); }
  const OptimizerConfig& config() const { return cfg_; }

 private:
  // grads <- grads * grad_scale, clipped by clipnorm per variable or global_clipnorm over all.
  void clip(float* grads, float grad_scale, const Exec& ex) const;

  OptimizerConfig cfg_;
  std::vector<size_t> variables_;
  size_t n_;
  std::vector<float> slots_;  // schema::slots_per_parameter blocks of n, in its order
};

// ---- the engine ----------------------------------------------------------------------------
struct EngineOptions {
  uint32_t default_threads = 0;  // the plugin's `threads` option; 0: every usable core
  size_t bucket_bytes = 4u << 20;  // gradient allreduce bucket size
  bool fuse = true;                // fuse batch_normalization + relu, flatten as a view (tests compare with false)
};

// SKYFORGE_CPU_PROFILE=1: per-layer wall time of forward and backward, loss, allreduce and
// optimizer, accumulated over the engine's train steps and printed to stderr as mean
// microseconds per step when the engine is destroyed. Off (no clock reads) otherwise.
struct Profile;

class CpuEngine : public Engine {
 public:
  CpuEngine(const ModelSpec& spec, const Communicator& comm, const EngineOptions& opt = {});
  ~CpuEngine() override;

  StepResult train_step(const float* x, const int32_t* y, uint32_t batch) override;
  StepResult eval_step(const float* x, const int32_t* y, uint32_t batch) override;
  void predict(const float* x, uint32_t batch, float* logits) override;
  uint64_t param_count() const override { return params_.size(); }
  void get_params(float* out, uint64_t count) const override;
  void set_params(const float* in, uint64_t count) override;
  // skyforge/engine_state.hpp: the backend-neutral layout; load_state also reads the cpu
  // backend's own version-1 format (load_state_v1).
  std::string state_dict() const override;
  void load_state(std::string_view bytes) override;

  // Introspection for tests and tools.
  int threads() const { return exec_.threads; }
  uint64_t step() const { return step_; }
  // The architecture text of the version-1 format (tests build such states by hand).
  const std::string& v1_architecture() const { return legacy_arch_; }
  size_t num_layers() const { return layers_.size(); }
  Layer& layer(size_t i) { return *layers_[i]; }
  uint32_t classes() const { return classes_; }
  // Mean gradient of the (global) batch loss in training mode, without an update
  // (data-parallel: collective, like train_step). Returns the step's loss/accuracy.
  StepResult gradients(const float* x, const int32_t* y, uint32_t batch, std::vector<float>& grads);

 private:
  void ensure_capacity(uint32_t batch);
  void check_batch(const void* x, const int32_t* y, uint32_t batch, const char* what) const;
  EngineState shape_of_state();  // this engine's state, sized, with no values
  std::vector<std::vector<float>*> moving_state() const;  // non-trainable state, in run order
  // A training forward updates the moving statistics, a version-1 state overwrites them: a step
  // that fails after its forward (every replica refusing invalid inputs, among others) and a
  // state that fails half way put them back (kept before, restored when it throws).
  void keep_moving_state();
  void restore_moving_state();
  void load_state_v1(std::string_view bytes);
  // The last forward's unusable inputs over every layer (Layer::invalid_inputs), and the error
  // every replica throws when the global batch held any (SF_ERR_INVALID).
  uint64_t invalid_inputs(std::string& first) const;
  [[noreturn]] void refuse_invalid_inputs(const std::string& first, double count) const;
  // The buffer layer j's output is in (j: a listing index, or GraphPlan::kInput for x).
  float* output_of(size_t j, const float* x, bool training);
  // prof: where to add this call's times (train_step's calls only; null otherwise).
  const float* forward(const float* x, uint32_t batch, bool training, Profile* prof = nullptr);
  // The backward of GraphPlan::backward from the loss's gradient, the buckets' allreduce with it.
  void backward(const float* x, uint32_t batch, Profile* prof);
  StepResult compute(const float* x, const int32_t* y, uint32_t batch, bool training, bool backward,
                     Profile* prof = nullptr);

  Communicator comm_;
  Exec exec_;
  EngineOptions eopt_;
  Shape input_shape_;
  // The model graph (schema::graph): layers in listing order, run in order_.
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::vector<size_t>> inputs_;  // per layer: its producers (GraphPlan::kInput: x)
  std::vector<size_t> order_;
  size_t output_ = 0;                 // the model's output layer
  std::vector<size_t> param_offset_;  // per layer: its parameters in the flat buffers (run order)
  GraphPlan plan_;
  uint32_t classes_ = 0;
  std::vector<float> params_, grads_;
  std::vector<float> moving_kept_;  // keep_moving_state's copy, every layer's in run order
  std::unique_ptr<Optimizer> opt_;
  uint64_t step_ = 0;
  uint64_t seed_ = 0;  // the run's seed: dropout masks (from the spec, or from a loaded state)
  uint32_t capacity_ = 0;
  std::vector<std::vector<float>> act_slots_, grad_slots_;  // plan_'s slots, batch * width each
  std::vector<const float*> xs_;                     // one layer's input buffers
  std::vector<float*> dxs_;                          // one layer's input gradients
  std::vector<uint8_t> fused_;            // layer i is a relu fused into its input (batch_normalization)
  std::vector<uint8_t> view_;             // layer i is a view: its output is its input's buffer
  std::string arch_;                      // schema::architecture_text: what a state must match
  std::string legacy_arch_;               // describe() of every layer + optimizer: version-1 states
  std::unique_ptr<Profile> prof_;         // SKYFORGE_CPU_PROFILE
};

std::unique_ptr<Engine> make_engine(const ModelSpec& spec, const Communicator& comm,
                                    const EngineOptions& opt = {});

// Threads this process may use (sched_getaffinity), at least 1.
int usable_cores();

}  // namespace skyforge::cpu
