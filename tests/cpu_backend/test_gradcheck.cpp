// Finite-difference gradient checks of every cpu-backend layer and of the loss.
//
// The kernels are float32, so the checks are too: for a layer y = f(x; p) we take the scalar
// L = sum(r * y) with fixed random r (accumulated in double), compare the layer's backward
// (dy = r) against the central difference (L(v + eps) - L(v - eps)) / 2eps, eps = 1e-2, for
// every input and parameter element (strided down to ~250 per tensor), and accept
// |numeric - analytic| <= 2e-3 + 2e-2 * max(|numeric|, |analytic|). The float rounding of L
// (~1e-6 relative) divided by 2eps stays near 1e-4; the truncation error O(eps^2) is ~1e-4 for
// the smooth layers. Piecewise-linear layers (relu, max pooling) get inputs at least 3*eps away
// from their kinks and ties so the difference never crosses one.
#include "gradcheck.hpp"

#include <skyforge/kernels/philox.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

using namespace skyforge::cpu;
using namespace cpu_test;

namespace {

std::unique_ptr<Layer> make(const LayerSpec& s, const Shape& in) { return make_layer(s, in, 0, 1, 0); }

}  // namespace

TEST(GradCheck, DenseLinearWithBias) {
  auto l = make(layer("dense", {{"units", "5"}}), {7});
  auto c = check_layer(*l, 4, uniform(4 * 7, 1, -1, 1), true);
  EXPECT_EQ(c.params, 7u * 5 + 5);
  EXPECT_EQ(c.inputs, 28u);
}

TEST(GradCheck, DenseNoBias) {
  auto l = make(layer("dense", {{"units", "6"}, {"use_bias", "false"}}), {5});
  EXPECT_EQ(l->param_size(), 30u);
  check_layer(*l, 3, uniform(15, 2, -1, 1), true);
}

TEST(GradCheck, DenseRelu) {
  // Kernel, input and bias chosen so that no pre-activation lies within eps of zero.
  auto l = make(layer("dense", {{"units", "4"}, {"activation", "relu"}}), {3});
  std::vector<float> p = {0.5f, -0.4f, 0.3f, 0.7f, 0.2f, 0.6f, -0.5f, 0.1f, -0.3f, 0.2f, 0.4f, -0.6f,
                          0.05f, -0.05f, 0.1f, -0.1f};
  std::vector<float> x = {1.0f, 0.5f, -0.5f, -1.0f, 0.3f, 0.8f};
  std::vector<float> y(8);
  std::vector<float> g(p.size());
  l->bind(p.data(), g.data());
  l->forward(x.data(), y.data(), 2, true);
  check_layer(*l, 2, x, true, p);
}

TEST(GradCheck, DenseSoftmaxActivation) {
  auto l = make(layer("dense", {{"units", "5"}, {"activation", "softmax"}}), {4});
  check_layer(*l, 3, uniform(12, 3, -1, 1), true);
}

TEST(GradCheck, DenseOnLastAxisOfImage) {
  // Keras Dense on a rank-3 input acts on the last axis.
  auto l = make(layer("dense", {{"units", "3"}}), {2, 3, 4});
  EXPECT_EQ(l->out_shape, (Shape{2, 3, 3}));
  check_layer(*l, 2, uniform(2 * 24, 4, -1, 1), true);
}

TEST(GradCheck, Conv2dSameWithBias) {
  auto l = make(layer("conv2d", {{"filters", "3"}, {"kernel_size", "3"}, {"padding", "same"}}), {5, 5, 2});
  EXPECT_EQ(l->out_shape, (Shape{5, 5, 3}));
  check_layer(*l, 2, uniform(2 * 50, 5, -1, 1), true);
}

TEST(GradCheck, Conv2dValidNoBias) {
  auto l = make(layer("conv2d", {{"filters", "4"}, {"kernel_size", "2,3"}, {"use_bias", "false"}}), {5, 6, 2});
  EXPECT_EQ(l->out_shape, (Shape{4, 4, 4}));
  EXPECT_EQ(l->param_size(), 2u * 3 * 2 * 4);
  check_layer(*l, 2, uniform(2 * 60, 6, -1, 1), true);
}

