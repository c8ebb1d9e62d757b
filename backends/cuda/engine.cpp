// The cuda engine (engine.hpp; docs/compute-backends.md, "The cuda engine"). No
// CUDA API here: memory, GEMMs and collectives go through Device, elementwise/row/reduction work
// through the kernels' launch API, so this file is compiled for both builds.
#include "engine.hpp"

#include "attention.hpp"

#include <skyforge/initial_weights.hpp>
#include <skyforge/kernels/activation.hpp>
#include <skyforge/lr_schedule_of.hpp>

#include <skyforge/layer_schema.hpp>
#include <skyforge/optimizer_schema.hpp>

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <set>

namespace skyforge::cuda {

namespace k = skyforge::kernels;
using Shape = std::vector<uint32_t>;

namespace {

[[noreturn]] void invalid(const std::string& m) { throw Error(m, SF_ERR_INVALID); }

size_t numel(const Shape& s) { return std::accumulate(s.begin(), s.end(), size_t{1}, std::multiplies<>()); }
using schema::detail::shape_text;  // "(None, 28, 28, 1)"

// A step's sums (sums_, pending_): loss, correct count, samples, and the embedding layers'
// invalid indices (a count, so that every rank sees every rank's after the allreduce).
constexpr size_t kSums = 4;

}  // namespace

enum class Kind {
  dense, conv2d, activation, view, dropout, batchnorm, global_avg_pool, max_pool, avg_pool, add, concat,
  layer_norm, attention, embedding, position_embedding
};

// Where a layer's backward puts the gradient of one of its inputs: nowhere (the model's input,
// or a producer that needs none), or a gradient slot (CudaEngine::gslots_), written or, when an
// earlier backward already wrote there (fan-out), added to.
struct GradTarget {
  static constexpr size_t kNone = SIZE_MAX;
  size_t slot = kNone;
  bool add = false;
};

struct Layer {
  Kind kind = Kind::view;
  size_t index = 0;  // in the listing (the model's layers as given); layers_ holds them in run order
  std::string type;
  Shape in, out;     // in: the first input's shape
  std::vector<size_t> inputs;  // producers' positions in layers_ (schema::Graph::kInput: the model's input)
  size_t poff = 0, psize = 0;  // slice of the device's flat parameter buffer (256-byte aligned)
  size_t loff = 0;             // and of the logical one (get_params, the state: no gaps)
  // dense
  size_t fin = 0, units = 0;
  bool use_bias = true;
  k::Activation act = k::Activation::linear;
  Buffer<float> pre;  // dense, conv2d with a gelu: the activation's input, which its gradient reads
  // conv2d (units: filters; win.batch set per call), the poolings (win.H/W/C; global 1D: W = 1)
  k::WindowShape win;
  Buffer<float> col;  // the last training forward's im2col, then the backward's dcol (col_of)
  bool direct = false;  // the last forward ran on the device's convolutions (cuDNN), not im2col
  Buffer<int32_t> arg;  // max_pooling2d: each output's input (index within its sample)
  // dropout
  float rate = 0.f;
  bool dropped = false;  // the last forward applied a mask
  // batch_normalization
  size_t C = 0;
  float momentum = 0.99f, epsilon = 1e-3f;
  bool scale = true, center = true, relu = false;  // relu: the next layer (a relu) fused in
  bool synchronized = false;  // statistics over every replica's batch
  Buffer<float> mean, var, invstd, moving_mean, moving_var;
  Buffer<double> sums;  // synchronized: the 2C + 1 sums the replicas add (kernels' BnSums)
  // layer_normalization: C features, epsilon, scale, center as above; mean and invstd per row
  // embedding: fin = input_dim, units = output_dim; position_embedding: units = sequence_length
  Buffer<int32_t> order;   // embedding: the backward's workspace
  Buffer<double> invalid;  // embedding: the forward's count of invalid indices
  std::unique_ptr<Attention> attention;  // multi_head_attention
  // concatenate: per input, its floats per row; a row is everything from the axis on
  std::vector<size_t> widths;
  size_t row_width = 0, rows_per_sample = 0;
  // engine bookkeeping
  bool fused = false;  // a relu applied by its input, a batch_normalization it is the only consumer of
  bool view = false;   // output is the input's bytes (flatten, reshape)
  bool alias() const { return fused || view; }  // no buffer, no backward: its gradient is its input's
  Buffer<float> y;
  const float* out_ptr = nullptr;
  // The backward plan (CudaEngine::plan_gradients): whether it runs, the slot holding the
  // gradient of its output, per input where dx goes, and a scratch slot for a dx that is added.
  bool backward = false;
  size_t dy_slot = GradTarget::kNone, scratch = GradTarget::kNone;
  std::vector<GradTarget> dx;

