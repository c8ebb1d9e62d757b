// reductions = "fp32" (docs/kernels.md, "Reductions"; the plugin's `reductions` option) in the
// cuda engine's host build: the Device's stream carries it, and the main job's MLP and convnet
// (BatchNorm, conv2d filter gradients, bias gradients all reduce) train as with fp64 to a
// float's rounding, every run repeating bit for bit.
#include "common.hpp"

#include <cmath>
#include <cstdio>
#include <utility>

using namespace cuda_test;
namespace cu = skyforge::cuda;
namespace sk = skyforge::kernels;

namespace {

struct Trained {
  std::vector<double> losses;
  std::vector<float> weights;
};

Trained train(const ModelSpec& m, cu::DeviceOptions::Reductions r, int steps) {
  cu::EngineOptions o;
  o.reductions = r;
  auto e = cu::make_engine(m, skyforge::Communicator{}, skyforge::Host{}, o);
  Trained out;
  for (int s = 0; s < steps; ++s) {
    const Batch b = make_batch(900 + s, 32, features(m));
    out.losses.push_back(e->train_step(b.x.data(), b.y.data(), 32).loss);
  }
  out.weights = params_of(*e);
  return out;
}

}  // namespace

// The option reaches the kernels through the Device's stream; the host build's auto is fp64.
TEST(Reductions, TheDevicesStreamCarriesTheMode) {
  using R = cu::DeviceOptions::Reductions;
  using M = sk::Reduction;
  for (const auto& [option, mode] : {std::pair{R::automatic, M::fp64}, std::pair{R::fp64, M::fp64},
                                     std::pair{R::fp32, M::fp32}}) {
    cu::DeviceOptions o;
    o.reductions = option;
    EXPECT_EQ(cu::Device(skyforge::Communicator{}, skyforge::Host{}, o).stream().reduction, mode);
  }
}

// 5 Adam steps of batch 32 each way: the losses and the weights within 1e-6 (relative, resp.
// absolute) of fp64's, and two fp32 runs equal bit for bit. (After 5 steps both modes' weights
// are still bit for bit the same here: a sum that both hold to 2^-44 rounds to the same float
// almost always; after 12 the convnet's differ by 4e-14.)
TEST(Reductions, Fp32TrainsTheMlpAndConvnetAsFp64DoesAndRepeatsBitForBit) {
  using R = cu::DeviceOptions::Reductions;
  for (const ModelSpec& m : {mlp(81), convnet(82)}) {
    const bool conv = m.layers.front().type == "conv2d";
    const int steps = 5;
    const Trained f64 = train(m, R::fp64, steps), f32 = train(m, R::fp32, steps), again = train(m, R::fp32, steps);
    double loss = 0;
    for (int s = 0; s < steps; ++s) loss = std::max(loss, std::fabs(f32.losses[s] - f64.losses[s]) / f64.losses[s]);
    const double weights = max_abs_diff(f32.weights, f64.weights);
    std::printf("%s, %d steps: fp32 reductions vs fp64: loss %.3g (relative), weights %.3g\n", conv ? "convnet" : "mlp",
                steps, loss, weights);
    EXPECT_LE(loss, 1e-6);
    EXPECT_LE(weights, 1e-6);
    EXPECT_EQ(f32.losses, again.losses);
    EXPECT_EQ(f32.weights, again.weights);
  }
}
