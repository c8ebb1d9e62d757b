// The cpu backend's row kernels (simd.hpp's RowKernels: GELU, softmax rows, layer
// normalization), written once over a 16-lane float type and its operations `O`, and compiled
// three times: with AVX-512 registers, with pairs of AVX2 registers (simd_rows.inc) and with
// plain float[16] (rows_portable.cpp). Every lane sees the same operations in the same order in
// all three, without fma contraction (those translation units build with -ffp-contract=off), so
// every table gives the same bits, and SKYFORGE_CPU_ISA changes none.
//
//   O::V                     16 floats
//   load(p) / store(p, v)    16 floats at p
//   load_n(p, n, fill)       the first n (< 16) floats at p, `fill` in the other lanes
//   store_n(p, v, n)         the first n lanes
//   set, add, sub, mul, div  lane by lane
//   max(a, b), min(a, b)     a > b ? a : b and a < b ? a : b (x86's maxps/minps: b if either is NaN)
//   abs(a)                   the sign bit cleared
//   less(a, b, x, y)         a < b ? x : y
//   pow2(t)                  2^n for t = n + kMagic (n an integer in [-126, 127])
//   sum(v), hmax(v)          lanes folded in a fixed tree: l + (l + 8), then + 4, + 2, + 1
//
// Sums over a row run in 16 lanes (element j into lane j mod 16, in increasing j), then that
// tree. exp and erfc are polynomial approximations (below), not libm's: a few ulp from it.
//
// Only C headers and builtins: the AVX translation units include this, and every function here
// has internal linkage (see simd_kernels.inc).
#pragma once

#include <stddef.h>

