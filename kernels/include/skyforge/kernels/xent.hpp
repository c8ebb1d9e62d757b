// Sparse softmax cross-entropy from logits, its gradient and the accuracy count
// (docs/kernels.md; the loss of docs/compute-backends.md).
#pragma once

#include "hd.hpp"

#include <cmath>

namespace skyforge::kernels {

// Row n of logits [rows, classes] with label y:
//   lse = max + log(sum_j exp(l_j - max)); loss[n] = lse - l_y;
//   hit[n] = 1 if argmax(l) == y (the first maximum wins) else 0;
//   dlogits[n, j] = exp(l_j - lse) - [j == y]   (the gradient of loss[n]; dlogits may be null).
// A label outside [0, classes) gives loss NaN, hit 0 and a zero gradient row: visible in the
// loss, never a read out of bounds (engines reject such labels before the step).
struct XentRow {
  const float* logits;
  const int32_t* labels;
  size_t classes;
  float* loss;
  float* hit;
  float* dlogits;
  SF_HD void operator()(size_t n) const {
    const float* l = logits + n * classes;
    float* d = dlogits ? dlogits + n * classes : nullptr;
    const int32_t label = labels[n];
    if (label < 0 || static_cast<size_t>(label) >= classes) {
      loss[n] = ::nanf("");
      hit[n] = 0.f;
      if (d)
        for (size_t j = 0; j < classes; ++j) d[j] = 0.f;
      return;
    }
    const size_t y = static_cast<size_t>(label);
    size_t am = 0;
    for (size_t j = 1; j < classes; ++j)
      if (l[j] > l[am]) am = j;
    const float m = l[am];
    float s = 0.f;
    for (size_t j = 0; j < classes; ++j) s += ::expf(l[j] - m);
    const float lse = m + ::logf(s);
    loss[n] = lse - l[y];
    hit[n] = am == y ? 1.f : 0.f;
    if (d) {
      for (size_t j = 0; j < classes; ++j) d[j] = ::expf(l[j] - lse);
      d[y] -= 1.f;
    }
  }
};

}  // namespace skyforge::kernels