TEST(GradCheck, Conv2dStride2Same) {
  // TF "same": out = ceil(7 / 2) = 4, total pad = (4 - 1) * 2 + 4 - 7 = 3, top 1 bottom 2.
  auto l = make(layer("conv2d", {{"filters", "2"}, {"kernel_size", "4"}, {"strides", "2"}, {"padding", "same"}}),
                {7, 7, 3});
  EXPECT_EQ(l->out_shape, (Shape{4, 4, 2}));
  check_layer(*l, 2, uniform(2 * 147, 7, -1, 1), true);
}

TEST(GradCheck, Conv2dStride2Valid) {
  auto l = make(layer("conv2d", {{"filters", "3"}, {"kernel_size", "3"}, {"strides", "(2, 2)"}}), {7, 8, 2});
  EXPECT_EQ(l->out_shape, (Shape{3, 3, 3}));
  check_layer(*l, 3, uniform(3 * 112, 8, -1, 1), true);
}

TEST(GradCheck, Conv2dOneByOne) {
  auto l = make(layer("conv2d", {{"filters", "3"}, {"kernel_size", "1"}}), {3, 3, 4});
  check_layer(*l, 2, uniform(2 * 36, 9, -1, 1), true);
}

TEST(GradCheck, Conv2dReluMatchesReference) {
  // Forward against a direct convolution (NHWC, Keras kernel layout, TF same padding).
  auto l = make(layer("conv2d", {{"filters", "2"}, {"kernel_size", "3"}, {"strides", "2"}, {"padding", "same"}}),
                {6, 5, 2});
  const uint32_t B = 2, H = 6, W = 5, C = 2, F = 2, K = 3, S = 2;
  const auto& o = l->out_shape;
  ASSERT_EQ(o, (Shape{3, 3, 2}));
  auto x = uniform(B * H * W * C, 10, -1, 1);
  std::vector<float> p(l->param_size()), g(p.size());
  p = uniform(p.size(), 3, -0.5f, 0.5f);
  p[p.size() - 1] = 0.25f;
  l->bind(p.data(), g.data());
  std::vector<float> y(B * numel(o));
  l->forward(x.data(), y.data(), B, false);
  const int pad_h = ((3 - 1) * S + K - H) / 2, pad_w = ((3 - 1) * S + K - W) / 2;
  for (uint32_t n = 0; n < B; ++n)
    for (uint32_t oh = 0; oh < 3; ++oh)
      for (uint32_t ow = 0; ow < 3; ++ow)
        for (uint32_t f = 0; f < F; ++f) {
          double s = p[K * K * C * F + f];
          for (uint32_t i = 0; i < K; ++i)
            for (uint32_t j = 0; j < K; ++j)
              for (uint32_t c = 0; c < C; ++c) {
                const int ih = static_cast<int>(oh * S + i) - pad_h, iw = static_cast<int>(ow * S + j) - pad_w;
                if (ih < 0 || iw < 0 || ih >= static_cast<int>(H) || iw >= static_cast<int>(W)) continue;
                s += static_cast<double>(x[((n * H + ih) * W + iw) * C + c]) * p[((i * K + j) * C + c) * F + f];
              }
          EXPECT_NEAR(y[((n * 3 + oh) * 3 + ow) * F + f], s, 1e-5);
        }
}

TEST(GradCheck, BatchNormTrain) {
  auto l = make(layer("batch_normalization"), {3, 2, 3});
  EXPECT_EQ(l->param_size(), 6u);
  check_layer(*l, 4, uniform(4 * 18, 12, -2, 3), true);
}

TEST(GradCheck, BatchNormTrainCenterOnly) {
  auto l = make(layer("batch_normalization", {{"scale", "false"}}), {5});
  EXPECT_EQ(l->param_size(), 5u);
  check_layer(*l, 6, uniform(30, 13, -1, 1), true);
}

