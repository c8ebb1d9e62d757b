// The optimizer schema's learning rate (skyforge/optimizer_schema.hpp: learning_rate, or a
// learning_rate_schedule) as an LrSchedule (lr_schedule.hpp), each argument rounded to float
// where Keras rounds it. Host code only (C++20, the SDK's schema): both engines and keras.hpp
// call it.
#pragma once

#include <skyforge/lr_schedule.hpp>

#include <skyforge/optimizer_schema.hpp>

#include <algorithm>

namespace skyforge {

inline LrSchedule schedule_of(const schema::OptimizerConfig& c) {
  static_assert(schema::kMaxBoundaries == kMaxScheduleBoundaries);
  LrSchedule s;
  if (!c.schedule()) {
    s.rate = c.real("learning_rate");
    return s;
  }
  const schema::ScheduleConfig& k = *c.schedule();
  auto f = [](double x) { return static_cast<float>(x); };
  if (k.name() == "piecewise_constant_decay") {
    s.kind = ScheduleKind::piecewise_constant_decay;
    s.boundary_count = static_cast<uint32_t>(k.boundaries().size());
    std::copy(k.boundaries().begin(), k.boundaries().end(), s.boundaries);
    std::transform(k.values().begin(), k.values().end(), s.values, f);
    return s;
  }
  s.initial_learning_rate = f(k.real("initial_learning_rate"));
  s.decay_steps = f(k.real("decay_steps"));
  if (k.name() == "exponential_decay") {
    s.kind = ScheduleKind::exponential_decay;
    s.decay_rate = f(k.real("decay_rate"));
    s.staircase = k.flag("staircase");
  } else {
    s.kind = ScheduleKind::cosine_decay;
    s.alpha = f(k.real("alpha"));
    s.one_minus_alpha = f(1.0 - k.real("alpha"));
    s.warmup_target = f(k.real("warmup_target"));
    s.warmup_steps = f(k.real("warmup_steps"));
  }
  return s;
}

}  // namespace skyforge
