// The cpu backend's engine: model assembly, training step, data parallelism, optimizers,
// state_dict.
#include "cpu_ops.hpp"

#include <skyforge/engine_state.hpp>
#include <skyforge/initial_weights.hpp>
#include <skyforge/layer_schema.hpp>

#include <omp.h>
#include <sched.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define SKYFORGE_CPU_MXCSR 1
#endif

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdlib>

namespace skyforge::cpu {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return 1;
}

namespace {

// OpenBLAS runs single-threaded: the engine's OpenMP threads split big GEMMs themselves
// (cpu_ops.hpp, gemm), so one pool of exactly `threads` threads does all the work.
void use_single_threaded_blas() {
  static std::atomic<bool> done{false};
  if (!done.exchange(true)) openblas_set_num_threads(1);
}

[[noreturn]] void invalid(const std::string& m) { throw Error(m, SF_ERR_INVALID); }

// Flush-to-zero and denormals-are-zero (MXCSR FTZ | DAZ) for the duration of one engine call, on
// the calling thread and on its OpenMP workers, restored afterwards. Subnormal floats (below
// 1.2e-38) cost x86 cores a microcode assist per operation: Adam's second moments and tiny
// gradients reach them after an epoch or so and made the optimizer several times slower.
// TensorFlow/Keras run their CPU kernels the same way (and PyTorch offers it as
// torch.set_flush_denormal). Every thread flushes, so results do not depend on the thread count.
//
// libgomp does not keep its workers: a team smaller than the last one retires the extra
// threads, and a larger one creates threads that inherit the creating thread's MXCSR. So the
// calling thread flushes first (threads created during the call start flushed), a team of
// `threads` sets every worker, and on the way out the calling thread is restored first and a
// team of `threads` then restores every worker to the caller's value, unconditionally.
#if defined(SKYFORGE_CPU_MXCSR)
constexpr unsigned kFtzDaz = 0x8040;  // FTZ (bit 15) | DAZ (bit 6)

class FlushDenormals {
 public:
  explicit FlushDenormals(int threads) : threads_(threads), saved_(_mm_getcsr()) { set_all(saved_ | kFtzDaz); }
  ~FlushDenormals() { set_all(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  void set_all(unsigned csr) const {
    _mm_setcsr(csr);
    if (threads_ > 1) {
#pragma omp parallel num_threads(threads_)
      _mm_setcsr(csr);
    }
  }
  int threads_;
  unsigned saved_;
};
#else
class FlushDenormals {
 public:
  explicit FlushDenormals(int) {}
};
#endif

constexpr char kMagic[8] = {'S', 'F', 'C', 'P', 'U', 'E', 'N', 'G'};

}  // namespace

// ---- profile -------------------------------------------------------------------------------
struct Profile {
  using clock = std::chrono::steady_clock;
  std::vector<double> fwd, bwd;  // seconds, per layer, train steps only
  double loss = 0, allreduce = 0, optimizer = 0, total = 0;
  uint64_t steps = 0, samples = 0;
  static double since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }
  static bool enabled() {
    const char* e = std::getenv("SKYFORGE_CPU_PROFILE");
    return e && *e && std::strcmp(e, "0") != 0;
  }
};

// ---- engine --------------------------------------------------------------------------------
CpuEngine::~CpuEngine() {
  if (!prof_ || prof_->steps == 0) return;
  const Profile& p = *prof_;
  const double us = 1e6 / static_cast<double>(p.steps);
  const simd::Kernels* sk = simd::kernels();
  std::fprintf(stderr, "skyforge cpu profile (rank %u): %llu train steps, %.1f samples/step, %d thread(s), kernels %s;"
               " mean us per step\n", comm_.rank(), static_cast<unsigned long long>(p.steps),
               static_cast<double>(p.samples) / static_cast<double>(p.steps), exec_.threads, sk ? sk->name : "openblas");
  std::fprintf(stderr, "  %-5s %-48s %10s %10s\n", "layer", "", "forward", "backward");
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = *layers_[i];
    const std::string what = l.type + " " + shape_str(l.in_shape) + "->" + shape_str(l.out_shape) +
                             (fused_[i] ? " (fused)" : view_[i] ? " (view)" : "");
    std::fprintf(stderr, "  %-5zu %-48s %10.1f %10.1f\n", i, what.c_str(), p.fwd[i] * us, p.bwd[i] * us);
  }
  double f = 0, b = 0;
  for (size_t i = 0; i < layers_.size(); ++i) f += p.fwd[i], b += p.bwd[i];
  std::fprintf(stderr, "  %-54s %10.1f %10.1f\n", "layers", f * us, b * us);
  std::fprintf(stderr, "  %-54s %10.1f\n", "loss", p.loss * us);
  std::fprintf(stderr, "  %-54s %10.1f\n", "gradient allreduce", p.allreduce * us);
  std::fprintf(stderr, "  %-54s %10.1f\n", "optimizer", p.optimizer * us);
  std::fprintf(stderr, "  %-54s %10.1f\n", "train_step total", p.total * us);
}

