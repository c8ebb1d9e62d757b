// The transformer layers' kernels (norm.hpp, attention.hpp, embedding.hpp) through the host
// build: layer normalization against a double-precision reference and finite differences, the
// head layouts as exact permutations, the embeddings' forward and table gradients against plain
// loops (repeated and invalid indices included), and the replays of a recorded stream.
#include "reference.hpp"

#include <skyforge/kernels/embedding.hpp>

#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <stdexcept>

namespace sk = skyforge::kernels;

namespace {

// Row-wise layer normalization in double.
std::vector<double> layer_norm_ref(const std::vector<double>& x, size_t rows, size_t F, const std::vector<double>& g,
                                   const std::vector<double>& b, double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (size_t j = 0; j < F; ++j) m += x[r * F + j] / static_cast<double>(F);
    for (size_t j = 0; j < F; ++j) v += (x[r * F + j] - m) * (x[r * F + j] - m) / static_cast<double>(F);
    for (size_t j = 0; j < F; ++j) y[r * F + j] = g[j] * (x[r * F + j] - m) / std::sqrt(v + eps) + b[j];
  }
  return y;
}

struct LnCase {
  size_t rows, F;
  bool gamma, beta;
};

void layer_norm_case(const LnCase& p) {
  const size_t rows = p.rows, F = p.F;
  const float eps = 1e-3f;
  const auto xf = kref::randn(rows * F, 11, 2.f, 0.5f), wf = kref::randn(rows * F, 12);
  const auto gf = kref::randn(F, 13, 0.5f, 1.f), bf = kref::randn(F, 14);
  auto x = kref::to_double(xf);
  std::vector<double> g(F, 1.0), b(F, 0.0);
  if (p.gamma) g = kref::to_double(gf);
  if (p.beta) b = kref::to_double(bf);
  const float* gamma = p.gamma ? gf.data() : nullptr;
  const float* beta = p.beta ? bf.data() : nullptr;

  std::vector<float> y(rows * F), mean(rows), invstd(rows);
  sk::layer_norm_forward(xf.data(), y.data(), rows, F, gamma, beta, eps, mean.data(), invstd.data());
  const auto ref = layer_norm_ref(x, rows, F, g, b, eps);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 2e-5 * (1 + std::abs(ref[i]))) << i;

  std::vector<float> dx(rows * F), dgamma(F, -7.f), dbeta(F, -7.f);
  std::vector<double> ws(sk::reduce_workspace(rows, F));
  sk::layer_norm_backward(xf.data(), wf.data(), dx.data(), rows, F, gamma, mean.data(), invstd.data(),
                          p.gamma ? dgamma.data() : nullptr, p.beta ? dbeta.data() : nullptr, ws.data());
  const auto w = kref::to_double(wf);
  auto loss = [&] { return kref::dot(w, layer_norm_ref(x, rows, F, g, b, eps)); };
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(dx[i], kref::fd(x, i, loss), 2e-4 * (1 + std::abs(dx[i]))) << "dx " << i;
  for (size_t j = 0; j < F; ++j) {
    if (p.gamma) EXPECT_NEAR(dgamma[j], kref::fd(g, j, loss), 2e-4 * (1 + std::abs(dgamma[j]))) << "dgamma " << j;
    else EXPECT_EQ(dgamma[j], -7.f);
    if (p.beta) EXPECT_NEAR(dbeta[j], kref::fd(b, j, loss), 2e-4 * (1 + std::abs(dbeta[j]))) << "dbeta " << j;
    else EXPECT_EQ(dbeta[j], -7.f);
  }

  // dx may be dy's buffer.
  auto inplace = wf;
  sk::layer_norm_backward(xf.data(), inplace.data(), inplace.data(), rows, F, gamma, mean.data(), invstd.data(),
                          nullptr, nullptr, nullptr);
  EXPECT_EQ(inplace, dx);
}

