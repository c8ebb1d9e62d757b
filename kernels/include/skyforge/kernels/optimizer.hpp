// Multi-tensor optimizer updates (docs/kernels.md; the Keras rules of docs/compute-backends.md):
// one launch walks every element of up to kMaxTensorsPerLaunch parameter tensors, each call
// finding its tensor in a table passed by value (so a captured CUDA graph holds it).
#pragma once

#include "hd.hpp"
#include "step.hpp"

#include <cmath>

namespace skyforge::kernels {

// Tensors per launch: the table stays under the 4 KiB of kernel parameters every CUDA GPU takes
// (static_assert below).
inline constexpr int kMaxTensorsPerLaunch = 64;

struct TensorTable {
  uint32_t count = 0;
  size_t end[kMaxTensorsPerLaunch];  // prefix sums of the sizes: tensor t holds [end[t-1], end[t])
  float* param[kMaxTensorsPerLaunch];
  const float* grad[kMaxTensorsPerLaunch];
  float* slot0[kMaxTensorsPerLaunch];
  float* slot1[kMaxTensorsPerLaunch];
  float* slot2[kMaxTensorsPerLaunch];

  // The tensor holding flat element i (i < end[count - 1]): the first t with end[t] > i.
  SF_HD uint32_t find(size_t i) const {
    uint32_t lo = 0, hi = count - 1;
    while (lo < hi) {
      const uint32_t mid = (lo + hi) / 2;
      if (end[mid] > i) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  }
};

// Keras Adam on one element, with g = grad * scale (scale turns a gradient sum into a mean):
//   m += (g - m)(1 - beta_1); v += (g^2 - v)(1 - beta_2); p -= alpha * m / (sqrt(v) + epsilon)
// where alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t), t = iteration + 1 (adam_alpha).
// AdamW (weight_decay > 0) first decays the parameter as Keras does: p -= p * weight_decay * lr.
// Slots: m in slot0, v in slot1.
// With `samples` (device memory) the scale is float(1 / *samples), read when the update runs.
SF_HD inline float grad_scale_of(float scale, const double* samples) {
  return samples ? static_cast<float>(1.0 / *samples) : scale;
}

// Keras' decoupled weight decay (AdamW), before the optimizer's step: p -= p * weight_decay * lr.
SF_HD inline void decoupled_decay(float& p, float weight_decay, float lr) { p -= p * weight_decay * lr; }

// With `state` (device memory) the rules' lr is float(state->lr) (step.hpp), read when the
// update runs.
SF_HD inline float rate_of(float lr, const StepState* state) { return state ? static_cast<float>(state->lr) : lr; }

// With `state` alpha is state->alpha and lr state->lr, read when the update runs.
struct AdamRule {
  float b1c, b2c, alpha, eps, scale;  // b1c = 1 - beta_1, b2c = 1 - beta_2
  const double* samples = nullptr;
  const StepState* state = nullptr;
  float weight_decay = 0.f, lr = 0.f;
  SF_HD void operator()(float& p, float g, float* s0, float* s1, float*) const {
    const float gi = g * grad_scale_of(scale, samples);
    const float a = state ? state->alpha : alpha;
    if (weight_decay != 0.f) decoupled_decay(p, weight_decay, rate_of(lr, state));
    float m = *s0, v = *s1;
    m += (gi - m) * b1c;
    v += (gi * gi - v) * b2c;
    p -= a * m / (::sqrtf(v) + eps);
    *s0 = m;
    *s1 = v;
  }
};

// Keras SGD on one element, g = grad * scale: momentum 0: p -= lr * g; else (velocity in slot0)
//   v = momentum * v - lr * g; p += nesterov ? momentum * v - lr * g : v.
struct SgdRule {
  float lr, momentum, scale;
  bool nesterov;
  const double* samples = nullptr;
  const StepState* state = nullptr;
  SF_HD void operator()(float& p, float g, float* s0, float*, float*) const {
    const float gi = g * grad_scale_of(scale, samples);
    const float r = rate_of(lr, state);
    if (momentum == 0.f) {
      p -= r * gi;
      return;
    }
    const float v = *s0 * momentum - r * gi;
    *s0 = v;
    p += nesterov ? v * momentum - r * gi : v;
  }
};

// Keras RMSprop on one element, g = grad * scale: v = rho * v + (1 - rho) g^2 (slot0); centered:
//   a = rho * a + (1 - rho) g (slot2), d = v - a^2 + epsilon, else d = v + epsilon;
//   step = lr * g / sqrt(d); momentum > 0: m = momentum * m + step (slot1), p -= m; else p -= step.
struct RmspropRule {
  float lr, rho, rho_c, momentum, eps, scale;  // rho_c = 1 - rho
  bool centered;
  const double* samples = nullptr;
  const StepState* state = nullptr;
  SF_HD void operator()(float& p, float g, float* s0, float* s1, float* s2) const {
    const float gi = g * grad_scale_of(scale, samples);
    const float v = rho * *s0 + rho_c * (gi * gi);
    *s0 = v;
    float d = v + eps;
    if (centered) {
      const float a = rho * *s2 + rho_c * gi;
      *s2 = a;
      d = v - a * a + eps;
    }
    const float step = rate_of(lr, state) * gi / ::sqrtf(d);
    if (momentum > 0.f) {
      const float m = momentum * *s1 + step;
      *s1 = m;
      p -= m;
    } else {
      p -= step;
    }
  }
};

// A refused step (step.hpp) changes no parameter and no slot.
template <class Rule>
struct MultiTensorApply {
  TensorTable t;
  Rule rule;
  SF_HD void operator()(size_t i) const {
    if (refused(rule.state)) return;
    const uint32_t k = t.find(i);
    const size_t j = i - (k ? t.end[k - 1] : 0);
    rule(t.param[k][j], t.grad[k][j], t.slot0[k] ? t.slot0[k] + j : nullptr, t.slot1[k] ? t.slot1[k] + j : nullptr,
         t.slot2[k] ? t.slot2[k] + j : nullptr);
  }
};

static_assert(sizeof(MultiTensorApply<RmspropRule>) + 64 <= 4096, "a launch's table must fit kernel parameters");

}  // namespace skyforge::kernels
