// Fused bias + activation, forward and backward, and softmax over the last axis
// (docs/kernels.md; semantics of docs/compute-backends.md). Row-major [rows, width].
#pragma once

#include "hd.hpp"

#include <cmath>

namespace skyforge::kernels {

// Element i of [rows, width]: y = y + bias[i mod width] (bias may be null), then ReLU if asked.
struct BiasActElem {
  float* y;
  const float* bias;
  size_t width;
  bool relu;
  SF_HD void operator()(size_t i) const {
    float v = y[i];
    if (bias) v += bias[i % width];
    y[i] = relu ? (v > 0.f ? v : 0.f) : v;
  }
};

// Row r: y = softmax(y + bias), stable (the row's maximum subtracted before exp).
struct BiasSoftmaxRow {
  float* y;
  const float* bias;
  size_t width;
  SF_HD void operator()(size_t r) const {
    float* row = y + r * width;
    if (bias)
      for (size_t j = 0; j < width; ++j) row[j] += bias[j];
    float m = row[0];
    for (size_t j = 1; j < width; ++j) m = m < row[j] ? row[j] : m;
    float s = 0.f;
    for (size_t j = 0; j < width; ++j) {
      row[j] = ::expf(row[j] - m);
      s += row[j];
    }
    const float inv = 1.f / s;
    for (size_t j = 0; j < width; ++j) row[j] *= inv;
  }
};

// ReLU backward, element i: dy = y > 0 ? dy : 0, from the activation's output y.
struct ReluBackElem {
  const float* y;
  float* dy;
  SF_HD void operator()(size_t i) const { dy[i] = y[i] > 0.f ? dy[i] : 0.f; }
};

// Softmax backward, row r: dy = y * (dy - <dy, y>), from the activation's output y.
struct SoftmaxBackRow {
  const float* y;
  float* dy;
  size_t width;
  SF_HD void operator()(size_t r) const {
    const float* yr = y + r * width;
    float* d = dy + r * width;
    float dot = 0.f;
    for (size_t j = 0; j < width; ++j) dot += d[j] * yr[j];
    for (size_t j = 0; j < width; ++j) d[j] = yr[j] * (d[j] - dot);
  }
};

}  // namespace skyforge::kernels
