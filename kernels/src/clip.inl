// launch.hpp's gradient clipping and learning-rate calls (clip.hpp, skyforge/lr_schedule.hpp), written once
// for both builds (common.hpp says how); included after the build's for_n.
#include "common.hpp"

#include <skyforge/kernels/clip.hpp>

namespace skyforge::kernels {

size_t clip_workspace(const ClipLayout& l) { return l.blocks + l.count + 1; }

void clip_gradients(float* grad, const ClipLayout& l, const ClipConfig& c, const double* samples, double* ws,
                    Stream s) {
  constexpr const char* what = "clip_gradients";
  impl::require(c.clipnorm > 0 || c.global_clipnorm > 0, what, "neither clipnorm nor global_clipnorm is set");
  impl::require(grad && samples && ws && l.table && l.count > 0, what, "grad, samples, ws and a layout are required");
  double* part = ws;
  double* squares = ws + l.blocks;
  for_n(s, l.size, ScaleToMean{grad, samples}, what);
  with_sum(s.reduction, [&](auto sum) {
    using A = decltype(sum);
    for_n(s, l.blocks, ClipBlockSquares<A>{grad, l, part}, what);
    for_n(s, l.count, ClipVariableSquares<A>{l, part, squares}, what);
  });
  if (c.clipnorm > 0) {
    for_n(s, l.size, ClipEach{grad, l, squares, static_cast<float>(c.clipnorm)}, what);
    return;
  }
  double* scale = squares + l.count;
  for_n(s, 1, GlobalClipScale{squares, l.count, c.global_clipnorm, scale}, what);
  for_n(s, l.size, ScaleBy{grad, scale}, what);
}

void learning_rate_step(const LrSchedule& schedule, StepState* state, Stream s) {
  impl::require(state != nullptr, "learning_rate_step", "state is null");
  for_n(s, 1, ScheduledRate{state, schedule}, "learning_rate_step");
}

}  // namespace skyforge::kernels
