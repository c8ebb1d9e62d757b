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

}  // namespace cuda_test
