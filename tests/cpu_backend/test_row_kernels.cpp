// The row kernels (simd.hpp's RowKernels: GELU, softmax rows, layer normalization): every
// kernel table this CPU has gives the portable table's bits (row_kernels.hpp's contract), and
// the results follow the exact functions, computed in double with libm, within the bounds
// measured here (their own exp and erfc are polynomial approximations).
#include "simd.hpp"

#include "helpers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

using namespace skyforge::cpu;

namespace {

// Row widths around the 16-lane chunks, and the transformer's 49 and 64.
constexpr size_t kWidths[] = {1, 5, 8, 9, 15, 16, 17, 31, 49, 64, 100};

std::vector<float> spread(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  skyforge::Rng rng(seed);
  for (auto& e : v) e = (uniform01(rng) - 0.5f) * 2.f * scale;
  return v;
}

// Every output of the six kernels on inputs of every width, concatenated.
std::vector<float> outputs(const simd::RowKernels& rk) {
  std::vector<float> out;
  auto keep = [&](const std::vector<float>& v) { out.insert(out.end(), v.begin(), v.end()); };
  for (size_t w : kWidths) {
    const size_t rows = 3, n = rows * w;
    std::vector<float> z = spread(n, 10 + w, 6.f), y(n), d = spread(n, 20 + w, 1.f);
    if (w > 3) z[0] = 0.f, z[1] = -0.f, z[2] = -30.f, z[3] = 40.f;
    rk.gelu(z.data(), y.data(), n);
    keep(y);
    std::vector<float> g = d;
    rk.gelu_grad(z.data(), g.data(), n);
    keep(g);
    std::vector<float> s = z;
    rk.softmax(s.data(), rows, w);
    keep(s);
    std::vector<float> sg = d;
    rk.softmax_grad(s.data(), sg.data(), rows, w);
    keep(sg);
    const std::vector<float> gamma = spread(w, 30 + w, 2.f), beta = spread(w, 40 + w, 1.f);
    std::vector<float> mean(rows), invstd(rows), dx(n);
    for (const bool affine : {true, false}) {
      rk.layer_norm(z.data(), y.data(), rows, w, affine ? gamma.data() : nullptr, affine ? beta.data() : nullptr,
                    1e-3f, mean.data(), invstd.data());
      keep(y), keep(mean), keep(invstd);
      rk.layer_norm_dx(z.data(), d.data(), dx.data(), rows, w, affine ? gamma.data() : nullptr, mean.data(),
                       invstd.data());
      keep(dx);
    }
  }
  return out;
}

double gelu_exact(double z) { return 0.5 * z * std::erfc(-z / std::sqrt(2.0)); }
double gelu_slope_exact(double z) {
  return 0.5 * std::erfc(-z / std::sqrt(2.0)) + z * std::exp(-0.5 * z * z) / std::sqrt(2.0 * std::numbers::pi);
}

}  // namespace