TEST(LayerNorm, ForwardAndBackwardMatchTheReference) {
  for (const LnCase& c : {LnCase{7, 16, true, true}, LnCase{40, 5, true, false}, LnCase{3, 33, false, true},
                          LnCase{1, 1, false, false}, LnCase{300, 4, true, true}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.F << " gamma " << c.gamma << " beta " << c.beta);
    layer_norm_case(c);
    if (HasFatalFailure()) return;
  }
}

TEST(LayerNorm, SameBitsOnAnyThreadCount) {
  const size_t rows = 257, F = 48;
  const auto x = kref::randn(rows * F, 21, 3.f), dy = kref::randn(rows * F, 22), g = kref::randn(F, 23);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<float> y(rows * F), mean(rows), invstd(rows), dx(rows * F), dg(F), db(F);
    std::vector<double> ws(sk::reduce_workspace(rows, F));
    sk::layer_norm_forward(x.data(), y.data(), rows, F, g.data(), g.data(), 1e-3f, mean.data(), invstd.data());
    sk::layer_norm_backward(x.data(), dy.data(), dx.data(), rows, F, g.data(), mean.data(), invstd.data(), dg.data(),
                            db.data(), ws.data());
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dg.begin(), dg.end());
    y.insert(y.end(), db.begin(), db.end());
    return y;
  };
  const int keep = omp_get_max_threads();
  const auto one = run(1), four = run(4);
  omp_set_num_threads(keep);
  EXPECT_EQ(one, four);
}

TEST(Heads, SplitAndMergeArePermutations) {
  const size_t B = 3, S = 5, H = 4, D = 6;
  std::vector<float> x(B * S * H * D);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  std::vector<float> split(x.size()), back(x.size());
  sk::split_heads(x.data(), split.data(), B, S, H, D);
  for (size_t b = 0; b < B; ++b)
    for (size_t h = 0; h < H; ++h)
      for (size_t s = 0; s < S; ++s)
        for (size_t d = 0; d < D; ++d)
          ASSERT_EQ(split[((b * H + h) * S + s) * D + d], x[((b * S + s) * H + h) * D + d]);
  sk::merge_heads(split.data(), back.data(), B, S, H, D);
  EXPECT_EQ(back, x);
  EXPECT_THROW(sk::split_heads(x.data(), x.data(), B, S, H, D), std::invalid_argument);
}

TEST(Embedding, IndexRule) {
  EXPECT_EQ(sk::embedding_index(0.f, 5), 0);
  EXPECT_EQ(sk::embedding_index(4.f, 5), 4);
  EXPECT_EQ(sk::embedding_index(5.f, 5), -1);
  EXPECT_EQ(sk::embedding_index(-1.f, 5), -1);
  EXPECT_EQ(sk::embedding_index(1.5f, 5), -1);
  EXPECT_EQ(sk::embedding_index(NAN, 5), -1);
  EXPECT_EQ(sk::embedding_index(INFINITY, 5), -1);
  EXPECT_EQ(sk::embedding_index(16777216.f, size_t{1} << 30), -1);
}