  size_t rows(uint32_t batch) const {
    const size_t w = kind == Kind::dense ? fin : kind == Kind::batchnorm ? C : in.back();
    return batch * (numel(in) / w);
  }
};

// A layer's dropout mask key (docs/kernels.md, "Dropout"); the kernels read its step from the
// device's StepState.
k::DropoutKey dropout_key(const Layer& l, uint64_t seed, uint32_t rank) {
  return k::DropoutKey{seed, 0, static_cast<uint32_t>(l.index), rank};
}

// One train step's timing marks by what they enclose, summed over the profiled steps.
struct CudaProfile {
  enum class Part { forward, backward, loss, allreduce_wait, optimizer, step };
  struct Span {
    Part part;
    size_t layer;  // forward, backward: which
    size_t from, to;
  };
  std::vector<Span> spans;  // this step's
  std::vector<double> fwd, bwd;
  double loss = 0, allreduce = 0, optimizer = 0, total = 0;
  uint64_t steps = 0, samples = 0;
  // The first step of each batch size is left out: it holds the one-time costs (cuDNN's and
  // cuBLAS' loading, plans, the timing of convolution algorithms).
  std::set<uint32_t> seen;
  uint64_t first_steps = 0;
  static bool enabled() {
    const char* e = std::getenv("SKYFORGE_CUDA_PROFILE");
    return e && *e && std::strcmp(e, "0") != 0;
  }
};

CudaEngine::CudaEngine(const ModelSpec& spec, const Communicator& comm, const Host& host, const EngineOptions& opt)
    : comm_(comm), eopt_(opt), input_shape_(spec.input_shape), seed_(spec.seed) {
  try {
    schema::check_model(input_shape_, spec.layers.size(), spec.loss);
  } catch (const schema::LayerError& e) {
    invalid(e.what());
  }
  try {
    const schema::OptimizerConfig o = schema::parse_optimizer(spec.optimizer, spec.optimizer_options.all());
    optimizer_ = std::string(o.name());
    schedule_ = schedule_of(o);
    clip_ = {o.real("clipnorm"), o.real("global_clipnorm")};
    slots_per_param_ = schema::slots_per_parameter(o);
    if (optimizer_ == "adam" || optimizer_ == "adamw")
      adam_ = {o.real("learning_rate"), o.real("beta_1"), o.real("beta_2"), o.real("epsilon"),
               optimizer_ == "adamw" ? o.real("weight_decay") : 0.0};
    else if (optimizer_ == "rmsprop")
      rmsprop_ = {o.real("learning_rate"), o.real("rho"), o.real("momentum"), o.real("epsilon"), o.flag("centered")};
    else
      sgd_ = {o.real("learning_rate"), o.real("momentum"), o.flag("nesterov")};
  } catch (const schema::OptimizerError& e) {
    invalid(e.what());
  }

  DeviceOptions dopt = eopt_;
  dopt.survey = CudaProfile::enabled();  // the profile lists every convolution algorithm's time
  dev_ = std::make_unique<Device>(comm_, host, dopt);

  // Every layer through the schema: options with defaults, the graph (run order, inputs,
  // shapes, parameter counts). layers_ holds the layers in run order, so the flat parameter
  // buffer is in the schema's layout (initial_weights.hpp).
  std::vector<schema::LayerConfig> configs;
  schema::Graph graph;
  try {
    for (size_t i = 0; i < spec.layers.size(); ++i) {
      const LayerSpec& ls = spec.layers[i];
      const std::vector<std::pair<std::string, std::string>> options(ls.options.all().begin(), ls.options.all().end());
      configs.push_back(schema::parse(ls.type, options, i));
    }
    graph = schema::graph(input_shape_, configs);
  } catch (const schema::LayerError& e) {
    invalid(e.what());
  }
  std::vector<size_t> position(configs.size());  // listing index -> position in layers_
  for (size_t i : graph.order) {
    position[i] = layers_.size();
    const schema::LayerConfig& c = configs[i];
    const schema::LayerShape& s = graph.shapes[i];
    const Shape& shape = graph.in_shapes[i][0];
    auto l = std::make_unique<Layer>();
    for (size_t p : graph.inputs[i]) l->inputs.push_back(p == schema::Graph::kInput ? p : position[p]);
    try {
      const std::string& t = spec.layers[i].type;
      auto activation = [&] {
        const std::string& a = c.choice("activation");
        return a == "relu"      ? k::Activation::relu
               : a == "softmax" ? k::Activation::softmax
               : a == "gelu"    ? k::Activation::gelu
               : a == "tanh"    ? k::Activation::tanh
               : a == "sigmoid" ? k::Activation::sigmoid
                                : k::Activation::linear;
      };
      // conv2d and the 2D poolings: the window of `size_option` with the schema's geometry.
      auto window = [&](const char* size_option) {
        const schema::Size2 ks = c.size(size_option), st = c.size("strides");
        l->win.kh = ks.h, l->win.kw = ks.w, l->win.sh = st.h, l->win.sw = st.w;
        l->win.pt = s.rows.pad, l->win.pl = s.cols.pad, l->win.Ho = s.rows.out, l->win.Wo = s.cols.out;
      };
      if (shape.size() == 3) l->win.H = shape[0], l->win.W = shape[1], l->win.C = shape[2];
      if (t == "dense") {
        l->kind = Kind::dense;
        l->fin = shape.back();
        l->units = c.count("units");
        l->use_bias = c.flag("use_bias");
        l->act = activation();
      } else if (t == "conv2d") {
        l->kind = Kind::conv2d;
        l->units = c.count("filters");
        l->use_bias = c.flag("use_bias");
        l->act = activation();
        window("kernel_size");
      } else if (t == "max_pooling2d" || t == "average_pooling2d") {
        l->kind = t == "max_pooling2d" ? Kind::max_pool : Kind::avg_pool;
        window("pool_size");
      } else if (t == "global_average_pooling2d") {
        l->kind = Kind::global_avg_pool;
      } else if (t == "global_average_pooling1d") {  // (steps, features): steps x 1 positions
        l->kind = Kind::global_avg_pool;
        l->win.H = shape[0], l->win.W = 1, l->win.C = shape[1];
      } else if (t == "relu" || t == "softmax" || t == "tanh" || t == "sigmoid") {
        l->kind = Kind::activation;
        l->act = t == "relu" ? k::Activation::relu
                 : t == "softmax" ? k::Activation::softmax
                 : t == "tanh" ? k::Activation::tanh
                               : k::Activation::sigmoid;
      } else if (t == "gelu") {
        l->kind = Kind::activation;
        l->act = c.flag("approximate") ? k::Activation::gelu_tanh : k::Activation::gelu;
      } else if (t == "flatten" || t == "reshape") {
        l->kind = Kind::view;
        l->view = true;
      } else if (t == "add") {
        l->kind = Kind::add;
      } else if (t == "concatenate") {
        // Each input is [rows, width] with rows everything before the axis (batch included).
        l->kind = Kind::concat;
        const int64_t rank = static_cast<int64_t>(shape.size()), axis = c.integer("axis");
        const size_t a = static_cast<size_t>(axis < 0 ? axis + rank : axis - 1);  // in the sample's dims
        l->rows_per_sample = numel(Shape(shape.begin(), shape.begin() + static_cast<ptrdiff_t>(a)));
        for (const Shape& in : graph.in_shapes[i]) l->widths.push_back(numel(in) / l->rows_per_sample);
        l->row_width = numel(s.output) / l->rows_per_sample;
      } else if (t == "dropout") {
        l->kind = Kind::dropout;
        l->rate = static_cast<float>(c.real("rate"));
      } else if (t == "batch_normalization") {
        l->kind = Kind::batchnorm;
        l->C = shape.back();
        l->momentum = static_cast<float>(c.real("momentum"));
        l->epsilon = static_cast<float>(c.real("epsilon"));
        l->scale = c.flag("scale");
        l->center = c.flag("center");
        l->synchronized = c.flag("synchronized");
      } else if (t == "layer_normalization") {
        l->kind = Kind::layer_norm;
        l->C = shape.back();
        l->epsilon = static_cast<float>(c.real("epsilon"));
        l->scale = c.flag("scale");
        l->center = c.flag("center");
      } else if (t == "multi_head_attention") {
        l->kind = Kind::attention;
        l->attention = std::make_unique<Attention>(
            Attention::Shape{shape[0], shape[1], c.count("num_heads"), c.count("key_dim"), c.count("value_dim"),
                             c.flag("use_bias"), static_cast<float>(c.real("dropout"))});
      } else if (t == "embedding") {
        l->kind = Kind::embedding;
        embeds_ = true;
        l->fin = c.count("input_dim");
        l->units = c.count("output_dim");
        l->invalid = Buffer<double>(*dev_, 1);
      } else if (t == "position_embedding") {
        l->kind = Kind::position_embedding;
        l->units = c.count("sequence_length");
      } else {
        throw Error(c.where() + ": the cuda engine has no kernels for this layer yet (it has: dense, conv2d, relu, "
                                "softmax, gelu, tanh, sigmoid, flatten, reshape, dropout, batch_normalization, "
                                "global_average_pooling1d, global_average_pooling2d, max_pooling2d, "
                                "average_pooling2d, add, concatenate, layer_normalization, multi_head_attention, "
                                "embedding, position_embedding)",
                    SF_ERR_UNSUPPORTED);
      }
    } catch (const schema::LayerError& e) {
      invalid(e.what());
    }
    l->index = i;
    l->type = spec.layers[i].type;
    l->in = shape;
    l->out = s.output;
    l->psize = static_cast<size_t>(s.trainable);
    l->loff = n_params_;
    n_params_ += l->psize;
    if (l->psize) {  // each slice on a 256-byte boundary: GEMM operands, buckets, the update's vectors
      l->poff = aligned(n_device_);
      n_device_ = l->poff + l->psize;
    }
    layers_.push_back(std::move(l));
  }
  n_device_ = aligned(n_device_);  // each optimizer slot array starts aligned too
  output_ = position[graph.output];
  try {
    classes_ = schema::classes_of(layers_[output_]->out, graph.output, layers_[output_]->type);
  } catch (const schema::LayerError& e) {
    invalid(e.what());
  }
  arch_ = schema::architecture_text(input_shape_, configs, optimizer_);  // what a state must match

  // A relu whose input is a batch_normalization it is the only consumer of is fused into it (the
  // kernels' relu flag), as the cpu backend does: nothing else reads the values before the relu.
  for (auto& l : layers_)
    if (l->kind == Kind::activation && l->act == k::Activation::relu && l->inputs[0] != schema::Graph::kInput) {
      Layer& bn = *layers_[l->inputs[0]];
      if (bn.kind == Kind::batchnorm && graph.consumers[bn.index].size() == 1) bn.relu = l->fused = true;
    }
  plan_gradients();

  // Initial weights on the host: the SDK's, which are every backend's (skyforge/initial_weights.hpp).
  const std::vector<float> init = initial_weights(input_shape_, configs, spec.seed);
  for (auto& l : layers_) {
    if (l->kind == Kind::batchnorm) {
      std::vector<float> ones(l->C, 1.f);
      l->mean = Buffer<float>(*dev_, l->C);
      l->var = Buffer<float>(*dev_, l->C);
      l->invstd = Buffer<float>(*dev_, l->C);
      l->moving_mean = Buffer<float>(*dev_, l->C);
      l->moving_var = Buffer<float>(*dev_, l->C);
      dev_->zero(l->moving_mean.get(), l->C * sizeof(float));
      dev_->upload(l->moving_var.get(), ones.data(), l->C * sizeof(float));
      if (l->synchronized) l->sums = Buffer<double>(*dev_, 2 * l->C + 1);
    }
  }
  params_ = Buffer<float>(*dev_, n_device_);
  grads_ = Buffer<float>(*dev_, n_device_);
  const std::vector<float> params = to_device(init.data(), 1);
  dev_->upload(params_.get(), params.data(), n_device_ * sizeof(float));
  dev_->zero(grads_.get(), n_device_ * sizeof(float));  // the gaps stay zeros: no layer writes them
  n_slots_ = slots_per_param_ * n_params_;
  slots_ = Buffer<float>(*dev_, slots_per_param_ * n_device_);
  dev_->zero(slots_.get(), slots_per_param_ * n_device_ * sizeof(float));
  sums_ = Buffer<double>(*dev_, kSums);
  pending_ = Buffer<double>(*dev_, kSums);
  dev_->zero(pending_.get(), kSums * sizeof(double));
  pending_before_ = Buffer<double>(*dev_, kSums);
  state_ = Buffer<k::StepState>(*dev_, 1);
  const k::StepState start{};
  dev_->upload(state_.get(), &start, sizeof start);
  if (clip_.clipnorm > 0 || clip_.global_clipnorm > 0) {
    // Each weight tensor (Keras' variables: clipnorm clips each alone), and each gap of the
    // device's layout as a variable of zeros: it adds 0 to every norm (the same bits) and is
    // scaled to zeros.
    std::vector<size_t> variables;
    size_t end = 0;
    for (const auto& l : layers_) {
      if (!l->psize) continue;
      if (l->poff > end) variables.push_back(l->poff - end);
      for (uint64_t w : graph.shapes[l->index].weights) variables.push_back(w);
      end = l->poff + l->psize;
    }
    if (n_device_ > end) variables.push_back(n_device_ - end);
    const std::vector<uint64_t> table = k::clip_table(variables);
    clip_table_ = Buffer<uint64_t>(*dev_, table.size());
    dev_->upload(clip_table_.get(), table.data(), table.size() * sizeof(uint64_t));
    clip_layout_ = {clip_table_.get(), static_cast<uint32_t>(variables.size()), table.back(), n_device_};
    clip_ws_ = Buffer<double>(*dev_, k::clip_workspace(clip_layout_));
  }
  // Data-parallel: every replica starts from rank 0's weights, whatever its seed.
  dev_->broadcast(params_.get(), n_device_ * sizeof(float), 0);
  dev_->synchronize();
  if (CudaProfile::enabled()) {
    prof_ = std::make_unique<CudaProfile>();
    prof_->fwd.assign(layers_.size(), 0.0);
    prof_->bwd.assign(layers_.size(), 0.0);
    eopt_.graphs = false;  // a layer's time is an eager step's; a graph runs as one launch
  }
}

// The backward's plan, fixed for the engine's life (so a captured step replays it): which layers
// run a backward (those with parameters at or before them), and the gradient slots by liveness,
// walking the run order backwards as the backward does. A layer's output gradient takes a slot
// when its first consumer (in the backward's order) writes it; later consumers add to it (a
// fan-out's sum, in reverse run order on every rank); the slot is free again once the layer's own
// backward has read it. An alias layer's (flatten, reshape, a fused relu) gradient is its
// input's slot. A dx added to a slot is made in a scratch slot first, unless the layer is a
// merge (add, concatenate), whose dx is a copy that copy_block adds directly.
void CudaEngine::plan_gradients() {
  constexpr size_t kInput = schema::Graph::kInput, kNone = GradTarget::kNone;
  auto owner = [&](size_t p) {  // the layer whose slot holds p's output gradient
    while (p != kInput && layers_[p]->alias()) p = layers_[p]->inputs[0];
    return p;
  };
  for (auto& l : layers_) {
    l->backward = l->psize > 0;
    for (size_t p : l->inputs) l->backward = l->backward || (p != kInput && layers_[p]->backward);
  }
  std::set<size_t> free;
  auto take = [&] {
    if (free.empty()) return n_gslots_++;
    const size_t slot = *free.begin();
    free.erase(free.begin());
    return slot;
  };
  // The loss's gradient goes to the layer that computes the output: the output layer itself, or
  // the one under it when the output is a view (flatten, reshape) or a fused relu. An output
  // that is a view of the model's input has nothing to train: no slot.
  const size_t computes_output = owner(output_);
  loss_slot_ = kNone;
  if (computes_output != kInput) loss_slot_ = layers_[computes_output]->dy_slot = take();
  for (size_t i = layers_.size(); i-- > 0;) {
    Layer& l = *layers_[i];
    if (!l.backward || l.alias()) continue;
    l.dx.assign(l.inputs.size(), GradTarget{});
    for (size_t j = 0; j < l.inputs.size(); ++j) {
      const size_t p = owner(l.inputs[j]);
      if (p == kInput || !layers_[p]->backward) continue;
      Layer& producer = *layers_[p];
      l.dx[j].add = producer.dy_slot != kNone;
      if (!l.dx[j].add) producer.dy_slot = take();
      l.dx[j].slot = producer.dy_slot;
      if (l.dx[j].add && l.kind != Kind::add && l.kind != Kind::concat && l.scratch == kNone) l.scratch = take();
    }
    if (l.scratch != kNone) free.insert(l.scratch);
    free.insert(l.dy_slot);
  }
}

void CudaEngine::profile_step(uint32_t batch) {
  CudaProfile& p = *prof_;
  dev_->synchronize();
  if (p.seen.insert(batch).second) {
    ++p.first_steps;
    p.spans.clear();
    dev_->clear_marks();
    return;
  }
  for (const CudaProfile::Span& s : p.spans) {
    const double t = dev_->seconds(s.from, s.to);
    using Part = CudaProfile::Part;
    switch (s.part) {
      case Part::forward: p.fwd[s.layer] += t; break;
      case Part::backward: p.bwd[s.layer] += t; break;
      case Part::loss: p.loss += t; break;
      case Part::allreduce_wait: p.allreduce += t; break;
      case Part::optimizer: p.optimizer += t; break;
      case Part::step: p.total += t; break;
    }
  }
  p.spans.clear();
  dev_->clear_marks();
  ++p.steps;
  p.samples += batch;
}

// Every buffer is declared after dev_, so it goes back to the device before the device itself.
// Deferred or replayed steps may still run: freeing the buffers (cudaFree waits for the device)
// would wait for them unwatched, so wait here, watched (a stuck peer aborts NCCL instead).
CudaEngine::~CudaEngine() {
  try {
    dev_->make_current();
    dev_->synchronize();
  } catch (const std::exception&) {  // already failed, or aborted now: nothing left to wait for
  }
  if (!prof_) return;
  const CudaProfile& p = *prof_;
  const std::string convs = dev_->describe_convolutions();
  if (p.steps == 0) {  // every step was its batch size's first: nothing to average, the algorithms still said
    std::fprintf(stderr, "skyforge cuda profile (rank %u, %s build): no train step after the first of its batch size "
                 "(%llu left out); nothing timed\n", comm_.rank(), Device::build_name(),
                 static_cast<unsigned long long>(p.first_steps));
    if (!convs.empty()) std::fprintf(stderr, "  conv2d windows:\n%s", convs.c_str());
    return;
  }
  const double us = 1e6 / static_cast<double>(p.steps);
  std::fprintf(stderr, "skyforge cuda profile (rank %u, %s build): %llu train steps (and %llu left out: the first "
               "of each batch size), %.1f samples/step, every step eager (graphs off while profiling); mean device us "
               "per step\n", comm_.rank(), Device::build_name(), static_cast<unsigned long long>(p.steps),
               static_cast<unsigned long long>(p.first_steps), static_cast<double>(p.samples) / static_cast<double>(p.steps));
  std::fprintf(stderr, "  %-5s %-60s %10s %10s\n", "layer", "", "forward", "backward");
  double f = 0, b = 0;
  for (const auto& lp : layers_) {  // run order, each under its index in the listing
    const Layer& l = *lp;
    const size_t i = l.index;
    std::string what = l.type + " " + shape_text(l.in) + "->" + shape_text(l.out);
    if (l.fused) what += " (fused)";
    if (l.view) what += " (view)";
    std::fprintf(stderr, "  %-5zu %-60s %10.1f %10.1f\n", i, what.c_str(), p.fwd[i] * us, p.bwd[i] * us);
    f += p.fwd[i], b += p.bwd[i];
  }
  std::fprintf(stderr, "  %-66s %10.1f %10.1f\n", "layers", f * us, b * us);
  std::fprintf(stderr, "  %-66s %10.1f\n", "loss", p.loss * us);
  std::fprintf(stderr, "  %-66s %10.1f\n", "waiting for the gradient allreduce", p.allreduce * us);
  std::fprintf(stderr, "  %-66s %10.1f\n", "optimizer", p.optimizer * us);
  std::fprintf(stderr, "  %-66s %10.1f\n", "train step total", p.total * us);
  if (!convs.empty()) std::fprintf(stderr, "  conv2d windows:\n%s", convs.c_str());
}

// A conv2d layer's im2col buffer for batches up to `batch`, in floats.
static size_t col_floats(const Layer& l, uint32_t batch) {
  k::WindowShape g = l.win;
  g.batch = batch;
  return g.positions() * g.col_width();
}

void CudaEngine::ensure_capacity(uint32_t batch) {
  if (batch <= capacity_) return;
  // Steps may still run on the device (deferred, replayed): freeing their buffers would wait
  // for them without the collective timeout's watch, so wait here, watched.
  if (capacity_) dev_->synchronize();
  for (const auto& l : layers_)
    if (static_cast<double>(batch) * static_cast<double>(std::max(numel(l->out), numel(l->in))) >= 2147483647.0)
      invalid("batch " + std::to_string(batch) + " is too large for layer " + std::to_string(l->index) + " (" +
              l->type + "): its activations would exceed 2^31 elements");
  // The graphs captured so far stay (dropping them on one rank alone would part it from its
  // peers' choices): each keeps the buffers it points at, which go to `old` as they are
  // replaced and live as long as the last such graph (memory: the old buffers beside the new
  // until those graphs go). Without graphs they go at once. Each new buffer is made before its
  // old one goes, so a growth that fails leaves every buffer usable at the old capacity.
  auto old = std::make_shared<Kept>();
  Kept* kept = nullptr;
  for (auto& [key, g] : graphs_)
    if (g.graph) g.keep.push_back(old), kept = old.get();
  size_t widest = numel(input_shape_),
         ws = std::max(k::reduce_workspace(batch, 1), k::softmax_xent_workspace(batch, classes_));
  for (auto& l : layers_) {
    const size_t n = numel(l->out);
    widest = std::max(widest, n);
    if (!l->alias()) renew(l->y, *dev_, size_t{batch} * n, kept);
    if (k::slope_reads_input(l->act) && (l->kind == Kind::dense || l->kind == Kind::conv2d))
      renew(l->pre, *dev_, size_t{batch} * n, kept);
    if (l->kind == Kind::dense) ws = std::max(ws, k::reduce_workspace(l->rows(batch), l->units));
    if (l->kind == Kind::batchnorm) ws = std::max(ws, k::reduce_workspace(l->rows(batch), l->C));
    if (l->kind == Kind::conv2d) {
      k::WindowShape g = l->win;
      g.batch = batch;
      // col_of makes one at the layer's first use; a layer that has one gets it now, so a
      // shape first run before the growth is captured after it without an allocation.
      if (l->col.get()) renew(l->col, *dev_, col_floats(*l, batch), kept);
      ws = std::max(ws, k::reduce_workspace(g.positions(), l->units));
      if (k::thin_window(g)) ws = std::max(ws, k::conv_filter_grad_workspace(g, l->units));
    }
    if (l->kind == Kind::max_pool) renew(l->arg, *dev_, size_t{batch} * n, kept);
    if (l->kind == Kind::layer_norm) {
      renew(l->mean, *dev_, l->rows(batch), kept);
      renew(l->invstd, *dev_, l->rows(batch), kept);
      ws = std::max(ws, k::reduce_workspace(l->rows(batch), l->C));
    }
    if (l->kind == Kind::attention) {
      l->attention->reserve(*dev_, batch, kept);
      ws = std::max(ws, l->attention->workspace(batch));
    }
    if (l->kind == Kind::embedding) {
      renew(l->order, *dev_, k::embedding_backward_workspace(size_t{batch} * numel(l->in)), kept);
      ws = std::max(ws, k::reduce_workspace(size_t{batch} * numel(l->in), 1));
    }
    if (l->kind == Kind::position_embedding) ws = std::max(ws, k::reduce_workspace(batch, n));
  }
  renew(x_, *dev_, size_t{batch} * numel(input_shape_), kept);
  gslots_.resize(n_gslots_);
  for (auto& slot : gslots_) renew(slot, *dev_, size_t{batch} * widest, kept);
  renew(loss_, *dev_, batch, kept);
  renew(hit_, *dev_, batch, kept);
  renew(labels_, *dev_, batch, kept);
  renew(idx_, *dev_, batch, kept);
  renew(ws_, *dev_, ws, kept);
  capacity_ = batch;
}

float* CudaEngine::col_of(Layer& l) {
  if (!l.col.get()) l.col = Buffer<float>(*dev_, col_floats(l, capacity_));
  return l.col.get();
}

void CudaEngine::check_batch(const void* x, const int32_t* y, uint32_t batch, const char* what) const {
  if (batch == 0) invalid(std::string(what) + ": batch must be > 0");
  if (!x) invalid(std::string(what) + ": x is NULL");
  if (y)
    for (uint32_t i = 0; i < batch; ++i)
      if (y[i] < 0 || static_cast<uint32_t>(y[i]) >= classes_)
        invalid(std::string(what) + ": label " + std::to_string(y[i]) + " of sample " + std::to_string(i) +
                " is outside [0, " + std::to_string(classes_) + ")");
}

const float* CudaEngine::input_of(const Layer& l, size_t j, const float* x) const {
  return l.inputs[j] == schema::Graph::kInput ? x : layers_[l.inputs[j]]->out_ptr;
}

// x is device memory (x_). Returns the logits.
const float* CudaEngine::forward(const float* x, uint32_t batch, bool training) {
  const k::Stream s = dev_->stream();
  for (auto& lp : layers_) {
    Layer& l = *lp;
    const float* in = input_of(l, 0, x);
    if (l.alias()) {  // fused: its input already applied it; a view: the same bytes
      l.out_ptr = in;
      continue;
    }
    float* y = l.y.get();
    const float* p = params_.get() + l.poff;
    const size_t n = size_t{batch} * numel(l.in);
    const size_t m0 = mark();
    switch (l.kind) {
      case Kind::dense: {
        const size_t M = l.rows(batch);
        const float* bias = l.use_bias ? p + l.fin * l.units : nullptr;
        if (l.pre.get()) {  // a gelu: its gradient reads its input
          dev_->gemm_bias_act(M, l.units, l.fin, in, p, bias, k::Activation::linear, l.pre.get());
          k::activation_forward(l.pre.get(), y, M * l.units, l.act, s);
        } else {
          dev_->gemm_bias_act(M, l.units, l.fin, in, p, bias, l.act, y);
        }
        break;
      }
      case Kind::conv2d: {
        k::WindowShape g = l.win;
        g.batch = batch;
        const size_t M = g.positions(), kkc = g.col_width();
        const float* bias = l.use_bias ? p + kkc * l.units : nullptr;
        // cuDNN where the device has it for this window, else im2col + GEMM (the host build).
        // A gelu: the values before it into pre, which its gradient reads.
        float* z = l.pre.get() ? l.pre.get() : y;
        const k::Activation act = l.pre.get() ? k::Activation::linear : l.act;
        l.direct = dev_->conv_forward(g, l.units, in, p, z);
        if (l.direct) {
          k::bias_activation_forward(z, bias, M, l.units, act, s);
        } else {
          float* col = col_of(l);
          k::im2col(in, col, g, s);
          dev_->gemm_bias_act(M, l.units, kkc, col, p, bias, act, z);
        }
        if (l.pre.get()) k::activation_forward(z, y, M * l.units, l.act, s);
        break;
      }
      case Kind::max_pool: {
        k::WindowShape g = l.win;
        g.batch = batch;
        k::max_pool_forward(in, y, l.arg.get(), g, s);
        break;
      }
      case Kind::avg_pool: {
        k::WindowShape g = l.win;
        g.batch = batch;
        k::avg_pool_forward(in, y, g, s);
        break;
      }
      case Kind::global_avg_pool:
        k::global_avg_pool_forward(in, y, batch, size_t{l.win.H} * l.win.W, l.win.C, s);
        break;
      case Kind::activation:
        if (l.act != k::Activation::softmax) {
          k::activation_forward(in, y, n, l.act, s);
          break;
        }
        dev_->copy(y, in, n * sizeof(float));
        k::bias_activation_forward(y, nullptr, n / l.in.back(), l.in.back(), l.act, s);
        break;
      case Kind::add:
        for (size_t j = 0; j < l.inputs.size(); ++j) k::copy_block(input_of(l, j, x), n, y, n, 1, n, j > 0, s);
        break;
      case Kind::concat: {
        const size_t rows = batch * l.rows_per_sample;
        for (size_t j = 0, off = 0; j < l.inputs.size(); off += l.widths[j++])
          k::copy_block(input_of(l, j, x), l.widths[j], y + off, l.row_width, rows, l.widths[j], false, s);
        break;
      }
      case Kind::dropout:
        l.dropped = training && l.rate > 0.f;
        if (l.dropped) {
          // The mask is a function of (seed, step, layer, rank): docs/kernels.md, "Dropout".
          k::dropout(in, y, n, l.rate, dropout_key(l, seed_, comm_.rank()), state_.get(), s);
        } else {
          dev_->copy(y, in, n * sizeof(float));
        }
        break;
      case Kind::batchnorm: {
        const size_t M = l.rows(batch);
        const float* gamma = l.scale ? p : nullptr;
        const float* beta = l.center ? p + (l.scale ? l.C : 0) : nullptr;
        if (!training) {
          k::batchnorm_forward_inference(in, y, M, l.C, gamma, beta, l.epsilon, l.relu, l.moving_mean.get(),
                                         l.moving_var.get(), s);
          break;
        }
        if (l.synchronized) {
          // The global batch's statistics: this replica's sums, summed over the replicas (every
          // rank's synchronized BatchNorms in layer order), before the stream normalises.
          k::batchnorm_forward_sums(in, M, l.C, l.sums.get(), ws_.get(), s);
          dev_->allreduce_sum(l.sums.get(), 2 * l.C + 1);
          dev_->join_collectives();
          k::batchnorm_forward_normalize(in, y, M, l.C, gamma, beta, l.epsilon, l.relu, l.sums.get(), l.mean.get(),
                                         l.var.get(), l.invstd.get(), s);
        } else {
          k::batchnorm_forward_training(in, y, M, l.C, gamma, beta, l.epsilon, l.relu, l.mean.get(), l.var.get(),
                                        l.invstd.get(), ws_.get(), s);
        }
        break;  // the moving statistics move once the step is not refused (enqueue)
      }
      case Kind::layer_norm:
        k::layer_norm_forward(in, y, l.rows(batch), l.C, l.scale ? p : nullptr,
                              l.center ? p + (l.scale ? l.C : 0) : nullptr, l.epsilon, l.mean.get(), l.invstd.get(), s);
        break;
      case Kind::attention:
        l.attention->forward(*dev_, in, p, y, batch, training, dropout_key(l, seed_, comm_.rank()), state_.get());
        break;
      case Kind::embedding:
        // An index that is not an integer in [0, input_dim) counts in the step's sums
        // (sums_[3]), reported when the step's results are read (check_indices).
        k::embedding_forward(in, p, y, n, l.fin, l.units, l.invalid.get(), ws_.get(), s);
        k::accumulate(sums_.get() + 3, l.invalid.get(), 1, s);
        break;
      case Kind::position_embedding:
        k::position_embedding_forward(p, y, batch, l.in[0], l.in[1], s);
        break;
      case Kind::view: break;
    }
    if (profiling_) prof_->spans.push_back({CudaProfile::Part::forward, l.index, m0, mark()});
    l.out_ptr = y;
  }
  return layers_[output_]->out_ptr;
}

void CudaEngine::stage(const float* x, const int32_t* y, uint32_t batch, const char* what) {
  check_batch(x, y, batch, what);
  if (!y) invalid(std::string(what) + ": labels are NULL");
  ensure_capacity(batch);
  dev_->upload(x_.get(), x, size_t{batch} * numel(input_shape_) * sizeof(float));
  dev_->upload(labels_.get(), y, size_t{batch} * sizeof(int32_t));
}

// Forward, loss and accuracy sums, and with `train` the backward with the bucketed gradient
// allreduce (grads_: the global gradient SUM, as in the cpu backend, docs/compute-backends.md)
// and the optimizer update. The step's sums are made global on the device (one small allreduce
// of three doubles beside the gradients'), and the update reads the global sample count there,
// so nothing here needs the host to wait: a deferred step only adds its sums to pending_.
void CudaEngine::enqueue(uint32_t batch, bool train, bool pend) {
  const k::Stream s = dev_->stream();
  const bool dp = dev_->data_parallel();
  if (profiling_) {  // a step that failed while profiled left its marks
    prof_->spans.clear();
    dev_->clear_marks();
  }
  profiling_ = prof_ && train && !dev_->capturing();
  using Part = CudaProfile::Part;
  auto span = [&](Part part, size_t layer, size_t from) {
    if (profiling_) prof_->spans.push_back({part, layer, from, mark()});
  };
  const size_t start = mark();
  k::fill(sums_.get() + 3, 1, 0.0, s);  // the embeddings' invalid indices, counted by the forward
  const float* logits = forward(x_.get(), batch, train);
  size_t m = mark();
  k::softmax_xent(logits, labels_.get(), batch, classes_, loss_.get(), hit_.get(),
                  train && loss_slot_ != GradTarget::kNone ? gslots_[loss_slot_].get() : nullptr, ws_.get(), s);
  k::reduce_sum(loss_.get(), batch, sums_.get(), ws_.get(), s);
  k::reduce_sum(hit_.get(), batch, sums_.get() + 1, ws_.get(), s);
  k::fill(sums_.get() + 2, 1, static_cast<double>(batch), s);
  span(Part::loss, 0, m);
  if (dp) dev_->allreduce_sum(sums_.get(), kSums);  // overlaps the backward below
  if (train) {
    const size_t bucket = std::max<size_t>(eopt_.bucket_bytes / sizeof(float), 1);
    size_t lo = n_device_, hi = n_device_;  // pending bucket [lo, hi), grows downwards
    for (size_t i = layers_.size(); i-- > 0;) {
      Layer& l = *layers_[i];
      if (!l.backward || l.alias()) continue;  // alias: its consumers wrote its input's gradient
      const float* in = input_of(l, 0, x_.get());
      float* dy = gslots_[l.dy_slot].get();
      // The first input's dx (the only one but a merge's): its slot, or the scratch when added.
      const GradTarget to = l.dx[0];
      float* dx = to.slot == GradTarget::kNone ? nullptr : gslots_[to.add ? l.scratch : to.slot].get();
      const float* p = params_.get() + l.poff;
      float* g = grads_.get() + l.poff;
      const size_t n = size_t{batch} * numel(l.in);
      m = mark();
      switch (l.kind) {
        case Kind::dense: {
          const size_t M = l.rows(batch);
          k::activation_backward(l.pre.get(), l.out_ptr, dy, M, l.units, l.act, s);
          dev_->gemm(true, false, l.fin, l.units, M, 1.f, in, l.fin, dy, l.units, 0.f, g, l.units);
          if (l.use_bias) k::bias_grad(dy, M, l.units, g + l.fin * l.units, ws_.get(), s);
          if (dx) dev_->gemm(false, true, M, l.fin, l.units, 1.f, dy, l.units, p, l.units, 0.f, dx, l.fin);
          break;
        }
        case Kind::conv2d: {
          // A thin window's dW as a column reduction (kernels::conv_filter_grad, on any device:
          // cuDNN's deterministic algorithms are slowest there). The rest on cuDNN when the
          // forward was (Device::conv_backward); else dW = col^T dy with the forward's col (made
          // here if the forward ran on cuDNN), dcol = dy W^T into the same buffer, then col2im.
          k::WindowShape gw = l.win;
          gw.batch = batch;
          const size_t M = gw.positions(), kkc = gw.col_width();
          k::activation_backward(l.pre.get(), l.out_ptr, dy, M, l.units, l.act, s);
          if (l.use_bias) k::bias_grad(dy, M, l.units, g + kkc * l.units, ws_.get(), s);
          const bool thin = k::thin_window(gw);
          if (thin) k::conv_filter_grad(in, dy, gw, l.units, g, ws_.get(), s);
          if (l.direct && dev_->conv_backward(gw, l.units, in, p, dy, thin ? nullptr : g, dx)) break;
          conv_backward_gemm(*dev_, gw, l.units, in, p, dy, thin && !dx ? nullptr : col_of(l), !l.direct,
                             thin ? nullptr : g, dx);  // the forward left its col unless it ran direct
          break;
        }
        case Kind::max_pool:
          if (dx) {
            k::WindowShape gw = l.win;
            gw.batch = batch;
            k::max_pool_backward(dy, l.arg.get(), dx, gw, s);
          }
          break;
        case Kind::avg_pool:
          if (dx) {
            k::WindowShape gw = l.win;
            gw.batch = batch;
            k::avg_pool_backward(dy, dx, gw, s);
          }
          break;
        case Kind::global_avg_pool:
          if (dx) k::global_avg_pool_backward(dy, dx, batch, size_t{l.win.H} * l.win.W, l.win.C, s);
          break;
        case Kind::activation:
          if (dx) {
            k::activation_backward(in, l.out_ptr, dy, n / l.in.back(), l.in.back(), l.act, s);
            dev_->copy(dx, dy, n * sizeof(float));
          }
          break;
        case Kind::add:  // every input's dx is dy
          for (const GradTarget& t : l.dx)
            if (t.slot != GradTarget::kNone) {
              const size_t m = size_t{batch} * numel(l.out);
              k::copy_block(dy, m, gslots_[t.slot].get(), m, 1, m, t.add, s);
            }
          break;
        case Kind::concat: {  // input j's dx is its columns of dy
          const size_t rows = batch * l.rows_per_sample;
          for (size_t j = 0, off = 0; j < l.dx.size(); off += l.widths[j++])
            if (l.dx[j].slot != GradTarget::kNone)
              k::copy_block(dy + off, l.row_width, gslots_[l.dx[j].slot].get(), l.widths[j], rows, l.widths[j],
                            l.dx[j].add, s);
          break;
        }
        case Kind::dropout:
          if (dx) {
            if (l.dropped)
              k::dropout(dy, dx, n, l.rate, dropout_key(l, seed_, comm_.rank()), state_.get(), s);
            else
              dev_->copy(dx, dy, n * sizeof(float));
          }
          break;
        case Kind::batchnorm: {
          const float* relu_y = l.relu ? l.out_ptr : nullptr;
          float* dgamma = l.scale ? g : nullptr;
          float* dbeta = l.center ? g + (l.scale ? l.C : 0) : nullptr;
          if (!l.synchronized || !dx) {
            k::batchnorm_backward(in, relu_y, dy, dx, l.rows(batch), l.C, l.scale ? p : nullptr, l.mean.get(),
                                  l.invstd.get(), dgamma, dbeta, ws_.get(), s);
            break;
          }
          // dx as for the global batch: its sums, summed over the replicas between the gradient
          // buckets (in reverse layer order on every rank); dgamma and dbeta stay this
          // replica's, which the gradient allreduce sums.
          k::batchnorm_backward_sums(in, relu_y, dy, l.rows(batch), l.C, l.mean.get(), l.invstd.get(), dgamma, dbeta,
                                     l.sums.get(), ws_.get(), s);
          dev_->allreduce_sum(l.sums.get(), 2 * l.C + 1);
          dev_->join_collectives();
          k::batchnorm_backward_dx(in, relu_y, dy, dx, l.rows(batch), l.C, l.scale ? p : nullptr, l.mean.get(),
                                   l.invstd.get(), l.sums.get(), s);
          break;
        }
        case Kind::layer_norm:
          k::layer_norm_backward(in, dy, dx, l.rows(batch), l.C, l.scale ? p : nullptr, l.mean.get(), l.invstd.get(),
                                 l.scale ? g : nullptr, l.center ? g + (l.scale ? l.C : 0) : nullptr, ws_.get(), s);
          break;
        case Kind::attention:
          l.attention->backward(*dev_, in, p, dy, g, dx, batch, ws_.get(), dropout_key(l, seed_, comm_.rank()),
                                state_.get());
          break;
        case Kind::embedding:  // indices: no gradient reaches the input
          k::embedding_backward(in, dy, g, n, l.fin, l.units, l.order.get(), s);
          if (dx) dev_->zero(dx, n * sizeof(float));
          break;
        case Kind::position_embedding:  // the input gives only the shape
          k::position_embedding_backward(dy, g, batch, l.in[0], l.units, l.in[1], ws_.get(), s);
          if (dx) dev_->zero(dx, n * sizeof(float));
          break;
        case Kind::view: break;
      }
      // A fan-out's later dx: added to what the consumers after this one wrote (merges add their own).
      if (dx && to.add && l.kind != Kind::add && l.kind != Kind::concat)
        k::copy_block(dx, n, gslots_[to.slot].get(), n, 1, n, true, s);
      span(Part::backward, l.index, m);
      if (dp && l.psize > 0) {
        lo = l.poff;
        // Reverse layer order, as the backward produces them: a bucket goes out once full.
        if (hi - lo >= bucket) {
          dev_->allreduce_sum(grads_.get() + lo, hi - lo);
          hi = lo;
        }
      }
    }
    if (dp && hi > 0) dev_->allreduce_sum(grads_.get(), hi);
  }
  m = mark();
  if (dp) dev_->join_collectives();  // the update and the sums read what the allreduces made
  span(Part::allreduce_wait, 0, m);
  // Invalid inputs on any rank refuse this step, and every later one until the host reports
  // them (check_refused): no update, no step counted, on every rank alike (the cpu engine's
  // contract), without the host waiting here. Only a model with an embedding can meet them.
  if (embeds_) k::refuse_invalid(state_.get(), sums_.get() + 3, s);
  m = mark();
  if (train) {
    for (const auto& l : layers_)  // from this step's batch statistics, which the forward kept
      if (l->kind == Kind::batchnorm)
        k::batchnorm_update_moving(l->moving_mean.get(), l->moving_var.get(), l->mean.get(), l->var.get(), l->C,
                                   l->momentum, state_.get(), s);
    // The whole flat buffer is one tensor of the multi-tensor update (docs/kernels.md); the
    // gradient sum becomes a mean with the global sample count in sums_[2].
    // Clipping (the cpu engine's order) makes the gradient the mean first; the rate of this
    // update comes from the schedule at the device's step counter.
    k::OptimTensor t;
    t.param = params_.get();
    t.grad = grads_.get();
    t.size = n_device_;
    const double* samples = sums_.get() + 2;
    if (clip_table_.get()) {
      k::clip_gradients(grads_.get(), clip_layout_, clip_, samples, clip_ws_.get(), s);
      samples = nullptr;
    }
    k::learning_rate_step(schedule_, state_.get(), s);
    if (optimizer_ == "adam" || optimizer_ == "adamw") {
      t.slot0 = slots_.get();
      t.slot1 = slots_.get() + n_device_;
      k::adam_update(&t, 1, adam_, state_.get(), samples, s);
    } else if (optimizer_ == "rmsprop") {
      // schema::slots_per_parameter's order: mean square, [momentum], [mean gradient]
      t.slot0 = slots_.get();
      t.slot1 = rmsprop_.momentum > 0 ? slots_.get() + n_device_ : nullptr;
      t.slot2 = rmsprop_.centered ? slots_.get() + (t.slot1 ? 2 : 1) * n_device_ : nullptr;
      k::rmsprop_update(&t, 1, rmsprop_, state_.get(), samples, s);
    } else {
      t.slot0 = n_slots_ ? slots_.get() : nullptr;
      k::sgd_update(&t, 1, sgd_, state_.get(), samples, s);
    }
    k::advance_step(state_.get(), s);
  }
  span(Part::optimizer, 0, m);
  if (pend) k::accumulate(pending_.get(), sums_.get(), kSums, s);
  span(Part::step, 0, start);
  if (profiling_) {
    profiling_ = false;
    profile_step(batch);
  }
}

// An embedding layer met `count` indices outside its table: the input's error, found on the
// device and reported once the step is done (every rank alike).
void CudaEngine::check_indices(double count, const char* consequence) const {
  if (count == 0) return;
  std::string layers;
  for (const auto& l : layers_)
    if (l->kind == Kind::embedding)
      layers += (layers.empty() ? "" : ", ") + std::string("layer ") + std::to_string(l->index) + " (embedding)";
  invalid(std::to_string(static_cast<uint64_t>(count)) + " input value(s) of " + layers +
          " are not integer indices in [0, input_dim): " + consequence);
}

// The steps since the last report met invalid inputs: the device refused their updates
// (StepState::invalid); it takes them again from here, and the host's step count is the device's.
void CudaEngine::check_refused() {
  if (!embeds_) return;
  k::StepState state;
  dev_->download(&state, state_.get(), sizeof state);
  if (state.invalid == 0) return;
  k::fill(&state_.get()->invalid, 1, 0.0, dev_->stream());
  step_ = state.iteration;
  check_indices(state.invalid, "the steps since the last results were refused, none updated the model");
}

StepResult CudaEngine::read_sums() {
  StepResult r;
  double sums[kSums];
  dev_->download(sums, sums_.get(), sizeof(sums));
  check_refused();
  r.samples = static_cast<uint64_t>(sums[2]);
  r.correct = static_cast<uint64_t>(std::llround(sums[1]));
  r.loss = sums[0] / sums[2];
  return r;
}

void CudaEngine::usable() const {
  if (!failure_.empty()) throw Error(failure_ + " (earlier)", SF_ERR);
}

// Data parallel, every rank runs each step's collectives in the same order. A step that fails on
// this rank — its own argument checks included (a bad label on one rank alone), since the peers
// go on into the step — leaves them in collectives this rank will not join (or would join with
// its next step's data): the engine is failed from then on, and the device aborts its
// collectives (NCCL), which a peer's transport may notice before the collective timeout.
template <class Step>
void CudaEngine::with_peers(const char* what, const Step& step) {
  try {
    step();
  } catch (const std::exception& e) {
    if (dev_->data_parallel() && failure_.empty()) {
      failure_ = std::string("cuda: ") + what + " failed on rank " + std::to_string(comm_.rank()) + " of " +
                 std::to_string(comm_.size()) + " after it began (" + e.what() +
                 "): its peers' collectives can no longer be matched, so this engine refuses every later step "
                 "(restart the job, from a checkpoint)";
      dev_->abort(failure_);
    }
    throw;
  }
}

StepResult CudaEngine::train_step(const float* x, const int32_t* y, uint32_t batch) {
  dev_->make_current();
  usable();
  with_peers("train_step", [&] {
    stage(x, y, batch, "train_step");
    enqueue(batch, true, false);
  });
  ++step_;
  return read_sums();
}

StepResult CudaEngine::eval_step(const float* x, const int32_t* y, uint32_t batch) {
  dev_->make_current();
  usable();
  with_peers("eval_step", [&] {
    stage(x, y, batch, "eval_step");
    enqueue(batch, false, false);
  });
  return read_sums();
}

// A bound-data step. Its shape's first occurrence runs eager (the warm-up: cuBLAS picks its
// kernels, buffers settle), the second is captured as a graph and replayed, every later one
// replays it: one launch for gather, forward, backward, allreduces and update. The step
// counter, the sample count and the pending sums live on the device, so a replay is the step
// it runs as (docs/compute-backends.md, "Graphs").
StepResult CudaEngine::indexed(uint64_t data, const uint64_t* idx, uint32_t batch, bool train, bool deferred,
                               const char* what) {
  std::vector<uint32_t> batches;  // step_batches' are this step's alone
  batches.swap(next_batches_);
  dev_->make_current();
  usable();
  with_peers(what, [&] {
    const auto it = data_.find(data);
    if (it == data_.end()) throw unknown_data(data);
    if (batch == 0) invalid(std::string(what) + ": batch must be > 0");
    if (!idx) invalid(std::string(what) + ": idx is NULL");
    const uint64_t n = it->second.n;
    for (uint32_t i = 0; i < batch; ++i)
      if (idx[i] >= n)
        invalid(std::string(what) + ": index " + std::to_string(idx[i]) + " at position " + std::to_string(i) +
                " is outside bound set " + std::to_string(data) + " of " + std::to_string(n) + " samples");
    ensure_capacity(batch);
    StepGraph* g = nullptr;
    if (eopt_.graphs) {
      g = &graphs_[graph_key(data, batch, train, batches)];
      g->data = data;
    }
    // The indices go up without a wait, outside any graph, to the buffer the step gathers from
    // (a graph's own: idx_ may have been replaced since it was captured); the batch is gathered
    // on the device.
    dev_->upload_async(g && g->graph ? g->idx : idx_.get(), idx, size_t{batch} * sizeof(uint64_t));
    // Every bound-data step adds its sums to pending_; one whose sums are returned leaves
    // pending_ as it found it.
    if (!deferred) dev_->copy(pending_before_.get(), pending_.get(), kSums * sizeof(double));
    const BoundSet& set = it->second;
    auto step = [&] {
      k::gather_rows(set.x.get(), set.y.get(), idx_.get(), batch, numel(input_shape_), x_.get(), labels_.get(),
                     dev_->stream());
      enqueue(batch, train, true);
    };
    if (g && g->graph) {
      dev_->replay(*g->graph);
      ++stats_.replayed;
    } else if (!g || ++g->seen < 2) {
      step();
      ++stats_.eager;
    } else {
      dev_->begin_capture();
      try {
        step();
        g->graph = dev_->end_capture();
      } catch (...) {
        dev_->abort_capture();
        throw;
      }
      g->idx = idx_.get();
      ++stats_.captured;
      dev_->replay(*g->graph);
      ++stats_.replayed;
    }
    if (!deferred) dev_->copy(pending_.get(), pending_before_.get(), kSums * sizeof(double));
  });
  if (train) ++step_;
  return deferred ? StepResult{} : read_sums();
}

// Whether an NCCL launch is captured, and from which capture, must be the same on every rank
// (NCCL's rule), and the ranks' batches differ at an epoch's end: the key names every rank's
// batch. From step_batches, the schedule every rank shares, no exchange is needed; without it,
// every rank's own key is gathered (a collective of a few bytes, each step).
std::string CudaEngine::graph_key(uint64_t data, uint32_t batch, bool train, const std::vector<uint32_t>& batches) {
  GraphKey mine;
  mine.data = data;  // the same on every rank: bind_data numbers its calls, which are collective
  mine.batch = batch;
  mine.train = train;
  const auto bytes = [](const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); };
  if (!batches.empty()) {
    if (batches[comm_.rank()] != batch)
      invalid("step_batches gave rank " + std::to_string(comm_.rank()) + " a batch of " +
              std::to_string(batches[comm_.rank()]) + ", but its step has " + std::to_string(batch) + " samples");
    mine.batch = 0;
    return "s" + bytes(&mine, sizeof mine) + bytes(batches.data(), batches.size() * sizeof(uint32_t));
  }
  const std::string key = bytes(&mine, sizeof mine);
  return "g" + (comm_.size() > 1 ? comm_.allgather(key) : key);
}