CpuEngine::CpuEngine(const ModelSpec& spec, const Communicator& comm, const EngineOptions& opt)
    : comm_(comm), eopt_(opt), input_shape_(spec.input_shape), seed_(spec.seed) {
  exec_.threads = spec.threads > 0             ? static_cast<int>(spec.threads)
                  : opt.default_threads > 0 ? static_cast<int>(opt.default_threads)
                                            : usable_cores();
  try {
    schema::check_model(input_shape_, spec.layers.size(), spec.loss);
  } catch (const schema::LayerError& e) {
    invalid(e.what());
  }
  const OptimizerConfig ocfg = parse_optimizer(spec.optimizer, spec.optimizer_options);

  // The model graph (skyforge/layer_schema.hpp): its errors name the layer.
  std::vector<schema::LayerConfig> configs;
  schema::Graph g;
  try {
    for (size_t i = 0; i < spec.layers.size(); ++i) {
      const auto& given = spec.layers[i].options.all();
      configs.push_back(schema::parse(spec.layers[i].type, {given.begin(), given.end()}, i));
    }
    g = schema::graph(input_shape_, configs);
    classes_ = schema::classes_of(g.shapes[g.output].output, g.output, configs[g.output].type());
  } catch (const schema::LayerError& e) {
    invalid(e.what());
  }
  inputs_ = g.inputs;
  order_ = g.order;
  output_ = g.output;
  legacy_arch_ = "input" + shape_str(input_shape_);
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    auto l = make_layer(spec.layers[i], g.in_shapes[i], i, spec.seed, comm_.rank());
    l->set_exec(exec_);
    l->set_communicator(comm_);
    legacy_arch_ += ';';
    legacy_arch_ += l->describe();
    layers_.push_back(std::move(l));
  }
  legacy_arch_ += ';';
  legacy_arch_ += ocfg.name;
  arch_ = schema::architecture_text(input_shape_, configs, ocfg.name);

  // Parameters in run order: the SDK's initial weights, every backend's (skyforge/initial_weights.hpp).
  std::vector<size_t> variables;  // each weight tensor (Keras' variables: clipnorm clips each alone)
  size_t total = 0;
  param_offset_.assign(layers_.size(), 0);
  for (size_t i : order_) {
    param_offset_[i] = total;
    total += layers_[i]->param_size();
    for (uint64_t w : g.shapes[i].weights) variables.push_back(w);
  }
  params_ = initial_weights(input_shape_, configs, spec.seed);
  if (params_.size() != total) throw std::logic_error("cpu: the layers' parameter counts differ from the layer schema's");
  grads_.assign(total, 0.f);
  for (size_t i = 0; i < layers_.size(); ++i)
    layers_[i]->bind(params_.data() + param_offset_[i], grads_.data() + param_offset_[i]);
  opt_ = std::make_unique<Optimizer>(ocfg, std::move(variables));

  // A view (flatten, reshape) hands its input's buffer on. A relu whose input is a layer that can
  // apply it (batch_normalization) feeding nothing else is fused into it: no pass, no buffer, no
  // backward of its own (bit-identical results, fewer memory passes).
  fused_.assign(layers_.size(), 0);
  view_.assign(layers_.size(), 0);
  std::vector<PlanLayer> plan(layers_.size());
  for (size_t i : order_) {
    const size_t in = inputs_[i][0];
    view_[i] = eopt_.fuse && layers_[i]->is_view();
    fused_[i] = eopt_.fuse && layers_[i]->type == "relu" && in != GraphPlan::kInput && !plan[in].alias &&
                g.consumers[in].size() == 1 && layers_[in]->fuse_relu();
    plan[i] = {inputs_[i], numel(layers_[i]->out_shape), layers_[i]->param_size() > 0, view_[i] || fused_[i]};
  }
  plan_ = plan_graph(plan, order_, output_);
  if (Profile::enabled()) {
    prof_ = std::make_unique<Profile>();
    prof_->fwd.assign(layers_.size(), 0.0);
    prof_->bwd.assign(layers_.size(), 0.0);
  }
  // Data-parallel: every replica starts from rank 0's weights, whatever its seed.
  comm_.broadcast(params_.data(), params_.size() * sizeof(float), 0);
}

