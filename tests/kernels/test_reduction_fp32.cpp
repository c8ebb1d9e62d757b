// The FP32 reductions (Stream::reduction = fp32; sums.hpp, docs/kernels.md "Reductions"): the
// pair-of-floats accumulator against the exact sum and a plain float sum, the reducing kernels
// against their fp64 path on adversarial inputs, and the same bits on 1 and on several threads.
#include "reference.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

namespace sk = skyforge::kernels;

namespace {

constexpr sk::Stream kFp32{nullptr, sk::Reduction::fp32};
constexpr sk::Stream kFp64{nullptr, sk::Reduction::fp64};

// f() with one thread and with several: the pair path's bits depend on the shape alone.
template <class F>
auto on_one_and_many(const F& f) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  auto one = f();
  omp_set_num_threads(std::max(4, before));
  auto many = f();
  omp_set_num_threads(before);
  return std::make_pair(one, many);
}

// A million terms of about 0.1 in order: a plain float sum drifts by about 1e-3 of the total
// (each add rounds at the total's scale); the pair stays within 1e-12 of the exact sum (long
// double: the floats' sum is exact there to 64 bits), the double within 1e-15.
TEST(PairSum, AMillionTermsBeatAPlainFloatSumByOrdersOfMagnitude) {
  const auto x = kref::randn(1'000'000, 41, 0.01f, 0.1f);
  long double exact = 0;
  float plain = 0.f;
  sk::FloatPairSum pair;
  sk::DoubleSum dbl;
  for (float v : x) {
    exact += v;
    plain += v;
    pair.add(v);
    dbl.add(v);
  }
  const double e = static_cast<double>(exact);
  const double plain_err = std::fabs(plain - e) / e, pair_err = std::fabs(pair.value() - e) / e;
  std::printf("a million terms in order, relative error: float %.3g, pair %.3g, double %.3g\n", plain_err, pair_err,
              std::fabs(dbl.value() - e) / e);
  EXPECT_GT(plain_err, 1e-5);
  EXPECT_LT(pair_err, 1e-12);
  EXPECT_GT(plain_err / std::max(pair_err, 1e-300), 1e6);  // orders of magnitude
  EXPECT_LT(std::fabs(dbl.value() - e) / e, 1e-15);
}

