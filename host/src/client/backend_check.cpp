#include "backend_check.hpp"

#include <skyforge/data.hpp>
#include <skyforge/keras.hpp>
#include <skyforge/layer_schema.hpp>
#include <skyforge/thread_group.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <tuple>

#include "catalog.hpp"
#include "loader.hpp"
#include "services.hpp"

namespace skyforge {
namespace {

namespace kd = keras::detail;
using Vec = std::vector<float>;
using Kv = std::vector<std::pair<std::string, std::string>>;

// A check that does not hold / does not apply to this backend (SF_ERR_UNSUPPORTED).
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct Skip : std::runtime_error {
  using std::runtime_error::runtime_error;
};

keras::Layer layer(std::string type, Kv options = {}) { return keras::Layer{std::move(type), std::move(options), {}}; }

struct Model {
  std::vector<uint32_t> input;
  std::vector<keras::Layer> layers;
  uint32_t classes = 3;  // units of the last dense layer
  std::string optimizer = "adam";
  Kv optimizer_options = {{"learning_rate", "0.01"}};
};

Model with_sgd(Model m, const char* learning_rate) {
  m.optimizer = "sgd";
  m.optimizer_options = {{"learning_rate", learning_rate}, {"momentum", "0"}};
  return m;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2g", v);
  return b;
}

// One engine of a backend, through its C table only.
class Engine {
 public:
  Engine(keras::Backend b, const Model& m, uint64_t seed, const sf_communicator* comm = nullptr) {
    spec_.layers = m.layers;
    spec_.input_shape = m.input;
    spec_.optimizer = m.optimizer;
    spec_.optimizer_options = m.optimizer_options;
    spec_.loss = "sparse_categorical_crossentropy";
    spec_.build(seed, 1);
    try {
      h_ = std::make_unique<kd::EngineHandle>(b, spec_.spec, Communicator(comm));
    } catch (const Error& e) {
      if (e.status() == SF_ERR_UNSUPPORTED) throw Skip(e.what());
      throw Failure(e.what());
    }
    uint64_t n = 0;
    check(h_->hooks().param_count(h_->self(), h_->engine(), &n), "param_count");
    n_ = static_cast<size_t>(n);
  }
  size_t param_count() const { return n_; }
  // train_step / eval_step; the status, with the engine's message in *why.
  sf_status try_step(bool train, const Vec& x, const std::vector<int32_t>& y, uint32_t batch, sf_step_result& r,
                     std::string* why = nullptr) {
    r = sf_step_result{};
    r.struct_size = sizeof r;
    auto fn = train ? h_->hooks().train_step : h_->hooks().eval_step;
    const sf_status st = fn(h_->self(), h_->engine(), x.data(), y.data(), batch, &r);
    if (st != SF_OK && why) *why = message();
    return st;
  }
  sf_step_result step(bool train, const Vec& x, const std::vector<int32_t>& y, uint32_t batch) {
    sf_step_result r;
    check(try_step(train, x, y, batch, r), train ? "train_step" : "eval_step");
    return r;
  }
  Vec params() const {
    Vec p(n_);
    check(h_->hooks().get_params(h_->self(), h_->engine(), p.data(), n_), "get_params");
    return p;
  }
  void set_params(const Vec& p) { check(h_->hooks().set_params(h_->self(), h_->engine(), p.data(), p.size()), "set_params"); }
  std::string state() const {
    std::string s;
    check(h_->hooks().state_dict(h_->self(), h_->engine(), skyforge::detail::string_sink(s)), "state_dict");
    return s;
  }
  // Bound data (ABI 1.8): false when the backend has no such hooks or keeps no data here.
  bool bind(const Vec& x, const std::vector<int32_t>& y) {
    const sf_compute_hooks& h = h_->hooks();
    if (!h.bind_data) return false;
    const sf_status st = h.bind_data(h_->self(), h_->engine(), x.data(), y.data(), y.size(), &data_);
    if (st == SF_ERR_UNSUPPORTED) return false;
    check(st, "bind_data");
    return true;
  }
  sf_status try_indexed(bool train, uint64_t data, const std::vector<uint64_t>& idx, sf_step_result* r,
                        std::string* why = nullptr) {
    if (r) *r = sf_step_result{}, r->struct_size = sizeof *r;
    auto fn = train ? h_->hooks().train_step_indexed : h_->hooks().eval_step_indexed;
    const sf_status st = fn(h_->self(), h_->engine(), data, idx.data(), static_cast<uint32_t>(idx.size()), r);
    if (st != SF_OK && why) *why = message();
    return st;
  }
  void indexed(bool train, const std::vector<uint64_t>& idx, sf_step_result* r) {
    check(try_indexed(train, data_, idx, r), train ? "train_step_indexed" : "eval_step_indexed");
  }
  sf_step_result take() {
    sf_step_result r{};
    r.struct_size = sizeof r;
    check(h_->hooks().take_results(h_->self(), h_->engine(), &r), "take_results");
    return r;
  }
  sf_status release(uint64_t data) { return h_->hooks().release_data(h_->self(), h_->engine(), data); }
  uint64_t data() const { return data_; }
  sf_status try_load(const std::string& s, std::string* why) {
    const sf_status st = h_->hooks().load_state(h_->self(), h_->engine(), s.data(), s.size());
    if (st != SF_OK) *why = message();
    return st;
  }

