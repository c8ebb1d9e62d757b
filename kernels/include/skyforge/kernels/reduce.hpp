// Deterministic reductions (docs/kernels.md, "Reductions"): column sums of a row-major
// [rows, cols] matrix in double, split in a way that depends on the shape only, so every
// backend, thread count and GPU adds the same terms in the same order.
//
// Stage 1 (ColumnPartials, rows' worth of work spread over K * cols calls): partial k of
// column c adds rows k, k + K, k + 2K, ... in that order. Neighbouring calls read neighbouring
// columns, then neighbouring rows, so a GPU warp reads contiguous memory.
// Stage 2 (ColumnTotals, one call per column): adds the K partials in order k = 0 .. K-1.
#pragma once

#include "hd.hpp"

namespace skyforge::kernels {

// K, the partials per column: one per 64 rows, at most 1024, at least 1.
SF_HD inline size_t reduce_split(size_t rows) {
  const size_t k = (rows + 63) / 64;
  return k < 1 ? 1 : (k > 1024 ? 1024 : k);
}

// Doubles of workspace every kernel taking `ws` needs for a [rows, cols] input: Q <= 2
// partial sets of K * cols, then 2 * cols for per-column results.
SF_HD inline size_t reduce_workspace(size_t rows, size_t cols) { return 2 * reduce_split(rows) * cols + 2 * cols; }

// Term: SF_HD void operator()(size_t r, size_t c, double* acc) const, adding row r's Q terms.
// part[(q * K + k) * cols + c] receives partial k of quantity q for column c.
template <int Q, class Term>
struct ColumnPartials {
  Term term;
  size_t rows, cols, K;
  double* part;
  SF_HD void operator()(size_t i) const {
    const size_t k = i / cols, c = i % cols;
    double acc[Q];
    for (int q = 0; q < Q; ++q) acc[q] = 0.0;
    for (size_t r = k; r < rows; r += K) term(r, c, acc);
    for (int q = 0; q < Q; ++q) part[(q * K + k) * cols + c] = acc[q];
  }
};

// Finish: SF_HD void operator()(size_t c, const double* total) const, with Q totals.
template <int Q, class Finish>
struct ColumnTotals {
  Finish finish;
  size_t cols, K;
  const double* part;
  SF_HD void operator()(size_t c) const {
    double s[Q];
    for (int q = 0; q < Q; ++q) s[q] = 0.0;
    for (size_t k = 0; k < K; ++k)
      for (int q = 0; q < Q; ++q) s[q] += part[(q * K + k) * cols + c];
    finish(c, s);
  }
};

struct SumTerm {
  const float* x;
  size_t cols;
  SF_HD void operator()(size_t r, size_t c, double* a) const { a[0] += static_cast<double>(x[r * cols + c]); }
};

struct SumSquaresTerm {
  const float* x;
  size_t cols;
  SF_HD void operator()(size_t r, size_t c, double* a) const {
    const double v = x[r * cols + c];
    a[0] += v * v;
  }
};

struct StoreDouble {
  double* out;
  SF_HD void operator()(size_t c, const double* s) const { out[c] = s[0]; }
};

struct StoreFloat {
  float* out;
  SF_HD void operator()(size_t c, const double* s) const { out[c] = static_cast<float>(s[0]); }
};

}  // namespace skyforge::kernels