// Large values that cancel, with small ones between: 1e8 + t, -1e8, ... A float cannot hold
// 1e8 + 0.001 and loses every t; the pair's TwoSum keeps them, to about 2^-48 of the large
// values' scale (1e8 * 1e-14 = 1e-6) from the double's sum.
TEST(PairSum, LargeCancellingValuesKeepTheSmallOnes) {
  const auto small = kref::randn(30'000, 42, 1e-3f);
  sk::FloatPairSum pair;
  sk::DoubleSum dbl;
  float plain = 0.f;
  for (size_t i = 0; i < small.size(); ++i) {
    const float big = (i % 2 ? -1.f : 1.f) * 1e8f;
    for (float v : {big, small[i]}) {
      pair.add(v);
      dbl.add(v);
      plain += v;
    }
  }
  if (small.size() % 2) {
    pair.add(-1e8f);
    dbl.add(-1e8f);
  }
  EXPECT_NEAR(pair.value(), dbl.value(), 1e8 * 1e-14);
  EXPECT_GT(std::fabs(plain - dbl.value()), 1e-2);  // the float lost them (their sum is about 0.25)
  std::printf("1e8s cancelling around 3e4 small terms: float off by %.3g, pair by %.3g\n",
              std::fabs(plain - dbl.value()), std::fabs(pair.value() - dbl.value()));
}

// Products: each x * y exact (the fused multiply-add's error term), so a dot product that
// cancels to a small value is right where a float's products would not be.
TEST(PairSum, ProductsAreExact) {
  const float a = 1.f + 0x1p-20f, b = 1.f - 0x1p-20f;  // a * b = 1 - 2^-40, rounded to 1 in float
  sk::FloatPairSum pair;
  pair.add_product(a, b);
  pair.add(-1.f);
  EXPECT_EQ(pair.value(), -0x1p-40);
  double slot = 0.0;  // a workspace's double holds the pair
  pair.store(&slot);
  EXPECT_EQ(sk::FloatPairSum::load(&slot).value(), pair.value());
}

// reduce_sum over a million floats with large cancelling terms (+-1e4 in turn) on a mean of 3:
// fp32 within 1e-12 of fp64's sum (relative to the sum of magnitudes), the same bits on any
// thread count; a plain float sum is off by orders of magnitude more.
TEST(ReductionFp32, ReduceSumOfAMillionRowsIsNearFp64AndThreadFree) {
  const size_t n = 1'000'000;
  auto x = kref::randn(n, 43, 1.f, 3.f);
  for (size_t i = 0; i < n; ++i) x[i] += (i % 2 ? -1e4f : 1e4f);
  std::vector<double> ws(sk::reduce_workspace(n, 1));
  auto sum = [&](sk::Stream s) {
    double out = -1.0;
    sk::reduce_sum(x.data(), n, &out, ws.data(), s);
    return out;
  };
  const auto [one, many] = on_one_and_many([&] { return sum(kFp32); });
  EXPECT_EQ(one, many);
  const double ref = sum(kFp64), magnitude = 1e4 * n;
  EXPECT_LT(std::fabs(one - ref), 1e-12 * magnitude);
  float plain = 0.f;
  for (float v : x) plain += v;
  EXPECT_GT(std::fabs(plain - ref), 1e3 * std::fabs(one - ref) + 1e-3);
  std::printf("reduce_sum of 1e6 rows, absolute error: plain float in order %.3g, fp32 pairs %.3g (sum %.9g)\n",
              std::fabs(plain - ref), std::fabs(one - ref), ref);

  double sq = 0.0, sq64 = 0.0;
  sk::reduce_sum_squares(x.data(), n, &sq, ws.data(), kFp32);
  sk::reduce_sum_squares(x.data(), n, &sq64, ws.data(), kFp64);
  EXPECT_LT(std::fabs(sq - sq64) / sq64, 1e-12);
}

// BatchNorm over a [1024 * 28 * 28, 12] batch whose mean is 300 standard deviations off zero
// (the sum of squares cancels against the squared mean): the statistics and the backward's
// gradients of the fp32 path within a float's rounding of fp64's, the same bits on 1 and 4 threads.
TEST(ReductionFp32, BatchnormMatchesFp64ToFloatRoundingAndIsThreadFree) {
  const size_t rows = size_t{1024} * 28 * 28 / 4, C = 12;
  const auto x = kref::randn(rows * C, 44, 1.f, 300.f), dy = kref::randn(rows * C, 45, 1.f, 0.5f);
  std::vector<double> ws(sk::reduce_workspace(rows, C) + 2 * C);
  struct Out {
    std::vector<float> y, mean, var, invstd, dx, dgamma, dbeta;
    bool operator==(const Out&) const = default;
  };
  auto run = [&](sk::Stream s) {
    Out o{std::vector<float>(rows * C), std::vector<float>(C), std::vector<float>(C), std::vector<float>(C),
          std::vector<float>(rows * C), std::vector<float>(C), std::vector<float>(C)};
    sk::batchnorm_forward_training(x.data(), o.y.data(), rows, C, nullptr, nullptr, 1e-3f, false, o.mean.data(),
                                   o.var.data(), o.invstd.data(), ws.data(), s);
    sk::batchnorm_backward(x.data(), nullptr, dy.data(), o.dx.data(), rows, C, nullptr, o.mean.data(),
                           o.invstd.data(), o.dgamma.data(), o.dbeta.data(), ws.data(), s);
    return o;
  };
  const auto [one, many] = on_one_and_many([&] { return run(kFp32); });
  EXPECT_TRUE(one == many);
  const Out ref = run(kFp64);
  auto near = [](const std::vector<float>& a, const std::vector<float>& b, double rel, const char* what) {
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_LE(std::fabs(a[i] - b[i]), rel * std::max(1.0, std::fabs(static_cast<double>(b[i])))) << what << " " << i;
  };
  near(one.mean, ref.mean, 1e-7, "mean");
  near(one.var, ref.var, 1e-6, "var");
  near(one.invstd, ref.invstd, 1e-6, "invstd");
  near(one.dbeta, ref.dbeta, 1e-7, "dbeta");
  near(one.dgamma, ref.dgamma, 1e-7, "dgamma");
  near(one.dx, ref.dx, 1e-5, "dx");
}

// conv2d's filter gradient (its own first stage, with products): fp32 near fp64 and thread-free.
TEST(ReductionFp32, ConvFilterGradMatchesFp64AndIsThreadFree) {
  sk::WindowShape g;
  g.batch = 64, g.H = 28, g.W = 28, g.C = 3, g.kh = 3, g.kw = 3, g.pt = 1, g.pl = 1, g.Ho = 28, g.Wo = 28;
  const size_t filters = 8, cols = g.col_width() * filters;
  const auto x = kref::randn(g.batch * g.H * g.W * g.C, 46, 1.f, 2.f);
  const auto dy = kref::randn(g.positions() * filters, 47, 1.f);
  std::vector<double> ws(sk::conv_filter_grad_workspace(g, filters));
  auto run = [&](sk::Stream s) {
    std::vector<float> dw(cols);
    sk::conv_filter_grad(x.data(), dy.data(), g, filters, dw.data(), ws.data(), s);
    return dw;
  };
  const auto [one, many] = on_one_and_many([&] { return run(kFp32); });
  EXPECT_EQ(one, many);
  const auto ref = run(kFp64);
  for (size_t i = 0; i < cols; ++i) EXPECT_NEAR(one[i], ref[i], 1e-6 * std::max(1.f, std::fabs(ref[i]))) << i;
}

// Layer normalization's parameter gradients and bias_grad on the same footing.
TEST(ReductionFp32, LayerNormAndBiasGradsMatchFp64AndAreThreadFree) {
  const size_t rows = 4096, F = 64;
  const auto x = kref::randn(rows * F, 48, 1.f, 5.f), dy = kref::randn(rows * F, 49, 1.f);
  std::vector<float> mean(rows), invstd(rows), y(rows * F);
  sk::layer_norm_forward(x.data(), y.data(), rows, F, nullptr, nullptr, 1e-5f, mean.data(), invstd.data());
  std::vector<double> ws(sk::reduce_workspace(rows, F));
  auto run = [&](sk::Stream s) {
    std::vector<float> dgamma(F), dbeta(F), dbias(F);
    sk::layer_norm_backward(x.data(), dy.data(), nullptr, rows, F, nullptr, mean.data(), invstd.data(),
                            dgamma.data(), dbeta.data(), ws.data(), s);
    sk::bias_grad(dy.data(), rows, F, dbias.data(), ws.data(), s);
    dgamma.insert(dgamma.end(), dbeta.begin(), dbeta.end());
    dgamma.insert(dgamma.end(), dbias.begin(), dbias.end());
    return dgamma;
  };
  const auto [one, many] = on_one_and_many([&] { return run(kFp32); });
  EXPECT_EQ(one, many);
  const auto ref = run(kFp64);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(one[i], ref[i], 1e-6 * std::max(1.f, std::fabs(ref[i]))) << i;
}

// Gradient clipping's norms (blocks of 4096 squares, then the blocks, then the variables):
// global_clipnorm and clipnorm from fp32's norms within float rounding of fp64's, thread-free.
TEST(ReductionFp32, ClippingNormsMatchFp64AndAreThreadFree) {
  const std::vector<size_t> sizes = {10'000, 3, 70'000};
  const std::vector<uint64_t> table = sk::clip_table(sizes);
  sk::ClipLayout l{table.data(), static_cast<uint32_t>(sizes.size()), table[2 * sizes.size() + 1], 0};
  for (size_t n : sizes) l.size += n;
  const auto grad = kref::randn(l.size, 50, 3.f, 1.f);
  const double samples = 32.0;
  std::vector<double> ws(sk::clip_workspace(l));
  for (const sk::ClipConfig c : {sk::ClipConfig{0.0, 1.0}, sk::ClipConfig{1.0, 0.0}}) {
    auto run = [&](sk::Stream s) {
      auto g = grad;
      sk::clip_gradients(g.data(), l, c, &samples, ws.data(), s);
      return g;
    };
    const auto [one, many] = on_one_and_many([&] { return run(kFp32); });
    EXPECT_EQ(one, many);
    const auto ref = run(kFp64);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(one[i], ref[i], 1e-6 * std::fabs(ref[i]) + 1e-12) << i;
  }
}

}  // namespace
