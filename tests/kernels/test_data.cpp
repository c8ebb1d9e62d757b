// Bound data (data.hpp, docs/kernels.md "Bound data"): the batch gathered from sample indices,
// the step sums kept on the device, and the optimizers' scale read from a device count, each
// against the host-side computation it replaces.
#include "reference.hpp"

#include <skyforge/kernels/launch.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>

namespace sk = skyforge::kernels;

TEST(BoundData, GatherRowsCopiesTheIndexedSamplesAndLabels) {
  const size_t n = 97, width = 784;
  const std::vector<float> x = kref::randn(n * width, 7);
  std::vector<int32_t> y(n);
  for (size_t i = 0; i < n; ++i) y[i] = static_cast<int32_t>((i * 31) % 10);
  // Repeats, the last sample, out of order: what an epoch's permutation hands a step.
  const std::vector<uint64_t> idx = {96, 0, 5, 5, 42, 1, 95, 17};
  std::vector<float> out(idx.size() * width, -1.f);
  std::vector<int32_t> labels(idx.size(), -1);
  sk::gather_rows(x.data(), y.data(), idx.data(), idx.size(), width, out.data(), labels.data());
  for (size_t r = 0; r < idx.size(); ++r) {
    EXPECT_EQ(0, std::memcmp(out.data() + r * width, x.data() + idx[r] * width, width * sizeof(float))) << "row " << r;
    EXPECT_EQ(labels[r], y[idx[r]]) << "row " << r;
  }
  // Rows only.
  std::vector<float> only(width);
  sk::gather_rows(x.data(), nullptr, idx.data() + 4, 1, width, only.data(), nullptr);
  EXPECT_EQ(0, std::memcmp(only.data(), x.data() + 42 * width, width * sizeof(float)));
  EXPECT_THROW(sk::gather_rows(x.data(), y.data(), idx.data(), 1, width, out.data(), nullptr), std::invalid_argument);
  EXPECT_THROW(sk::gather_rows(nullptr, nullptr, idx.data(), 1, width, out.data(), nullptr), std::invalid_argument);
}

TEST(BoundData, FillAndAccumulateKeepRunningSums) {
  double acc[3], step[3];
  sk::fill(acc, 3, 0.0);
  double want[3] = {0, 0, 0};
  for (int s = 1; s <= 50; ++s) {
    step[0] = 0.1 * s, step[1] = s % 7, step[2] = 64;
    sk::accumulate(acc, step, 3);
    for (int i = 0; i < 3; ++i) want[i] += step[i];
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(acc[i], want[i]) << i;  // the same additions in the same order
  sk::fill(acc + 1, 2, 3.5);
  EXPECT_EQ(acc[1], 3.5);
  EXPECT_EQ(acc[2], 3.5);
  EXPECT_THROW(sk::accumulate(acc, nullptr, 3), std::invalid_argument);
}

// The scale read from a device count, and Adam's iteration and the learning rate read from a
// device StepState (learning_rate_step writes a constant schedule's rate) equal the host's
// float(1 / samples), iteration and rate bit for bit, for Adam and for SGD with momentum;
// advance_step counts the updates.
TEST(BoundData, OptimizerStateOnTheDeviceEqualsTheHostArguments) {
  const size_t n = 4099;
  const double samples = 192;  // a global batch: 3 ranks x 64
  const float scale = static_cast<float>(1.0 / samples);
  for (int opt = 0; opt < 2; ++opt) {
    std::vector<float> pa = kref::randn(n, 1), pb = pa, ma(n, 0.f), mb(n, 0.f), va(n, 0.f), vb(n, 0.f);
    sk::StepState state{};
    const sk::AdamConfig adam{0.01, 0.8, 0.95, 1e-7};
    for (uint64_t step = 0; step < 6; ++step) {
      const std::vector<float> g = kref::randn(n, 10 + static_cast<uint32_t>(step), 30.f);
      sk::OptimTensor a{pa.data(), g.data(), ma.data(), va.data(), n}, b{pb.data(), g.data(), mb.data(), vb.data(), n};
      if (opt == 0) {
        sk::learning_rate_step(skyforge::LrSchedule{.rate = adam.learning_rate}, &state);
        sk::adam_update(&a, 1, adam, step, scale);
        sk::adam_update(&b, 1, adam, &state, &samples);
        EXPECT_EQ(state.alpha, sk::adam_alpha(adam, step));
      } else {
        const sk::SgdConfig c{0.05, 0.9, true};
        sk::learning_rate_step(skyforge::LrSchedule{.rate = c.learning_rate}, &state);
        sk::sgd_update(&a, 1, c, scale);
        sk::sgd_update(&b, 1, c, &state, &samples);
      }
      sk::advance_step(&state);
    }
    EXPECT_EQ(state.iteration, 6u);
    EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), n * sizeof(float))) << (opt ? "sgd" : "adam");
    EXPECT_EQ(0, std::memcmp(ma.data(), mb.data(), n * sizeof(float))) << (opt ? "sgd" : "adam");
  }
  sk::OptimTensor t{};
  EXPECT_THROW(sk::adam_update(&t, 1, sk::AdamConfig{}, nullptr, nullptr), std::invalid_argument);
  EXPECT_THROW(sk::learning_rate_step(skyforge::LrSchedule{}, nullptr), std::invalid_argument);
}

