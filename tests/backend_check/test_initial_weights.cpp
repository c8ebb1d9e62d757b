// skyforge::initial_weights (sdk/include/skyforge/initial_weights.hpp): what every backend starts
// from, the SDK's promise that a seed means the same weights on every backend. Pinned by hash to
// the values the cpu backend drew with its own initialiser before it took the SDK's (the main
// job's weights did not change when it did), so a change to the function cannot pass unnoticed.
#include <gtest/gtest.h>

#include <skyforge/initial_weights.hpp>
#include <skyforge/keras_callbacks.hpp>  // fnv1a64

#include "helpers.hpp"  // tests/cpu_backend: model specs

namespace {

std::vector<float> sdk_weights(const skyforge::ModelSpec& m) {
  std::vector<skyforge::schema::LayerConfig> configs;
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const auto& given = m.layers[i].options.all();
    configs.push_back(skyforge::schema::parse(m.layers[i].type, {given.begin(), given.end()}, i));
  }
  return skyforge::initial_weights(m.input_shape, configs, m.seed);
}

std::vector<float> cpu_weights(const skyforge::ModelSpec& m) {
  auto e = skyforge::cpu::make_engine(m, skyforge::Communicator{});
  std::vector<float> p(e->param_count());
  e->get_params(p.data(), p.size());
  return p;
}

uint64_t hash(const std::vector<float>& w) {
  return skyforge::keras::fnv1a64(std::string_view(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float)));
}

}  // namespace

// The hashes of what InitialWeights.AreTheCpuBackendsBitForBit showed equal to the cpu backend's
// own initialiser (commit 2485c93, before that initialiser was removed).
TEST(InitialWeights, ArePinned) {
  EXPECT_EQ(hash(sdk_weights(cpu_test::mlp(1))), 0xb97364e623dd5faeull);
  EXPECT_EQ(hash(sdk_weights(cpu_test::convnet(42))), 0x5d9bb54615251979ull);
}

TEST(InitialWeights, AreTheCpuBackendsBitForBit) {
  using cpu_test::layer;
  for (uint64_t seed : {1u, 42u}) {
    EXPECT_EQ(sdk_weights(cpu_test::mlp(seed)), cpu_weights(cpu_test::mlp(seed))) << "mlp, seed " << seed;
    EXPECT_EQ(sdk_weights(cpu_test::convnet(seed)), cpu_weights(cpu_test::convnet(seed))) << "convnet, seed " << seed;
  }
  // Rectangular kernels, no bias, gamma and beta both learnt, a dense on rank-3 input.
  skyforge::ModelSpec m;
  m.input_shape = {7, 6, 2};
  m.layers = {layer("conv2d", {{"filters", "3"}, {"kernel_size", "3,2"}, {"use_bias", "false"}}),
              layer("batch_normalization"), layer("max_pooling2d", {{"pool_size", "2"}}),
              layer("dense", {{"units", "4"}}), layer("flatten"), layer("dense", {{"units", "5"}})};
  m.seed = 9;
  const auto w = sdk_weights(m);
  EXPECT_EQ(w, cpu_weights(m));
  EXPECT_EQ(w[3 * 2 * 2 * 3], 1.f);  // gamma after the kernel
}
