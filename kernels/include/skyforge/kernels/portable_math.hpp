// exp and log in double that give the same bits in both builds (docs/kernels.md, "Wide rows"):
// the libraries' expf/logf differ between the host (glibc) and the GPU (CUDA's), these use only
// operations IEEE rounds one way (+, -, /, explicit fma, rint, ldexp, frexp), and every product
// that meets a sum is an explicit fma, so neither compiler's contraction changes a result.
// Accurate to a few units in the last place of a double: far below a float's rounding.
#pragma once

#include "hd.hpp"

#include <cmath>

namespace skyforge::kernels {

// e^x. Below -708 it returns 0: the true value is under 2^-1021, below every float and too small
// to move a sum of at least 1 (the softmax's, whose largest term is e^0); NaN stays NaN.
SF_HD inline double portable_exp(double x) {
  if (!(x > -708.0)) return x != x ? x : 0.0;
  if (x > 710.0) return INFINITY;
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2Hi = 0.693145751953125;  // 15 significant bits: k * kLn2Hi is exact
  constexpr double kLn2Lo = 1.4286068203094173e-06;
  const double k = ::rint(x * kLog2e);
  const double r = ::fma(-k, kLn2Lo, ::fma(-k, kLn2Hi, x));  // |r| <= ln2 / 2 (and a hair)
  // Taylor to r^13 / 13!: the first term left out is below 4e-18 of the result.
  double p = ::fma(1.0 / 6227020800.0, r, 1.0 / 479001600.0);
  p = ::fma(p, r, 1.0 / 39916800.0);
  p = ::fma(p, r, 1.0 / 3628800.0);
  p = ::fma(p, r, 1.0 / 362880.0);
  p = ::fma(p, r, 1.0 / 40320.0);
  p = ::fma(p, r, 1.0 / 5040.0);
  p = ::fma(p, r, 1.0 / 720.0);
  p = ::fma(p, r, 1.0 / 120.0);
  p = ::fma(p, r, 1.0 / 24.0);
  p = ::fma(p, r, 1.0 / 6.0);
  p = ::fma(p, r, 0.5);
  p = ::fma(p, r, 1.0);
  p = ::fma(p, r, 1.0);
  return ::ldexp(p, static_cast<int>(k));  // exact: the result is a normal double
}

// log(x) for x >= 1 (a softmax's sum of exponentials), +inf and NaN passing through.
SF_HD inline double portable_log_ge1(double x) {
  if (!(x < INFINITY)) return x;
  int e = 0;
  double m = ::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  if (m < 0.70710678118654752) {
    m *= 2.0;
    --e;
  }
  // log(m) = 2 atanh(f), f = (m - 1) / (m + 1), |f| <= 0.1716: the series to f^23 / 23.
  const double f = (m - 1.0) / (m + 1.0), f2 = f * f;
  double q = 1.0 / 23.0;
  for (int n = 21; n >= 1; n -= 2) q = ::fma(q, f2, 1.0 / n);  // 1.0 / n: one IEEE division
  constexpr double kLn2 = 0.69314718055994531;
  return ::fma(static_cast<double>(e), kLn2, (2.0 * f) * q);
}

}  // namespace skyforge::kernels
