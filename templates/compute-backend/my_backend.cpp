// A skyforge compute backend in plain C++: the layers dense (activation linear, relu or
// softmax), relu, softmax and flatten; SGD and Adam with Keras' rules (their options checked by
// skyforge/optimizer_schema.hpp); sparse softmax cross-entropy; data parallel over the pool's
// communicator. Start here for your own backend:
// replace the loops with your library's kernels and keep what the contract asks
// (docs/compute-backends.md), then run `skyforge backend-check my_backend`.
//
// The contract in brief (skyforge/abi.h, sf_compute_hooks): an engine owns the whole step;
// weights are one flat buffer in the layout every backend shares, initialised from the seed by
// skyforge::initial_weights; state_dict is skyforge/engine_state.hpp's layout (checkpoints move
// between backends); with a communicator of size > 1 rank 0's weights are broadcast and
// gradients are summed over ranks, then divided by the global batch; loss and accuracy cover the
// global batch. Refuse what you cannot do with skyforge::Error(why, SF_ERR_UNSUPPORTED) and bad
// input with SF_ERR_INVALID: the SDK turns exceptions into statuses.
#include <skyforge/engine_state.hpp>
#include <skyforge/initial_weights.hpp>
#include <skyforge/layer_schema.hpp>
#include <skyforge/optimizer_schema.hpp>
#include <skyforge/sdk.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace {

using skyforge::Error;

enum class Kind { dense, relu, softmax, flatten };

struct Layer {
  Kind kind;
  size_t in = 0, out = 0;  // features per sample
  size_t poff = 0;         // dense: kernel (in, out) at poff, bias (out) after it when use_bias
  bool bias = false;
  Kind act = Kind::flatten;  // dense's activation: relu, softmax, or flatten for linear
};

void softmax_rows(float* y, size_t rows, size_t n) {
  for (size_t r = 0; r < rows; ++r) {
    float* v = y + r * n;
    const float m = *std::max_element(v, v + n);
    double s = 0;
    for (size_t j = 0; j < n; ++j) s += v[j] = std::exp(v[j] - m);
    for (size_t j = 0; j < n; ++j) v[j] = static_cast<float>(v[j] / s);
  }
}

class MyEngine : public skyforge::Engine {
 public:
  MyEngine(const skyforge::ModelSpec& spec, const skyforge::Communicator& comm) : comm_(comm) {
    std::vector<skyforge::schema::LayerConfig> configs;
    std::vector<uint32_t> shape = spec.input_shape;
    size_t feats = 1;
    for (uint32_t d : shape) feats *= d;
    in_ = feats;
    for (size_t i = 0; i < spec.layers.size(); ++i) {
      const auto& l = spec.layers[i];
      const auto& given = l.options.all();
      configs.push_back(skyforge::schema::parse(l.type, {given.begin(), given.end()}, i));  // LayerError: SF_ERR_INVALID
      const auto& c = configs.back();
      // A layer list in order, each taking the previous one's output: model graphs (`inputs`,
      // merge layers) need an engine that runs them (docs/layers.md, "The model graph").
      if (!c.inputs().empty() || c.def().takes_many())
        throw Error(c.label() + ": my_backend runs Sequential models only (no inputs, add or concatenate)",
                    SF_ERR_UNSUPPORTED);
      const auto s = c.infer(shape);
      Layer L;
      L.in = feats;
      if (l.type == "dense") {
        if (shape.size() != 1)
          throw Error(c.where() + ": my_backend takes dense on a flat input only (add flatten)", SF_ERR_UNSUPPORTED);
        L.kind = Kind::dense;
        L.bias = c.flag("use_bias");
        const std::string& act = c.choice("activation");
        if (act != "linear" && act != "relu" && act != "softmax")
          throw Error(c.where() + ": my_backend has no activation '" + act + "' (it has linear, relu, softmax)",
                      SF_ERR_UNSUPPORTED);
        L.act = act == "relu" ? Kind::relu : act == "softmax" ? Kind::softmax : Kind::flatten;
        L.poff = n_params_;
        n_params_ += s.trainable;
      } else if (l.type == "relu" || l.type == "softmax" || l.type == "flatten") {
        L.kind = l.type == "relu" ? Kind::relu : l.type == "softmax" ? Kind::softmax : Kind::flatten;
      } else {
        throw Error(c.where() + ": my_backend has no kernels for this layer", SF_ERR_UNSUPPORTED);
      }
      shape = s.output;
      feats = 1;
      for (uint32_t d : shape) feats *= d;
      L.out = feats;
      layers_.push_back(L);
    }
    if (shape.size() != 1) throw Error("the model's output must be (classes,)", SF_ERR_INVALID);
    classes_ = shape[0];
    params_ = skyforge::initial_weights(spec.input_shape, configs, spec.seed);
    seed_ = spec.seed;
    grads_.assign(n_params_, 0.f);
    set_optimizer(spec.optimizer, spec.optimizer_options);
    arch_ = skyforge::schema::architecture_text(spec.input_shape, configs, adam_ ? "adam" : "sgd");
    comm_.broadcast(params_.data(), params_.size() * sizeof(float), 0);  // every replica starts from rank 0's
  }