TEST(Embedding, ForwardAndTableGradientWithRepeatsAndInvalidIndices) {
  const size_t V = 9, D = 5, rows = 60;
  std::vector<float> x(rows);
  for (size_t r = 0; r < rows; ++r) x[r] = static_cast<float>((r * 7 + r / 5) % V);
  x[3] = -1.f, x[17] = 9.f, x[40] = 2.5f;  // invalid
  const auto table = kref::randn(V * D, 31), dy = kref::randn(rows * D, 32);
  std::vector<float> y(rows * D, -7.f);
  std::vector<double> ws(sk::reduce_workspace(rows, 1));
  double invalid = -1;
  sk::embedding_forward(x.data(), table.data(), y.data(), rows, V, D, &invalid, ws.data());
  EXPECT_EQ(invalid, 3.0);
  for (size_t r = 0; r < rows; ++r) {
    const int64_t v = sk::embedding_index(x[r], V);
    for (size_t j = 0; j < D; ++j) ASSERT_EQ(y[r * D + j], v < 0 ? 0.f : table[static_cast<size_t>(v) * D + j]) << r;
  }
  x[3] = 0.f, x[17] = 8.f, x[40] = 2.f;
  sk::embedding_forward(x.data(), table.data(), y.data(), rows, V, D, &invalid, ws.data());
  EXPECT_EQ(invalid, 0.0);
  x[3] = -1.f, x[17] = 9.f, x[40] = 2.5f;

  std::vector<int32_t> iws(sk::embedding_backward_workspace(rows));
  std::vector<float> dtable(V * D, -7.f);
  sk::embedding_backward(x.data(), dy.data(), dtable.data(), rows, V, D, iws.data());
  std::vector<float> ref(V * D, 0.f);  // rows in order, in float: the kernel's sums exactly
  for (size_t r = 0; r < rows; ++r) {
    const int64_t v = sk::embedding_index(x[r], V);
    if (v >= 0)
      for (size_t j = 0; j < D; ++j) ref[static_cast<size_t>(v) * D + j] += dy[r * D + j];
  }
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(dtable[i], ref[i]) << i;

  // An index no row uses gets a zero row; the same bits on any thread count.
  std::vector<float> x1(rows, 4.f), d1(V * D), d4(V * D);
  const int keep = omp_get_max_threads();
  omp_set_num_threads(1);
  sk::embedding_backward(x1.data(), dy.data(), d1.data(), rows, V, D, iws.data());
  omp_set_num_threads(4);
  sk::embedding_backward(x1.data(), dy.data(), d4.data(), rows, V, D, iws.data());
  omp_set_num_threads(keep);
  EXPECT_EQ(d1, d4);
  for (size_t i = 0; i < d1.size(); ++i) {
    if (i / D == 4) continue;
    ASSERT_EQ(d1[i], 0.f) << i;
  }
}

TEST(PositionEmbedding, BroadcastAndBatchSumOfTheFirstRows) {
  const size_t B = 6, S = 4, L = 7, D = 3;
  const auto table = kref::randn(L * D, 41), dy = kref::randn(B * S * D, 42);
  std::vector<float> y(B * S * D);
  sk::position_embedding_forward(table.data(), y.data(), B, S, D);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], table[i % (S * D)]);
  std::vector<float> dtable(L * D, -7.f);
  std::vector<double> ws(sk::reduce_workspace(B, S * D));
  sk::position_embedding_backward(dy.data(), dtable.data(), B, S, L, D, ws.data());
  for (size_t i = 0; i < L * D; ++i) {
    double s = 0;
    if (i < S * D)
      for (size_t b = 0; b < B; ++b) s += dy[b * S * D + i];
    EXPECT_EQ(dtable[i], static_cast<float>(s)) << i;
  }
  EXPECT_THROW(sk::position_embedding_backward(dy.data(), dtable.data(), B, L + 1, L, D, ws.data()),
               std::invalid_argument);
}

TEST(TransformerKernels, RecordedOnAStreamAndReplayed) {
  const size_t rows = 10, F = 8;
  auto x = kref::randn(rows * F, 51);
  std::vector<float> y(rows * F), mean(rows), invstd(rows), pos(rows * F);
  const auto table = kref::randn(rows * F, 52);
  sk::HostRecording rec;
  const sk::Stream s{&rec};
  sk::layer_norm_forward(x.data(), y.data(), rows, F, nullptr, nullptr, 1e-3f, mean.data(), invstd.data(), s);
  sk::position_embedding_forward(table.data(), pos.data(), 1, rows, F, s);
  EXPECT_EQ(y, std::vector<float>(rows * F));  // recorded, not run
  rec.replay();
  EXPECT_EQ(pos, table);
  x[0] += 1.f;  // a replay reads the memory as it is then
  const auto before = y;
  rec.replay();
  EXPECT_NE(y, before);
}

}  // namespace