void CpuEngine::ensure_capacity(uint32_t batch) {
  if (batch <= capacity_) return;
  // BLAS takes int dimensions: keep every activation tensor below 2^31 elements.
  for (const auto& l : layers_)
    if (static_cast<double>(batch) * static_cast<double>(numel(l->out_shape)) >= 2147483647.0 ||
        static_cast<double>(batch) * static_cast<double>(numel(l->in_shape)) >= 2147483647.0)
      invalid("batch " + std::to_string(batch) + " is too large for layer " + std::to_string(l->index) + " (" +
              l->type + "): its activations would exceed 2^31 elements");
  act_slots_.resize(plan_.act_width.size());
  for (size_t s = 0; s < act_slots_.size(); ++s) act_slots_[s].assign(batch * plan_.act_width[s], 0.f);
  grad_slots_.resize(plan_.grad_width.size());
  for (size_t s = 0; s < grad_slots_.size(); ++s) grad_slots_[s].assign(batch * plan_.grad_width[s], 0.f);
  for (const auto& l : layers_) l->reserve(batch);
  capacity_ = batch;
}

void CpuEngine::check_batch(const void* x, const int32_t* y, uint32_t batch, const char* what) const {
  if (batch == 0) invalid(std::string(what) + ": batch must be > 0");
  if (!x) invalid(std::string(what) + ": x is NULL");
  if (y) {
    for (uint32_t i = 0; i < batch; ++i)
      if (y[i] < 0 || static_cast<uint32_t>(y[i]) >= classes_)
        invalid(std::string(what) + ": label " + std::to_string(y[i]) + " of sample " + std::to_string(i) +
                " is outside [0, " + std::to_string(classes_) + ")");
  }
}

float* CpuEngine::output_of(size_t j, const float* x, bool training) {
  const size_t v = j == GraphPlan::kInput ? j : plan_.value[j];
  // No layer writes to its inputs, so the caller's input may stand in for a layer's output.
  if (v == GraphPlan::kInput) return const_cast<float*>(x);
  return act_slots_[(training ? plan_.train_slot : plan_.infer_slot)[v]].data();
}

const float* CpuEngine::forward(const float* x, uint32_t batch, bool training, Profile* prof) {
  for (size_t i : order_) {
    if (plan_.value[i] != i) continue;  // a view or a fused relu: its output is its input's buffer
    xs_.clear();
    for (size_t j : inputs_[i]) xs_.push_back(output_of(j, x, training));
    const auto t0 = prof ? Profile::clock::now() : Profile::clock::time_point{};
    if (training) layers_[i]->begin_step(seed_, step_);
    layers_[i]->forward_inputs(xs_, output_of(i, x, training), batch, training);
    if (prof) prof->fwd[i] += Profile::since(t0);
  }
  return output_of(output_, x, training);
}