void CudaEngine::step_batches(std::span<const uint32_t> batches) {
  if (batches.size() != comm_.size())
    invalid("step_batches: " + std::to_string(batches.size()) + " batches for a pool of " +
            std::to_string(comm_.size()) + " ranks");
  next_batches_.assign(batches.begin(), batches.end());
}

uint64_t CudaEngine::bind_data(const float* x, const int32_t* y, uint64_t n) {
  // Every call takes a number, bound or refused, so the sets' numbers agree on every rank (a
  // graph's key holds it: graph_key).
  const uint64_t id = next_data_++;
  dev_->make_current();
  if (!x || !y) invalid("bind_data: x and y are required");
  if (n == 0) invalid("bind_data: no samples");
  const size_t sample = numel(input_shape_);
  if (n > SIZE_MAX / sizeof(float) / sample) invalid("bind_data: " + std::to_string(n) + " samples overflow memory");
  for (uint64_t i = 0; i < n; ++i)
    if (y[i] < 0 || static_cast<uint32_t>(y[i]) >= classes_)
      invalid("bind_data: label " + std::to_string(y[i]) + " of sample " + std::to_string(i) + " is outside [0, " +
              std::to_string(classes_) + ")");
  const size_t bytes = n * sample * sizeof(float) + n * sizeof(int32_t);
  BoundSet b;
  b.n = n;
  try {
    b.x = Buffer<float>(*dev_, n * sample);
    b.y = Buffer<int32_t>(*dev_, n);
  } catch (const Error& e) {
    // Too big for this device: the caller passes samples per step instead (abi.h).
    throw Error(std::string(Device::build_name()) + ": a bound set of " + std::to_string(n) + " samples (" +
                    std::to_string(bytes >> 20) + " MiB) does not fit: " + e.what(),
                SF_ERR_UNSUPPORTED);
  }
  dev_->upload(b.x.get(), x, n * sample * sizeof(float));
  dev_->upload(b.y.get(), y, n * sizeof(int32_t));
  data_.emplace(id, std::move(b));
  return id;
}

