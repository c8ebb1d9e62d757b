// skyforge::keras over the real `cpu` engine (backends/cpu), reached through the SDK's C glue
// (skyforge::detail::compute_hooks), exactly as a native app reaches a loaded backend plugin, on
// Fashion-MNIST; with 2 ranks, each rank (a thread) has its own real GlooCommunicator over a real
// rendezvous store (real_parts.hpp). Built only when the cpu engine library is part of the build.
#include <skyforge/datasets.hpp>
#include <skyforge/keras.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "model_util.hpp"
#include "real_parts.hpp"
#include "test_util.hpp"

namespace K = skyforge::keras;
namespace ds = skyforge::datasets;
namespace fs = std::filesystem;
using real::CpuInstance;

namespace {

struct Subset {
  std::vector<float> x;
  std::vector<int32_t> y;
};
Subset head(const ds::Dataset& d, size_t n) {
  return Subset{std::vector<float>(d.x.begin(), d.x.begin() + static_cast<std::ptrdiff_t>(n * 784)),
                std::vector<int32_t>(d.y.begin(), d.y.begin() + static_cast<std::ptrdiff_t>(n))};
}

K::Sequential mlp() {
  return K::Sequential({K::Input({28, 28, 1}), K::Flatten(), K::Dense(64, "relu"), K::Dense(10)});
}

}  // namespace

// The guide's convnet built with the builders is accepted by the cpu engine, and the engine's
// trainable parameter count equals the summary's.
TEST(KerasCpu, ConvnetSpecAndParamCount) {
  CpuInstance cpu;
  K::Sequential m({K::Input({28, 28, 1}), K::Conv2D(12, 3, 1, "same", false), K::BatchNormalization(), K::ReLU(),
                   K::Conv2D(24, 6, 2, "same", false), K::BatchNormalization(0.99, 1e-3, true, false), K::ReLU(),
                   K::MaxPooling2D(2), K::Conv2D(32, 3, 1, "valid"), K::BatchNormalization(), K::ReLU(),
                   K::GlobalAveragePooling2D(), K::Dense(256, "relu"), K::Dropout(0.5), K::Dense(10)});
  K::CompileOptions o;
  o.backend = cpu.backend();
  o.threads = 2;
  m.compile(K::Adam{1e-3}, "sparse_categorical_crossentropy", {"accuracy"}, o);
  const std::string s = m.summary();
  const size_t at = s.find("Trainable params: ");
  ASSERT_NE(at, std::string::npos);
  const auto trainable = std::stoull(s.substr(at + 18));
  EXPECT_EQ(m.get_weights().size(), trainable) << s;
}

TEST(KerasCpu, FashionMnistMlpLearnsAndResumes) {
  if (!fs::exists(fs::path(FASHION_MNIST_DIR) / "train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "no Fashion-MNIST in " << FASHION_MNIST_DIR;
  const ds::TrainTest data = ds::load_fashion_mnist(FASHION_MNIST_DIR);
  const Subset train = head(data.train, 8000), test = head(data.test, 2000);
  TempDir dir("keras_cpu");
  CpuInstance cpu;
  K::Sequential m = mlp();
  K::CompileOptions co;
  co.backend = cpu.backend();
  co.seed = 3;
  co.threads = 1;  // the test machine may have 1-2 cores, shared
  m.compile(K::Adam{2e-3}, "sparse_categorical_crossentropy", {"accuracy"}, co);
  K::FitOptions o = model_util::quiet_fit(2, 64);
  o.validation_data = {test.x, test.y};
  o.callbacks.checkpoint_dir = (dir.path / "ckpt").string();
  o.callbacks.csv = (dir.path / "h.csv").string();
  const K::History h = m.fit(train.x, train.y, o);
  EXPECT_LT(h["loss"][1], h["loss"][0]);
  EXPECT_GT(h["val_accuracy"][1], 0.75);
  const K::EvalResult r = m.evaluate(test.x, test.y, 500);
  EXPECT_EQ(r.samples, 2000u);
  EXPECT_NEAR(r.accuracy, h["val_accuracy"][1], 1e-9);
  const std::vector<float> logits = m.predict(test.x, 256);
  size_t right = 0;
  for (size_t i = 0; i < 2000; ++i) {
    const float* z = logits.data() + i * 10;
    right += static_cast<int32_t>(std::max_element(z, z + 10) - z) == test.y[i];
  }
  EXPECT_NEAR(static_cast<double>(right) / 2000.0, r.accuracy, 1e-9);

  // A fresh model resumed from the checkpoint has the same weights and continues.
  CpuInstance cpu2;
  K::Sequential again = mlp();
  co.backend = cpu2.backend();
  again.compile(K::Adam{2e-3}, "sparse_categorical_crossentropy", {"accuracy"}, co);
  o.callbacks.resume = true;
  o.epochs = 2;
  const K::History h2 = again.fit(train.x, train.y, o);  // nothing left to train
  EXPECT_EQ(h2.history, h.history);
  EXPECT_EQ(again.get_weights(), m.get_weights());
}

// Data::replicated on 2 ranks (threads, each with its own GlooCommunicator) follows the 1-rank
// trajectory with the real engine: same global batches, gradients averaged.
TEST(KerasCpu, TwoRanksMatchOneRankOnTheSameGlobalBatch) {
  if (!fs::exists(fs::path(FASHION_MNIST_DIR) / "train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "no Fashion-MNIST in " << FASHION_MNIST_DIR;
  const ds::TrainTest data = ds::load_fashion_mnist(FASHION_MNIST_DIR);
  const Subset train = head(data.train, 2000);
  K::FitOptions o = model_util::quiet_fit(1, 64);
  o.data = K::Data::replicated;
  o.seed = 1;
  auto compile = [](K::Sequential& m, const CpuInstance& cpu, const sf_communicator* comm) {
    K::CompileOptions co;
    co.backend = cpu.backend();
    co.communicator = skyforge::Communicator(comm);
    co.seed = 5;
    co.threads = 1;
    m.compile(K::SGD{0.05}, "sparse_categorical_crossentropy", {"accuracy"}, co);
  };
  CpuInstance single;
  K::Sequential m1 = mlp();
  compile(m1, single, nullptr);
  const K::History h1 = m1.fit(train.x, train.y, o);
  const std::vector<float> w1 = m1.get_weights();

  std::vector<std::vector<float>> w(2);
  std::vector<K::History> h(2);
  const std::vector<std::string> err = real::run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
    CpuInstance cpu;
    K::Sequential m = mlp();
    compile(m, cpu, comm);
    h[r] = m.fit(train.x, train.y, o);
    w[r] = m.get_weights();
  });
  ASSERT_EQ(err, (std::vector<std::string>{"", ""}));
  EXPECT_EQ(w[0], w[1]);
  ASSERT_EQ(w[0].size(), w1.size());
  double max_diff = 0;
  for (size_t i = 0; i < w1.size(); ++i) max_diff = std::max(max_diff, static_cast<double>(std::fabs(w[0][i] - w1[i])));
  EXPECT_LT(max_diff, 1e-4);
  EXPECT_NEAR(h[0]["loss"][0], h1["loss"][0], 1e-4);
}