// Reverse run order from the loss's gradient (in plan_.output_grad). A layer's output read by
// several layers gets the sum of their gradients: the first (last to run) writes it, the others'
// come through a scratch slot added in, in reverse run order: the same order every time.
void CpuEngine::backward(const float* x, uint32_t batch, Profile* prof) {
  auto tick = [&] { return prof ? Profile::clock::now() : Profile::clock::time_point{}; };
  const bool dp = comm_.size() > 1;
  const size_t bucket = std::max<size_t>(eopt_.bucket_bytes / sizeof(float), 1);
  size_t lo = params_.size(), hi = params_.size();  // pending bucket [lo, hi), grows downwards
  for (const GraphPlan::Step& s : plan_.backward) {
    const size_t i = s.layer;
    xs_.clear();
    dxs_.clear();
    for (size_t k = 0; k < inputs_[i].size(); ++k) {
      xs_.push_back(output_of(inputs_[i][k], x, true));
      dxs_.push_back(s.dx[k] == GraphPlan::kNone ? nullptr : grad_slots_[s.dx[k]].data());
    }
    auto t0 = tick();
    layers_[i]->backward_inputs(xs_, output_of(i, x, true), grad_slots_[s.dy].data(), dxs_, batch);
    for (size_t k = 0; k < s.sum_into.size(); ++k)
      if (s.sum_into[k] != GraphPlan::kNone)
        k::add_into(grad_slots_[s.sum_into[k]].data(), dxs_[k], batch * numel(layers_[inputs_[i][k]]->out_shape),
                    exec_);
    if (prof) prof->bwd[i] += Profile::since(t0);
    if (dp && layers_[i]->param_size() > 0) {
      lo = param_offset_[i];
      // Reverse parameter order, as backward produces them: a bucket goes out once it is full.
      if (hi - lo >= bucket) {
        t0 = tick();
        comm_.allreduce(grads_.data() + lo, hi - lo, SF_REDUCE_SUM);
        if (prof) prof->allreduce += Profile::since(t0);
        hi = lo;
      }
    }
  }
  const auto t0 = tick();
  if (dp && hi > 0) comm_.allreduce(grads_.data(), hi, SF_REDUCE_SUM);
  if (prof) prof->allreduce += Profile::since(t0);
}

// One forward (+ backward with bucketed gradient allreduce). Leaves grads_ holding the GLOBAL
// gradient SUM; the returned samples is the global count the caller divides by.
StepResult CpuEngine::compute(const float* x, const int32_t* y, uint32_t batch, bool training, bool backward,
                              Profile* prof) {
  check_batch(x, y, batch, training ? "train_step" : "eval_step");
  if (!y) invalid("labels are NULL");
  use_single_threaded_blas();
  ensure_capacity(batch);
  // A training forward moves the moving statistics: a step that fails after it (every replica
  // refusing invalid inputs, or any other error) leaves them as they were, as it leaves the weights.
  if (training) keep_moving_state();
  try {
    const float* logits = forward(x, batch, training, prof);
    auto tick = [&] { return prof ? Profile::clock::now() : Profile::clock::time_point{}; };
    auto t0 = tick();
    uint64_t correct = 0;
    float* dlogits =
        backward && plan_.output_grad != GraphPlan::kNone ? grad_slots_[plan_.output_grad].data() : nullptr;
    const double loss_sum = sparse_xent(logits, y, batch, classes_, dlogits, &correct, exec_);
    if (prof) prof->loss += Profile::since(t0);
    if (backward) this->backward(x, batch, prof);
    // loss sum, correct and samples of the global batch, in one small collective, after the
    // gradients': a training step meets its peers once (a meeting after the forward too would make
    // every step wait for the slowest forward and then again for the slowest backward).
    // ... and the inputs no layer could use (embedding indices), so that every replica refuses the
    // step alike, before any update, instead of one failing while its peers wait in a collective.
    std::string first_invalid;
    const uint64_t invalid_here = invalid_inputs(first_invalid);
    double stats[4] = {loss_sum, static_cast<double>(correct), static_cast<double>(batch),
                       static_cast<double>(invalid_here)};
    t0 = tick();
    comm_.allreduce(stats, 4, SF_REDUCE_SUM);
    if (prof) prof->allreduce += Profile::since(t0);
    if (stats[3] > 0) refuse_invalid_inputs(first_invalid, stats[3]);
    StepResult r;
    r.samples = static_cast<uint64_t>(stats[2]);
    r.correct = static_cast<uint64_t>(stats[1]);
    r.loss = stats[0] / stats[2];
    return r;
  } catch (...) {
    if (training) restore_moving_state();
    throw;
  }
}