void CudaEngine::release_data(uint64_t data) {
  dev_->make_current();
  const auto it = data_.find(data);
  if (it == data_.end()) throw unknown_data(data);
  dev_->synchronize();  // no queued gather still reads it
  std::erase_if(graphs_, [&](const auto& e) { return e.second.data == data; });  // they gather from it
  data_.erase(it);
}

StepResult CudaEngine::train_step_indexed(uint64_t data, const uint64_t* idx, uint32_t batch, bool deferred) {
  return indexed(data, idx, batch, true, deferred, "train_step_indexed");
}

StepResult CudaEngine::eval_step_indexed(uint64_t data, const uint64_t* idx, uint32_t batch, bool deferred) {
  return indexed(data, idx, batch, false, deferred, "eval_step_indexed");
}

StepResult CudaEngine::take_results() {
  dev_->make_current();
  usable();
  double p[kSums];
  dev_->download(p, pending_.get(), sizeof(p));  // waits for every deferred step
  dev_->zero(pending_.get(), sizeof(p));
  check_refused();
  StepResult r;
  r.samples = static_cast<uint64_t>(p[2]);
  r.correct = static_cast<uint64_t>(std::llround(p[1]));
  r.loss = p[2] > 0 ? p[0] / p[2] : 0.0;
  return r;
}