 private:
  std::string message() const {
    const char* m = h_->hooks().engine_last_error(h_->self(), h_->engine());
    return m ? m : "";
  }
  void check(sf_status st, const char* what) const {
    if (st != SF_OK) throw Failure(std::string(what) + " failed: " + (message().empty() ? "no message" : message()));
  }

  kd::CompiledSpec spec_;
  std::unique_ptr<kd::EngineHandle> h_;
  size_t n_ = 0;
  uint64_t data_ = 0;  // the bound set
};

// Deterministic samples: x uniform in [-1, 1), labels cycling through the classes.
struct Batch {
  Vec x;
  std::vector<int32_t> y;
  uint32_t n = 0;
};
Batch batch_of(const Model& m, uint32_t n, uint64_t seed) {
  size_t per = 1;
  for (uint32_t d : m.input) per *= d;
  Batch b;
  b.n = n;
  b.x.resize(per * n);
  Rng rng(seed);
  for (float& v : b.x) v = static_cast<float>(static_cast<double>(rng.next() >> 40) * 0x1.0p-24 * 2.0 - 1.0);
  for (uint32_t i = 0; i < n; ++i) b.y.push_back(static_cast<int32_t>((i + seed) % m.classes));
  return b;
}
Batch slice(const Batch& b, uint32_t from, uint32_t n) {
  const size_t per = b.x.size() / b.n;
  Batch s;
  s.n = n;
  s.x.assign(b.x.begin() + static_cast<std::ptrdiff_t>(from * per), b.x.begin() + static_cast<std::ptrdiff_t>((from + n) * per));
  s.y.assign(b.y.begin() + from, b.y.begin() + from + n);
  return s;
}

double max_abs_diff(const Vec& a, const Vec& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// ---- the models ---------------------------------------------------------------------------------

// A small model around each layer type of the schema, its gradient flowing through the layer.
std::optional<Model> harness(std::string_view type) {
  const Kv dense3 = {{"units", "3"}};
  if (type == "dense") return Model{{6}, {layer("dense", {{"units", "5"}, {"activation", "relu"}}), layer("dense", dense3)}};
  if (type == "conv2d")  // 'same' stride 1, then 'valid' stride 2
    return Model{{6, 6, 2},
                 {layer("conv2d", {{"filters", "3"}, {"kernel_size", "3"}, {"padding", "same"}}),
                  layer("conv2d", {{"filters", "2"}, {"kernel_size", "2"}, {"strides", "2"}}), layer("flatten"),
                  layer("dense", dense3)}};
  if (type == "batch_normalization")
    return Model{{6}, {layer("dense", {{"units", "5"}}), layer("batch_normalization"), layer("dense", dense3)}};
  if (type == "relu" || type == "softmax")
    return Model{{6}, {layer("dense", {{"units", "5"}}), layer(std::string(type)), layer("dense", dense3)}};
  if (type == "flatten") return Model{{3, 2}, {layer("flatten"), layer("dense", dense3)}};
  if (type == "global_average_pooling2d")
    return Model{{4, 4, 3},
                 {layer("conv2d", {{"filters", "2"}, {"kernel_size", "2"}}), layer("global_average_pooling2d"),
                  layer("dense", dense3)}};
  if (type == "max_pooling2d")
    return Model{{4, 4, 2},
                 {layer("conv2d", {{"filters", "2"}, {"kernel_size", "2"}, {"padding", "same"}}),
                  layer("max_pooling2d", {{"pool_size", "2"}}), layer("flatten"), layer("dense", dense3)}};
  if (type == "dropout")
    return Model{{6}, {layer("dense", {{"units", "5"}}), layer("dropout", {{"rate", "0.5"}}), layer("dense", dense3)}};
  return std::nullopt;
}

Model mlp() {
  return Model{{8}, {layer("dense", {{"units", "16"}, {"activation", "relu"}}), layer("dense", {{"units", "4"}})}, 4};
}

// The convnet example's layers, small (no dropout: see agreement()).
Model convnet() {
  return Model{{8, 8, 1},
               {layer("conv2d", {{"filters", "4"}, {"kernel_size", "3"}, {"padding", "same"}, {"use_bias", "false"}}),
                layer("batch_normalization", {{"scale", "false"}}), layer("relu"),
                layer("conv2d", {{"filters", "6"}, {"kernel_size", "3"}, {"strides", "2"}}), layer("relu"),
                layer("max_pooling2d", {{"pool_size", "2"}, {"padding", "same"}}), layer("global_average_pooling2d"),
                layer("dense", {{"units", "8"}, {"activation", "relu"}}), layer("dense", {{"units", "4"}})},
               4};
}

// ---- the checks ---------------------------------------------------------------------------------

// The gradient one SGD step (learning rate 1) applies, against central differences of the
// training loss (an engine with learning rate 1e-30 evaluates it without moving). float32
// throughout: |numeric - analytic| <= 2e-3 + 5e-2 * max(|numeric|, |analytic|), h = 1e-3.
std::string gradients(keras::Backend b, const Model& base) {
  const Batch d = batch_of(base, 4, 7);
  Engine step(b, with_sgd(base, "1"), 11), probe(b, with_sgd(base, "1e-30"), 11);
  const Vec p0 = step.params();
  step.step(true, d.x, d.y, d.n);
  const Vec p1 = step.params();
  const size_t n = p0.size(), samples = std::min<size_t>(n, 40);
  constexpr float h = 1e-3f;
  double worst = 0;
  for (size_t k = 0; k < samples; ++k) {
    const size_t i = k * n / samples;
    const double analytic = double(p0[i]) - double(p1[i]);
    Vec p = p0;
    p[i] = p0[i] + h;
    probe.set_params(p);
    const double up = probe.step(true, d.x, d.y, d.n).loss;
    p[i] = p0[i] - h;
    probe.set_params(p);
    const double down = probe.step(true, d.x, d.y, d.n).loss;
    const double numeric = (up - down) / (2.0 * double(h));
    const double err = std::fabs(numeric - analytic), allowed = 2e-3 + 5e-2 * std::max(std::fabs(numeric), std::fabs(analytic));
    if (err > allowed)
      throw Failure("parameter " + std::to_string(i) + " of " + std::to_string(n) + ": the step applied gradient " +
                    num(analytic) + ", finite differences give " + num(numeric));
    worst = std::max(worst, err);
  }
  return std::to_string(samples) + " of " + std::to_string(n) + " parameters' gradients agree with finite differences (max error " +
         num(worst) + ")";
}

// Dropout: inference is the identity (the same model without it gives the same loss); training
// applies a mask (the loss differs).
std::string dropout(keras::Backend b, const Model& with) {
  Model without = with;
  without.layers.erase(without.layers.begin() + 1);
  const Batch d = batch_of(with, 8, 5);
  Engine e(b, with, 3), plain(b, without, 3);
  plain.set_params(e.params());
  const double eval_with = e.step(false, d.x, d.y, d.n).loss, eval_without = plain.step(false, d.x, d.y, d.n).loss;
  if (eval_with != eval_without)
    throw Failure("inference with dropout gives loss " + num(eval_with) + ", without " + num(eval_without) +
                  ": dropout must be the identity at inference");
  const double train_with = e.step(true, d.x, d.y, d.n).loss, train_without = plain.step(true, d.x, d.y, d.n).loss;
  if (train_with == train_without) throw Failure("training with rate 0.5 gives the loss of the model without dropout");
  return "the identity at inference, a mask in training";
}

// Rank 0's initial weights reach rank 1 (created with another seed), the replicas stay
// bit-identical, and 2 ranks on halves of a global batch follow 1 rank on all of it. SGD: an
// update linear in the gradient, so float-order differences stay as small as they are (Adam's
// first steps are ~lr * sign(g) and would magnify them on near-zero gradients).
std::string data_parallel(keras::Backend b) {
  const Model m = with_sgd(mlp(), "0.1");
  constexpr int kSteps = 3;
  std::vector<Batch> batches;
  for (int s = 0; s < kSteps; ++s) batches.push_back(batch_of(m, 8, 100 + s));
  Engine one(b, m, 21);
  std::vector<double> one_loss;
  for (const Batch& d : batches) one_loss.push_back(one.step(true, d.x, d.y, d.n).loss);
  const Vec one_params = one.params();

  ThreadGroup group(2);
  std::vector<Vec> initial(2), final(2);
  std::vector<std::vector<double>> losses(2);
  std::vector<std::string> errors(2);
  std::vector<bool> skipped(2, false);
  try {
    // A rank that throws leaves the group (ThreadGroup::run), so the other's collectives fail
    // instead of waiting for it.
    group.run([&](uint32_t r) {
      try {
        Engine e(b, m, r == 0 ? 21 : 99, group.comm(r));
        initial[r] = e.params();
        for (const Batch& d : batches) {
          const Batch mine = slice(d, r * 4, 4);
          losses[r].push_back(e.step(true, mine.x, mine.y, mine.n).loss);
        }
        final[r] = e.params();
      } catch (const std::exception& e) {
        errors[r] = e.what();
        skipped[r] = dynamic_cast<const Skip*>(&e) != nullptr;
        throw;
      }
    });
  } catch (const std::exception&) {
    if (skipped[0] && skipped[1]) throw Skip(errors[0]);  // every rank refused: it does not apply
    std::string why;
    for (uint32_t r = 0; r < 2; ++r)
      if (!errors[r].empty()) why += (why.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + errors[r]);
    throw Failure(why);
  }
  if (initial[0] != initial[1]) throw Failure("rank 1's initial weights are not rank 0's (created with seeds 21 and 99)");
  if (final[0] != final[1] || losses[0] != losses[1]) throw Failure("the two replicas differ after training");
  const double dp = max_abs_diff(final[0], one_params);
  double dl = 0;
  for (int s = 0; s < kSteps; ++s) dl = std::max(dl, std::fabs(losses[0][s] - one_loss[s]) / std::max(1.0, std::fabs(one_loss[s])));
  if (dp > 1e-5 || dl > 1e-5)
    throw Failure("2 ranks drift from 1 rank: max |weight difference| " + num(dp) + ", loss " + num(dl) +
                  " relative (allowed 1e-5)");
  return "replicas bit-identical; 2 ranks follow 1 rank to " + num(dp) + " (weights), " + num(dl) + " (loss) after " +
         std::to_string(kSteps) + " SGD steps";
}

// Runs check(name, model) on the MLP and the convnet; a model the backend refuses with
// SF_ERR_UNSUPPORTED is reported as skipped, and the check is skipped when both are.
std::string on_both_models(const std::function<std::string(const char*, const Model&)>& check) {
  std::string out, skipped;
  for (const auto& [name, m] : {std::pair<const char*, Model>{"mlp", mlp()}, {"convnet", convnet()}}) {
    try {
      out += std::string(out.empty() ? "" : "; ") + name + ": " + check(name, m);
    } catch (const Skip& s) {
      skipped += std::string(skipped.empty() ? "" : "; ") + name + " skipped: " + s.what();
    }
  }
  if (out.empty()) throw Skip(skipped);
  return out + (skipped.empty() ? "" : "; " + skipped);
}

// state_dict -> load_state into an engine made with another seed resumes bit for bit; a damaged
// state and another model's are refused and leave the engine as it was.
std::string state_of(keras::Backend b, const Model& m, const Model& other_model) {
  Engine a(b, m, 31), c(b, m, 77);
  for (int s = 0; s < 2; ++s) {
    const Batch d = batch_of(m, 6, 200 + s);
    a.step(true, d.x, d.y, d.n);
  }
  const std::string saved = a.state();
  std::string why;
  if (c.try_load(saved, &why) != SF_OK) throw Failure("load_state of its own state_dict failed: " + why);
  for (int s = 2; s < 4; ++s) {
    const Batch d = batch_of(m, 6, 200 + s);
    if (a.step(true, d.x, d.y, d.n).loss != c.step(true, d.x, d.y, d.n).loss) throw Failure("a resumed engine's loss differs");
  }
  if (a.params() != c.params()) throw Failure("a resumed engine's weights differ after 2 more steps");

  const Vec before = c.params();
  if (c.try_load(saved.substr(0, saved.size() / 2), &why) == SF_OK) throw Failure("a truncated state was accepted");
  if (why.empty()) throw Failure("a truncated state was refused without a message");
  Engine other(b, other_model, 1);
  std::string why_other;
  if (c.try_load(other.state(), &why_other) == SF_OK) throw Failure("another model's state was accepted");
  if (c.params() != before) throw Failure("a refused load_state changed the engine");
  return "resumes bit for bit; refused a truncated state (\"" + why + "\") and another model's";
}

std::string state(keras::Backend b) {
  Model wider = mlp();
  wider.layers[0].options = {{"units", "12"}, {"activation", "relu"}};
  return on_both_models([&](const char*, const Model& m) { return state_of(b, m, wider); });
}

// Bound data (abi.h, ABI 1.8), where the backend keeps data: steps on a bound set's samples by
// index are the plain steps on the same samples bit for bit, whether their results are returned
// or deferred; take_results sums the deferred ones and then starts from zero; an index past the
// set and a released set are refused with a message.
std::string bound_data_of(keras::Backend b, const Model& m) {
  const Batch all = batch_of(m, 23, 500);
  Engine plain(b, m, 51), bound(b, m, 51);
  if (!bound.bind(all.x, all.y)) throw Skip("this model's set was not bound (SF_ERR_UNSUPPORTED)");
  const std::vector<std::vector<uint64_t>> steps = {{22, 0, 5, 5, 17, 3}, {1, 2, 4, 6, 8, 10}, {21, 20, 19}, {7, 9, 11, 13}};
  double loss_sum = 0;
  uint64_t correct = 0, samples = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    Batch d;
    d.n = static_cast<uint32_t>(steps[s].size());
    for (uint64_t i : steps[s]) {
      const Batch one = slice(all, static_cast<uint32_t>(i), 1);
      d.x.insert(d.x.end(), one.x.begin(), one.x.end());
      d.y.push_back(one.y[0]);
    }
    const sf_step_result rp = plain.step(true, d.x, d.y, d.n);
    if (s == 1) {
      sf_step_result rb;
      bound.indexed(true, steps[s], &rb);
      if (rb.loss != rp.loss || rb.correct != rp.correct || rb.samples != rp.samples)
        throw Failure("train_step_indexed's result differs from train_step's on the same samples");
      continue;
    }
    bound.indexed(true, steps[s], nullptr);
    loss_sum += rp.loss * static_cast<double>(rp.samples);
    correct += rp.correct;
    samples += rp.samples;
  }
  const sf_step_result sums = bound.take();
  const double want = loss_sum / static_cast<double>(samples);
  if (sums.samples != samples || sums.correct != correct || std::fabs(sums.loss - want) > 1e-9 * std::fabs(want))
    throw Failure("take_results gave loss " + num(sums.loss) + ", " + std::to_string(sums.correct) + " correct of " +
                  std::to_string(sums.samples) + "; the deferred steps' results sum to " + num(want) + ", " +
                  std::to_string(correct) + " of " + std::to_string(samples));
  if (bound.take().samples != 0) throw Failure("take_results did not start again from zero");
  if (bound.params() != plain.params()) throw Failure("steps on bound data trained differently from plain steps");
  sf_step_result r;
  std::string why;
  if (bound.try_indexed(false, bound.data(), {0, 23}, &r, &why) == SF_OK) throw Failure("index 23 of 23 samples was accepted");
  if (why.empty()) throw Failure("an index past the set was refused without a message");
  if (bound.release(bound.data()) != SF_OK) throw Failure("release_data failed");
  std::string why_gone;
  if (bound.try_indexed(true, bound.data(), {0}, &r, &why_gone) == SF_OK) throw Failure("a released set was used");
  return "bit for bit the plain steps (" + std::to_string(steps.size()) +
         " steps, deferred and not); refused an index past the set (\"" + why + "\") and a released set";
}

std::string bound_data(keras::Backend b) {
  const Model m = mlp();
  Engine probe(b, m, 1);
  if (!probe.bind(batch_of(m, 2, 1).x, batch_of(m, 2, 1).y))
    throw Skip("the backend keeps no bound data (no bind_data hook, or it answers SF_ERR_UNSUPPORTED): keras copies "
               "each batch to train_step");
  return on_both_models([&](const char*, const Model& each) { return bound_data_of(b, each); });
}

// Bad input is refused with a message and the engine still works afterwards.
std::string bad_input(keras::Backend b) {
  const Model m = mlp();
  Engine e(b, m, 41);
  Batch d = batch_of(m, 4, 9);
  sf_step_result r;
  std::string why;
  if (e.try_step(true, d.x, d.y, 0, r, &why) == SF_OK) throw Failure("train_step accepted an empty batch");
  if (why.empty()) throw Failure("an empty batch was refused without a message");
  d.y[2] = static_cast<int32_t>(m.classes);
  std::string why_label;
  if (e.try_step(true, d.x, d.y, d.n, r, &why_label) == SF_OK)
    throw Failure("train_step accepted label " + std::to_string(m.classes) + " for " + std::to_string(m.classes) + " classes");
  d.y[2] = 0;
  if (e.try_step(true, d.x, d.y, d.n, r, &why) != SF_OK) throw Failure("the engine fails after refusing bad input: " + why);
  Model bad = m;
  bad.layers.push_back(layer("conv2d", {{"filters", "2"}, {"kernel_size", "3"}}));  // rank-1 input
  bool accepted = false;
  try {
    Engine refused(b, bad, 1);
    accepted = true;
  } catch (const std::exception&) {  // refused (SF_ERR_UNSUPPORTED is a refusal too)
  }
  if (accepted) throw Failure("engine_create accepted conv2d on a rank-1 input");
  return "refused an empty batch, a label out of range (\"" + why_label + "\") and conv2d on a rank-1 input";
}

// The same models, seed and batches as the reference backend: losses within 1e-4 relative and
// weights within 1e-4 after 10 steps (float sums in another order; docs/compute-backends.md).
std::string agreement(keras::Backend b, keras::Backend ref, const std::string& ref_name) {
  return "after 10 steps, " + on_both_models([&](const char* name, const Model& given) {
           // The convnet with SGD + momentum: Adam's normalised step magnifies float-order
           // differences on parameters whose gradient is near 0 (batch_normalization, relu).
           Model m = given;
           if (std::string(name) == "convnet") {
             m = with_sgd(given, "0.05");
             m.optimizer_options.back().second = "0.9";
           }
           Engine e(b, m, 51), r(ref, m, 51);
           if (e.param_count() != r.param_count())
             throw Failure(std::string(name) + ": " + std::to_string(e.param_count()) + " parameters, " + ref_name +
                           " has " + std::to_string(r.param_count()));
           if (e.params() != r.params())
             throw Failure(std::string(name) + ": the initial weights differ from " + ref_name +
                           "'s (skyforge/initial_weights.hpp)");
           double dl = 0;
           for (int s = 0; s < 10; ++s) {
             const Batch d = batch_of(m, 16, 300 + s);
             const double le = e.step(true, d.x, d.y, d.n).loss, lr = r.step(true, d.x, d.y, d.n).loss;
             dl = std::max(dl, std::fabs(le - lr) / std::max(1e-6, std::fabs(lr)));
           }
           const double dp = max_abs_diff(e.params(), r.params());
           if (dl > 1e-4 || dp > 1e-4)
             throw Failure(std::string(name) + ": loss " + num(dl) + " relative, weights " + num(dp) + " from " +
                           ref_name + " after 10 steps (allowed 1e-4)");
           return "same initial weights, loss " + num(dl) + ", weights " + num(dp);
         });
}

// A checkpoint moves between this backend and the reference, both ways (skyforge/
// engine_state.hpp, the backend-neutral layout): loaded into an engine made with another seed it
// gives the same weights, and the next step's loss agrees to 1e-4 relative.
std::string checkpoint(keras::Backend b, keras::Backend ref, const std::string& ref_name) {
  return on_both_models([&](const char* name, const Model& m) {
    std::string out;
    for (const auto& [from, to, way] :
         {std::tuple{b, ref, std::string("to ") + ref_name}, std::tuple{ref, b, std::string("from ") + ref_name}}) {
      Engine a(from, m, 61), c(to, m, 62);
      for (int s = 0; s < 2; ++s) {
        const Batch d = batch_of(m, 8, 400 + s);
        a.step(true, d.x, d.y, d.n);
      }
      std::string why;
      if (c.try_load(a.state(), &why) != SF_OK)
        throw Failure(std::string(name) + ": a state " + way + " was refused: " + why +
                      " (write and read skyforge/engine_state.hpp's layout)");
      if (c.params() != a.params()) throw Failure(std::string(name) + ": the weights differ after a load " + way);
      const Batch d = batch_of(m, 8, 402);
      const double la = a.step(true, d.x, d.y, d.n).loss, lc = c.step(true, d.x, d.y, d.n).loss;
      const double dl = std::fabs(la - lc) / std::max(1e-6, std::fabs(la));
      if (dl > 1e-4) throw Failure(std::string(name) + ": resumed " + way + ", the next loss differs by " + num(dl));
      out += (out.empty() ? "" : ", ") + way + " " + num(dl);
    }
    return "resumes " + out;
  });
}

struct Tally {
  int passed = 0, skipped = 0, failed = 0;
};

void run_check(std::ostream& out, Tally& t, const std::string& name, const std::function<std::string()>& fn) {
  try {
    const std::string what = fn();
    out << "PASS  " << name << ": " << what << "\n";
    ++t.passed;
  } catch (const Skip& s) {
    out << "SKIP  " << name << ": " << s.what() << "\n";
    ++t.skipped;
  } catch (const std::exception& e) {
    out << "FAIL  " << name << ": " << e.what() << "\n";
    ++t.failed;
  }
  out.flush();
}

}  // namespace

int run_backend_check(const BackendCheckOptions& o, std::ostream& out, std::ostream& err) {
  Catalog catalog(Catalog::default_search_dirs(o.plugin_path));
  Services services([&](int32_t level, const std::string& m) {
    if (level >= SF_LOG_WARN) err << "skyforge backend-check: " << m << "\n";
  });
  Loader loader(services.table());
  struct Loaded {
    std::unique_ptr<PluginInstance> instance;
    keras::Backend backend;
  };
  auto load = [&](const std::string& name, const Kv& given, const char* role) -> std::optional<Loaded> {
    const PluginInfo* info = catalog.find(name);
    if (!info || info->kind != "compute_backend") {
      err << "skyforge backend-check: no compute backend named '" << name << "' (see `skyforge plugins`)\n";
      return std::nullopt;
    }
    Kv options = given;
    for (const auto& opt : info->options)
      if (opt.default_value && std::none_of(options.begin(), options.end(), [&](auto& kv) { return kv.first == opt.name; }))
        options.emplace_back(opt.name, *opt.default_value);
    try {
      Loaded l;
      l.instance = loader.create(loader.load(info->library, info->name, SF_KIND_COMPUTE_BACKEND,
                                             std::make_pair(info->abi_major, info->abi_minor)),
                                 options);
      l.instance->call_optional(&sf_compute_hooks::probe, "probe");
      l.backend = keras::Backend(l.instance->hooks<sf_compute_hooks>(), l.instance->self());
      out << role << name << " " << info->version << " (" << info->library << ", ABI " << info->abi_major << "."
          << info->abi_minor << ")\n";
      return l;
    } catch (const std::exception& e) {
      err << "skyforge backend-check: compute backend '" << name << "' cannot run here: " << e.what() << "\n";
      return std::nullopt;
    }
  };
  auto subject = load(o.backend, o.options, "skyforge backend-check: ");
  if (!subject) return 2;
  std::optional<Loaded> reference;
  if (!o.against.empty() && o.against != o.backend) {
    reference = load(o.against, {}, "  reference: ");
    if (!reference) return 2;
  }

  Tally t;
  const keras::Backend b = subject->backend;
  for (const schema::LayerDef& def : schema::catalogue()) {
    const std::string type(def.type);
    run_check(out, t, "layer " + type, [&] {
      const std::optional<Model> m = harness(type);
      if (!m) throw Failure("the suite has no model for this layer of the schema (host/src/client/backend_check.cpp)");
      return type == "dropout" ? dropout(b, *m) : gradients(b, *m);
    });
  }
  run_check(out, t, "data parallel", [&] { return data_parallel(b); });
  run_check(out, t, "state", [&] { return state(b); });
  run_check(out, t, "bad input", [&] { return bad_input(b); });
  run_check(out, t, "bound data", [&] { return bound_data(b); });
  if (reference) {
    run_check(out, t, "agrees with " + o.against, [&] { return agreement(b, reference->backend, o.against); });
    run_check(out, t, "checkpoint with " + o.against, [&] { return checkpoint(b, reference->backend, o.against); });
  }
  if (t.passed == 0) {  // a backend that refuses every model has not shown anything
    out << "FAIL  the backend refused every model of the suite: nothing was checked\n";
    ++t.failed;
  }
  out << t.passed << " passed, " << t.skipped << " skipped, " << t.failed << " failed\n";
  return t.failed ? 1 : 0;
}

}  // namespace skyforge
