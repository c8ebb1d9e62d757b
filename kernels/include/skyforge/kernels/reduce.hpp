// Deterministic reductions (docs/kernels.md, "Reductions"): column sums of a row-major
// [rows, cols] matrix, split in a way that depends on the shape only, so every backend, thread
// count and GPU adds the same terms in the same order, in an accumulator A of sums.hpp (a
// double, or with Reduction::fp32 a pair of floats) that each partial is stored as.
//
// Stage 1 (ColumnPartials, rows' worth of work spread over K * cols calls): partial k of
// column c adds rows k, k + K, k + 2K, ... in that order. Neighbouring calls read neighbouring
// columns, then neighbouring rows, so a GPU warp reads contiguous memory. K is chosen so that
// K * cols calls fill a large GPU (kReduceCalls) with at least kReduceMinRows rows each: a
// BatchNorm over 12 channels of a [1024, 28, 28] batch is 802,816 rows in 12 columns, and a
// split that ignored the columns would leave most of the GPU idle while it reads 38 MB.
// Middle stages (ColumnPartials over the partials, while more than kReduceFanIn partials are left): the K partials
// of a column become ceil(K / kReduceFanIn), partial k adding partials k, k + K', k + 2K', ...
// Last stage (ColumnTotals, one call per column): adds the last (<= kReduceFanIn) partials in
// order k = 0 .. K-1.
#pragma once

#include "hd.hpp"
#include "sums.hpp"

namespace skyforge::kernels {

inline constexpr size_t kReduceCalls = size_t{1} << 17;  // stage 1's calls to aim for (an H100 holds 270k threads)
inline constexpr size_t kReduceMinRows = 16;             // rows per stage-1 partial, at least
inline constexpr size_t kReduceFanIn = 64;               // partials a later stage adds per call, at most

// K, stage 1's partials per column: ceil(rows / 16), at most ceil(2^17 / cols), at least 1.
// Never decreasing in rows, so a workspace sized for a batch serves every smaller one.
SF_HD inline size_t reduce_split(size_t rows, size_t cols) {
  const size_t by_rows = (rows + kReduceMinRows - 1) / kReduceMinRows;
  const size_t by_cols = (kReduceCalls + (cols ? cols : 1) - 1) / (cols ? cols : 1);
  const size_t k = by_rows < by_cols ? by_rows : by_cols;
  return k < 1 ? 1 : k;
}

// The partials a middle stage leaves of K: ceil(K / kReduceFanIn).
SF_HD inline size_t reduce_next(size_t k) { return (k + kReduceFanIn - 1) / kReduceFanIn; }

// Doubles of workspace every kernel taking `ws` needs for a [rows, cols] input: stage 1's
// Q <= 2 partial sets of K * cols, the second stage's 2 * K' * cols (later stages take turns in
// the two), then 2 * cols for per-column results. Never decreasing in rows.
SF_HD inline size_t reduce_partials(size_t rows, size_t cols) {
  const size_t k = reduce_split(rows, cols);
  return 2 * k * cols + (k > kReduceFanIn ? 2 * reduce_next(k) * cols : 0);
}
SF_HD inline size_t reduce_workspace(size_t rows, size_t cols) { return reduce_partials(rows, cols) + 2 * cols; }

// Term: template <class A> SF_HD void operator()(size_t r, size_t c, A* acc) const, adding
// row r's Q terms (A::add, A::add_product). part[(q * K + k) * cols + c] receives partial k of
// quantity q for column c (A::store).
template <int Q, class Term, class A = DoubleSum>
struct ColumnPartials {
  Term term;
  size_t rows, cols, K;
  double* part;
  SF_HD void operator()(size_t i) const {
    const size_t k = i / cols, c = i % cols;
    A acc[Q];
    for (size_t r = k; r < rows; r += K) term(r, c, acc);
    for (int q = 0; q < Q; ++q) acc[q].store(part + (q * K + k) * cols + c);
  }
};

// A middle stage's term, for ColumnPartials over the [K_in, cols] partials of each of Q
// quantities (as ColumnPartials lays them out): row r adds partial r of every quantity.
template <int Q>
struct PartialsTerm {
  const double* in;
  size_t K_in, cols;
  template <class A>
  SF_HD void operator()(size_t r, size_t c, A* a) const {
    for (int q = 0; q < Q; ++q) a[q].add(A::load(in + (q * K_in + r) * cols + c));
  }
};

// Finish: SF_HD void operator()(size_t c, const double* total) const, with Q totals (A::value).
template <int Q, class Finish, class A = DoubleSum>
struct ColumnTotals {
  Finish finish;
  size_t cols, K;
  const double* part;
  SF_HD void operator()(size_t c) const {
    A acc[Q];
    for (size_t k = 0; k < K; ++k)
      for (int q = 0; q < Q; ++q) acc[q].add(A::load(part + (q * K + k) * cols + c));
    double s[Q];
    for (int q = 0; q < Q; ++q) s[q] = acc[q].value();
    finish(c, s);
  }
};

struct SumTerm {
  const float* x;
  size_t cols;
  template <class A>
  SF_HD void operator()(size_t r, size_t c, A* a) const { a[0].add(x[r * cols + c]); }
};

struct SumSquaresTerm {
  const float* x;
  size_t cols;
  template <class A>
  SF_HD void operator()(size_t r, size_t c, A* a) const {
    const float v = x[r * cols + c];
    a[0].add_product(v, v);
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
