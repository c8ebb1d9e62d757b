// The SIMD kernels (simd.hpp) against a scalar reference with the numerics contract they
// promise: every output element is one fma chain, in a fixed order. Convolutions: over what
// im2col would hold (padding zeros included), the forward's chain over the window in (i, j, c)
// order, the weight gradient's over the output pixels of the batch in order. GEMM: over the
// reduction index. So the results must be bit-identical, for each instruction set the CPU has,
// whichever internal path a shape takes.
#include "cpu_ops.hpp"
#include "simd.hpp"

#include "helpers.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

using namespace skyforge::cpu;

namespace {

struct Case {
  size_t H, W, C, k, s, F;
  bool same;
};

simd::ConvGeom geometry(const Case& c) {
  const size_t Ho = c.same ? (c.H + c.s - 1) / c.s : (c.H - c.k) / c.s + 1;
  const size_t Wo = c.same ? (c.W + c.s - 1) / c.s : (c.W - c.k) / c.s + 1;
  const long ph = c.same ? std::max<long>(0, static_cast<long>((Ho - 1) * c.s + c.k) - static_cast<long>(c.H)) : 0;
  const long pw = c.same ? std::max<long>(0, static_cast<long>((Wo - 1) * c.s + c.k) - static_cast<long>(c.W)) : 0;
  return {c.H, c.W, c.C, c.k, c.k, c.s, c.s, static_cast<size_t>(ph / 2), static_cast<size_t>(pw / 2), Ho, Wo};
}

// f(m, t, xi) for every window entry inside the image, in col order: output pixel m (over the
// batch), tap t = (i, j, c), and the index xi of the input element it reads.
template <class F>
void for_each_window_entry(const simd::ConvGeom& g, size_t batch, F&& f) {
  size_t m = 0;
  for (size_t n = 0; n < batch; ++n)
    for (size_t oh = 0; oh < g.Ho; ++oh)
      for (size_t ow = 0; ow < g.Wo; ++ow, ++m)
        for (size_t i = 0; i < g.kh; ++i)
          for (size_t j = 0; j < g.kw; ++j) {
            const long ih = static_cast<long>(oh * g.sh + i) - static_cast<long>(g.pt);
            const long iw = static_cast<long>(ow * g.sw + j) - static_cast<long>(g.pl);
            if (ih < 0 || iw < 0 || ih >= static_cast<long>(g.H) || iw >= static_cast<long>(g.W)) continue;
            for (size_t c = 0; c < g.C; ++c)
              f(m, (i * g.kw + j) * g.C + c, ((n * g.H + static_cast<size_t>(ih)) * g.W + static_cast<size_t>(iw)) * g.C + c);
          }
}

// The im2col matrix [batch * Ho * Wo, kh * kw * C], zeros where a window leaves the image.
std::vector<float> im2col(const simd::ConvGeom& g, const std::vector<float>& x, size_t batch) {
  const size_t K = g.kh * g.kw * g.C;
  std::vector<float> col(batch * g.Ho * g.Wo * K, 0.f);
  for_each_window_entry(g, batch, [&](size_t m, size_t t, size_t xi) { col[m * K + t] = x[xi]; });
  return col;
}

std::vector<float> random(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  skyforge::Rng rng(seed);
  for (auto& e : v) e = uniform01(rng) - 0.5f;
  return v;
}

// f(table) under each kernel table this CPU has (AVX2, then AVX-512; simd::set_isa is
// process-wide), then the best one again.
template <class F>
void for_each_table(F&& f) {
  const simd::Isa best = simd::supported();
  for (simd::Isa isa : {simd::Isa::avx2, simd::Isa::avx512}) {
    if (isa > best) continue;
    simd::set_isa(isa);
    const simd::Kernels* sk = simd::kernels();
    ASSERT_NE(sk, nullptr);
    f(*sk);
  }
  simd::set_isa(best);
}

}  // namespace

