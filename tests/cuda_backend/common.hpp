// Shared by the cuda engine's tests: a deterministic data set and comparisons with the cpu backend.
#pragma once

#include "helpers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