// A step's invalid inputs (refuse_invalid, before its update) refuse it: every optimizer's
// update leaves the parameters and slots, advance_step the iteration, as they were, and so for
// every later step until the count is set back to 0; then the updates apply again.
TEST(BoundData, RefusedStepsChangeNoParameterSlotOrIteration) {
  const size_t n = 517;
  const double samples = 8, none = 0, two = 2;
  const std::vector<float> g = kref::randn(n, 21);
  std::vector<float> p = kref::randn(n, 22), s0 = kref::randn(n, 23, 0.1f, 1.f), s1 = kref::randn(n, 24, 0.1f, 1.f),
                     s2 = kref::randn(n, 25, 0.1f, 1.f);  // positive: mean squares
  const auto before = p;
  sk::OptimTensor t{p.data(), g.data(), s0.data(), s1.data(), n, s2.data()};
  const auto slots = [&] { return std::vector<std::vector<float>>{s0, s1, s2}; };
  const auto slots_before = slots();
  sk::StepState state{3, 0.f, 0.01};
  auto updates = [&] {
    sk::refuse_invalid(&state, &none);  // a valid step after a refused one stays refused
    sk::adam_update(&t, 1, sk::AdamConfig{0.01, 0.9, 0.999, 1e-7, 0.1}, &state, &samples);
    sk::sgd_update(&t, 1, sk::SgdConfig{0.01, 0.9, true}, &state, &samples);
    sk::rmsprop_update(&t, 1, sk::RmspropConfig{0.01, 0.9, 0.5, 1e-7, true}, &state, &samples);
    sk::advance_step(&state);
  };
  sk::refuse_invalid(&state, &two);
  EXPECT_EQ(state.invalid, 2.0);
  for (int step = 0; step < 2; ++step) updates();
  EXPECT_EQ(state.iteration, 3u);
  EXPECT_EQ(p, before);
  EXPECT_EQ(slots(), slots_before);
  state.invalid = 0;  // the host reported it
  updates();
  EXPECT_EQ(state.iteration, 4u);
  EXPECT_NE(p, before);
  EXPECT_THROW(sk::refuse_invalid(nullptr, &two), std::invalid_argument);
}

// Dropout keyed by a device StepState draws the mask of the key with that step.
TEST(BoundData, DropoutStepFromTheDeviceEqualsTheKeysStep) {
  const size_t n = 1003;
  const std::vector<float> x = kref::randn(n, 3);
  for (uint64_t step : {0ull, 7ull, (1ull << 32) + 5}) {
    std::vector<float> a(n), b(n);
    sk::dropout(x.data(), a.data(), n, 0.4f, sk::DropoutKey{11, step, 2, 1});
    const sk::StepState st{step, 0.f};
    sk::dropout(x.data(), b.data(), n, 0.4f, sk::DropoutKey{11, 999, 2, 1}, &st);  // the key's own step is ignored
    EXPECT_EQ(a, b) << step;
  }
}

// A conv2d kernel between Keras' (kh, kw, C, filters) and cuDNN's KRSC, and back.
TEST(BoundData, TransposeSwapsRowsAndColumns) {
  const size_t rows = 3 * 3 * 5, cols = 7;
  const std::vector<float> w = kref::randn(rows * cols, 9);
  std::vector<float> t(rows * cols), back(rows * cols);
  sk::transpose(w.data(), rows, cols, t.data());
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) ASSERT_EQ(t[c * rows + r], w[r * cols + c]) << r << "," << c;
  sk::transpose(t.data(), cols, rows, back.data());
  EXPECT_EQ(back, w);
  EXPECT_THROW(sk::transpose(t.data(), cols, rows, t.data()), std::invalid_argument);
}