namespace skyforge::cpu::simd {
namespace {

namespace rows_detail {

constexpr size_t kLanes = 16;
constexpr float kMagic = 12582912.f;  // 1.5 * 2^23: x + kMagic rounds x to an integer in the low bits

// exp(x): x = n ln2 + r (Cody-Waite: ln2 in a 16-bit high part and the rest), |r| <= ln2/2 + an
// ulp, e^r by its Taylor polynomial of degree 7 (truncation 5e-9 relative), times 2^n. Below
// kExpLo (just under ln 2^-126) the result is 0; the argument is clamped to 88 above; NaN stays
// NaN.
// (tests/cpu_backend/test_row_kernels.cpp measures softmax and GELU against double precision.)
constexpr float kExpLo = -87.33654475f, kExpHi = 88.f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723e-6f;
constexpr float kExpPoly[8] = {1.f,           1.f,            0.5f,           1.f / 6.f,
                               1.f / 24.f,    1.f / 120.f,    1.f / 720.f,    1.f / 5040.f};

template <class O>
inline typename O::V exp(typename O::V x) {
  using V = typename O::V;
  const V xc = O::min(O::set(kExpHi), O::max(O::set(kExpLo), x));
  const V t = O::add(O::mul(xc, O::set(kLog2e)), O::set(kMagic));
  const V n = O::sub(t, O::set(kMagic));
  const V r = O::sub(O::sub(xc, O::mul(n, O::set(kLn2Hi))), O::mul(n, O::set(kLn2Lo)));
  V p = O::set(kExpPoly[7]);
  for (int k = 6; k >= 0; --k) p = O::add(O::mul(p, r), O::set(kExpPoly[k]));
  return O::less(x, O::set(kExpLo), O::set(0.f), O::mul(p, O::pow2(t)));
}

// erfc(x) = e^(-x^2) R(|x|) for x >= 0 and 2 - that below 0, R(a) = e^(a^2) erfc(a) (the scaled
// complementary error function) as a polynomial of degree 9 in t = 1 / (1 + p a), fitted to
// minimise the relative error over a in [0, 9.3] (past it e^(-a^2) is below float's range):
// 3.5e-7 evaluated in float. So erfc keeps its relative precision where it is tiny, which
// 1 - erf would not. *e receives e^(-x^2) (GELU's derivative uses it).
constexpr float kErfcP = 0.49f;
constexpr float kErfcPoly[10] = {4.597998213284882e-06f, 0.27631470561027527f,  0.2782679498195648f,
                                 0.2295752912759781f,    0.24229896068572998f,  -0.11620178073644638f,
                                 0.4278082847595215f,    -0.5940858721733093f,  0.3193705081939697f,
                                 -0.06335274130105972f};

template <class O>
inline typename O::V erfc(typename O::V x, typename O::V* e) {
  using V = typename O::V;
  const V a = O::abs(x);
  *e = exp<O>(O::sub(O::set(0.f), O::mul(a, a)));
  const V t = O::div(O::set(1.f), O::add(O::set(1.f), O::mul(O::set(kErfcP), a)));
  V r = O::set(kErfcPoly[9]);
  for (int k = 8; k >= 0; --k) r = O::add(O::mul(r, t), O::set(kErfcPoly[k]));
  const V small = O::mul(*e, r);
  return O::less(x, O::set(0.f), O::sub(O::set(2.f), small), small);
}

// Keras' exact GELU, x Phi(x) = 0.5 x erfc(-x / sqrt 2), and its derivative
// 0.5 erfc(-x / sqrt 2) + x e^(-x^2 / 2) / sqrt(2 pi).
constexpr float kMinusSqrtHalf = -0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;

template <class O>
inline typename O::V gelu(typename O::V z) {
  typename O::V e;
  return O::mul(O::mul(O::set(0.5f), z), erfc<O>(O::mul(z, O::set(kMinusSqrtHalf)), &e));
}
template <class O>
inline typename O::V gelu_slope(typename O::V z) {
  typename O::V e;
  const typename O::V c = erfc<O>(O::mul(z, O::set(kMinusSqrtHalf)), &e);
  return O::add(O::mul(O::set(0.5f), c), O::mul(O::mul(z, O::set(kInvSqrt2Pi)), e));
}

// f(j, n) over [0, width) in chunks of 16: n = 16, then the last n < 16.
template <class F>
inline void chunks(size_t width, F&& f) {
  size_t j = 0;
  for (; j + kLanes <= width; j += kLanes) f(j, kLanes);
  if (j < width) f(j, width - j);
}
template <class O>
inline typename O::V load(const float* p, size_t n, float fill) {
  return n == kLanes ? O::load(p) : O::load_n(p, n, O::set(fill));
}
template <class O>
inline void store(float* p, typename O::V v, size_t n) {
  if (n == kLanes) O::store(p, v);
  else O::store_n(p, v, n);
}

}  // namespace rows_detail

template <class O>
void gelu_rows(const float* z, float* y, size_t n) {
  using namespace rows_detail;
  chunks(n, [&](size_t j, size_t m) { store<O>(y + j, gelu<O>(load<O>(z + j, m, 0.f)), m); });
}

template <class O>
void gelu_grad_rows(const float* z, float* dy, size_t n) {
  using namespace rows_detail;
  chunks(n, [&](size_t j, size_t m) {
    store<O>(dy + j, O::mul(load<O>(dy + j, m, 0.f), gelu_slope<O>(load<O>(z + j, m, 0.f))), m);
  });
}

// Softmax over each row of s[rows, width], in place: m = max, e = exp(x - m), e / sum(e).
template <class O>
void softmax_rows(float* s, size_t rows, size_t width) {
  using namespace rows_detail;
  using V = typename O::V;
  const float ninf = -__builtin_inff();
  for (size_t r = 0; r < rows; ++r) {
    float* row = s + r * width;
    V mx = O::set(ninf);
    chunks(width, [&](size_t j, size_t n) { mx = O::max(mx, load<O>(row + j, n, ninf)); });
    const V m = O::set(O::hmax(mx));
    V acc = O::set(0.f);
    chunks(width, [&](size_t j, size_t n) {
      const V e = exp<O>(O::sub(load<O>(row + j, n, ninf), m));  // exp(-inf) = 0 in the spare lanes
      acc = O::add(acc, e);
      store<O>(row + j, e, n);
    });
    const V inv = O::set(1.f / O::sum(acc));
    chunks(width, [&](size_t j, size_t n) { store<O>(row + j, O::mul(load<O>(row + j, n, 0.f), inv), n); });
  }
}

// dy <- y * (dy - sum(dy * y)) over each row: the softmax's backward from its output y.
template <class O>
void softmax_grad_rows(const float* y, float* dy, size_t rows, size_t width) {
  using namespace rows_detail;
  using V = typename O::V;
  for (size_t r = 0; r < rows; ++r) {
    const float* yr = y + r * width;
    float* d = dy + r * width;
    V acc = O::set(0.f);
    chunks(width, [&](size_t j, size_t n) { acc = O::add(acc, O::mul(load<O>(d + j, n, 0.f), load<O>(yr + j, n, 0.f))); });
    const V dot = O::set(O::sum(acc));
    chunks(width, [&](size_t j, size_t n) {
      store<O>(d + j, O::mul(load<O>(yr + j, n, 0.f), O::sub(load<O>(d + j, n, 0.f), dot)), n);
    });
  }
}

// Layer normalization of each row of x[rows, C]: mean = sum(x) / C, var = sum((x - mean)^2) / C,
// invstd = 1 / sqrt(var + eps), y = (x - mean) * invstd * gamma + beta (gamma, beta: C floats, or
// null for none); mean[r] and invstd[r] are kept for the backward.
template <class O>
void layer_norm_rows(const float* x, float* y, size_t rows, size_t C, const float* gamma, const float* beta, float eps,
                     float* mean, float* invstd) {
  using namespace rows_detail;
  using V = typename O::V;
  const float fc = static_cast<float>(C);
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    V acc = O::set(0.f);
    chunks(C, [&](size_t j, size_t n) { acc = O::add(acc, load<O>(xr + j, n, 0.f)); });
    const float mf = O::sum(acc) / fc;
    const V m = O::set(mf);
    acc = O::set(0.f);
    chunks(C, [&](size_t j, size_t n) {
      const V d = O::sub(load<O>(xr + j, n, mf), m);  // 0 in the spare lanes
      acc = O::add(acc, O::mul(d, d));
    });
    const float isf = 1.f / __builtin_sqrtf(O::sum(acc) / fc + eps);
    const V is = O::set(isf);
    chunks(C, [&](size_t j, size_t n) {
      V v = O::mul(O::sub(load<O>(xr + j, n, 0.f), m), is);
      if (gamma) v = O::mul(v, load<O>(gamma + j, n, 0.f));
      if (beta) v = O::add(v, load<O>(beta + j, n, 0.f));
      store<O>(yr + j, v, n);
    });
    mean[r] = mf;
    invstd[r] = isf;
  }
}

// The input gradient of layer_norm_rows: with dh = dy * gamma and xhat = (x - mean) * invstd,
// dx = invstd * ((dh - sum(dh) / C) - xhat * sum(dh * xhat) / C).
template <class O>
void layer_norm_dx_rows(const float* x, const float* dy, float* dx, size_t rows, size_t C, const float* gamma,
                        const float* mean, const float* invstd) {
  using namespace rows_detail;
  using V = typename O::V;
  const float fc = static_cast<float>(C);
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    const float* d = dy + r * C;
    float* o = dx + r * C;
    const V m = O::set(mean[r]), is = O::set(invstd[r]);
    auto dh = [&](size_t j, size_t n) {
      const V v = load<O>(d + j, n, 0.f);
      return gamma ? O::mul(v, load<O>(gamma + j, n, 0.f)) : v;
    };
    auto xhat = [&](size_t j, size_t n) { return O::mul(O::sub(load<O>(xr + j, n, 0.f), m), is); };
    V s1 = O::set(0.f), s2 = O::set(0.f);
    chunks(C, [&](size_t j, size_t n) {
      const V h = dh(j, n);
      s1 = O::add(s1, h);
      s2 = O::add(s2, O::mul(h, xhat(j, n)));
    });
    const V m1 = O::set(O::sum(s1) / fc), m2 = O::set(O::sum(s2) / fc);
    chunks(C, [&](size_t j, size_t n) {
      store<O>(o + j, O::mul(is, O::sub(O::sub(dh(j, n), m1), O::mul(xhat(j, n), m2))), n);
    });
  }
}

}  // namespace
}  // namespace skyforge::cpu::simd
