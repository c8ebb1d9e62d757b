// bf16.hpp's rounding calls, written once for both builds (common.hpp says how); included after
// the build's for_n.
#include "common.hpp"

#include <skyforge/kernels/bf16.hpp>

namespace skyforge::kernels {

namespace {
struct ToBf16 {
  const float* x;
  uint16_t* y;
  SF_HD void operator()(size_t i) const { y[i] = bf16_bits(x[i]); }
};
struct RoundBf16 {
  const float* x;
  float* y;
  SF_HD void operator()(size_t i) const { y[i] = bf16_round(x[i]); }
};
}  // namespace

void to_bf16(const float* x, uint16_t* y, size_t n, Stream s) {
  if (n) for_n(s, n, ToBf16{x, y}, "to_bf16");
}
void round_bf16(const float* x, float* y, size_t n, Stream s) {
  if (n) for_n(s, n, RoundBf16{x, y}, "round_bf16");
}

}  // namespace skyforge::kernels