void CudaEngine::predict(const float* x, uint32_t batch, float* logits) {
  dev_->make_current();
  check_batch(x, nullptr, batch, "predict");
  if (!logits) invalid("predict: logits is NULL");
  ensure_capacity(batch);
  dev_->upload(x_.get(), x, size_t{batch} * numel(input_shape_) * sizeof(float));
  k::fill(sums_.get() + 3, 1, 0.0, dev_->stream());
  dev_->download(logits, forward(x_.get(), batch, false), size_t{batch} * classes_ * sizeof(float));
  double count = 0;
  dev_->download(&count, sums_.get() + 3, sizeof count);
  check_indices(count, "their rows were zeros");
}

void CudaEngine::get_params(float* out, uint64_t count) const {
  dev_->make_current();
  if (count != n_params_)
    invalid("get_params: count " + std::to_string(count) + " != param_count " + std::to_string(n_params_));
  std::vector<float> d(n_device_);
  dev_->download(d.data(), params_.get(), n_device_ * sizeof(float));
  to_logical(d.data(), out, 1);
}

void CudaEngine::set_params(const float* in, uint64_t count) {
  dev_->make_current();
  if (count != n_params_)
    invalid("set_params: count " + std::to_string(count) + " != param_count " + std::to_string(n_params_));
  const std::vector<float> d = to_device(in, 1);
  dev_->upload(params_.get(), d.data(), n_device_ * sizeof(float));
  dev_->zero(grads_.get(), n_device_ * sizeof(float));  // the gaps, as load_state says
}

