// Shared by the cuda engine's tests: a deterministic data set and comparisons with the cpu backend.
#pragma once

#include "engine.hpp"
#include "helpers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace cuda_test {

using namespace cpu_test;

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

// `batch` samples of `features` values in [0, 1) and labels in [0, classes) from the pinned generator.
inline Batch make_batch(uint64_t seed, uint32_t batch, size_t features, uint32_t classes = 10) {
  skyforge::Rng rng(seed);
  Batch b;
  b.x.resize(batch * features);
  for (float& v : b.x) v = static_cast<float>(rng.next() >> 40) / 16777216.0f;
  for (uint32_t i = 0; i < batch; ++i) b.y.push_back(static_cast<int32_t>(rng.next() % classes));
  return b;
}

inline std::vector<float> params_of(const skyforge::Engine& e) {
  std::vector<float> p(e.param_count());
  e.get_params(p.data(), p.size());
  return p;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

// Values per sample of m's input.
inline size_t features(const ModelSpec& m) {
  size_t n = 1;
  for (uint32_t d : m.input_shape) n *= d;
  return n;
}

// The status and message of the Error f throws (SF_OK and "" when it returns).
inline std::pair<sf_status, std::string> status_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const skyforge::Error& e) {
    return {e.status(), e.what()};
  }
  return {SF_OK, ""};
}

// n samples of m's input from seed: make(seed, n), or make_batch's when make is empty.
using MakeBatch = std::function<Batch(uint64_t seed, uint32_t n)>;
inline Batch batch_of(const ModelSpec& m, const MakeBatch& make, uint64_t seed, uint32_t n) {
  return make ? make(seed, n) : make_batch(seed, n, features(m));
}

// 8 steps on the same batches, the cuda engine taking the cpu
// backend's whole state before each (test_engine.cpp's lockstep): each step's forward,
// backward (dropout masks included) and update compared, the loss within 1e-5 relative and the
// weights within 1e-5 (test_engine.cpp's tolerances, docs/compute-backends.md).
inline void expect_lockstep(const ModelSpec& m, uint32_t batch, const MakeBatch& make = {}) {
  auto c = skyforge::cpu::make_engine(m, skyforge::Communicator{});
  auto g = skyforge::cuda::make_engine(m, skyforge::Communicator{});
  const std::vector<float> initial = params_of(*g);
  ASSERT_EQ(params_of(*c), initial) << "initial weights differ";
  for (int s = 0; s < 8; ++s) {
    const Batch b = batch_of(m, make, 200 + s, batch);
    const auto rc = c->train_step(b.x.data(), b.y.data(), batch);
    const auto rg = g->train_step(b.x.data(), b.y.data(), batch);
    EXPECT_NEAR(rg.loss, rc.loss, 1e-5 * std::max(1.0, std::fabs(rc.loss))) << "step " << s;
    EXPECT_LE(max_abs_diff(params_of(*c), params_of(*g)), 1e-5) << "step " << s;
    g->load_state(c->state_dict());
  }
  EXPECT_GT(max_abs_diff(initial, params_of(*g)), 1e-3) << "training did not move the parameters";
}

// Data parallel: two ranks (threads), 4 steps of 5 samples each, hold the same bits.
inline void expect_two_ranks_bit_identical(const ModelSpec& m, const MakeBatch& make = {}) {
  std::vector<std::vector<float>> params(2);
  ThreadGroup group(2);
  group.run([&](uint32_t rank) {
    auto e = skyforge::cuda::make_engine(m, skyforge::Communicator(group.comm(rank)));
    for (int s = 0; s < 4; ++s) {
      const Batch b = batch_of(m, make, 300 + 10 * s + rank, 5);
      e->train_step(b.x.data(), b.y.data(), 5);
    }
    params[rank] = params_of(*e);
  });
  EXPECT_EQ(params[0], params[1]);
}

// A checkpoint after 3 steps on b (6 samples, 10 classes) loads in the cpu engine and back: the
// same state, the same logits; a step from the loaded state is the step from the saved one.
inline void expect_state_moves_between_engines(const ModelSpec& m, const Batch& b) {
  auto g = skyforge::cuda::make_engine(m, skyforge::Communicator{});
  for (int s = 0; s < 3; ++s) g->train_step(b.x.data(), b.y.data(), 6);
  auto c = skyforge::cpu::make_engine(m, skyforge::Communicator{});
  c->load_state(g->state_dict());
  EXPECT_EQ(params_of(*c), params_of(*g));
  auto back = skyforge::cuda::make_engine(m, skyforge::Communicator{});
  back->load_state(c->state_dict());
  EXPECT_EQ(back->state_dict(), g->state_dict());
  std::vector<float> lc(60), lg(60);
  c->predict(b.x.data(), 6, lc.data());
  back->predict(b.x.data(), 6, lg.data());
  for (size_t i = 0; i < lc.size(); ++i) EXPECT_NEAR(lg[i], lc[i], 1e-5) << i;
  g->train_step(b.x.data(), b.y.data(), 6);
  back->train_step(b.x.data(), b.y.data(), 6);
  EXPECT_EQ(params_of(*back), params_of(*g));
}

// Bound-data steps on `all` (24 samples, 5 steps of 6) with graphs off and on: the steps captured
// once and replayed are the eager ones bit for bit, and 4 of the 5 were replays.
inline void expect_replays_equal_eager_steps(const ModelSpec& m, const Batch& all) {
  std::vector<std::vector<float>> params;
  for (bool graphs : {false, true}) {
    skyforge::cuda::EngineOptions o;
    o.graphs = graphs;
    auto e = skyforge::cuda::make_engine(m, skyforge::Communicator{}, skyforge::Host{}, o);
    const uint64_t d = e->bind_data(all.x.data(), all.y.data(), 24);
    for (uint64_t s = 0; s < 5; ++s) {
      std::vector<uint64_t> idx(6);
      for (uint64_t i = 0; i < 6; ++i) idx[i] = (s * 5 + i * 7) % 24;
      e->train_step_indexed(d, idx.data(), 6, false);
    }
    params.push_back(params_of(*e));
    EXPECT_EQ(dynamic_cast<const skyforge::cuda::CudaEngine&>(*e).graph_stats().replayed, graphs ? 4u : 0u);
  }
  EXPECT_EQ(params[0], params[1]);
}

// Thin windows (at most 32 values a position) take their weight gradient from the engine's
// column reduction (kernels::conv_filter_grad): a first one (1x1 over 2 channels), one that
// needs its input gradient too (3x3 'same' over 3), a wide strided one whose trailing padding
// cuDNN cannot express, and a thin strided 'valid' one after it.
inline ModelSpec thin_convnet(uint64_t seed) {
  ModelSpec m;
  m.input_shape = {14, 14, 2};
  m.layers = {layer("conv2d", {{"filters", "3"}, {"kernel_size", "1"}, {"activation", "relu"}}),
              layer("conv2d", {{"filters", "4"}, {"kernel_size", "3"}, {"padding", "same"}, {"activation", "relu"}}),
              layer("conv2d", {{"filters", "5"}, {"kernel_size", "3"}, {"strides", "2"}, {"padding", "same"}}),
              layer("conv2d", {{"filters", "3"}, {"kernel_size", "2"}, {"strides", "2"}, {"activation", "relu"}}),
              layer("flatten"),
              layer("dense", {{"units", "10"}})};
  m.seed = seed;
  return m;
}

}  // namespace cuda_test
