// Dense-layer, loss, reduction and batch-normalization kernels of the host build against plain
// double references (reference.hpp), and their backward kernels against finite differences of
// those references.
#include "reference.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <stdexcept>

namespace sk = skyforge::kernels;
using kref::Activation;

namespace {

constexpr Activation kActs[] = {Activation::linear, Activation::relu, Activation::softmax};

const char* name(Activation a) {
  return a == Activation::relu ? "relu" : a == Activation::softmax ? "softmax" : "linear";
}

// Forward: float kernel vs double reference, relative error below 1e-5 of the output's scale.
TEST(BiasActivation, ForwardMatchesReference) {
  const size_t rows = 37, width = 19;
  const auto z = kref::randn(rows * width, 1, 2.f), b = kref::randn(width, 2);
  for (Activation act : kActs)
    for (bool with_bias : {false, true}) {
      auto y = z;
      sk::bias_activation_forward(y.data(), with_bias ? b.data() : nullptr, rows, width, act);
      const auto bd = kref::to_double(b);
      const auto ref = kref::bias_act(kref::to_double(z), with_bias ? &bd : nullptr, rows, width, act);
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_NEAR(y[i], ref[i], 1e-5 * (1 + std::abs(ref[i]))) << name(act) << " bias " << with_bias << " at " << i;
    }
}

// Backward: L = sum w * act(z + b); activation_backward(y, dy = w) gives dL/dz, bias_grad of it
// gives dL/db; both against central differences of the double reference.
TEST(BiasActivation, BackwardMatchesFiniteDifferences) {
  const size_t rows = 6, width = 7;
  const auto zf = kref::randn(rows * width, 3), bf = kref::randn(width, 4), wf = kref::randn(rows * width, 5);
  for (Activation act : kActs) {
    auto y = zf;
    sk::bias_activation_forward(y.data(), bf.data(), rows, width, act);
    auto dz = wf;
    sk::activation_backward(y.data(), dz.data(), rows, width, act);
    std::vector<float> db(width);
    std::vector<double> ws(sk::reduce_workspace(rows, width));
    sk::bias_grad(dz.data(), rows, width, db.data(), ws.data());

    auto z = kref::to_double(zf), b = kref::to_double(bf);
    const auto w = kref::to_double(wf);
    auto loss = [&] { return kref::dot(w, kref::bias_act(z, &b, rows, width, act)); };
    for (size_t i = 0; i < z.size(); ++i) {
      if (act == Activation::relu && std::abs(z[i] + b[i % width]) < 1e-4) continue;  // at the kink
      ASSERT_NEAR(dz[i], kref::fd(z, i, loss), 1e-4) << name(act) << " dz " << i;
    }
    for (size_t j = 0; j < width; ++j) ASSERT_NEAR(db[j], kref::fd(b, j, loss), 1e-4) << name(act) << " db " << j;
  }
}

// bias_grad over many rows (several partials per column) vs a double column sum.
TEST(BiasGrad, ColumnSumsOfManyRows) {
  const size_t rows = 5000, width = 13;
  const auto dy = kref::randn(rows * width, 6);
  std::vector<float> db(width);
  std::vector<double> ws(sk::reduce_workspace(rows, width));
  sk::bias_grad(dy.data(), rows, width, db.data(), ws.data());
  for (size_t j = 0; j < width; ++j) {
    double s = 0;
    for (size_t r = 0; r < rows; ++r) s += dy[r * width + j];
    EXPECT_FLOAT_EQ(db[j], static_cast<float>(s));
  }
}

TEST(Reduce, SumAndSumOfSquares) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{100000}, size_t{1000003}}) {
    const auto x = kref::randn(n, 7, 1.f, 0.5f);
    double ref = 0, ref2 = 0;
    for (float v : x) {
      ref += v;
      ref2 += static_cast<double>(v) * v;
    }
    std::vector<double> ws(sk::reduce_workspace(n, 1));
    double s = -1, s2 = -1;
    sk::reduce_sum(x.data(), n, &s, ws.data());
    sk::reduce_sum_squares(x.data(), n, &s2, ws.data());
    EXPECT_NEAR(s, ref, 1e-9 * (1 + std::abs(ref))) << n;
    EXPECT_NEAR(s2, ref2, 1e-9 * (1 + ref2)) << n;
  }
  EXPECT_THROW(sk::reduce_sum(nullptr, 4, nullptr, nullptr), std::invalid_argument);
}

