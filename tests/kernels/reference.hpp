// Plain double-precision references for the kernel tests (docs/kernels.md gives the formulas):
// straightforward loops, no shared code with the kernels.
#pragma once

#include <skyforge/kernels/launch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace kref {

using skyforge::kernels::Activation;

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f, float shift = 0.f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen) * scale + shift;
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// act(z + bias) over [rows, width].
inline std::vector<double> bias_act(const std::vector<double>& z, const std::vector<double>* bias, size_t rows,
                                    size_t width, Activation act) {
  std::vector<double> y(rows * width);
  for (size_t r = 0; r < rows; ++r) {
    double m = -INFINITY;
    for (size_t j = 0; j < width; ++j) {
      double v = z[r * width + j] + (bias ? (*bias)[j] : 0.0);
      if (act == Activation::relu) v = std::max(v, 0.0);
      y[r * width + j] = v;
      m = std::max(m, v);
    }
    if (act == Activation::softmax) {
      double s = 0;
      for (size_t j = 0; j < width; ++j) s += std::exp(y[r * width + j] - m);
      for (size_t j = 0; j < width; ++j) y[r * width + j] = std::exp(y[r * width + j] - m) / s;
    }
  }
  return y;
}

// Per-row sparse cross-entropy from logits: log(sum exp l) - l_y.
inline std::vector<double> xent(const std::vector<double>& l, const std::vector<int32_t>& labels, size_t rows,
                                size_t classes) {
  std::vector<double> loss(rows);
  for (size_t n = 0; n < rows; ++n) {
    double m = -INFINITY, s = 0;
    for (size_t j = 0; j < classes; ++j) m = std::max(m, l[n * classes + j]);
    for (size_t j = 0; j < classes; ++j) s += std::exp(l[n * classes + j] - m);
    loss[n] = m + std::log(s) - l[n * classes + static_cast<size_t>(labels[n])];
  }
  return loss;
}

// Batch normalisation over [rows, C] with the batch's mean and biased variance (two passes).
struct BnOut {
  std::vector<double> y, mean, var;
};
inline BnOut batchnorm(const std::vector<double>& x, size_t rows, size_t C, const std::vector<double>& gamma,
                       const std::vector<double>& beta, double eps, bool relu) {
  BnOut o{std::vector<double>(rows * C), std::vector<double>(C, 0.0), std::vector<double>(C, 0.0)};
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < C; ++c) o.mean[c] += x[r * C + c] / static_cast<double>(rows);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < C; ++c) {
      const double d = x[r * C + c] - o.mean[c];
      o.var[c] += d * d / static_cast<double>(rows);
    }
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < C; ++c) {
      const double v = gamma[c] * (x[r * C + c] - o.mean[c]) / std::sqrt(o.var[c] + eps) + beta[c];
      o.y[r * C + c] = relu ? std::max(v, 0.0) : v;
    }
  return o;
}

// Central finite difference of f at element i of p (p is restored).
template <class F>
double fd(std::vector<double>& p, size_t i, F&& f, double h = 1e-6) {
  const double keep = p[i];
  p[i] = keep + h;
  const double a = f();
  p[i] = keep - h;
  const double b = f();
  p[i] = keep;
  return (a - b) / (2 * h);
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace kref
