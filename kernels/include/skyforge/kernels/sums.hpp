// The two accumulators of the deterministic reductions (reduce.hpp; docs/kernels.md,
// "Reductions"), chosen per launch by Stream::reduction:
//   DoubleSum     (Reduction::fp64) a double: FP64 adds, the engine's bits since the start;
//   FloatPairSum  (Reduction::fp32) an unevaluated sum hi + lo of two floats (a "double-float"):
//                 Knuth's TwoSum for each add and an exact product (a fused multiply-add's
//                 error term) for each product, so FP32 instructions only, for GPUs whose FP64
//                 rate is 1/64 of FP32 (L4, L40S, RTX). About 2^-44 relative per add: near a
//                 double's accuracy, a float's range (a sum past 3.4e38 is not finite).
// Both add the same terms in the same order, and each operation is one IEEE rounding with no
// product left to a compiler's contraction (portable_math.hpp's mul_rn), so each gives the
// same bits in both builds and on any thread count. A pair is stored in a workspace's double
// slot (8 bytes), so the workspace is the same for both. Totals leave as double (value()).
#pragma once

#include "hd.hpp"
#include "portable_math.hpp"

#include <cstring>

namespace skyforge::kernels {

enum class Reduction : int { fp64 = 0, fp32 = 1 };

struct DoubleSum {
  double v = 0.0;
  SF_HD void add(float x) { v += static_cast<double>(x); }
  SF_HD void add_product(float a, float b) { v += static_cast<double>(a) * static_cast<double>(b); }  // exact product
  SF_HD void add(const DoubleSum& o) { v += o.v; }
  SF_HD double value() const { return v; }
  SF_HD void store(double* slot) const { *slot = v; }
  SF_HD static DoubleSum load(const double* slot) { return {*slot}; }
};

// a * b - p exactly, for p = mul_rn(a, b) (a float where neither under- nor overflows): the
// GPU's fmaf; on the host the product in double (exact: 48 bits) less p, exact too, so the same
// bits without the software fmaf a baseline x86-64 host would call.
SF_HD inline float product_error(float a, float b, float p) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, -p);
#else
  return static_cast<float>(static_cast<double>(a) * static_cast<double>(b) - static_cast<double>(p));
#endif
}

struct FloatPairSum {
  float hi = 0.f, lo = 0.f;

  // s + e = a + b exactly, s = fl(a + b) (Knuth's TwoSum: any order of magnitude).
  SF_HD static void two_sum(float a, float b, float& s, float& e) {
    s = a + b;
    const float bb = s - a;
    e = (a - (s - bb)) + (b - bb);
  }
  // The same where |a| >= |b| (Dekker's FastTwoSum): renormalises a pair.
  SF_HD static void fast_two_sum(float a, float b, float& s, float& e) {
    s = a + b;
    e = b - (s - a);
  }

  SF_HD void add(float x) {
    float s, e;
    two_sum(hi, x, s, e);
    e += lo;
    fast_two_sum(s, e, hi, lo);
  }
  // A pair's add with both low parts' TwoSum (the QD library's ieee_add): accurate under cancellation.
  SF_HD void add(const FloatPairSum& o) {
    float s, e, t, f;
    two_sum(hi, o.hi, s, e);
    two_sum(lo, o.lo, t, f);
    e += t;
    fast_two_sum(s, e, s, e);
    e += f;
    fast_two_sum(s, e, hi, lo);
  }
  SF_HD void add_product(float a, float b) {
    const float p = mul_rn(a, b);
    add(FloatPairSum{p, product_error(a, b, p)});
  }
  SF_HD double value() const { return static_cast<double>(hi) + static_cast<double>(lo); }
  SF_HD void store(double* slot) const {
    const float v[2] = {hi, lo};
    std::memcpy(slot, v, sizeof v);
  }
  SF_HD static FloatPairSum load(const double* slot) {
    float v[2];
    std::memcpy(v, slot, sizeof v);
    return {v[0], v[1]};
  }
};
static_assert(2 * sizeof(float) == sizeof(double), "a pair fills a double's workspace slot");

// Calls f(DoubleSum{}) or f(FloatPairSum{}) as r says: a launch's one dispatch on its mode.
template <class F>
void with_sum(Reduction r, const F& f) {
  if (r == Reduction::fp32) f(FloatPairSum{});
  else f(DoubleSum{});
}

}  // namespace skyforge::kernels