// A BatchNorm-shaped column sum: many rows, few columns (12 channels of a [1024, 28, 28] batch
// in channels-last order). The split spreads stage 1 over enough calls to fill a GPU, the middle
// stages take turns in the workspace, the sums equal a plain double sum to rounding, and the
// bits depend on the shape alone: the same with 1 and with several threads.
TEST(Reduce, ManyRowsFewColumnsSpreadWideAndStayExact) {
  const size_t rows = size_t{1024} * 28 * 28, C = 12;
  EXPECT_GE(sk::reduce_split(rows, C) * C, sk::kReduceCalls - C);  // not 1024 * 12, as a split by rows alone gave
  EXPECT_GT(sk::reduce_split(rows, C), sk::kReduceFanIn * sk::kReduceFanIn);  // two middle stages
  const auto x = kref::randn(rows * C, 11, 1.f, 0.25f);
  std::vector<double> ref(C, 0.0);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < C; ++c) ref[c] += x[r * C + c];
  std::vector<double> ws(sk::reduce_workspace(rows, C));
  auto grad = [&](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> db(C, -1.f);
    sk::bias_grad(x.data(), rows, C, db.data(), ws.data());
    omp_set_num_threads(before);
    return db;
  };
  const std::vector<float> one = grad(1), many = grad(std::max(2, omp_get_max_threads()));
  EXPECT_EQ(one, many);
  for (size_t c = 0; c < C; ++c) EXPECT_EQ(one[c], static_cast<float>(ref[c])) << c;  // double sums of 800k floats: rounding to float hides the order
}

// A workspace sized for a batch serves every smaller one (the engines size it once, for their
// largest batch): reduce_workspace never decreases in rows.
TEST(Reduce, WorkspaceNeverShrinksWithMoreRows) {
  for (size_t cols : {size_t{1}, size_t{3}, size_t{12}, size_t{256}, size_t{5000}}) {
    size_t last = 0;
    for (size_t rows = 0; rows < (size_t{1} << 22); rows = rows * 5 / 4 + 1) {
      const size_t w = sk::reduce_workspace(rows, cols);
      ASSERT_GE(w, last) << rows << " rows, " << cols << " cols";
      last = w;
    }
  }
}

// Loss per row, hits (first argmax wins, ties included) and the gradient of sum(loss) by
// finite differences; a label outside [0, classes) gives NaN, no hit and a zero gradient row.
TEST(SoftmaxXent, LossHitsAndGradient) {
  const size_t rows = 9, classes = 5;
  auto lf = kref::randn(rows * classes, 8, 3.f);
  std::vector<int32_t> labels = {0, 1, 2, 3, 4, 4, 3, 2, 1};
  lf[8 * classes + 1] = lf[8 * classes + 3] = 50.f;  // row 8: a tie at classes 1 and 3, label 1
  std::vector<float> loss(rows), hit(rows), d(rows * classes);
  sk::softmax_xent(lf.data(), labels.data(), rows, classes, loss.data(), hit.data(), d.data());

  auto l = kref::to_double(lf);
  const auto ref = kref::xent(l, labels, rows, classes);
  for (size_t n = 0; n < rows; ++n) {
    EXPECT_NEAR(loss[n], ref[n], 1e-5 * (1 + ref[n])) << n;
    size_t am = 0;
    for (size_t j = 1; j < classes; ++j)
      if (lf[n * classes + j] > lf[n * classes + am]) am = j;
    EXPECT_EQ(hit[n], am == static_cast<size_t>(labels[n]) ? 1.f : 0.f) << n;
  }
  EXPECT_EQ(hit[8], 1.f);
  auto total = [&] {
    double s = 0;
    for (double v : kref::xent(l, labels, rows, classes)) s += v;
    return s;
  };
  for (size_t i = 0; i < l.size(); ++i) ASSERT_NEAR(d[i], kref::fd(l, i, total), 1e-5) << i;

  std::vector<int32_t> bad = {0, 5, -1};
  sk::softmax_xent(lf.data(), bad.data(), 3, classes, loss.data(), hit.data(), d.data());
  EXPECT_FALSE(std::isnan(loss[0]));
  for (size_t n : {1, 2}) {
    EXPECT_TRUE(std::isnan(loss[n]));
    EXPECT_EQ(hit[n], 0.f);
    for (size_t j = 0; j < classes; ++j) EXPECT_EQ(d[n * classes + j], 0.f);
  }
}

struct BnCase {
  size_t rows, C;
  bool gamma, beta, relu;
};

