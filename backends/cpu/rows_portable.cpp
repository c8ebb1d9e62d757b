// The row kernels (row_kernels.hpp) on plain float[16] values: the table used without AVX2
// (SKYFORGE_CPU_ISA=none, or a CPU without it). Built with -ffp-contract=off like the SIMD
// tables, so it gives their bits.
#include "row_kernels.hpp"
#include "simd.hpp"

#include <bit>
#include <cstdint>
#include <cstring>

namespace skyforge::cpu::simd::portable {
namespace {

struct Ops {
  struct V {
    float v[16];
  };
  template <class F>
  static V map(F&& f) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = f(i);
    return r;
  }
  static V load(const float* p) { return map([&](int i) { return p[i]; }); }
  static V load_n(const float* p, size_t n, V fill) {
    return map([&](int i) { return static_cast<size_t>(i) < n ? p[i] : fill.v[i]; });
  }
  static void store(float* p, V v) { std::memcpy(p, v.v, sizeof v.v); }
  static void store_n(float* p, V v, size_t n) { std::memcpy(p, v.v, n * sizeof(float)); }
  static V set(float x) { return map([&](int) { return x; }); }
  static V add(V a, V b) { return map([&](int i) { return a.v[i] + b.v[i]; }); }
  static V sub(V a, V b) { return map([&](int i) { return a.v[i] - b.v[i]; }); }
  static V mul(V a, V b) { return map([&](int i) { return a.v[i] * b.v[i]; }); }
  static V div(V a, V b) { return map([&](int i) { return a.v[i] / b.v[i]; }); }
  static float max1(float a, float b) { return a > b ? a : b; }
  static V max(V a, V b) { return map([&](int i) { return max1(a.v[i], b.v[i]); }); }
  static V min(V a, V b) { return map([&](int i) { return a.v[i] < b.v[i] ? a.v[i] : b.v[i]; }); }
  static V abs(V a) {
    return map([&](int i) { return std::bit_cast<float>(std::bit_cast<uint32_t>(a.v[i]) & 0x7FFFFFFFu); });
  }
  static V less(V a, V b, V x, V y) { return map([&](int i) { return a.v[i] < b.v[i] ? x.v[i] : y.v[i]; }); }
  static V pow2(V t) {
    return map([&](int i) {
      const uint32_t n = std::bit_cast<uint32_t>(t.v[i]) - std::bit_cast<uint32_t>(rows_detail::kMagic);
      return std::bit_cast<float>((n + 127u) << 23);
    });
  }
  // row_kernels.hpp's tree: l + l+8, then + 4, + 2, + 1.
  template <class F>
  static float fold(V v, F&& f) {
    for (int w = 8; w >= 1; w /= 2)
      for (int i = 0; i < w; ++i) v.v[i] = f(v.v[i], v.v[i + w]);
    return v.v[0];
  }
  static float sum(V v) { return fold(v, [](float a, float b) { return a + b; }); }
  static float hmax(V v) { return fold(v, max1); }
};

void gelu(const float* z, float* y, size_t n) { gelu_rows<Ops>(z, y, n); }
void gelu_grad(const float* z, float* dy, size_t n) { gelu_grad_rows<Ops>(z, dy, n); }
void softmax(float* s, size_t rows, size_t width) { softmax_rows<Ops>(s, rows, width); }
void softmax_grad(const float* y, float* dy, size_t rows, size_t width) { softmax_grad_rows<Ops>(y, dy, rows, width); }
void layer_norm(const float* x, float* y, size_t rows, size_t C, const float* gamma, const float* beta, float eps,
                float* mean, float* invstd) {
  layer_norm_rows<Ops>(x, y, rows, C, gamma, beta, eps, mean, invstd);
}
void layer_norm_dx(const float* x, const float* dy, float* dx, size_t rows, size_t C, const float* gamma,
                   const float* mean, const float* invstd) {
  layer_norm_dx_rows<Ops>(x, dy, dx, rows, C, gamma, mean, invstd);
}

}  // namespace

const RowKernels row_table = {&gelu, &gelu_grad, &softmax, &softmax_grad, &layer_norm, &layer_norm_dx};

}  // namespace skyforge::cpu::simd::portable
