// Fused bias + activation, forward and backward (relu, gelu, tanh, sigmoid elementwise), and
// softmax over the last axis (docs/kernels.md; semantics of docs/compute-backends.md).
// Row-major [rows, width].
#pragma once

#include "hd.hpp"

#include <cmath>

namespace skyforge::kernels {

// act(v) for an elementwise activation (every one but softmax), in float as the cpu backend.
SF_HD inline float activate(Activation act, float v) {
  constexpr float kSqrtHalf = 0.70710678118654752f, kSqrt2OverPi = 0.79788456080286536f;
  switch (act) {
    case Activation::relu: return v > 0.f ? v : 0.f;
    case Activation::gelu: return 0.5f * v * ::erfcf(-v * kSqrtHalf);
    case Activation::gelu_tanh: return 0.5f * v * (1.f + ::tanhf(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
    case Activation::tanh: return ::tanhf(v);
    case Activation::sigmoid: return 1.f / (1.f + ::expf(-v));
    default: return v;
  }
}

// d act / dv at the input v with output y (relu, tanh, sigmoid read y; the gelus read v).
SF_HD inline float activation_slope(Activation act, float v, float y) {
  constexpr float kSqrtHalf = 0.70710678118654752f, kSqrt2OverPi = 0.79788456080286536f,
                  kInvSqrt2Pi = 0.39894228040143268f;
  switch (act) {
    case Activation::relu: return y > 0.f ? 1.f : 0.f;
    case Activation::gelu: return 0.5f * ::erfcf(-v * kSqrtHalf) + v * kInvSqrt2Pi * ::expf(-0.5f * v * v);
    case Activation::gelu_tanh: {
      const float t = ::tanhf(kSqrt2OverPi * (v + 0.044715f * v * v * v));
      return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * 0.044715f * v * v);
    }
    case Activation::tanh: return 1.f - y * y;
    case Activation::sigmoid: return y * (1.f - y);
    default: return 1.f;
  }
}

// The gelus' slope needs the activation's input; every other one is a function of its output.
SF_HD inline bool slope_reads_input(Activation act) { return act == Activation::gelu || act == Activation::gelu_tanh; }

// Element i of [rows, width]: y = act(x + bias[i mod width]) (bias may be null; x may be y).
struct BiasActElem {
  const float* x;
  float* y;
  const float* bias;
  size_t width;
  Activation act;
  SF_HD void operator()(size_t i) const {
    float v = x[i];
    if (bias) v += bias[i % width];
    y[i] = activate(act, v);
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

// Elementwise backward, element i: dy *= act'(x), from the activation's input x (read by the
// gelus only; null for the others) and output y.
struct ActBackElem {
  const float* x;
  const float* y;
  float* dy;
  Activation act;
  SF_HD void operator()(size_t i) const { dy[i] *= activation_slope(act, x ? x[i] : 0.f, y[i]); }
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