// Training forward (batch mean, biased variance), the moving update, inference with the
// moving statistics, and the backward by finite differences of L = sum w * BN(x).
void batchnorm_case(const BnCase& p) {
  const size_t rows = p.rows, C = p.C;
  const float eps = 1e-3f, momentum = 0.9f;
  const auto xf = kref::randn(rows * C, 10, 2.f, 1.f), gf = kref::randn(C, 11, 0.5f, 1.f), bf = kref::randn(C, 12);
  const auto wf = kref::randn(rows * C, 13);
  const float* gamma = p.gamma ? gf.data() : nullptr;
  const float* beta = p.beta ? bf.data() : nullptr;

  std::vector<float> y(rows * C), mean(C), var(C), invstd(C);
  std::vector<double> ws(sk::reduce_workspace(rows, C));
  sk::batchnorm_forward_training(xf.data(), y.data(), rows, C, gamma, beta, eps, p.relu, mean.data(), var.data(),
                                 invstd.data(), ws.data());
  auto x = kref::to_double(xf), g = kref::to_double(gf), b = kref::to_double(bf);
  if (!p.gamma) g.assign(C, 1.0);
  if (!p.beta) b.assign(C, 0.0);
  const auto ref = kref::batchnorm(x, rows, C, g, b, eps, p.relu);
  for (size_t c = 0; c < C; ++c) {
    EXPECT_NEAR(mean[c], ref.mean[c], 1e-5 * (1 + std::abs(ref.mean[c])));
    EXPECT_NEAR(var[c], ref.var[c], 1e-5 * (1 + ref.var[c]));
    EXPECT_NEAR(invstd[c], 1 / std::sqrt(ref.var[c] + eps), 1e-5);
  }
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref.y[i], 1e-5 * (1 + std::abs(ref.y[i]))) << i;

  // moving = moving * momentum + batch * (1 - momentum), then inference normalises with it.
  std::vector<float> mm(C, 0.25f), mv(C, 2.f);
  sk::batchnorm_update_moving(mm.data(), mv.data(), mean.data(), var.data(), C, momentum);
  for (size_t c = 0; c < C; ++c) {
    EXPECT_NEAR(mm[c], 0.25 * 0.9 + ref.mean[c] * 0.1, 1e-6 * (1 + std::abs(ref.mean[c])));
    EXPECT_NEAR(mv[c], 2.0 * 0.9 + ref.var[c] * 0.1, 1e-6 * (1 + ref.var[c]));
  }
  std::vector<float> yi(rows * C);
  sk::batchnorm_forward_inference(xf.data(), yi.data(), rows, C, gamma, beta, eps, p.relu, mm.data(), mv.data());
  for (size_t i = 0; i < yi.size(); ++i) {
    const size_t c = i % C;
    double v = g[c] * (x[i] - mm[c]) / std::sqrt(static_cast<double>(mv[c]) + eps) + b[c];
    if (p.relu) v = std::max(v, 0.0);
    ASSERT_NEAR(yi[i], v, 1e-5 * (1 + std::abs(v))) << i;
  }

  std::vector<float> dx(rows * C), dgamma(C, -7.f), dbeta(C, -7.f);
  sk::batchnorm_backward(xf.data(), p.relu ? y.data() : nullptr, wf.data(), dx.data(), rows, C, gamma, mean.data(),
                         invstd.data(), p.gamma ? dgamma.data() : nullptr, p.beta ? dbeta.data() : nullptr, ws.data());
  const auto w = kref::to_double(wf);
  auto loss = [&] { return kref::dot(w, kref::batchnorm(x, rows, C, g, b, eps, p.relu).y); };
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t c = i % C;
    if (p.relu && std::abs(g[c] * (x[i] - ref.mean[c]) / std::sqrt(ref.var[c] + eps) + b[c]) < 1e-4) continue;  // kink
    ASSERT_NEAR(dx[i], kref::fd(x, i, loss), 2e-4 * (1 + std::abs(dx[i]))) << "dx " << i;
  }
  for (size_t c = 0; c < C; ++c) {
    if (p.gamma) EXPECT_NEAR(dgamma[c], kref::fd(g, c, loss), 2e-4 * (1 + std::abs(dgamma[c]))) << "dgamma " << c;
    else EXPECT_EQ(dgamma[c], -7.f);
    if (p.beta) EXPECT_NEAR(dbeta[c], kref::fd(b, c, loss), 2e-4 * (1 + std::abs(dbeta[c]))) << "dbeta " << c;
    else EXPECT_EQ(dbeta[c], -7.f);
  }

  // dx may be dy's buffer.
  auto inplace = wf;
  sk::batchnorm_backward(xf.data(), p.relu ? y.data() : nullptr, inplace.data(), inplace.data(), rows, C, gamma,
                         mean.data(), invstd.data(), nullptr, nullptr, ws.data());
  EXPECT_EQ(inplace, dx);
}

TEST(BatchNorm, ForwardBackwardAndMovingStatistics) {
  for (const BnCase& c : {BnCase{16, 3, true, true, false}, BnCase{200, 5, true, true, true},
                          BnCase{64, 4, false, true, false}, BnCase{1, 2, true, false, false},
                          BnCase{130, 1, false, false, true}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.C << " gamma " << c.gamma << " beta " << c.beta
                                      << " relu " << c.relu);
    batchnorm_case(c);
    if (HasFatalFailure()) return;
  }
}

TEST(BatchNorm, RejectsAnEmptyBatch) {
  std::vector<float> s(4);
  std::vector<double> ws(sk::reduce_workspace(1, 4));
  EXPECT_THROW(sk::batchnorm_forward_training(nullptr, nullptr, 0, 4, nullptr, nullptr, 1e-3f, false, s.data(),
                                              s.data(), s.data(), ws.data()),
               std::invalid_argument);
}

}  // namespace