TEST(GradCheck, BatchNormInferenceAndMovingStats) {
  auto l = make(layer("batch_normalization", {{"momentum", "0.5"}, {"epsilon", "0.01"}}), {2});
  std::vector<float> p = {2.f, 3.f, 0.5f, -1.f}, g(4);  // gamma, beta
  l->bind(p.data(), g.data());
  std::vector<float> x = {1, 10, 3, 20}, y(4);  // channel 0: {1, 3}, channel 1: {10, 20}
  l->forward(x.data(), y.data(), 2, true);
  // batch stats: mean {2, 15}, biased var {1, 25}
  EXPECT_NEAR(y[0], 2.f * (1 - 2) / std::sqrt(1.01f) + 0.5f, 1e-5);
  EXPECT_NEAR(y[3], 3.f * (20 - 15) / std::sqrt(25.01f) - 1.f, 1e-5);
  // moving = 0.5 * init + 0.5 * batch: mean {1, 7.5}, var {1, 13}
  l->forward(x.data(), y.data(), 2, false);
  EXPECT_NEAR(y[0], 2.f * (1 - 1) / std::sqrt(1.01f) + 0.5f, 1e-5);
  EXPECT_NEAR(y[1], 3.f * (10 - 7.5f) / std::sqrt(13.01f) - 1.f, 1e-5);
}

TEST(GradCheck, Relu) {
  auto l = make(layer("relu"), {4, 3});
  check_layer(*l, 3, away_from_zero(36, 14, 3 * kEps), true);
}

TEST(GradCheck, Softmax) {
  auto l = make(layer("softmax"), {2, 6});
  check_layer(*l, 2, uniform(24, 15, -2, 2), true);
}

TEST(GradCheck, DropoutFixedMask) {
  auto l = make(layer("dropout", {{"rate", "0.4"}}), {20});
  dropout_freeze_mask(*l, true);
  auto x = uniform(60, 16, -1, 1);
  check_layer(*l, 3, x, true);
  // Kept values are scaled by 1 / (1 - rate), dropped ones are 0, and roughly rate of them drop.
  std::vector<float> y(60);
  l->forward(x.data(), y.data(), 3, true);
  size_t dropped = 0;
  for (size_t i = 0; i < 60; ++i) {
    if (y[i] == 0.f) ++dropped;
    else EXPECT_NEAR(y[i], x[i] / 0.6f, 1e-6);
  }
  EXPECT_GT(dropped, 10u);
  EXPECT_LT(dropped, 40u);
  l->forward(x.data(), y.data(), 3, false);  // inference: identity
  EXPECT_EQ(y, x);
}

TEST(GradCheck, DropoutMasksAreThePhiloxFunctionOfSeedStepLayerAndRank) {
  auto l = make(layer("dropout", {{"rate", "0.5"}}), {64});
  auto x = uniform(2 * 64, 17, 1, 2);
  std::vector<float> a(2 * 64), b(2 * 64), c(2 * 64);
  l->begin_step(7, 0);
  l->forward(x.data(), a.data(), 2, true);
  l->begin_step(7, 1);
  l->forward(x.data(), b.data(), 2, true);
  EXPECT_NE(a, b);  // a fresh mask every step
  l->begin_step(7, 0);
  l->forward(x.data(), c.data(), 2, true);
  EXPECT_EQ(a, c);  // a function of (seed, step): no generator state
  // Element i is kept iff the kernels' dropout_keep says so (kernels/include/skyforge/kernels/
  // philox.hpp), the function the cuda engine's masks come from; make() builds layer 0, rank 0.
  const skyforge::kernels::DropoutKey key{7, 0, 0, 0};
  const uint32_t cut = skyforge::kernels::dropout_cut(0.5f);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i] != 0.f, skyforge::kernels::dropout_keep(key, i, cut)) << i;
}

TEST(GradCheck, MaxPoolingValid) {
  auto l = make(layer("max_pooling2d"), {5, 4, 2});
  EXPECT_EQ(l->out_shape, (Shape{2, 2, 2}));
  auto c = check_layer(*l, 2, distinct(2 * 40, 18, 3 * kEps), true);
  EXPECT_EQ(c.inputs, 80u);
}

TEST(GradCheck, MaxPoolingOverlappingSame) {
  auto l = make(layer("max_pooling2d", {{"pool_size", "3"}, {"strides", "2"}, {"padding", "same"}}), {5, 5, 2});
  EXPECT_EQ(l->out_shape, (Shape{3, 3, 2}));
  check_layer(*l, 2, distinct(2 * 50, 19, 3 * kEps), true);
}

TEST(GradCheck, GlobalAveragePooling) {
  auto l = make(layer("global_average_pooling2d"), {3, 4, 5});
  EXPECT_EQ(l->out_shape, (Shape{5}));
  check_layer(*l, 2, uniform(2 * 60, 20, -1, 1), true);
}

