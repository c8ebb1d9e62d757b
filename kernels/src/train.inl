// launch.hpp's optimizer and batch-normalization calls, written once for both builds
// (common.hpp says how); included after the build's for_n.
#include "common.hpp"

#include <skyforge/kernels/batchnorm.hpp>
#include <skyforge/kernels/optimizer.hpp>

#include <cmath>

namespace skyforge::kernels {

namespace {

// The tensors in groups of kMaxTensorsPerLaunch (empty ones skipped), one launch per group.
template <class Rule>
void multi_tensor(const OptimTensor* tensors, size_t count, const Rule& rule, bool slot0, bool slot1, bool slot2,
                  Stream s, const char* what) {
  impl::require(count == 0 || tensors, what, "tensors is null");
  MultiTensorApply<Rule> f{TensorTable{}, rule};
  size_t total = 0;
  auto flush = [&] {
    if (f.t.count) for_n(s, total, f, what);
    f.t.count = 0;
    total = 0;
  };
  for (size_t i = 0; i < count; ++i) {
    const OptimTensor& t = tensors[i];
    if (t.size == 0) continue;
    impl::require(t.param && t.grad, what, "a tensor's param or grad is null");
    impl::require(!slot0 || t.slot0, what, "a tensor's slot0 is null");
    impl::require(!slot1 || t.slot1, what, "a tensor's slot1 is null");
    impl::require(!slot2 || t.slot2, what, "a tensor's slot2 is null");
    const uint32_t k = f.t.count++;
    total += t.size;
    f.t.end[k] = total;
    f.t.param[k] = t.param;
    f.t.grad[k] = t.grad;
    f.t.slot0[k] = slot0 ? t.slot0 : nullptr;
    f.t.slot1[k] = slot1 ? t.slot1 : nullptr;
    f.t.slot2[k] = slot2 ? t.slot2 : nullptr;
    if (f.t.count == kMaxTensorsPerLaunch) flush();
  }
  flush();
}

}  // namespace

float adam_alpha(const AdamConfig& c, uint64_t iteration) {
  const double t = static_cast<double>(iteration + 1);
  return static_cast<float>(c.learning_rate * std::sqrt(1.0 - std::pow(c.beta_2, t)) / (1.0 - std::pow(c.beta_1, t)));
}

namespace {

void adam(const OptimTensor* tensors, size_t count, const AdamConfig& c, float alpha, float grad_scale,
          const double* samples, const StepState* state, Stream s) {
  const AdamRule rule{static_cast<float>(1.0 - c.beta_1), static_cast<float>(1.0 - c.beta_2), alpha,
                      static_cast<float>(c.epsilon), grad_scale, samples, state,
                      static_cast<float>(c.weight_decay), static_cast<float>(c.learning_rate)};
  multi_tensor(tensors, count, rule, true, true, false, s, "adam_update");
}

void sgd(const OptimTensor* tensors, size_t count, const SgdConfig& c, float grad_scale, const double* samples,
         const StepState* state, Stream s) {
  const SgdRule rule{static_cast<float>(c.learning_rate), static_cast<float>(c.momentum), grad_scale, c.nesterov,
                     samples, state};
  multi_tensor(tensors, count, rule, c.momentum != 0.0, false, false, s, "sgd_update");
}

void rmsprop(const OptimTensor* tensors, size_t count, const RmspropConfig& c, float grad_scale,
             const double* samples, const StepState* state, Stream s) {
  const RmspropRule rule{static_cast<float>(c.learning_rate), static_cast<float>(c.rho),
                         static_cast<float>(1.0 - c.rho), static_cast<float>(c.momentum),
                         static_cast<float>(c.epsilon), grad_scale, c.centered, samples, state};
  multi_tensor(tensors, count, rule, true, c.momentum > 0.0, c.centered, s, "rmsprop_update");
}

}  // namespace

void adam_update(const OptimTensor* tensors, size_t count, const AdamConfig& c, uint64_t iteration, float grad_scale,
                 Stream s) {
  adam(tensors, count, c, adam_alpha(c, iteration), grad_scale, nullptr, nullptr, s);
}

void adam_update(const OptimTensor* tensors, size_t count, const AdamConfig& c, StepState* state,
                 const double* samples, Stream s) {
  impl::require(state != nullptr, "adam_update", "state is null");
  for_n(s, 1, AdamAlpha{state, c.beta_1, c.beta_2}, "adam_update");
  adam(tensors, count, c, 0.f, 1.f, samples, state, s);
}

void advance_step(StepState* state, Stream s) {
  impl::require(state != nullptr, "advance_step", "state is null");
  for_n(s, 1, AdvanceStep{state}, "advance_step");
}

void refuse_invalid(StepState* state, const double* count, Stream s) {
  impl::require(state && count, "refuse_invalid", "state and count are required");
  for_n(s, 1, RefuseInvalid{state, count}, "refuse_invalid");
}

void sgd_update(const OptimTensor* tensors, size_t count, const SgdConfig& c, float grad_scale, Stream s) {
  sgd(tensors, count, c, grad_scale, nullptr, nullptr, s);
}

void sgd_update(const OptimTensor* tensors, size_t count, const SgdConfig& c, const StepState* state,
                const double* samples, Stream s) {
  impl::require(state != nullptr, "sgd_update", "state is null");
  sgd(tensors, count, c, 1.f, samples, state, s);
}

void rmsprop_update(const OptimTensor* tensors, size_t count, const RmspropConfig& c, float grad_scale, Stream s) {
  rmsprop(tensors, count, c, grad_scale, nullptr, nullptr, s);
}

void rmsprop_update(const OptimTensor* tensors, size_t count, const RmspropConfig& c, const StepState* state,
                    const double* samples, Stream s) {
  impl::require(state != nullptr, "rmsprop_update", "state is null");
  rmsprop(tensors, count, c, 1.f, samples, state, s);
}

void batchnorm_forward_training(const float* x, float* y, size_t rows, size_t C, const float* gamma, const float* beta,
                                float epsilon, bool relu, float* mean, float* var, float* invstd, double* ws,
                                Stream s) {
  constexpr const char* what = "batchnorm_forward_training";
  if (C == 0) return;
  impl::require(rows > 0, what, "needs at least one row");
  impl::require(mean && var && invstd, what, "mean, var and invstd are required");
  impl::column_reduce<2>(s, rows, C, BnStatsTerm{x, C}, BnStatsFinish{rows, epsilon, mean, var, invstd}, ws, what);
  for_n(s, rows * C, BnApply{x, y, C, gamma, beta, mean, invstd, nullptr, epsilon, relu}, what);
}

void batchnorm_forward_inference(const float* x, float* y, size_t rows, size_t C, const float* gamma,
                                 const float* beta, float epsilon, bool relu, const float* moving_mean,
                                 const float* moving_var, Stream s) {
  for_n(s, rows * C, BnApply{x, y, C, gamma, beta, moving_mean, nullptr, moving_var, epsilon, relu},
        "batchnorm_forward_inference");
}

void batchnorm_update_moving(float* moving_mean, float* moving_var, const float* mean, const float* var, size_t C,
                             float momentum, const StepState* state, Stream s) {
  for_n(s, C, BnMovingUpdate{moving_mean, moving_var, mean, var, momentum, state}, "batchnorm_update_moving");
}

void batchnorm_backward(const float* x, const float* relu_y, const float* dy, float* dx, size_t rows, size_t C,
                        const float* gamma, const float* mean, const float* invstd, float* dgamma, float* dbeta,
                        double* ws, Stream s) {
  constexpr const char* what = "batchnorm_backward";
  if (C == 0) return;
  impl::require(rows > 0, what, "needs at least one row");
  impl::require(ws != nullptr, what, "needs a workspace of reduce_workspace(rows, C) doubles");
  double* k = impl::workspace_tail(ws, rows, C);
  impl::column_reduce<2>(s, rows, C, BnBackTerm{x, relu_y, dy, mean, invstd, C}, BnBackFinish{rows, C, dgamma, dbeta, k},
                         ws, what);
  if (dx) for_n(s, rows * C, BnDx{x, relu_y, dy, dx, C, gamma, mean, invstd, k}, what);
}

void batchnorm_forward_sums(const float* x, size_t rows, size_t C, double* sums, double* ws, Stream s) {
  constexpr const char* what = "batchnorm_forward_sums";
  if (C == 0) return;
  impl::require(rows > 0, what, "needs at least one row");
  impl::require(sums != nullptr, what, "sums is null");
  impl::column_reduce<2>(s, rows, C, BnStatsTerm{x, C}, BnSums{rows, C, sums, nullptr, nullptr}, ws, what);
}

void batchnorm_forward_normalize(const float* x, float* y, size_t rows, size_t C, const float* gamma,
                                 const float* beta, float epsilon, bool relu, const double* sums, float* mean,
                                 float* var, float* invstd, Stream s) {
  constexpr const char* what = "batchnorm_forward_normalize";
  if (C == 0) return;
  impl::require(sums && mean && var && invstd, what, "sums, mean, var and invstd are required");
  for_n(s, C, BnStatsFromSums{C, sums, epsilon, mean, var, invstd}, what);
  for_n(s, rows * C, BnApply{x, y, C, gamma, beta, mean, invstd, nullptr, epsilon, relu}, what);
}

void batchnorm_backward_sums(const float* x, const float* relu_y, const float* dy, size_t rows, size_t C,
                             const float* mean, const float* invstd, float* dgamma, float* dbeta, double* sums,
                             double* ws, Stream s) {
  constexpr const char* what = "batchnorm_backward_sums";
  if (C == 0) return;
  impl::require(rows > 0, what, "needs at least one row");
  impl::require(sums != nullptr, what, "sums is null");
  impl::column_reduce<2>(s, rows, C, BnBackTerm{x, relu_y, dy, mean, invstd, C}, BnSums{rows, C, sums, dgamma, dbeta},
                         ws, what);
}

void batchnorm_backward_dx(const float* x, const float* relu_y, const float* dy, float* dx, size_t rows, size_t C,
                           const float* gamma, const float* mean, const float* invstd, double* sums, Stream s) {
  constexpr const char* what = "batchnorm_backward_dx";
  if (C == 0) return;
  impl::require(sums && dx, what, "sums and dx are required");
  for_n(s, C, BnBackKFromSums{C, sums}, what);
  for_n(s, rows * C, BnDx{x, relu_y, dy, dx, C, gamma, mean, invstd, sums}, what);
}

}  // namespace skyforge::kernels