StepResult CpuEngine::train_step(const float* x, const int32_t* y, uint32_t batch) {
  const FlushDenormals ftz(exec_.threads);
  const auto t0 = prof_ ? Profile::clock::now() : Profile::clock::time_point{};
  StepResult r = compute(x, y, batch, true, true, prof_.get());
  const auto t1 = prof_ ? Profile::clock::now() : Profile::clock::time_point{};
  // Every replica holds the same global sum, so the same update keeps them bit-identical.
  opt_->apply(params_.data(), grads_.data(), static_cast<float>(1.0 / static_cast<double>(r.samples)), step_, exec_);
  ++step_;
  if (prof_) {
    prof_->optimizer += Profile::since(t1);
    prof_->total += Profile::since(t0);
    ++prof_->steps;
    prof_->samples += batch;
  }
  return r;
}

StepResult CpuEngine::gradients(const float* x, const int32_t* y, uint32_t batch, std::vector<float>& g) {
  const FlushDenormals ftz(exec_.threads);
  StepResult r = compute(x, y, batch, true, true);
  g.resize(grads_.size());
  const float s = static_cast<float>(1.0 / static_cast<double>(r.samples));
  for (size_t i = 0; i < g.size(); ++i) g[i] = grads_[i] * s;
  return r;
}

StepResult CpuEngine::eval_step(const float* x, const int32_t* y, uint32_t batch) {
  const FlushDenormals ftz(exec_.threads);
  return compute(x, y, batch, false, false);
}

void CpuEngine::predict(const float* x, uint32_t batch, float* logits) {
  check_batch(x, nullptr, batch, "predict");
  if (!logits) invalid("predict: logits is NULL");
  const FlushDenormals ftz(exec_.threads);
  use_single_threaded_blas();
  ensure_capacity(batch);
  const float* out = forward(x, batch, false);
  std::string first_invalid;
  if (const uint64_t n = invalid_inputs(first_invalid)) refuse_invalid_inputs(first_invalid, static_cast<double>(n));
  std::memcpy(logits, out, size_t{batch} * classes_ * sizeof(float));
}

void CpuEngine::keep_moving_state() {
  moving_kept_.clear();
  for (const auto* m : moving_state()) moving_kept_.insert(moving_kept_.end(), m->begin(), m->end());
}

void CpuEngine::restore_moving_state() {
  const float* from = moving_kept_.data();
  for (auto* m : moving_state()) {
    std::copy(from, from + m->size(), m->begin());
    from += m->size();
  }
}

uint64_t CpuEngine::invalid_inputs(std::string& first) const {
  uint64_t n = 0;
  for (size_t i : order_) n += layers_[i]->invalid_inputs(first);
  return n;
}

void CpuEngine::refuse_invalid_inputs(const std::string& first, double count) const {
  const std::string what = std::to_string(static_cast<uint64_t>(count)) + " input value(s) of the global batch are not "
                           "valid indices";
  invalid(first.empty() ? what + " (on another replica)" : first + " (" + what + ")");
}

void CpuEngine::get_params(float* out, uint64_t count) const {
  if (count != params_.size())
    invalid("get_params: count " + std::to_string(count) + " != param_count " + std::to_string(params_.size()));
  if (count) std::memcpy(out, params_.data(), count * sizeof(float));
}

void CpuEngine::set_params(const float* in, uint64_t count) {
  if (count != params_.size())
    invalid("set_params: count " + std::to_string(count) + " != param_count " + std::to_string(params_.size()));
  if (count) std::memcpy(params_.data(), in, count * sizeof(float));
}

// The layers' non-trainable state (batch_normalization's moving statistics), in run order.
std::vector<std::vector<float>*> CpuEngine::moving_state() const {
  std::vector<std::vector<float>*> moving;
  for (size_t i : order_) layers_[i]->moving(moving);
  return moving;
}

// state_dict: the backend-neutral engine state (skyforge/engine_state.hpp), what the cuda engine
// writes and reads too, so a checkpoint moves between the two.
EngineState CpuEngine::shape_of_state() {
  EngineState s;
  s.architecture = arch_;
  s.params.resize(params_.size());
  s.slots.resize(opt_->slot_count());
  for (const auto* m : moving_state()) s.moving.emplace_back(m->size());
  return s;
}

std::string CpuEngine::state_dict() const {
  EngineState s;
  s.architecture = arch_;
  s.seed = seed_;
  s.step = step_;
  s.params = params_;
  s.slots.assign(opt_->slots_data(), opt_->slots_data() + opt_->slot_count());
  for (const auto* m : moving_state()) s.moving.push_back(*m);
  return write_engine_state(s);
}