TEST(GradCheck, Flatten) {
  auto l = make(layer("flatten"), {2, 3, 2});
  EXPECT_EQ(l->out_shape, (Shape{12}));
  check_layer(*l, 2, uniform(24, 21, -1, 1), true);
}

TEST(GradCheck, SparseCrossEntropyFromLogits) {
  const uint32_t B = 4, K = 6;
  auto z = uniform(B * K, 22, -3, 3);
  std::vector<int32_t> y = {0, 5, 2, 2};
  std::vector<float> dz(B * K);
  uint64_t correct = 0;
  const double loss = sparse_xent(z.data(), y.data(), B, K, dz.data(), &correct, Exec{1});
  double ref = 0;
  uint64_t ref_correct = 0;
  for (uint32_t n = 0; n < B; ++n) {
    double s = 0;
    size_t am = 0;
    for (uint32_t j = 0; j < K; ++j) {
      s += std::exp(static_cast<double>(z[n * K + j]));
      if (z[n * K + j] > z[n * K + am]) am = j;
    }
    ref += std::log(s) - z[n * K + y[n]];
    ref_correct += am == static_cast<size_t>(y[n]);
  }
  EXPECT_NEAR(loss, ref, 1e-5);
  EXPECT_EQ(correct, ref_correct);
  for (size_t i = 0; i < z.size(); ++i) {
    auto zp = z;
    zp[i] = z[i] + kEps;
    const double lp = sparse_xent(zp.data(), y.data(), B, K, nullptr, nullptr, Exec{1});
    zp[i] = z[i] - kEps;
    const double lm = sparse_xent(zp.data(), y.data(), B, K, nullptr, nullptr, Exec{1});
    const double num = (lp - lm) / (2.0 * kEps);
    EXPECT_TRUE(close(num, dz[i])) << "dlogits[" << i << "]: numeric " << num << " analytic " << dz[i];
  }
}

TEST(GradCheck, CrossEntropyIsStableForHugeLogits) {
  std::vector<float> z = {1000.f, -1000.f, 0.f};
  std::vector<int32_t> y = {1};
  std::vector<float> dz(3);
  const double loss = sparse_xent(z.data(), y.data(), 1, 3, dz.data(), nullptr, Exec{1});
  EXPECT_NEAR(loss, 2000.0, 1e-3);
  EXPECT_NEAR(dz[0], 1.f, 1e-6);
  EXPECT_NEAR(dz[1], -1.f, 1e-6);
}

// The whole engine (conv same/stride 2 + BN + relu + max pool + flatten + dense): the mean
// gradient it reports against differences of its own training-mode loss.
TEST(GradCheck, EngineEndToEnd) {
  ModelSpec m;
  m.input_shape = {6, 6, 2};
  m.layers = {layer("conv2d", {{"filters", "3"}, {"kernel_size", "3"}, {"strides", "2"}, {"padding", "same"}}),
              layer("batch_normalization"), layer("relu"), layer("max_pooling2d", {{"pool_size", "2"}}),
              layer("flatten"), layer("dense", {{"units", "4"}})};
  m.seed = 5;
  m.threads = 2;
  CpuEngine e(m, skyforge::Communicator());
  const uint32_t B = 5;
  auto x = uniform(B * 72, 23, -1, 1);
  std::vector<int32_t> y = {0, 1, 2, 3, 1};
  std::vector<float> grads, scratch;
  e.gradients(x.data(), y.data(), B, grads);
  std::vector<float> p(e.param_count());
  e.get_params(p.data(), p.size());
  const float eps = 1e-2f;
  size_t bad = 0;
  for (size_t j = 0; j < p.size(); ++j) {
    auto q = p;
    q[j] = p[j] + eps;
    e.set_params(q.data(), q.size());
    const double lp = e.gradients(x.data(), y.data(), B, scratch).loss;
    q[j] = p[j] - eps;
    e.set_params(q.data(), q.size());
    const double lm = e.gradients(x.data(), y.data(), B, scratch).loss;
    const double num = (lp - lm) / (2.0 * eps);
    // Kinks of relu / max pooling may sit within eps of a few parameters: allow a handful.
    if (std::fabs(num - grads[j]) > 2e-3 + 5e-2 * std::max(std::fabs(num), std::fabs(double{grads[j]}))) ++bad;
  }
  EXPECT_LE(bad, p.size() / 50) << "of " << p.size() << " parameters";
}
