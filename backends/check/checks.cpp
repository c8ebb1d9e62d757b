// The conformance checks (checks.hpp); above each, what it measures and within what tolerance.
#include "checks.hpp"

#include <skyforge/thread_group.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine.hpp"
#include "models.hpp"

namespace skyforge::backend_check {
namespace {

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2g", v);
  return b;
}

double max_abs_diff(const Vec& a, const Vec& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
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
  return "resumes bit for bit, refused a truncated state (\"" + why + "\") and another model's";
}

// Bound data (abi.h, ABI 1.8), where the backend keeps data: steps on a bound set's samples by
// index are the plain steps on the same samples bit for bit, whether their results are returned
// or deferred, and whether step_batches (ABI 1.9, where the table has it) named their batch first;
// take_results sums the deferred ones and then starts from zero; an index past the set and a
// released set are refused with a message.
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
    if (s % 2) bound.step_batches(d.n);
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

// Dropout: inference is the identity (the same model with dropout off gives the same loss);
// training applies a mask (the loss differs).
std::string dropout(keras::Backend b, const Model& with, const Model& without) {
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

// `m` trained on `batches` by 1 rank (seed 21) and by 2 (seeds 21 and seed1) over
// skyforge::ThreadGroup, rank 0 on the first `split` samples of each batch and rank 1 on the
// rest; then each evaluates (inference: batch_normalization's moving statistics) its share of
// `held_out`.
struct OneAndTwo {
  Vec one_params;
  std::vector<double> one_loss;
  double one_eval = 0;
  std::vector<Vec> initial{2}, final{2};
  std::vector<std::vector<double>> losses{2};
  std::vector<std::string> states{2};
  std::vector<double> eval = std::vector<double>(2);
};
OneAndTwo one_and_two(keras::Backend b, const Model& m, const std::vector<Batch>& batches, const Batch& held_out,
                      uint32_t split, uint64_t seed1) {
  OneAndTwo out;
  Engine one(b, m, 21);
  for (const Batch& d : batches) out.one_loss.push_back(one.step(true, d.x, d.y, d.n).loss);
  out.one_params = one.params();
  out.one_eval = one.step(false, held_out.x, held_out.y, held_out.n).loss;

  ThreadGroup group(2);
  std::vector<std::string> errors(2);
  std::vector<bool> skipped(2, false);
  auto share = [&](const Batch& d, uint32_t r) { return r == 0 ? slice(d, 0, split) : slice(d, split, d.n - split); };
  try {
    // A rank that throws leaves the group (ThreadGroup::run), so the other's collectives fail
    // instead of waiting for it.
    group.run([&](uint32_t r) {
      try {
        Engine e(b, m, r == 0 ? 21 : seed1, group.comm(r));
        out.initial[r] = e.params();
        for (const Batch& d : batches) {
          const Batch mine = share(d, r);
          out.losses[r].push_back(e.step(true, mine.x, mine.y, mine.n).loss);
        }
        out.final[r] = e.params();
        out.states[r] = e.state();
        const Batch mine = share(held_out, r);
        out.eval[r] = e.step(false, mine.x, mine.y, mine.n).loss;
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
  return out;
}

// The replicas bit-identical (weights, losses) and following 1 rank to 1e-5 (weights; training
// and held-out losses relative): "2 ranks follow 1 rank to ..." or Failure.
std::string two_follow_one(const OneAndTwo& r) {
  if (r.final[0] != r.final[1] || r.losses[0] != r.losses[1]) throw Failure("the two replicas differ after training");
  auto relative = [](double a, double want) { return std::fabs(a - want) / std::max(1.0, std::fabs(want)); };
  const double dp = max_abs_diff(r.final[0], r.one_params), de = relative(r.eval[0], r.one_eval);
  double dl = 0;
  for (size_t s = 0; s < r.one_loss.size(); ++s) dl = std::max(dl, relative(r.losses[0][s], r.one_loss[s]));
  if (dp > 1e-5 || dl > 1e-5 || de > 1e-5)
    throw Failure("2 ranks drift from 1 rank: max |weight difference| " + num(dp) + ", loss " + num(dl) +
                  ", held-out loss " + num(de) + " relative (allowed 1e-5)");
  return "2 ranks follow 1 rank to " + num(dp) + " (weights), " + num(dl) + " (loss), " + num(de) +
         " (held-out loss) after " + std::to_string(r.one_loss.size()) + " SGD steps";
}

// Rank 0's initial weights reach rank 1 (created with another seed), the replicas stay
// bit-identical, and 2 ranks on halves of a global batch follow 1 rank on all of it. SGD: an
// update linear in the gradient, so float-order differences stay as small as they are (Adam's
// first steps are ~lr * sign(g) and would magnify them on near-zero gradients).
std::string ranks(keras::Backend b, const Model& given) {
  const Model m = with_sgd(given, "0.1");
  std::vector<Batch> batches;
  for (int s = 0; s < 3; ++s) batches.push_back(batch_of(m, 8, 100 + s));
  const OneAndTwo r = one_and_two(b, m, batches, batch_of(m, 8, 110), 4, 99);
  if (r.initial[0] != r.initial[1]) throw Failure("rank 1's initial weights are not rank 0's (created with seeds 21 and 99)");
  return "replicas bit-identical, " + two_follow_one(r);
}

}  // namespace

std::string data_parallel(keras::Backend b) { return ranks(b, mlp()); }

// batch_normalization with synchronized = true: 2 ranks on unequal shares (5 and 3) of each
// global batch of 8 normalise with the global batch's statistics, so they hold bit-identical
// states (moving statistics included) and follow 1 rank on all of it as in `data parallel` —
// the held-out loss too, which inference takes from the moving statistics.
std::string synchronized_batchnorm(keras::Backend b) {
  const Model m = with_sgd(synchronized_batchnorm_model(), "0.1");
  std::vector<Batch> batches;
  for (int s = 0; s < 3; ++s) batches.push_back(batch_of(m, 8, 120 + s));
  const OneAndTwo r = one_and_two(b, m, batches, batch_of(m, 8, 130), 5, 21);
  if (r.states[0] != r.states[1])
    throw Failure("the replicas' states differ: their moving statistics are not the global batch's");
  return "states bit-identical across the replicas; " + two_follow_one(r);
}

std::string state(keras::Backend b) {
  Model wider = mlp();
  wider.layers[0].options = {{"units", "12"}, {"activation", "relu"}};
  return on_both_models([&](const char*, const Model& m) { return state_of(b, m, wider); });
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

// The same model, seed and batches as the reference backend: losses within 1e-4 relative and
// weights within 1e-4 after 10 steps (float sums in another order; docs/compute-backends.md).
std::string agrees_on(keras::Backend b, keras::Backend ref, const std::string& ref_name, const std::string& name,
                      const Model& m) {
  Engine e(b, m, 51), r(ref, m, 51);
  if (e.param_count() != r.param_count())
    throw Failure(name + ": " + std::to_string(e.param_count()) + " parameters, " + ref_name + " has " +
                  std::to_string(r.param_count()));
  if (e.params() != r.params())
    throw Failure(name + ": the initial weights differ from " + ref_name + "'s (skyforge/initial_weights.hpp)");
  double dl = 0;
  for (int s = 0; s < 10; ++s) {
    const Batch d = batch_of(m, 16, 300 + s);
    const double le = e.step(true, d.x, d.y, d.n).loss, lr = r.step(true, d.x, d.y, d.n).loss;
    dl = std::max(dl, std::fabs(le - lr) / std::max(1e-6, std::fabs(lr)));
  }
  const double dp = max_abs_diff(e.params(), r.params());
  if (dl > 1e-4 || dp > 1e-4)
    throw Failure(name + ": loss " + num(dl) + " relative, weights " + num(dp) + " from " + ref_name +
                  " after 10 steps (allowed 1e-4)");
  return "same initial weights, loss " + num(dl) + ", weights " + num(dp);
}

// A checkpoint of `m` moves between this backend and the reference, both ways (skyforge/
// engine_state.hpp, the backend-neutral layout): loaded into an engine made with another seed it
// gives the same weights, and the next step's loss agrees to 1e-4 relative.
std::string checkpoint_on(keras::Backend b, keras::Backend ref, const std::string& ref_name, const std::string& name,
                          const Model& m) {
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
      throw Failure(name + ": a state " + way + " was refused: " + why +
                    " (write and read skyforge/engine_state.hpp's layout)");
    if (c.params() != a.params()) throw Failure(name + ": the weights differ after a load " + way);
    const Batch d = batch_of(m, 8, 402);
    const double la = a.step(true, d.x, d.y, d.n).loss, lc = c.step(true, d.x, d.y, d.n).loss;
    const double dl = std::fabs(la - lc) / std::max(1e-6, std::fabs(la));
    if (dl > 1e-4) throw Failure(name + ": resumed " + way + ", the next loss differs by " + num(dl));
    out += (out.empty() ? "" : ", ") + way + " " + num(dl);
  }
  return "resumes " + out;
}

std::string agreement(keras::Backend b, keras::Backend ref, const std::string& ref_name) {
  return "after 10 steps, " + on_both_models([&](const char* name, const Model& given) {
           // The convnet with SGD + momentum: Adam's normalised step magnifies float-order
           // differences on parameters whose gradient is near 0 (batch_normalization, relu).
           Model m = given;
           if (std::string(name) == "convnet") {
             m = with_sgd(given, "0.05");
             m.optimizer_options.back().second = "0.9";
           }
           return agrees_on(b, ref, ref_name, name, m);
         });
}

std::string checkpoint(keras::Backend b, keras::Backend ref, const std::string& ref_name) {
  return on_both_models([&](const char* name, const Model& m) { return checkpoint_on(b, ref, ref_name, name, m); });
}

// One optimizer of the schema on the MLP, with options that use every slot it has
// (optimizer_model()): its state resumes bit for bit, and with a reference backend it agrees
// with the reference's and its checkpoints move both ways. Refused as unsupported: skipped.
std::string optimizer(keras::Backend b, const std::string& name, const keras::Backend* ref, const std::string& ref_name) {
  const Model m = optimizer_model(name);
  std::string out = state_of(b, m, convnet());
  if (ref) {
    out += "; " + agrees_on(b, *ref, ref_name, name, m);
    out += "; " + checkpoint_on(b, *ref, ref_name, name, m);
  }
  return out;
}

namespace {

// "name: " and fn()'s result; its Failure's message prefixed likewise (which part failed).
std::string part(const std::string& name, const std::function<std::string()>& fn) {
  try {
    return name + ": " + fn();
  } catch (const Failure& f) {
    throw Failure(name + ": " + f.what());
  }
}

}  // namespace

// A backend that refuses the harness's model gets Skip (from the gradients, the first part); a
// part that every rank refuses (one GPU), or the reference does, is said skipped in the line.
// A failure names its part, but the gradients' (which name the parameter).
std::string harness(keras::Backend b, const Harness& h, const keras::Backend* ref, const std::string& ref_name) {
  std::string out = gradients(b, h.model);
  if (h.dropout_on) out += "; " + part("dropout", [&] { return dropout(b, *h.dropout_on, h.model); });
  if (h.ranks_follow) try {
      out += "; " + part("1 rank vs 2", [&] { return ranks(b, h.model); });
    } catch (const Skip& s) {
      out += std::string("; 1 rank vs 2 skipped: ") + s.what();
    }
  out += "; " + part("state", [&] { return state_of(b, h.dropout_on.value_or(h.model), mlp()); });
  if (ref) try {
      out += "; " + part("with " + ref_name, [&] {
        const std::string agreed = agrees_on(b, *ref, ref_name, "10 steps", with_sgd(h.model, "0.1"));
        return agreed + ", checkpoint " + checkpoint_on(b, *ref, ref_name, "checkpoint", h.model);
      });
    } catch (const Skip& s) {
      out += "; not compared with " + ref_name + ", which refuses the model: " + s.what();
    }
  return out;
}

}  // namespace skyforge::backend_check