TEST(SimdConv, ForwardAndGradientsAreTheIm2colChains) {
  const simd::Isa best = simd::supported();
  if (best == simd::Isa::none) GTEST_SKIP() << "this CPU has no AVX2+FMA: only the OpenBLAS path exists";
  // A grey first layer (the convnet's), strided and odd 'same' padding, several channels with a
  // filter count past two vectors (several column blocks), windows long enough for the in-place
  // and panel paths, and a stride past the window.
  const Case cases[] = {{28, 28, 1, 3, 1, 12, true}, {9, 7, 2, 3, 2, 20, true},  {10, 10, 3, 5, 1, 40, false},
                        {8, 8, 1, 2, 2, 7, true},    {12, 12, 24, 6, 2, 32, true}, {28, 28, 12, 6, 2, 24, false},
                        {9, 9, 3, 1, 2, 5, false}};  // (last: input pixels no window covers)
  const size_t batch = 3;
  for_each_table([&](const simd::Kernels& table) {
    const simd::Kernels* sk = &table;
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(sk->name) + ": " + std::to_string(c.H) + "x" + std::to_string(c.W) + "x" +
                   std::to_string(c.C) + " k" + std::to_string(c.k) + " s" + std::to_string(c.s) + " F" +
                   std::to_string(c.F) + (c.same ? " same" : " valid"));
      const simd::ConvGeom g = geometry(c);
      const size_t K = c.k * c.k * c.C, M = batch * g.Ho * g.Wo;
      const auto x = random(batch * c.H * c.W * c.C, 1), w = random(K * c.F, 2), dy = random(M * c.F, 3);
      const auto col = im2col(g, x, batch);
      std::vector<float> y_ref(M * c.F), dw_ref(K * c.F), dx_ref(x.size(), 0.f);
      for (size_t m = 0; m < M; ++m)
        for (size_t f = 0; f < c.F; ++f) {
          float acc = 0.f;
          for (size_t t = 0; t < K; ++t) acc = std::fma(col[m * K + t], w[t * c.F + f], acc);
          y_ref[m * c.F + f] = acc;
        }
      for (size_t t = 0; t < K; ++t)
        for (size_t f = 0; f < c.F; ++f) {
          float acc = 0.f;
          for (size_t m = 0; m < M; ++m) acc = std::fma(col[m * K + t], dy[m * c.F + f], acc);
          dw_ref[t * c.F + f] = acc;
        }
      // Input gradient: dcol = dy · W^T, one chain per element over the filters, then col2im adding
      // each dx element's window entries in output-pixel order, from 0.
      std::vector<float> wt(c.F * K);
      for (size_t t = 0; t < K; ++t)
        for (size_t f = 0; f < c.F; ++f) wt[f * K + t] = w[t * c.F + f];
      for_each_window_entry(g, batch, [&](size_t m, size_t t, size_t xi) {
        float acc = 0.f;
        for (size_t f = 0; f < c.F; ++f) acc = std::fma(dy[m * c.F + f], wt[f * K + t], acc);
        dx_ref[xi] += acc;
      });
      // Buffers as Conv2D sizes them (layers.cpp, panel_floats); the input gradient also with the
      // smallest panels it accepts.
      const size_t pf = std::max<size_t>((size_t{128} << 10) / sizeof(float), 24 * K + 16);
      std::vector<float> buf(pf), y(M * c.F, NAN), dw(K * c.F, NAN), scratch(K * c.F);
      for (size_t floats : {pf, 24 * K + 16}) {
        std::vector<float> dx(x.size(), NAN);
        sk->conv_dgrad(g, dy.data(), 0, batch, wt.data(), c.F, dx.data(), buf.data(), floats);
        for (size_t i = 0; i < dx.size(); ++i)
          ASSERT_EQ(0, std::memcmp(&dx[i], &dx_ref[i], sizeof(float)))
              << "input gradient element " << i << " (buffer of " << floats << " floats): " << dx[i] << " vs "
              << dx_ref[i];
      }
      sk->conv_fwd(g, x.data(), 0, batch, w.data(), c.F, y.data(), buf.data(), pf);
      // The weight gradient in two row ranges, as two threads would split it.
      sk->conv_wgrad(g, x.data(), batch, dy.data(), c.F, 0, K / 2, dw.data(), buf.data(), pf, scratch.data());
      sk->conv_wgrad(g, x.data(), batch, dy.data(), c.F, K / 2, K, dw.data(), buf.data(), pf, scratch.data());
      // The in-place forward skips window rows outside the image instead of adding zero products:
      // the same value but for an exact zero's sign, so compare values there, bits elsewhere.
      for (size_t i = 0; i < y.size(); ++i) {
        if (y_ref[i] == 0.f && y[i] == 0.f) continue;
        ASSERT_EQ(0, std::memcmp(&y[i], &y_ref[i], sizeof(float))) << "forward element " << i << ": " << y[i]
                                                                     << " vs " << y_ref[i];
      }
      for (size_t i = 0; i < dw.size(); ++i)
        ASSERT_EQ(0, std::memcmp(&dw[i], &dw_ref[i], sizeof(float))) << "weight gradient element " << i << ": "
                                                                       << dw[i] << " vs " << dw_ref[i];
    }
  });
}

