// The cuda engine's host build (backends/cuda) against the cpu backend, the reference engine:
// docs/compute-backends.md, "The cuda engine (in progress)", states the tolerances checked here.
#include "common.hpp"
#include "engine.hpp"

#include <cstdio>
#include <memory>

using namespace cuda_test;
using skyforge::Communicator;
using skyforge::Error;
namespace cu = skyforge::cuda;
namespace cpu = skyforge::cpu;

namespace {

// Documented in docs/compute-backends.md: after kSteps steps on the same batches the mean loss
// of every step agrees to kLossTol (relative) and every parameter to kParamTol (absolute).
constexpr int kSteps = 20;
constexpr double kLossTol = 1e-5;
constexpr double kParamTol = 1e-5;

ModelSpec bn_model(uint64_t seed) {
  // dense on a rank-3 input (a batch of rows), batch_normalization with a fused relu, a softmax
  // layer, flatten and a last dense: every layer kind of the engine but dropout.
  ModelSpec m;
  m.input_shape = {6, 5, 4};
  m.layers = {layer("dense", {{"units", "16"}}),
              layer("batch_normalization"),
              layer("relu"),
              layer("dense", {{"units", "8"}, {"use_bias", "false"}}),
              layer("softmax"),
              layer("flatten"),
              layer("dense", {{"units", "10"}})};
  m.seed = seed;
  return m;
}

size_t features(const ModelSpec& m) {
  size_t n = 1;
  for (uint32_t d : m.input_shape) n *= d;
  return n;
}

struct Agreement {
  double loss = 0, params = 0;  // worst relative loss difference, final max |param difference|
};

// Trains the cpu backend and the cuda engine on the same batches and measures how far they drift.
Agreement train_both(const ModelSpec& spec, int steps, uint32_t batch) {
  auto c = cpu::make_engine(spec, Communicator{});
  auto g = cu::make_engine(spec, Communicator{});
  const std::vector<float> initial = params_of(*g);
  EXPECT_EQ(params_of(*c), initial);
  Agreement a;
  for (int s = 0; s < steps; ++s) {
    const Batch b = make_batch(100 + s, batch, features(spec));
    const auto rc = c->train_step(b.x.data(), b.y.data(), batch);
    const auto rg = g->train_step(b.x.data(), b.y.data(), batch);
    EXPECT_EQ(rc.samples, rg.samples);
    EXPECT_NEAR(static_cast<double>(rc.correct), static_cast<double>(rg.correct), 1.0) << "step " << s;
    a.loss = std::max(a.loss, std::fabs(rc.loss - rg.loss) / std::max(1.0, std::fabs(rc.loss)));
  }
  a.params = max_abs_diff(params_of(*c), params_of(*g));
  EXPECT_GT(max_abs_diff(initial, params_of(*g)), 1e-3) << "training did not move the parameters";
  return a;
}

}  // namespace

TEST(CudaEngine, HostBuildIsTheHostBuild) {
  auto e = std::make_unique<cu::CudaEngine>(mlp(1), Communicator{});
  EXPECT_STREQ(e->build(), "host");
  EXPECT_STREQ(skyforge::kernels::build_name(), "host");
}

TEST(CudaEngine, InitialParamsEqualCpuBitForBit) {
  for (uint64_t seed : {1ull, 7ull, 123456789ull}) {
    for (const ModelSpec& spec : {mlp(seed), bn_model(seed)}) {
      auto c = cpu::make_engine(spec, Communicator{});
      auto g = cu::make_engine(spec, Communicator{});
      ASSERT_EQ(c->param_count(), g->param_count());
      const auto pc = params_of(*c), pg = params_of(*g);
      ASSERT_EQ(0, std::memcmp(pc.data(), pg.data(), pc.size() * sizeof(float))) << "seed " << seed;
    }
  }
  // A different seed gives different weights.
  EXPECT_NE(params_of(*cu::make_engine(mlp(1), Communicator{})), params_of(*cu::make_engine(mlp(2), Communicator{})));
}

TEST(CudaEngine, MlpTrainsLikeCpuAdam) {
  const Agreement a = train_both(mlp(3), kSteps, 64);
  std::printf("mlp adam: worst loss difference %.3g (relative), params %.3g (absolute)\n", a.loss, a.params);
  EXPECT_LE(a.loss, kLossTol);
  EXPECT_LE(a.params, kParamTol);
}

TEST(CudaEngine, MlpTrainsLikeCpuSgdNesterov) {
  ModelSpec m = mlp(4);
  m.optimizer = "sgd";
  m.optimizer_options = opts({{"learning_rate", "0.05"}, {"momentum", "0.9"}, {"nesterov", "true"}});
  const Agreement a = train_both(m, kSteps, 64);
  std::printf("mlp sgd: worst loss difference %.3g (relative), params %.3g (absolute)\n", a.loss, a.params);
  EXPECT_LE(a.loss, kLossTol);
  EXPECT_LE(a.params, kParamTol);
}

TEST(CudaEngine, BatchNormModelTrainsLikeCpu) {
  const Agreement a = train_both(bn_model(5), kSteps, 32);
  std::printf("bn model adam: worst loss difference %.3g (relative), params %.3g (absolute)\n", a.loss, a.params);
  EXPECT_LE(a.loss, kLossTol);
  EXPECT_LE(a.params, kParamTol);
}