  skyforge::StepResult train_step(const float* x, const int32_t* y, uint32_t batch) override {
    return step(x, y, batch, true);
  }
  skyforge::StepResult eval_step(const float* x, const int32_t* y, uint32_t batch) override {
    return step(x, y, batch, false);
  }
  void predict(const float* x, uint32_t batch, float* logits) override {
    if (!x || !logits || batch == 0) throw Error("predict: empty batch", SF_ERR_INVALID);
    forward(x, batch);
    std::memcpy(logits, acts_.back().data(), size_t{batch} * classes_ * sizeof(float));
  }
  uint64_t param_count() const override { return n_params_; }
  void get_params(float* out, uint64_t n) const override {
    if (n != n_params_) throw Error("get_params: the model has " + std::to_string(n_params_) + " parameters", SF_ERR_INVALID);
    std::copy(params_.begin(), params_.end(), out);
  }
  void set_params(const float* in, uint64_t n) override {
    if (n != n_params_) throw Error("set_params: the model has " + std::to_string(n_params_) + " parameters", SF_ERR_INVALID);
    params_.assign(in, in + n);
  }
  // The backend-neutral engine state (skyforge/engine_state.hpp): the same bytes the cpu and cuda
  // backends write and read, so a checkpoint moves between this backend and theirs.
  std::string state_dict() const override {
    skyforge::EngineState s;
    s.architecture = arch_;
    s.seed = seed_;
    s.step = step_;
    s.params = params_;
    s.slots = slots_;
    return skyforge::write_engine_state(s);
  }
  void load_state(std::string_view b) override {
    skyforge::EngineState like;
    like.architecture = arch_;
    like.params.resize(params_.size());
    like.slots.resize(slots_.size());
    skyforge::EngineState s = skyforge::read_engine_state(b, like);  // std::invalid_argument: SF_ERR_INVALID
    params_ = std::move(s.params);
    slots_ = std::move(s.slots);
    step_ = s.step;
    seed_ = s.seed;
  }

 private:
  // The optimizer schema checks the options and fills in Keras' defaults: an unknown optimizer,
  // an option it does not have or a value out of its range is refused with its name
  // (OptimizerError, a std::invalid_argument: SF_ERR_INVALID).
  void set_optimizer(const std::string& name, const skyforge::Options& o) {
    const skyforge::schema::OptimizerConfig c = skyforge::schema::parse_optimizer(name, o.all());
    if (c.name() != "adam" && c.name() != "sgd")
      throw Error(std::string(c.name()) + ": not implemented here (adam and sgd are)", SF_ERR_UNSUPPORTED);
    if (c.schedule() || c.real("clipnorm") > 0 || c.real("global_clipnorm") > 0)
      throw Error("learning-rate schedules and gradient clipping: not implemented here", SF_ERR_UNSUPPORTED);
    adam_ = c.name() == "adam";
    lr_ = c.real("learning_rate");
    if (adam_) {
      b1_ = c.real("beta_1");
      b2_ = c.real("beta_2");
      eps_ = c.real("epsilon");
    } else {
      momentum_ = c.real("momentum");
      if (c.flag("nesterov")) throw Error("sgd: nesterov is not implemented here", SF_ERR_UNSUPPORTED);
    }
    slots_.assign(adam_ ? 2 * n_params_ : momentum_ > 0 ? n_params_ : 0, 0.f);
  }