std::vector<float> CudaEngine::to_device(const float* logical, size_t arrays) const {
  std::vector<float> d(arrays * n_device_, 0.f);
  for (size_t a = 0; a < arrays; ++a)
    for (const auto& l : layers_)
      std::copy_n(logical + a * n_params_ + l->loff, l->psize, d.begin() + static_cast<ptrdiff_t>(a * n_device_ + l->poff));
  return d;
}

void CudaEngine::to_logical(const float* device, float* logical, size_t arrays) const {
  for (size_t a = 0; a < arrays; ++a)
    for (const auto& l : layers_) std::copy_n(device + a * n_device_ + l->poff, l->psize, logical + a * n_params_ + l->loff);
}

std::vector<size_t> CudaEngine::param_offsets() const {
  std::vector<size_t> o;
  for (const auto& l : layers_)
    if (l->psize) o.push_back(l->poff);
  return o;
}


// The backend-neutral engine state (skyforge/engine_state.hpp): what the cpu backend writes and
// reads too, so a checkpoint moves between the two.
EngineState CudaEngine::shape_of_state() const {
  EngineState s;
  s.architecture = arch_;
  s.params.resize(n_params_);
  s.slots.resize(n_slots_);
  for (const auto& l : layers_)
    if (l->kind == Kind::batchnorm) s.moving.insert(s.moving.end(), 2, std::vector<float>(l->C));
  return s;
}

