// exp and log in double that give the same bits in both builds (docs/kernels.md, "Wide rows"):
// the libraries' expf/logf differ between the host (glibc) and the GPU (CUDA's); these use only
// operations IEEE rounds one way (+, -, *, /, frexp, ldexp), and every product is rounded on its
// own (mul_rn) before it meets a sum, so neither compiler's contraction into a fused
// multiply-add changes a result (a software fma, all a baseline x86-64 host has, costs 70 ns).
// Within 1e-15 of the true value, relatively (a few units in the last place of a double): far
// below a float's rounding.
#pragma once

#include "hd.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace skyforge::kernels {

// a * b rounded to T (double, or float for sums.hpp's pairs), never fused with a later sum:
// __dmul_rn / __fmul_rn on the GPU; on the host the product is pinned in a register, which ends
// contraction where the target has an fma.
template <class T>
SF_HD inline T mul_rn(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == sizeof(float)) return __fmul_rn(a, b);
  else return __dmul_rn(a, b);
#else
  T p = a * b;
#if defined(__GNUC__) && defined(__x86_64__)
  __asm__("" : "+x"(p));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(p));
#endif
  return p;
#endif
}

// a * b + c, the product rounded first.
SF_HD inline double mul_add_rn(double a, double b, double c) { return mul_rn(a, b) + c; }

// e^x. Below -708 it returns 0: the true value is under 2^-1021, below every float and too small
// to move a sum of at least 1 (the softmax's, whose largest term is e^0); NaN stays NaN.
SF_HD inline double portable_exp(double x) {
  if (!(x > -708.0)) return x != x ? x : 0.0;
  if (x > 710.0) return INFINITY;
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2Hi = 0.693145751953125;  // 15 significant bits: k * kLn2Hi and x - it exact
  constexpr double kLn2Lo = 1.4286068203094173e-06;
  constexpr double kRound = 6755399441055744.0;  // 1.5 * 2^52: t + it - it rounds t to an integer
  const double k = (mul_rn(x, kLog2e) + kRound) - kRound;
  const double r = (x - mul_rn(k, kLn2Hi)) - mul_rn(k, kLn2Lo);  // |r| <= ln2 / 2 (and a hair)
  // Taylor to r^13 / 13! (the first term left out is below 4e-18 of the result), by Estrin's
  // scheme: four short chains in place of one of thirteen.
  const double r2 = mul_rn(r, r), r4 = mul_rn(r2, r2), r8 = mul_rn(r4, r4);
  const double a0 = mul_add_rn(r, 1.0, 1.0), a1 = mul_add_rn(r, 1.0 / 6.0, 0.5),
               a2 = mul_add_rn(r, 1.0 / 120.0, 1.0 / 24.0), a3 = mul_add_rn(r, 1.0 / 5040.0, 1.0 / 720.0),
               a4 = mul_add_rn(r, 1.0 / 362880.0, 1.0 / 40320.0), a5 = mul_add_rn(r, 1.0 / 39916800.0, 1.0 / 3628800.0),
               a6 = mul_add_rn(r, 1.0 / 6227020800.0, 1.0 / 479001600.0);
  const double b0 = mul_add_rn(r2, a1, a0), b1 = mul_add_rn(r2, a3, a2), b2 = mul_add_rn(r2, a5, a4);
  const double p = mul_add_rn(r8, mul_add_rn(r4, a6, b2), mul_add_rn(r4, b1, b0));
  const int e = static_cast<int>(k);
  if (e > 1000) return ::ldexp(p, e);
  const uint64_t bits = static_cast<uint64_t>(e + 1023) << 52;  // 2^e, e >= -1021 here
  double scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return mul_rn(p, scale);  // exact: the result is a normal double
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
  const double f = (m - 1.0) / (m + 1.0), f2 = mul_rn(f, f);
  double q = 1.0 / 23.0;
  for (int n = 21; n >= 1; n -= 2) q = mul_add_rn(q, f2, 1.0 / n);  // 1.0 / n: one IEEE division
  constexpr double kLn2 = 0.69314718055994531;
  return mul_add_rn(static_cast<double>(e), kLn2, mul_rn(2.0 * f, q));
}

}  // namespace skyforge::kernels
