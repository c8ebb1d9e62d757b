// BatchNormalization over the last axis of a row-major [rows, C] input (docs/kernels.md; the
// Keras semantics of docs/compute-backends.md): training normalises with the batch's mean and
// biased variance, inference with the moving statistics. gamma / beta may be null (Keras'
// scale = false / center = false: 1 / 0). `relu` fuses a following ReLU (y = max(bn(x), 0),
// and the backward masks dy by that y), as the cpu backend does.
// Synchronized (statistics over every replica's batch): the reductions' totals go out as sums
// (BnSums: [C channel sums, C channel sums, rows], 2C + 1 doubles), the replicas add them up,
// and BnStatsFromSums / BnBackKFromSums finish from there with the same rules as the fused
// finishes (bn_statistics, bn_mean_k), so summed over one replica they give the same bits.
#pragma once

#include "hd.hpp"
#include "step.hpp"

#include <cmath>

namespace skyforge::kernels {

// Statistics terms: sum x and sum x^2 (reduce.hpp's accumulator A).
struct BnStatsTerm {
  const float* x;
  size_t C;
  template <class A>
  SF_HD void operator()(size_t r, size_t c, A* a) const {
    const float v = x[r * C + c];
    a[0].add(v);
    a[1].add_product(v, v);
  }
};

// mean = sum / M; var = max(sumsq / M - mean^2, 0) (both in double, var rounded to float);
// invstd = 1 / sqrt(var + epsilon) in float. A float's square is exact in double, so the
// cancellation costs (mean/std)^2 * 2^-53: below float's rounding while |mean| < 2^14 std.
SF_HD inline void bn_statistics(size_t c, double sum, double sumsq, double M, float eps, float* mean, float* var,
                                float* invstd) {
  const double mu = sum / M;
  const double d = sumsq / M - mu * mu;
  const float v = static_cast<float>(d > 0.0 ? d : 0.0);
  mean[c] = static_cast<float>(mu);
  var[c] = v;
  invstd[c] = 1.f / ::sqrtf(v + eps);
}

struct BnStatsFinish {
  size_t rows;
  float eps;
  float *mean, *var, *invstd;
  SF_HD void operator()(size_t c, const double* s) const {
    bn_statistics(c, s[0], s[1], static_cast<double>(rows), eps, mean, var, invstd);
  }
};

// Finish of either reduction, synchronized: out[c] = s[0], out[C + c] = s[1], out[2C] = rows;
// in the backward also this replica's dbeta = s[0] and dgamma = s[1] (null in the forward, and
// either may be null).
struct BnSums {
  size_t rows, C;
  double* out;
  float *dgamma, *dbeta;
  SF_HD void operator()(size_t c, const double* s) const {
    out[c] = s[0];
    out[C + c] = s[1];
    if (c == 0) out[2 * C] = static_cast<double>(rows);
    if (dbeta) dbeta[c] = static_cast<float>(s[0]);
    if (dgamma) dgamma[c] = static_cast<float>(s[1]);
  }
};

// The statistics of the batch whose BnSums these are (every replica's, once summed), per channel.
struct BnStatsFromSums {
  size_t C;
  const double* sums;
  float eps;
  float *mean, *var, *invstd;
  SF_HD void operator()(size_t c) const {
    bn_statistics(c, sums[c], sums[C + c], sums[2 * C], eps, mean, var, invstd);
  }
};

// y = x * scale + shift with scale = gamma * invstd, shift = beta - mean * scale; invstd is
// given (training) or 1 / sqrt(var + epsilon) from the moving variance (inference: invstd null).
struct BnApply {
  const float* x;
  float* y;
  size_t C;
  const float *gamma, *beta, *mean, *invstd, *var;
  float eps;
  bool relu;
  SF_HD void operator()(size_t i) const {
    const size_t c = i % C;
    const float is = invstd ? invstd[c] : 1.f / ::sqrtf(var[c] + eps);
    const float sc = (gamma ? gamma[c] : 1.f) * is;
    const float sh = (beta ? beta[c] : 0.f) - mean[c] * sc;
    const float v = x[i] * sc + sh;
    y[i] = relu && !(v > 0.f) ? 0.f : v;
  }
};

// moving = moving * momentum + batch * (1 - momentum), per channel.
struct BnMovingUpdate {
  float *moving_mean, *moving_var;
  const float *mean, *var;
  float momentum;
  const StepState* state;  // a refused step (step.hpp) leaves them as they were; null: never refused
  SF_HD void operator()(size_t c) const {
    if (refused(state)) return;
    moving_mean[c] = moving_mean[c] * momentum + mean[c] * (1.f - momentum);
    moving_var[c] = moving_var[c] * momentum + var[c] * (1.f - momentum);
  }
};

// Backward terms, with dv = dy masked by the fused ReLU's output (relu_y null: no mask) and
// xhat = (x - mean) * invstd: sum dv and sum dv * xhat.
struct BnBackTerm {
  const float *x, *relu_y, *dy, *mean, *invstd;
  size_t C;
  template <class A>
  SF_HD void operator()(size_t r, size_t c, A* a) const {
    const size_t i = r * C + c;
    const float dv = !relu_y || relu_y[i] > 0.f ? dy[i] : 0.f;
    a[0].add(dv);
    a[1].add(dv * ((x[i] - mean[c]) * invstd[c]));
  }
};

// A sum's mean over M rows, rounded to float (BnDx's k).
SF_HD inline double bn_mean_k(double sum, double M) { return static_cast<float>(sum / M); }

// dbeta = sum dv, dgamma = sum dv * xhat (either may be null); k[c] = sum dv / M and
// k[C + c] = sum dv * xhat / M, rounded to float, for BnDx.
struct BnBackFinish {
  size_t rows, C;
  float *dgamma, *dbeta;
  double* k;
  SF_HD void operator()(size_t c, const double* s) const {
    if (dbeta) dbeta[c] = static_cast<float>(s[0]);
    if (dgamma) dgamma[c] = static_cast<float>(s[1]);
    const double M = static_cast<double>(rows);
    k[c] = bn_mean_k(s[0], M);
    k[C + c] = bn_mean_k(s[1], M);
  }
};

// Synchronized: BnDx's k from the backward's BnSums (every replica's, once summed), in place.
struct BnBackKFromSums {
  size_t C;
  double* sums;
  SF_HD void operator()(size_t c) const {
    const double M = sums[2 * C];
    sums[c] = bn_mean_k(sums[c], M);
    sums[C + c] = bn_mean_k(sums[C + c], M);
  }
};

// dx = gamma * invstd * ((dv - mean(dv)) - xhat * mean(dv * xhat)).
struct BnDx {
  const float *x, *relu_y, *dy;
  float* dx;
  size_t C;
  const float *gamma, *mean, *invstd;
  const double* k;
  SF_HD void operator()(size_t i) const {
    const size_t c = i % C;
    const float dv = !relu_y || relu_y[i] > 0.f ? dy[i] : 0.f;
    const float sc = (gamma ? gamma[c] : 1.f) * invstd[c];
    const float k1 = static_cast<float>(k[c]), k2 = static_cast<float>(k[C + c]);
    dx[i] = sc * ((dv - k1) - ((x[i] - mean[c]) * invstd[c]) * k2);
  }
};

}  // namespace skyforge::kernels