TEST(SimdGemm, TilesAreTheFmaChains) {
  const simd::Isa best = simd::supported();
  if (best == simd::Isa::none) GTEST_SKIP() << "this CPU has no AVX2+FMA: only the OpenBLAS path exists";
  struct Shape {
    size_t M, N, K;
    bool ta, accumulate;
  };
  // The MLP's Dense GEMMs (forward, weight gradient), a half-vector width (pair tiles), ragged
  // edges, a reduction of one.
  const Shape shapes[] = {{64, 128, 784, false, false}, {784, 128, 64, true, false}, {13, 24, 50, false, true},
                          {7, 37, 19, true, true},       {30, 8, 1, false, false}};
  for_each_table([&](const simd::Kernels& table) {
    const simd::Kernels* sk = &table;
    for (const Shape& sh : shapes) {
      SCOPED_TRACE(std::string(sk->name) + ": " + std::to_string(sh.M) + "x" + std::to_string(sh.N) + "x" +
                   std::to_string(sh.K) + (sh.ta ? " A^T" : "") + (sh.accumulate ? " +=" : ""));
      const auto a = random(sh.M * sh.K, 4), b = random(sh.K * sh.N, 5), c0 = random(sh.M * sh.N, 6);
      // A is [M, K], or [K, M] read transposed.
      auto at = [&](size_t i, size_t t) { return sh.ta ? a[t * sh.M + i] : a[i * sh.K + t]; };
      std::vector<float> ref(sh.M * sh.N), c = c0;
      for (size_t i = 0; i < sh.M; ++i)
        for (size_t j = 0; j < sh.N; ++j) {
          float acc = 0.f;
          for (size_t t = 0; t < sh.K; ++t) acc = std::fma(at(i, t), b[t * sh.N + j], acc);
          ref[i * sh.N + j] = sh.accumulate ? c0[i * sh.N + j] + acc : acc;
        }
      sk->gemm(sh.M, sh.N, sh.K, a.data(), sh.ta ? 1 : sh.K, sh.ta ? sh.M : 1, b.data(), sh.N, c.data(), sh.N,
               sh.accumulate);
      ASSERT_EQ(0, std::memcmp(c.data(), ref.data(), c.size() * sizeof(float)));
    }
  });
}

// k::gemm routes a GEMM to the tiles or to OpenBLAS (cpu_ops.hpp): either way the engine's thread
// split must not change a bit, and the two must agree to rounding. Every table this CPU has, and
// the portable path (OpenBLAS alone); shapes split by rows and by columns, with ragged blocks.
TEST(SimdGemm, EngineGemmIsThreadCountInvariantAndAgreesWithOpenBlas) {
  const simd::Isa best = simd::supported();
  struct Shape {
    size_t M, N, K;
    bool ta;
  };
  const Shape shapes[] = {{200, 128, 784, false}, {64, 128, 784, false}, {784, 128, 64, true}, {1000, 40, 300, false},
                          {37, 900, 200, false}};
  for (simd::Isa isa : {simd::Isa::none, simd::Isa::avx2, simd::Isa::avx512}) {
    if (isa > best) continue;
    for (const Shape& sh : shapes) {
      SCOPED_TRACE(std::string(simd::isa_name(isa)) + ": " + std::to_string(sh.M) + "x" + std::to_string(sh.N) + "x" +
                   std::to_string(sh.K) + (sh.ta ? " A^T" : ""));
      const auto a = random(sh.M * sh.K, 7), b = random(sh.K * sh.N, 8);
      auto run = [&](simd::Isa table, int threads) {
        simd::set_isa(table);
        std::vector<float> c(sh.M * sh.N);
        k::gemm(sh.ta, false, sh.M, sh.N, sh.K, 1.f, a.data(), sh.ta ? sh.M : sh.K, b.data(), sh.N, 0.f, c.data(),
                sh.N, Exec{threads});
        return c;
      };
      const auto blas = run(simd::Isa::none, 1);
      const auto one = run(isa, 1);
      std::printf("k::gemm %zux%zux%zu with the %s table: %s, %zu block(s)\n", sh.M, sh.N, sh.K, simd::isa_name(isa),
                  k::tile_gemm(false, sh.N, sh.K, 1.f, 0.f) ? "register tiles" : "OpenBLAS",
                  k::gemm_blocks(std::max(sh.M, sh.N), sh.M, sh.N, sh.K));
      for (int threads : {2, 3, 4}) {
        const auto many = run(isa, threads);
        EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float))) << threads << " threads";
      }
      double worst = 0, largest = 0;
      for (size_t i = 0; i < blas.size(); ++i) {
        worst = std::max(worst, std::fabs(double{one[i]} - blas[i]));
        largest = std::max(largest, std::fabs(double{blas[i]}));
      }
      EXPECT_LT(worst, 1e-5 * largest);
    }
  }
  simd::set_isa(best);
}