void CpuEngine::load_state(std::string_view bytes) {
  if (!is_engine_state(bytes)) return load_state_v1(bytes);
  // Validate everything before touching the engine: a failed load leaves it unchanged.
  EngineState s;
  try {
    s = read_engine_state(bytes, shape_of_state());
  } catch (const std::invalid_argument& e) {
    invalid(std::string("cpu: ") + e.what());
  }
  step_ = s.step;
  seed_ = s.seed;  // dropout masks follow the run, not this engine's spec
  params_ = std::move(s.params);
  if (!s.slots.empty()) std::memcpy(opt_->slots(), s.slots.data(), s.slots.size() * sizeof(float));
  const std::vector<std::vector<float>*> moving = moving_state();
  for (size_t i = 0; i < moving.size(); ++i) *moving[i] = std::move(s.moving[i]);
  for (size_t i = 0; i < layers_.size(); ++i)  // params_ was replaced: rebind the layers
    layers_[i]->bind(params_.data() + param_offset_[i], grads_.data() + param_offset_[i]);
}

// The cpu backend's own format before the neutral one (version 1, native byte order):
//   char[8] "SFCPUENG" | u32 version (1) | u32 reserved (0)
//   u64 n + arch text (describe() of every layer and the optimizer name)
//   u64 step
//   u64 n + f32[n] parameters | u64 n + f32[n] optimizer slots
//   u32 n_layers, then each layer's state in order (batch_normalization: u64 C + moving_mean,
//       u64 C + moving_variance; dropout: a 32-byte generator state; others: nothing)
// Checkpoints written before this layout went away still resume: the dropout generator is read
// and dropped (masks are a function of the seed now) and the engine keeps its own seed.
void CpuEngine::load_state_v1(std::string_view bytes) {
  ByteReader r(bytes);
  char magic[8];
  r.raw(magic, sizeof(magic), "magic");
  if (std::memcmp(magic, kMagic, sizeof(magic)) != 0) invalid("cpu state: not a cpu backend state (bad magic)");
  const uint32_t version = r.get<uint32_t>("version");
  if (version != 1)
    invalid("cpu state: version " + std::to_string(version) + " is not supported (this backend reads version 1 of "
            "its own format and the engine state of skyforge/engine_state.hpp)");
  r.get<uint32_t>("reserved");
  const uint64_t alen = r.get<uint64_t>("architecture");
  if (alen > r.left()) invalid("cpu state: truncated architecture");
  std::string arch(alen, '\0');
  r.raw(arch.data(), alen, "architecture");
  if (arch != legacy_arch_)
    invalid("cpu state: saved from a different model or optimizer (" +
            engine_state_detail::first_difference(arch, legacy_arch_) + ")");
  const uint64_t step = r.get<uint64_t>("step");
  std::vector<float> params(params_.size()), slots(opt_->slot_count());
  r.floats(params.data(), params.size(), "parameters");
  r.floats(slots.data(), slots.size(), "optimizer slots");
  const uint32_t nl = r.get<uint32_t>("layer count");
  if (nl != layers_.size())
    invalid("cpu state: " + std::to_string(nl) + " layers saved, this model has " + std::to_string(layers_.size()));
  keep_moving_state();  // a state that fails half way leaves the layers as they were
  try {
    for (auto& l : layers_) {
      if (l->type == "dropout") {
        char generator[32];
        r.raw(generator, sizeof generator, "dropout generator (version 1)");
      }
      l->load_state(r);
    }
    if (r.left() != 0) invalid("cpu state: " + std::to_string(r.left()) + " unexpected trailing bytes");
  } catch (...) {
    restore_moving_state();
    throw;
  }
  step_ = step;
  if (!params.empty()) std::memcpy(params_.data(), params.data(), params.size() * sizeof(float));
  if (!slots.empty()) std::memcpy(opt_->slots(), slots.data(), slots.size() * sizeof(float));
}

std::unique_ptr<Engine> make_engine(const ModelSpec& spec, const Communicator& comm, const EngineOptions& opt) {
  return std::make_unique<CpuEngine>(spec, comm, opt);
}

}  // namespace skyforge::cpu