std::string CudaEngine::state_dict() const {
  dev_->make_current();
  EngineState s = shape_of_state();
  s.seed = seed_;
  s.step = step_;
  std::vector<float> d(n_device_ * std::max<size_t>(slots_per_param_, 1));
  dev_->download(d.data(), params_.get(), n_device_ * sizeof(float));
  to_logical(d.data(), s.params.data(), 1);
  dev_->download(d.data(), slots_.get(), slots_per_param_ * n_device_ * sizeof(float));
  to_logical(d.data(), s.slots.data(), slots_per_param_);
  size_t j = 0;
  for (const auto& l : layers_)
    if (l->kind == Kind::batchnorm) {
      dev_->download(s.moving[j].data(), l->moving_mean.get(), l->C * sizeof(float));
      dev_->download(s.moving[j + 1].data(), l->moving_var.get(), l->C * sizeof(float));
      j += 2;
    }
  return write_engine_state(s);
}

void CudaEngine::load_state(std::string_view b) {
  dev_->make_current();
  // Everything is read and checked on the host before the engine changes.
  EngineState s;
  try {
    s = read_engine_state(b, shape_of_state());
  } catch (const std::invalid_argument& e) {
    invalid(std::string("cuda: ") + e.what());
  }
  step_ = s.step;
  seed_ = s.seed;  // dropout masks follow the run, not this engine's spec
  graphs_.clear();  // a graph holds the seed in its dropout keys (load_state is collective, as steps are)
  const k::StepState state{s.step, 0.f};
  dev_->upload(state_.get(), &state, sizeof state);
  const std::vector<float> params = to_device(s.params.data(), 1), slots = to_device(s.slots.data(), slots_per_param_);
  dev_->upload(params_.get(), params.data(), n_device_ * sizeof(float));
  dev_->upload(slots_.get(), slots.data(), slots_per_param_ * n_device_ * sizeof(float));
  // The gaps of grads_ are zeros no layer writes, except a clipping scale of NaN (a diverged
  // step) times them: a loaded state starts from zeros there, or every later norm stays NaN.
  dev_->zero(grads_.get(), n_device_ * sizeof(float));
  size_t j = 0;
  for (const auto& l : layers_)
    if (l->kind == Kind::batchnorm) {
      dev_->upload(l->moving_mean.get(), s.moving[j].data(), l->C * sizeof(float));
      dev_->upload(l->moving_var.get(), s.moving[j + 1].data(), l->C * sizeof(float));
      j += 2;
    }
}

std::unique_ptr<Engine> make_engine(const ModelSpec& spec, const Communicator& comm, const Host& host,
                                    const EngineOptions& opt) {
  return std::make_unique<CudaEngine>(spec, comm, host, opt);
}

}  // namespace skyforge::cuda
