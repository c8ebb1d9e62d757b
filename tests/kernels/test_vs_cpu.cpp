// The host build against the cpu backend's own kernels (backends/cpu, the reference engine of
// docs/compute-backends.md): the same operations in the same order give the same bits where
// both are plain float code (bias + activation, the loss gradient, Adam and SGD); batch
// normalization adds its double sums in another order, so it agrees to float rounding.
#include "../cpu_backend/helpers.hpp"
#include "cpu_ops.hpp"
#include "reference.hpp"

#include <gtest/gtest.h>

#include <cstring>

namespace sk = skyforge::kernels;
namespace cpu = skyforge::cpu;

namespace {

const cpu::Exec kOneThread{1};

TEST(VsCpu, BiasActivationForwardAndBackwardBitForBit) {
  const size_t rows = 33, width = 10;
  const auto z = kref::randn(rows * width, 1, 3.f), b = kref::randn(width, 2), w = kref::randn(rows * width, 3);
  for (int a = 0; a < 3; ++a) {
    auto y_k = z, y_c = z;
    sk::bias_activation_forward(y_k.data(), b.data(), rows, width, static_cast<sk::Activation>(a));
    cpu::k::bias_activation(y_c.data(), b.data(), rows, width, static_cast<cpu::Activation>(a), kOneThread);
    EXPECT_EQ(y_k, y_c) << "activation " << a;
    auto d_k = w, d_c = w;
    sk::activation_backward(y_k.data(), d_k.data(), rows, width, static_cast<sk::Activation>(a));
    cpu::k::activation_backward(y_c.data(), d_c.data(), rows, width, static_cast<cpu::Activation>(a), kOneThread);
    EXPECT_EQ(d_k, d_c) << "activation " << a;
    std::vector<float> db_k(width), db_c(width);
    std::vector<double> ws(sk::reduce_workspace(rows, width));
    sk::bias_grad(d_k.data(), rows, width, db_k.data(), ws.data());
    cpu::k::bias_grad(d_c.data(), rows, width, kOneThread, db_c.data());
    for (size_t j = 0; j < width; ++j) EXPECT_FLOAT_EQ(db_k[j], db_c[j]) << "activation " << a;
  }
}

TEST(VsCpu, SparseCrossEntropy) {
  const uint32_t rows = 70, classes = 10;
  const auto l = kref::randn(size_t{rows} * classes, 4, 4.f);
  std::vector<int32_t> labels(rows);
  for (uint32_t n = 0; n < rows; ++n) labels[n] = static_cast<int32_t>((n * 7) % classes);
  std::vector<float> loss(rows), hit(rows), d_k(l.size()), d_c(l.size());
  sk::softmax_xent(l.data(), labels.data(), rows, classes, loss.data(), hit.data(), d_k.data());
  std::vector<double> ws(sk::reduce_workspace(rows, 1));
  double sum = 0, hits = 0;
  sk::reduce_sum(loss.data(), rows, &sum, ws.data());
  sk::reduce_sum(hit.data(), rows, &hits, ws.data());
  uint64_t correct = 0;
  const double cpu_sum = cpu::sparse_xent(l.data(), labels.data(), rows, classes, d_c.data(), &correct, kOneThread);
  EXPECT_NEAR(sum, cpu_sum, 1e-12 * cpu_sum);  // the same per-row losses, added in another order
  EXPECT_EQ(hits, static_cast<double>(correct));
  EXPECT_EQ(d_k, d_c);
}

// The cpu backend keeps every parameter in one flat buffer; the kernels see it as tensors.
void optimizer_case(const cpu::OptimizerConfig& cfg) {
  const std::vector<size_t> sizes = {100, 10, 7, 2000};
  size_t n = 0;
  for (size_t s : sizes) n += s;
  cpu::OptimizerConfig constant = cfg;
  constant.schedule.rate = cfg.learning_rate;  // the cpu optimizer's rate is its schedule's
  cpu::Optimizer opt(constant, n);
  auto p_c = kref::randn(n, 5), p_k = p_c;
  std::vector<float> m(n, 0.f), v(n, 0.f), a(n, 0.f);
  std::vector<sk::OptimTensor> tensors;
  for (size_t off = 0, i = 0; i < sizes.size(); off += sizes[i++])
    tensors.push_back({p_k.data() + off, nullptr, m.data() + off, v.data() + off, sizes[i], a.data() + off});
  for (uint64_t step = 0; step < 6; ++step) {
    auto g = kref::randn(n, 100 + static_cast<uint32_t>(step));  // apply() clips in place (not here)
    size_t off = 0;
    for (auto& t : tensors) {
      t.grad = g.data() + off;
      off += t.size;
    }
    opt.apply(p_c.data(), g.data(), 0.5f, step, kOneThread);
    if (cfg.name == "adam" || cfg.name == "adamw")
      sk::adam_update(tensors.data(), tensors.size(),
                      {cfg.learning_rate, cfg.beta_1, cfg.beta_2, cfg.epsilon, cfg.weight_decay}, step, 0.5f);
    else if (cfg.name == "rmsprop")
      sk::rmsprop_update(tensors.data(), tensors.size(),
                         {cfg.learning_rate, cfg.rho, cfg.momentum, cfg.epsilon, cfg.centered}, 0.5f);
    else
      sk::sgd_update(tensors.data(), tensors.size(), {cfg.learning_rate, cfg.momentum, cfg.nesterov}, 0.5f);
  }
  EXPECT_EQ(p_k, p_c) << cfg.name << " momentum " << cfg.momentum << " nesterov " << cfg.nesterov;
  if (opt.slot_count() >= n) {
    EXPECT_EQ(0, std::memcmp(m.data(), opt.slots(), n * sizeof(float)));
  }
  if (opt.slot_count() >= 2 * n) {
    EXPECT_EQ(0, std::memcmp(v.data(), opt.slots() + n, n * sizeof(float)));
  }
  if (opt.slot_count() == 3 * n) {  // rmsprop, momentum and centered: the mean gradient third
    EXPECT_EQ(0, std::memcmp(a.data(), opt.slots() + 2 * n, n * sizeof(float)));
  }
}

TEST(VsCpu, OptimizersBitForBit) {
  cpu::OptimizerConfig adam;
  adam.learning_rate = 0.003;
  optimizer_case(adam);
  cpu::OptimizerConfig sgd;
  sgd.name = "sgd";
  sgd.learning_rate = 0.02;
  optimizer_case(sgd);
  sgd.momentum = 0.9;
  optimizer_case(sgd);
  sgd.nesterov = true;
  optimizer_case(sgd);
  cpu::OptimizerConfig adamw = adam;
  adamw.name = "adamw";
  adamw.weight_decay = 0.05;
  optimizer_case(adamw);
  cpu::OptimizerConfig rmsprop;
  rmsprop.name = "rmsprop";
  rmsprop.learning_rate = 0.01;
  optimizer_case(rmsprop);
  rmsprop.momentum = 0.5;
  rmsprop.centered = true;
  optimizer_case(rmsprop);
}

// The cpu backend's batch_normalization layer (built through make_layer) vs the kernels:
// training forward, moving statistics, backward, inference; with and without the fused ReLU.
TEST(VsCpu, BatchNormalizationLayer) {
  const uint32_t batch = 12;
  const size_t C = 6, rows = batch * 4 * 4;
  const float eps = 1e-3f, momentum = 0.9f;
  for (bool relu : {false, true}) {
    auto layer = cpu::make_layer(cpu_test::layer("batch_normalization", {{"momentum", "0.9"}}), {4, 4, 6}, 0, 1, 0);
    if (relu) {
      ASSERT_TRUE(layer->fuse_relu());
    }
    std::vector<float> params = kref::randn(2 * C, 6, 0.5f, 1.f), grads(2 * C);
    layer->bind(params.data(), grads.data());
    layer->reserve(batch);
    const auto x = kref::randn(rows * C, 7, 2.f, 0.5f), dy = kref::randn(rows * C, 8);
    std::vector<float> y_c(rows * C), dx_c(rows * C), dy_c = dy;
    layer->forward(x.data(), y_c.data(), batch, true);
    layer->backward(x.data(), y_c.data(), dy_c.data(), dx_c.data(), batch);
    std::vector<std::vector<float>*> moving;
    layer->moving(moving);
    ASSERT_EQ(moving.size(), 2u);
    const std::vector<float> mm_c = *moving[0], mv_c = *moving[1];

    const float* gamma = params.data();
    const float* beta = params.data() + C;
    std::vector<float> y_k(rows * C), mean(C), var(C), invstd(C), dx_k(rows * C), dg(C), db(C);
    std::vector<float> mm_k(C, 0.f), mv_k(C, 1.f);  // Keras' initial moving statistics
    std::vector<double> ws(sk::reduce_workspace(rows, C));
    sk::batchnorm_forward_training(x.data(), y_k.data(), rows, C, gamma, beta, eps, relu, mean.data(), var.data(),
                                   invstd.data(), ws.data());
    sk::batchnorm_update_moving(mm_k.data(), mv_k.data(), mean.data(), var.data(), C, momentum);
    sk::batchnorm_backward(x.data(), relu ? y_k.data() : nullptr, dy.data(), dx_k.data(), rows, C, gamma, mean.data(),
                           invstd.data(), dg.data(), db.data(), ws.data());
    auto near = [](const std::vector<float>& a, const std::vector<float>& b, float tol, const char* what) {
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << what << " " << i;
    };
    near(y_k, y_c, 1e-6f, "y");
    near(mm_k, mm_c, 1e-6f, "moving_mean");
    near(mv_k, mv_c, 1e-6f, "moving_variance");
    near(dx_k, dx_c, 1e-5f, "dx");
    near(dg, std::vector<float>(grads.begin(), grads.begin() + C), 1e-5f, "dgamma");
    near(db, std::vector<float>(grads.begin() + C, grads.end()), 1e-5f, "dbeta");

    std::vector<float> yi_c(rows * C), yi_k(rows * C);
    layer->forward(x.data(), yi_c.data(), batch, false);
    sk::batchnorm_forward_inference(x.data(), yi_k.data(), rows, C, gamma, beta, eps, relu, mm_k.data(), mv_k.data());
    near(yi_k, yi_c, 1e-6f, "inference y");
  }
}

}  // namespace
