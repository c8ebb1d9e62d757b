// Functional models (Model(inputs, outputs)) trained on the real cpu engine (real_parts.hpp): a
// residual net and a transformer block learn the 3-class synthetic problem, and a chain of calls
// trains exactly as its Sequential twin.
#include <skyforge/keras.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model_util.hpp"
#include "real_parts.hpp"

namespace K = skyforge::keras;
using namespace model_util;

namespace {
K::CompileOptions on_cpu(const real::CpuInstance& cpu) { return {.backend = cpu.backend(), .seed = 7, .threads = 1}; }
}  // namespace

TEST(KerasFunctionalFit, ResidualNetLearns) {
  real::CpuInstance cpu;
  auto inputs = K::Input({2, 3, 1});
  auto h = K::Dense(8, {.activation = "relu", .name = "hidden"})(K::Flatten()(inputs));
  auto r = K::Dense(8)(K::BatchNormalization()(K::Dense(8, {.activation = "gelu"})(h)));
  K::Model m(inputs, K::Dense(3)(K::Activation("tanh")(K::Add()({h, r}))));
  m.compile(K::Adam{0.02}, "sparse_categorical_crossentropy", {"accuracy"}, on_cpu(cpu));
  const Synthetic train = make_data(300, 1), val = make_data(90, 2);
  const K::History h1 = m.fit(train.x, train.y, quiet_fit(8, 30));
  EXPECT_LT(h1["loss"].back(), h1["loss"].front());
  EXPECT_GT(m.evaluate(val.x, val.y).accuracy, 0.9);
}

TEST(KerasFunctionalFit, TransformerBlockTrains) {
  real::CpuInstance cpu;
  auto inputs = K::Input({2, 3, 1});
  auto x = K::Dense(8)(K::Reshape({2, 3})(inputs));
  x = K::Add()({x, K::PositionEmbedding(2)(x)});
  auto a = K::LayerNormalization()(x);
  x = K::Add()({x, K::MultiHeadAttention(2, 4, {.dropout = 0.1})(a, a)});
  x = K::Concatenate()({K::GlobalAveragePooling1D()(x), K::Flatten()(inputs)});
  K::Model m(inputs, K::Dense(3)(x));
  m.compile(K::Adam{0.02}, "sparse_categorical_crossentropy", {"accuracy"}, on_cpu(cpu));
  const Synthetic train = make_data(300, 1), val = make_data(90, 2);
  const K::History h = m.fit(train.x, train.y, quiet_fit(8, 30));
  EXPECT_TRUE(std::isfinite(h["loss"].back()));
  EXPECT_LT(h["loss"].back(), h["loss"].front());
  EXPECT_GT(m.evaluate(val.x, val.y).accuracy, 0.9);
}

// The same architecture, the same parameter layout: the same initial weights and the same steps.
TEST(KerasFunctionalFit, ChainTrainsAsItsSequentialTwin) {
  real::CpuInstance cpu;
  auto inputs = K::Input({2, 3, 1});
  K::Model f(inputs, K::Dense(3)(K::Dense(6, {.activation = "relu"})(K::Flatten()(inputs))));
  K::Sequential s({K::Input({2, 3, 1}), K::Flatten(), K::Dense(6, "relu"), K::Dense(3)});
  f.compile(K::SGD{0.1}, "sparse_categorical_crossentropy", {"accuracy"}, on_cpu(cpu));
  s.compile(K::SGD{0.1}, "sparse_categorical_crossentropy", {"accuracy"}, on_cpu(cpu));
  EXPECT_EQ(f.get_weights(), s.get_weights());
  const Synthetic train = make_data(120, 3);
  f.fit(train.x, train.y, quiet_fit(2, 20));
  s.fit(train.x, train.y, quiet_fit(2, 20));
  EXPECT_EQ(f.get_weights(), s.get_weights());
}