  void forward(const float* x, uint32_t batch) {
    acts_.assign(layers_.size() + 1, {});
    acts_[0].assign(x, x + size_t{batch} * in_);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& L = layers_[i];
      const std::vector<float>& a = acts_[i];
      std::vector<float>& y = acts_[i + 1];
      y.assign(size_t{batch} * L.out, 0.f);
      if (L.kind == Kind::dense) {
        const float* W = params_.data() + L.poff;
        for (size_t r = 0; r < batch; ++r)
          for (size_t k = 0; k < L.in; ++k)
            for (size_t j = 0; j < L.out; ++j) y[r * L.out + j] += a[r * L.in + k] * W[k * L.out + j];
        if (L.bias)
          for (size_t r = 0; r < batch; ++r)
            for (size_t j = 0; j < L.out; ++j) y[r * L.out + j] += W[L.in * L.out + j];
      } else {
        y = a;
      }
      const Kind act = L.kind == Kind::dense ? L.act : L.kind;
      if (act == Kind::relu)
        for (float& v : y) v = std::max(v, 0.f);
      if (act == Kind::softmax) softmax_rows(y.data(), batch, L.out);
    }
  }

  skyforge::StepResult step(const float* x, const int32_t* labels, uint32_t batch, bool train) {
    if (!x || !labels || batch == 0) throw Error("train_step: an empty batch", SF_ERR_INVALID);
    for (uint32_t i = 0; i < batch; ++i)
      if (labels[i] < 0 || static_cast<uint32_t>(labels[i]) >= classes_)
        throw Error("train_step: label " + std::to_string(labels[i]) + " of sample " + std::to_string(i) +
                        " is outside [0, " + std::to_string(classes_) + ")",
                    SF_ERR_INVALID);
    forward(x, batch);
    // Loss and accuracy over the global batch: sums of every rank's samples.
    std::vector<float> dy(size_t{batch} * classes_);
    double sums[3] = {0, 0, double(batch)};  // loss, correct, samples
    const std::vector<float>& logits = acts_.back();
    for (uint32_t r = 0; r < batch; ++r) {
      const float* z = logits.data() + size_t{r} * classes_;
      const float m = *std::max_element(z, z + classes_);
      double s = 0;
      for (uint32_t j = 0; j < classes_; ++j) s += std::exp(double(z[j]) - m);
      sums[0] += std::log(s) + m - z[labels[r]];
      sums[1] += (std::max_element(z, z + classes_) - z) == labels[r];
      for (uint32_t j = 0; j < classes_; ++j)
        dy[size_t{r} * classes_ + j] = float(std::exp(double(z[j]) - m) / s) - (int32_t(j) == labels[r] ? 1.f : 0.f);
    }
    comm_.allreduce(sums, 3);
    if (train) {
      backward(dy, batch);
      comm_.allreduce(grads_.data(), grads_.size());
      update(1.f / static_cast<float>(sums[2]));
    }
    return skyforge::StepResult{sums[0] / sums[2], static_cast<uint64_t>(sums[1]), static_cast<uint64_t>(sums[2])};
  }

  // dy: d(sum of per-sample losses)/d(logits); grads_ gets this rank's sums.
  void backward(std::vector<float> dy, uint32_t batch) {
    std::fill(grads_.begin(), grads_.end(), 0.f);
    for (size_t i = layers_.size(); i-- > 0;) {
      const Layer& L = layers_[i];
      const std::vector<float>& a = acts_[i];
      const std::vector<float>& y = acts_[i + 1];
      const Kind act = L.kind == Kind::dense ? L.act : L.kind;
      if (act == Kind::relu)
        for (size_t k = 0; k < dy.size(); ++k) dy[k] = y[k] > 0.f ? dy[k] : 0.f;
      if (act == Kind::softmax)
        for (size_t r = 0; r < batch; ++r) {
          double dot = 0;
          for (size_t j = 0; j < L.out; ++j) dot += double(dy[r * L.out + j]) * y[r * L.out + j];
          for (size_t j = 0; j < L.out; ++j) dy[r * L.out + j] = y[r * L.out + j] * (dy[r * L.out + j] - float(dot));
        }
      if (L.kind != Kind::dense) continue;  // relu, softmax, flatten: dx is dy (reshaped)
      const float* W = params_.data() + L.poff;
      float* gW = grads_.data() + L.poff;
      std::vector<float> dx(size_t{batch} * L.in, 0.f);
      for (size_t r = 0; r < batch; ++r)
        for (size_t k = 0; k < L.in; ++k)
          for (size_t j = 0; j < L.out; ++j) {
            gW[k * L.out + j] += a[r * L.in + k] * dy[r * L.out + j];
            dx[r * L.in + k] += dy[r * L.out + j] * W[k * L.out + j];
          }
      if (L.bias)
        for (size_t r = 0; r < batch; ++r)
          for (size_t j = 0; j < L.out; ++j) gW[L.in * L.out + j] += dy[r * L.out + j];
      dy = std::move(dx);
    }
  }

  // Keras' rules, on the global mean gradient g * scale.
  void update(float scale) {
    const size_t n = n_params_;
    if (!adam_) {
      for (size_t i = 0; i < n; ++i) {
        const float g = grads_[i] * scale;
        if (momentum_ > 0) {
          slots_[i] = slots_[i] * float(momentum_) - float(lr_) * g;
          params_[i] += slots_[i];
        } else {
          params_[i] -= float(lr_) * g;
        }
      }
    } else {
      const double t = double(++step_);
      const float alpha = float(lr_ * std::sqrt(1.0 - std::pow(b2_, t)) / (1.0 - std::pow(b1_, t)));
      float *m = slots_.data(), *v = slots_.data() + n;
      for (size_t i = 0; i < n; ++i) {
        const float g = grads_[i] * scale;
        m[i] += (g - m[i]) * float(1.0 - b1_);
        v[i] += (g * g - v[i]) * float(1.0 - b2_);
        params_[i] -= alpha * m[i] / (std::sqrt(v[i]) + float(eps_));
      }
      return;
    }
    ++step_;
  }

  skyforge::Communicator comm_;
  std::string arch_;  // schema::architecture_text: what a loaded state must match
  uint64_t seed_ = 0;  // the run's seed (this backend has no dropout; kept for the state)
  std::vector<Layer> layers_;
  size_t in_ = 0, n_params_ = 0;
  uint32_t classes_ = 0;
  std::vector<float> params_, grads_, slots_;
  std::vector<std::vector<float>> acts_;
  bool adam_ = true;  // else sgd; the options as set_optimizer found them
  double lr_ = 0, momentum_ = 0, b1_ = 0, b2_ = 0, eps_ = 0;
  uint64_t step_ = 0;
};

class MyBackend : public skyforge::ComputeBackend {
 public:
  using ComputeBackend::ComputeBackend;
  std::unique_ptr<skyforge::Engine> create_engine(const skyforge::ModelSpec& spec,
                                                  const skyforge::Communicator& comm) override {
    return std::make_unique<MyEngine>(spec, comm);
  }
};

}  // namespace

SKYFORGE_PLUGIN(MyBackend, "my_backend", "0.1.0",
                "Template compute backend: dense, relu, softmax and flatten in plain C++, data-parallel")
