// A training step's counter in device memory (docs/kernels.md, "Graphs"): the kernels that
// depend on the step (the scheduled learning rate, Adam's bias correction, dropout's Philox key)
// read it there when they run, so a step captured once as a CUDA graph and replayed runs as the
// step it is, not as the step it was captured at. The engine advances it after each update. It
// also holds the invalid inputs of steps whose error the host has not reported yet: while there
// are any, every update and advance_step leave the parameters, slots and counter as they were.
#pragma once

#include "hd.hpp"

#include <skyforge/lr_schedule.hpp>

#include <cmath>

namespace skyforge::kernels {

struct StepState {
  uint64_t iteration = 0;  // updates applied so far (Keras' optimizer.iterations)
  float alpha = 0.f;       // Adam's step size for the update in progress (adam_update writes it)
  // The learning rate of the update in progress, learning_rate_wide(schedule, iteration)
  // (skyforge/lr_schedule.hpp; learning_rate_step writes it): float(lr) is every rule's rate.
  double lr = 0.0;
  // Inputs no layer could use (embedding indices) met by steps since the host last reported
  // them (RefuseInvalid adds each step's global count before its update): while > 0 the steps
  // are refused. Sticky, so a deferred step refuses every later one until the host clears it.
  double invalid = 0.0;
};

// Whether the update in progress is refused (state may be null: an update by value, never refused).
SF_HD inline bool refused(const StepState* state) { return state && state->invalid > 0; }

// state->invalid += *count: the step's global count of invalid inputs, before its update.
struct RefuseInvalid {
  StepState* state;
  const double* count;
  SF_HD void operator()(size_t) const { state->invalid += *count; }
};

// state->lr = the schedule's rate at state->iteration.
struct ScheduledRate {
  StepState* state;
  LrSchedule schedule;
  SF_HD void operator()(size_t) const { state->lr = learning_rate_wide(schedule, state->iteration); }
};

// alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t), t = iteration + 1, lr = state->lr, in
// double: the host's adam_alpha, computed where the update runs.
struct AdamAlpha {
  StepState* state;
  double beta_1, beta_2;
  SF_HD void operator()(size_t) const {
    const double t = static_cast<double>(state->iteration + 1);
    state->alpha = static_cast<float>(state->lr * ::sqrt(1.0 - ::pow(beta_2, t)) / (1.0 - ::pow(beta_1, t)));
  }
};

struct AdvanceStep {
  StepState* state;
  SF_HD void operator()(size_t) const {
    if (!refused(state)) ++state->iteration;
  }
};

}  // namespace skyforge::kernels
