// Sparse softmax cross-entropy from logits, its gradient and the accuracy count
// (docs/kernels.md; the loss of docs/compute-backends.md): one call per row (XentRow), or for
// wide rows (a language model's vocabulary) each row split into slices, in stages (XentWide).
#pragma once

#include "hd.hpp"
#include "portable_math.hpp"

#include <cmath>

namespace skyforge::kernels {

SF_HD inline bool xent_label_ok(int32_t label, size_t classes) {
  return label >= 0 && static_cast<size_t>(label) < classes;
}

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
    if (!xent_label_ok(label, classes)) {
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

// ---- wide rows ------------------------------------------------------------------------------------
// Rows of more than kXentWideClasses classes take the staged path when the caller passes a
// workspace: at that width one call per row does three serial passes over 16 KB or more, and a
// small batch leaves most of a GPU idle. Every narrower row (every classifier up to ImageNet's
// 1000 classes and beyond) keeps the one-call-per-row path and its bits.
// Row n is split into K = xent_slices(classes) slices, slice k holding classes k, k + K, k + 2K,
// ... (neighbouring slices read neighbouring floats: a GPU warp's reads are contiguous; K > 32
// on this path). K depends on `classes` only, and each value below is made by one call in a
// fixed order, so a row's results depend on that row alone: not on the batch, the thread count
// or the build. Its exp and log are portable_math.hpp's, and its sums in double, so the host
// build and the CUDA build give the same bits. The stages, over a workspace of
// softmax_xent_workspace(rows, classes) doubles:
//   XentSliceMax  rows * K calls: each slice's first maximum (NaN skipped) and where it is;
//   XentRowMax    rows calls: the row's first maximum m (NaN when l_0 is, as XentRow) -> hit;
//   XentSliceSum  rows * K calls: each slice's sum of e_j = exp(l_j - m), in double, in index
//                 order (each e_j kept in dlogits as a float, when there is a gradient);
//   XentRowLoss   rows calls: S = the slices' sums in order k = 0 .. K-1 ->
//                 loss = m + log S - l_y (in double, then rounded);
//   XentGrad      rows * classes calls: dlogits_j = float(e_j / S) - [j = y].
// The loss agrees with XentRow's to float rounding (XentRow sums in float, this in double).
inline constexpr size_t kXentWideClasses = 4096;  // wider rows take the staged path
inline constexpr size_t kXentSlice = 128;         // classes a slice holds, at least
inline constexpr size_t kXentMaxSlices = 1024;    // slices a row is split into, at most

// K: ceil(classes / 128), at most 1024 (so the per-row stages add at most 1024 partials).
SF_HD inline size_t xent_slices(size_t classes) {
  const size_t k = (classes + kXentSlice - 1) / kXentSlice;
  return k < kXentMaxSlices ? k : kXentMaxSlices;
}

// Doubles of workspace the staged path needs: two partials per slice, then m and S per row
// (0 for rows on the per-row path). Never decreasing in rows.
SF_HD inline size_t softmax_xent_workspace(size_t rows, size_t classes) {
  return classes > kXentWideClasses ? 2 * rows * (xent_slices(classes) + 1) : 0;
}

// What every stage reads. Workspace layout (P = rows * K): [0, P) slice partials (the maxima,
// then the sums), [P, 2P) where each slice's maximum is, [2P, 2P + rows) m, then rows of S.
struct XentWide {
  const float* logits;
  const int32_t* labels;
  size_t rows, classes, K;
  double* ws;
  SF_HD size_t parts() const { return rows * K; }
  SF_HD double* row_max() const { return ws + 2 * parts(); }
  SF_HD double* row_sum() const { return ws + 2 * parts() + rows; }
};

struct XentSliceMax {
  XentWide w;
  SF_HD void operator()(size_t i) const {
    const size_t n = i / w.K, k = i % w.K;
    const float* l = w.logits + n * w.classes;
    float best = ::nanf("");
    size_t at = w.classes;  // none yet
    for (size_t j = k; j < w.classes; j += w.K) {
      const float v = l[j];
      if (v > best || (at == w.classes && v == v)) {
        best = v;
        at = j;
      }
    }
    w.ws[i] = best;
    w.ws[w.parts() + i] = static_cast<double>(at);
  }
};

struct XentRowMax {
  XentWide w;
  float* hit;
  SF_HD void operator()(size_t n) const {
    const double* best = w.ws + n * w.K;
    const double* at = w.ws + w.parts() + n * w.K;
    const float l0 = w.logits[n * w.classes];
    double m = l0, am = 0.0;  // XentRow's rule: a NaN l_0 is the maximum
    if (l0 == l0)
      for (size_t k = 0; k < w.K; ++k)  // slice 0 holds l_0: the first partial is not NaN
        if (best[k] > m || (best[k] == m && at[k] < am)) {
          m = best[k];
          am = at[k];
        }
    w.row_max()[n] = m;
    const int32_t label = w.labels[n];
    hit[n] = xent_label_ok(label, w.classes) && am == static_cast<double>(label) ? 1.f : 0.f;
  }
};

struct XentSliceSum {
  XentWide w;
  float* e;  // null, or dlogits: each exp(l_j - m) kept (rounded to float) for XentGrad
  SF_HD void operator()(size_t i) const {
    const size_t n = i / w.K, k = i % w.K;
    const float* l = w.logits + n * w.classes;
    const double m = w.row_max()[n];
    double s = 0.0;
    for (size_t j = k; j < w.classes; j += w.K) {
      const double v = portable_exp(static_cast<double>(l[j]) - m);
      s += v;
      if (e) e[n * w.classes + j] = static_cast<float>(v);
    }
    w.ws[i] = s;
  }
};

struct XentRowLoss {
  XentWide w;
  float* loss;
  SF_HD void operator()(size_t n) const {
    const double* part = w.ws + n * w.K;
    double s = 0.0;
    for (size_t k = 0; k < w.K; ++k) s += part[k];
    w.row_sum()[n] = s;
    const int32_t label = w.labels[n];
    loss[n] = xent_label_ok(label, w.classes)
                  ? static_cast<float>(w.row_max()[n] + portable_log_ge1(s) -
                                       static_cast<double>(w.logits[n * w.classes + static_cast<size_t>(label)]))
                  : ::nanf("");
  }
};

struct XentGrad {
  XentWide w;
  float* dlogits;  // holds XentSliceSum's exp(l_j - m)
  SF_HD void operator()(size_t i) const {
    const size_t n = i / w.classes, j = i % w.classes;
    const int32_t label = w.labels[n];
    if (!xent_label_ok(label, w.classes)) {
      dlogits[i] = 0.f;
      return;
    }
    const float p = static_cast<float>(static_cast<double>(dlogits[i]) / w.row_sum()[n]);
    dlogits[i] = j == static_cast<size_t>(label) ? p - 1.f : p;
  }
};

}  // namespace skyforge::kernels