TEST(SimdRows, EveryTableGivesThePortableBits) {
  const std::vector<float> portable = outputs(simd::portable::row_table);
  const simd::Isa best = simd::supported();
  const simd::Kernels* const before = simd::kernels();
  const struct Restore {  // the table in use before, whatever the exit
    simd::Isa isa;
    ~Restore() { simd::set_isa(isa); }
  } restore{before ? before->isa : simd::Isa::none};
  for (simd::Isa isa : {simd::Isa::avx2, simd::Isa::avx512}) {
    if (isa > best) continue;
    simd::set_isa(isa);
    ASSERT_NE(simd::kernels(), nullptr);
    const std::vector<float> got = outputs(simd::row_kernels());
    ASSERT_EQ(got.size(), portable.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &portable[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << simd::isa_name(isa) << ": " << differ << " of " << got.size() << " outputs differ";
  }
  simd::set_isa(simd::Isa::none);
  EXPECT_EQ(&simd::row_kernels(), &simd::portable::row_table);  // no table: the portable loops
}

// GELU over [-14, 14] in steps of 1e-4 against the exact function in double. Most of the error
// is the float argument's: -z / sqrt 2 rounded to float moves erfc by up to 2 a^2 2^-24 of itself
// (1.5e-6 at a = 3.5), so libm's erfcf of the same float argument is measured beside it. On an
// AVX2 EPYC: relative 1.87e-6 for |z| <= 5 (libm's float formula: 1.44e-6), 1.37e-5 further
// out where GELU is above 1e-30 (1.02e-5), absolute 3.8e-7, slope 2.0e-7.
TEST(SimdRows, GeluFollowsTheErrorFunction) {
  const simd::RowKernels& rk = simd::row_kernels();
  std::vector<float> z;
  for (int i = -140000; i <= 140000; ++i) z.push_back(static_cast<float>(i) * 1e-4f);  // [-14, 14]
  std::vector<float> y(z.size()), g(z.size(), 1.f);
  rk.gelu(z.data(), y.data(), z.size());
  rk.gelu_grad(z.data(), g.data(), z.size());
  double worst_core = 0, worst_tail = 0, worst_abs = 0, worst_slope = 0, libm_core = 0, libm_tail = 0;
  for (size_t i = 0; i < z.size(); ++i) {
    const double ref = gelu_exact(z[i]), err = std::fabs(y[i] - ref);
    const double lerr = std::fabs(0.5f * z[i] * std::erfc(-z[i] * 0.70710678118654752f) - ref);
    if (std::fabs(z[i]) <= 5.f && ref != 0) libm_core = std::max(libm_core, lerr / std::fabs(ref));
    else if (std::fabs(ref) > 1e-30) libm_tail = std::max(libm_tail, lerr / std::fabs(ref));
    worst_abs = std::max(worst_abs, err);
    if (std::fabs(z[i]) <= 5.f && ref != 0) worst_core = std::max(worst_core, err / std::fabs(ref));
    else if (std::fabs(ref) > 1e-30) worst_tail = std::max(worst_tail, err / std::fabs(ref));
    worst_slope = std::max(worst_slope, std::fabs(g[i] - gelu_slope_exact(z[i])));
  }
  RecordProperty("gelu_rel_core", std::to_string(worst_core));
  RecordProperty("gelu_rel_tail", std::to_string(worst_tail));
  std::printf("gelu: relative error %.3g (|z| <= 5), %.3g (tail above 1e-30); absolute %.3g; slope absolute %.3g; "
              "libm in float: %.3g, %.3g\n",
              worst_core, worst_tail, worst_abs, worst_slope, libm_core, libm_tail);
  EXPECT_LT(worst_core, 2.5e-6);
  EXPECT_LT(worst_tail, 2e-5);
  EXPECT_LT(worst_core, 1.5 * libm_core);
  EXPECT_LT(worst_tail, 1.5 * libm_tail);
  EXPECT_LT(worst_abs, 1e-6);
  EXPECT_LT(worst_slope, 1e-6);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float v = nan;
  rk.gelu(&v, &v, 1);
  EXPECT_TRUE(std::isnan(v)) << "a NaN must stay a NaN, not become a number";
}

TEST(SimdRows, SoftmaxAndLayerNormFollowDouble) {
  const simd::RowKernels& rk = simd::row_kernels();
  double worst_soft = 0, worst_ln = 0;
  for (size_t w : kWidths) {
    const size_t rows = 4;
    std::vector<float> s = spread(rows * w, 50 + w, 20.f);
    const std::vector<float> x = s;
    rk.softmax(s.data(), rows, w);
    for (size_t r = 0; r < rows; ++r) {
      double m = -1e300, sum = 0;
      for (size_t j = 0; j < w; ++j) m = std::max(m, double{x[r * w + j]});
      for (size_t j = 0; j < w; ++j) sum += std::exp(x[r * w + j] - m);
      for (size_t j = 0; j < w; ++j) {
        const double ref = std::exp(x[r * w + j] - m) / sum;
        if (ref > 1e-30) worst_soft = std::max(worst_soft, std::fabs(s[r * w + j] - ref) / ref);
      }
    }
    std::vector<float> y(rows * w), mean(rows), invstd(rows);
    const std::vector<float> ln = spread(rows * w, 60 + w, 3.f);
    rk.layer_norm(ln.data(), y.data(), rows, w, nullptr, nullptr, 1e-3f, mean.data(), invstd.data());
    for (size_t r = 0; r < rows; ++r) {
      double mu = 0, var = 0;
      for (size_t j = 0; j < w; ++j) mu += ln[r * w + j];
      mu /= static_cast<double>(w);
      for (size_t j = 0; j < w; ++j) var += (ln[r * w + j] - mu) * (ln[r * w + j] - mu);
      const double is = 1 / std::sqrt(var / static_cast<double>(w) + 1e-3);
      for (size_t j = 0; j < w; ++j) worst_ln = std::max(worst_ln, std::fabs(y[r * w + j] - (ln[r * w + j] - mu) * is));
    }
  }
  std::printf("softmax: relative error %.3g; layer norm: absolute error %.3g\n", worst_soft, worst_ln);
  EXPECT_LT(worst_soft, 3e-6);  // exp of x - max down to -40: the argument's rounding, 40 * 2^-24
  EXPECT_LT(worst_ln, 2e-6);
  // A spread past float's exp range: the far entries are 0, the row still sums to 1.
  std::vector<float> far = {0.f, -100.f, -200.f, 1.f};
  rk.softmax(far.data(), 1, far.size());
  EXPECT_EQ(far[1], 0.f);
  EXPECT_EQ(far[2], 0.f);
  EXPECT_NEAR(far[0] + far[3], 1.f, 1e-7f);
}
