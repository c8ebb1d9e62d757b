// precision = "bf16" beside FP32, for the host build's tests (test_bf16.cpp) and the CUDA
// build's (test_engine_gpu.cpp): the same checks, each build's engine.
#pragma once

#include "common.hpp"

#include <skyforge/datasets.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace cuda_test {

inline skyforge::cuda::EngineOptions bf16_options() {
  skyforge::cuda::EngineOptions o;
  o.precision = skyforge::cuda::DeviceOptions::Precision::bf16;
  return o;
}

// Training in each precision on the same batches: the mean training loss of the last `tail`
// steps, as Keras' History reports an epoch's, and the weights.
struct Losses {
  double fp32 = 0, bf16 = 0;
  std::vector<float> weights_fp32, weights_bf16;
};
inline Losses train_each_way(const ModelSpec& m, const std::vector<Batch>& batches, uint32_t tail) {
  Losses r;
  for (int way = 0; way < 2; ++way) {
    auto e = skyforge::cuda::make_engine(m, skyforge::Communicator{}, skyforge::Host{},
                                         way ? bf16_options() : skyforge::cuda::EngineOptions{});
    double mean = 0;
    for (size_t s = 0; s < batches.size(); ++s) {
      const uint32_t n = static_cast<uint32_t>(batches[s].y.size());
      const double loss = e->train_step(batches[s].x.data(), batches[s].y.data(), n).loss;
      if (s >= batches.size() - tail) mean += loss / tail;
    }
    (way ? r.bf16 : r.fp32) = mean;
    (way ? r.weights_bf16 : r.weights_fp32) = params_of(*e);
  }
  return r;
}

// Fashion-MNIST's first steps * 32 training images in batches of 32 (x / 255), or none (with
// *why) when the dataset is not installed.
inline std::vector<Batch> fashion_batches(uint32_t steps, std::string* why) {
  skyforge::datasets::TrainTest data;
  try {
    data = skyforge::datasets::load_fashion_mnist();
  } catch (const std::exception& e) {
    *why = std::string(e.what()) + " (Debian: apt-get install dataset-fashion-mnist)";
    return {};
  }
  std::vector<Batch> out(steps);
  for (uint32_t s = 0; s < steps; ++s) {
    out[s].x.assign(data.train.x.begin() + s * 32 * 784, data.train.x.begin() + (s + 1) * 32 * 784);
    out[s].y.assign(data.train.y.begin() + s * 32, data.train.y.begin() + (s + 1) * 32);
  }
  return out;
}

// The main job's MLP, 1,000 steps of batch 32 each way: the mean loss of steps 901-1000 in bf16
// within 1% of FP32's, and other weights (the rounding is in the step, not a no-op).
inline void expect_main_jobs_mlp_within_one_percent(const char* build) {
  std::string why;
  const std::vector<Batch> batches = fashion_batches(1000, &why);
  if (batches.empty()) GTEST_SKIP() << why;
  const Losses r = train_each_way(mlp(71), batches, 100);
  std::printf("%s build, mlp on Fashion-MNIST, mean training loss of steps 901-1000: fp32 %.5f, bf16 %.5f (%+.2f%%)\n",
              build, r.fp32, r.bf16, 100 * (r.bf16 - r.fp32) / r.fp32);
  EXPECT_LT(r.fp32, 0.6) << "the model did not learn: the comparison would say little";
  EXPECT_LE(std::fabs(r.bf16 - r.fp32), 0.01 * r.fp32);
  EXPECT_NE(r.weights_fp32, r.weights_bf16);
}

// One SGD step at a time in bf16 from the cpu backend's FP32 state (8 steps of batch 32 of
// Fashion-MNIST-like data): the worst relative loss difference and the worst weight difference
// from the cpu backend's FP32 step.
inline std::pair<double, double> bf16_steps_beside_cpu(ModelSpec m) {
  m.optimizer = "sgd";
  m.optimizer_options = opts({{"learning_rate", "0.05"}, {"momentum", "0.9"}});
  auto c = skyforge::cpu::make_engine(m, skyforge::Communicator{});
  auto g = skyforge::cuda::make_engine(m, skyforge::Communicator{}, skyforge::Host{}, bf16_options());
  double loss = 0, weights = 0;
  for (int s = 0; s < 8; ++s) {
    const Batch b = make_batch(600 + s, 32, features(m));
    g->load_state(c->state_dict());
    const double lc = c->train_step(b.x.data(), b.y.data(), 32).loss;
    const double lg = g->train_step(b.x.data(), b.y.data(), 32).loss;
    loss = std::max(loss, std::fabs(lg - lc) / lc);
    weights = std::max(weights, max_abs_diff(params_of(*c), params_of(*g)));
  }
  return {loss, weights};
}

}  // namespace cuda_test
