// The finite-difference gradient check of one cpu-backend layer (test_gradcheck.cpp describes
// the method and its tolerance) and the inputs the checks feed it.
#pragma once

#include "helpers.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace cpu_test {

using namespace skyforge::cpu;

inline constexpr float kEps = 1e-2f;

inline bool close(double num, double ana) { return std::fabs(num - ana) <= 2e-3 + 2e-2 * std::max(std::fabs(num), std::fabs(ana)); }

inline std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi) {
  skyforge::Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = lo + (hi - lo) * uniform01(rng);
  return v;
}

// Values at least `gap` away from zero (for relu).
inline std::vector<float> away_from_zero(size_t n, uint64_t seed, float gap) {
  auto v = uniform(n, seed, -1.f, 1.f);
  for (auto& x : v) x = x >= 0 ? x + gap : x - gap;
  return v;
}

// Distinct values on a grid of spacing `gap`, shuffled (for max pooling: no ties).
inline std::vector<float> distinct(size_t n, uint64_t seed, float gap) {
  auto perm = skyforge::permutation(n, true, seed);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (static_cast<float>(perm[i]) - static_cast<float>(n) / 2) * gap;
  return v;
}

struct Checked {
  size_t inputs = 0, params = 0;
};

// Checks dx and dparams of `l` at input x. `params`: the layer's parameters (empty: uniform in
// [-0.5, 0.5], so biases/gammas are not trivially 0/1).
inline Checked check_layer(Layer& l, uint32_t batch, std::vector<float> x, bool training, std::vector<float> params = {},
                    bool check_dx = true) {
  l.set_exec(Exec{2});
  l.reserve(batch);
  const size_t in_n = batch * numel(l.in_shape), out_n = batch * numel(l.out_shape);
  EXPECT_EQ(x.size(), in_n);
  std::vector<float> p(l.param_size()), g(l.param_size(), 0.f);
  if (params.empty()) {
    p = uniform(p.size(), 11, -0.5f, 0.5f);  // not Keras' init: biases and gammas away from 0 and 1
  } else {
    p = params;
  }
  l.bind(p.data(), g.data());
  const auto r = uniform(out_n, 99, -1.f, 1.f);

  std::vector<float> y(out_n), dy(r), dx(in_n, 0.f);
  l.forward(x.data(), y.data(), batch, training);
  l.backward(x.data(), y.data(), dy.data(), check_dx ? dx.data() : nullptr, batch);
  const std::vector<float> grads = g;

  std::vector<float> y2(out_n);
  auto L = [&](const std::vector<float>& xin) {
    l.forward(xin.data(), y2.data(), batch, training);
    double s = 0;
    for (size_t i = 0; i < out_n; ++i) s += static_cast<double>(r[i]) * y2[i];
    return s;
  };
  Checked c;
  if (check_dx) {
    const size_t stride = std::max<size_t>(1, in_n / 250);
    for (size_t i = 0; i < in_n; i += stride) {
      auto xp = x;
      xp[i] = x[i] + kEps;
      const double lp = L(xp);
      xp[i] = x[i] - kEps;
      const double lm = L(xp);
      const double num = (lp - lm) / (2.0 * kEps);
      EXPECT_TRUE(close(num, dx[i])) << l.type << " dx[" << i << "]: numeric " << num << " analytic " << dx[i];
      ++c.inputs;
    }
  }
  const size_t stride = std::max<size_t>(1, p.size() / 250);
  for (size_t j = 0; j < p.size(); j += stride) {
    const float keep = p[j];
    p[j] = keep + kEps;
    const double lp = L(x);
    p[j] = keep - kEps;
    const double lm = L(x);
    p[j] = keep;
    const double num = (lp - lm) / (2.0 * kEps);
    EXPECT_TRUE(close(num, grads[j])) << l.type << " dparam[" << j << "]: numeric " << num << " analytic "
                                      << grads[j];
    ++c.params;
  }
  return c;
}

}  // namespace cpu_test
