// A bound dataset's batches and a step's running sums, on the device (docs/kernels.md, "Bound
// data"): the engine keeps the whole training set in device memory and gathers each batch there
// from the step's sample indices, and adds each step's loss and accuracy counts into sums it
// reads back only when the caller asks (no host synchronisation per step). And blocks of rows
// moved between buffers (a model graph's merges).
#pragma once

#include "hd.hpp"

namespace skyforge::kernels {

// out[r, :] = x[idx[r], :] for rows of `width` floats; one call per element.
struct GatherRows {
  const float* x;
  const uint64_t* idx;
  float* out;
  size_t width;
  SF_HD void operator()(size_t i) const {
    const size_t r = i / width, c = i - r * width;
    out[i] = x[idx[r] * width + c];
  }
};

// out[r] = y[idx[r]].
struct GatherLabels {
  const int32_t* y;
  const uint64_t* idx;
  int32_t* out;
  SF_HD void operator()(size_t r) const { out[r] = y[idx[r]]; }
};

// acc[i] += x[i] (a step's sums into the pending ones), or with x null, p[i] = value.
struct AddOrSet {
  double* acc;
  const double* x;
  double value;
  SF_HD void operator()(size_t i) const {
    if (x) acc[i] += x[i];
    else acc[i] = value;
  }
};

// dst[c, r] = src[r, c] for a row-major [rows, cols] src: a conv2d kernel between Keras' layout
// (kh, kw, C, filters) = [kh*kw*C, filters] and cuDNN's KRSC = [filters, kh*kw*C].
struct Transpose {
  const float* src;
  float* dst;
  size_t rows, cols;
  SF_HD void operator()(size_t i) const {
    const size_t r = i / cols, c = i - r * cols;
    dst[c * rows + r] = src[i];
  }
};

// Element i of a [rows, width] block: dst[r * dst_stride + c] = (add ? dst[..] : 0) + src[r *
// src_stride + c] (copy_block: concatenate's slices, add's sums, a fan-out's gradient sum).
struct CopyBlock {
  const float* src;
  float* dst;
  size_t src_stride, dst_stride, width;
  bool add;
  SF_HD void operator()(size_t i) const {
    const size_t r = i / width, c = i - r * width;
    const float v = src[r * src_stride + c];
    float& d = dst[r * dst_stride + c];
    d = add ? d + v : v;
  }
};

}  // namespace skyforge::kernels
