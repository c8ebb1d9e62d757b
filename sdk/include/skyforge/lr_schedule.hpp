// Learning-rate schedules (docs/compute-backends.md, "Learning-rate schedules"): Keras 3's
// CosineDecay (with its linear warmup), ExponentialDecay and PiecewiseConstantDecay as one plain
// struct and one formula, used everywhere a rate is computed: the cpu engine per update on the
// host, the cuda engine's kernels on the device from the step counter (kernels/step.hpp), so a
// captured graph replays the rate of the step it runs as, and keras.hpp's TensorBoard
// (epoch_learning_rate). Plain C++17 that nvcc compiles for the device too (SKYFORGE_HD).
// lr_schedule_of.hpp fills the struct from the optimizer schema.
//
// The rate of update t is schedule(optimizer.iterations before it), computed as Keras computes
// it: in float32, the step converted to float first.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SKYFORGE_HD __host__ __device__
#else
#define SKYFORGE_HD
#endif

namespace skyforge {

// piecewise_constant_decay's boundaries, at most (the struct travels by value into a kernel).
inline constexpr uint32_t kMaxScheduleBoundaries = 32;

enum class ScheduleKind : uint32_t { constant = 0, cosine_decay = 1, exponential_decay = 2, piecewise_constant_decay = 3 };

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::constant;
  double rate = 0.0;  // constant: the learning rate as given (Adam's alpha takes it in double)
  // cosine_decay, exponential_decay: Keras' arguments, each rounded to float as Keras does.
  float initial_learning_rate = 0.f, decay_steps = 1.f;
  float alpha = 0.f, one_minus_alpha = 1.f;  // cosine_decay: alpha and float(1 - alpha), 1 - alpha in double
  float warmup_target = 0.f, warmup_steps = 0.f;  // cosine_decay: linear from initial_learning_rate to warmup_target
  float decay_rate = 1.f;                         // exponential_decay
  bool staircase = false;                         // exponential_decay
  // piecewise_constant_decay: values[0] while step <= boundaries[0], values[i] while
  // boundaries[i-1] < step <= boundaries[i], values[boundary_count] after the last.
  uint32_t boundary_count = 0;
  int64_t boundaries[kMaxScheduleBoundaries] = {};
  float values[kMaxScheduleBoundaries + 1] = {};
};

namespace detail {
// Keras' CosineDecay._decay_function: from * ((1 - alpha) * 0.5 * (1 + cos(pi * step / decay_steps)) + alpha).
SKYFORGE_HD inline float cosine_decayed(const LrSchedule& s, float step, float from) {
  const float pi = 3.14159265358979323846f;
  const float cosine = 0.5f * (1.0f + ::cosf(pi * (step / s.decay_steps)));
  return from * (s.one_minus_alpha * cosine + s.alpha);
}
}  // namespace detail

// The learning rate of the update that follows `iteration` updates (Keras' optimizer.iterations).
SKYFORGE_HD inline float learning_rate(const LrSchedule& s, uint64_t iteration) {
  switch (s.kind) {
    case ScheduleKind::constant:
      return static_cast<float>(s.rate);
    case ScheduleKind::piecewise_constant_decay: {
      const int64_t step = static_cast<int64_t>(iteration);
      uint32_t i = 0;
      while (i < s.boundary_count && step > s.boundaries[i]) ++i;
      return s.values[i];
    }
    case ScheduleKind::exponential_decay: {
      float p = static_cast<float>(iteration) / s.decay_steps;
      if (s.staircase) p = ::floorf(p);
      return s.initial_learning_rate * ::powf(s.decay_rate, p);
    }
    case ScheduleKind::cosine_decay: {
      // Keras' warmup_target=None is warmup_target = initial_learning_rate with no warmup steps:
      // the same floats through the same operations.
      const float at = ::fminf(static_cast<float>(iteration), s.decay_steps + s.warmup_steps);
      if (at < s.warmup_steps)
        return (s.warmup_target - s.initial_learning_rate) * (at / s.warmup_steps) + s.initial_learning_rate;
      return detail::cosine_decayed(s, at - s.warmup_steps, s.warmup_target);
    }
  }
  return 0.f;
}

// The same where Adam's alpha is computed in double: a constant rate as given, unrounded.
SKYFORGE_HD inline double learning_rate_wide(const LrSchedule& s, uint64_t iteration) {
  return s.kind == ScheduleKind::constant ? s.rate : static_cast<double>(learning_rate(s, iteration));
}

}  // namespace skyforge
