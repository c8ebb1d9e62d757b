// Layer normalization over the last axis of a row-major [rows, F] input (docs/kernels.md; Keras'
// LayerNormalization(axis=-1)): each row normalised by its own mean and biased variance, then
// scaled by gamma and shifted by beta (either may be null: Keras' scale = false / center =
// false). One call per row, its sums in double in index order: deterministic, and the same bits
// in both builds.
#pragma once

#include "hd.hpp"

#include <cmath>

namespace skyforge::kernels {

// Row r: mean and var = mean((x - mean)^2) in double (two passes), invstd = 1 / sqrt(var + eps)
// in float; y = (x - mean) * invstd * gamma + beta. mean[r] and invstd[r] kept for the backward.
struct LayerNormRow {
  const float* x;
  float* y;
  size_t F;
  const float *gamma, *beta;
  float eps;
  float *mean, *invstd;
  SF_HD void operator()(size_t r) const {
    const float* xr = x + r * F;
    double s = 0.0;
    for (size_t j = 0; j < F; ++j) s += static_cast<double>(xr[j]);
    const double mu = s / static_cast<double>(F);
    double v = 0.0;
    for (size_t j = 0; j < F; ++j) {
      const double d = static_cast<double>(xr[j]) - mu;
      v += d * d;
    }
    const float m = static_cast<float>(mu);
    const float is = 1.f / ::sqrtf(static_cast<float>(v / static_cast<double>(F)) + eps);
    mean[r] = m;
    invstd[r] = is;
    float* yr = y + r * F;
    for (size_t j = 0; j < F; ++j) {
      const float xhat = (xr[j] - m) * is;
      yr[j] = xhat * (gamma ? gamma[j] : 1.f) + (beta ? beta[j] : 0.f);
    }
  }
};

// Parameter-gradient terms, column j over the rows: sum dy * xhat (dgamma) and sum dy (dbeta).
struct LayerNormParamTerm {
  const float *x, *dy, *mean, *invstd;
  size_t F;
  template <class A>
  SF_HD void operator()(size_t r, size_t j, A* a) const {
    const size_t i = r * F + j;
    a[0].add(dy[i] * ((x[i] - mean[r]) * invstd[r]));
    a[1].add(dy[i]);
  }
};

// dgamma, dbeta from LayerNormParamTerm's totals (either may be null).
struct LayerNormParamFinish {
  float *dgamma, *dbeta;
  SF_HD void operator()(size_t j, const double* s) const {
    if (dgamma) dgamma[j] = static_cast<float>(s[0]);
    if (dbeta) dbeta[j] = static_cast<float>(s[1]);
  }
};

// Row r of the input's gradient, with g = dy * gamma and xhat = (x - mean) * invstd:
// dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), the means in double. dx may equal dy.
struct LayerNormDxRow {
  const float *x, *dy;
  float* dx;
  size_t F;
  const float *gamma, *mean, *invstd;
  SF_HD void operator()(size_t r) const {
    const size_t o = r * F;
    const float m = mean[r], is = invstd[r];
    double s1 = 0.0, s2 = 0.0;
    for (size_t j = 0; j < F; ++j) {
      const float g = dy[o + j] * (gamma ? gamma[j] : 1.f);
      s1 += static_cast<double>(g);
      s2 += static_cast<double>(g * ((x[o + j] - m) * is));
    }
    const float k1 = static_cast<float>(s1 / static_cast<double>(F));
    const float k2 = static_cast<float>(s2 / static_cast<double>(F));
    for (size_t j = 0; j < F; ++j) {
      const float g = dy[o + j] * (gamma ? gamma[j] : 1.f);
      dx[o + j] = is * ((g - k1) - ((x[o + j] - m) * is) * k2);
    }
  }
};

}  // namespace skyforge::kernels
