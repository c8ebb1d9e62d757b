// Keras' gradient clipping (docs/compute-backends.md, "Gradient clipping") on a flat gradient of
// variables laid end to end: clipnorm scales each variable to at most that norm, global_clipnorm
// all of them together. The norms are summed the one way every engine sums them: each
// variable's squares in blocks of kClipBlock elements from its start, each block in order in
// double, then the blocks in order, then (global_clipnorm) the variables in order, so the cpu
// engine and the cuda engine's builds compute the same bits on any thread count. (With
// Reduction::fp32 the blocks and their sums are in pairs of floats, sums.hpp: other bits, as
// deterministic; the variables' totals are doubles either way.)
#pragma once

#include "hd.hpp"
#include "sums.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace skyforge::kernels {

inline constexpr size_t kClipBlock = 4096;

// Sum of x[i]^2 over [0, n) in the accumulator A (sums.hpp), in order (one block): each
// product exact, so an FMA or not gives the same bits.
template <class A>
SF_HD inline A block_squares(const float* x, size_t n) {
  A acc;
  for (size_t i = 0; i < n; ++i) acc.add_product(x[i], x[i]);
  return acc;
}
// The same in double (the cpu engine's).
SF_HD inline double block_sum_squares(const float* x, size_t n) { return block_squares<DoubleSum>(x, n).value(); }

// std::min / std::max as the host computes them (the first argument when unordered: a NaN norm
// stays NaN on every build).
SF_HD inline float min_of(float a, float b) { return b < a ? b : a; }
SF_HD inline float max_of(float a, float b) { return a < b ? b : a; }

// Keras' factors: clipnorm's g * c / max(|g|, c) and global_clipnorm's c * min(1 / |all|, 1 / c).
SF_HD inline float clipnorm_bound(double squares, float clipnorm) {
  return max_of(static_cast<float>(::sqrt(squares)), clipnorm);
}
SF_HD inline float global_clip_scale(double squares, double global_clipnorm) {
  const float norm = static_cast<float>(::sqrt(squares));
  return static_cast<float>(global_clipnorm) * min_of(1.f / norm, static_cast<float>(1.0 / global_clipnorm));
}

struct ClipConfig {
  double clipnorm = 0.0, global_clipnorm = 0.0;  // Keras' options; 0: off (clipnorm wins when both are set)
};

// The variables of a flat gradient: table[0 .. count] the prefix sums of their sizes, then
// table[count + 1 .. 2 count + 1] the prefix sums of their block counts (clip_table), in the
// pointers' memory.
struct ClipLayout {
  const uint64_t* table = nullptr;
  uint32_t count = 0;  // variables
  size_t blocks = 0;   // kClipBlock blocks in all (a variable's last may be short)
  size_t size = 0;     // elements in all

  SF_HD const uint64_t* offset() const { return table; }
  SF_HD const uint64_t* first_block() const { return table + count + 1; }
  // The variable of element i (of block j): the first v whose end is past it (empty ones skipped).
  SF_HD static uint32_t search(const uint64_t* ends, uint32_t count, uint64_t i) {
    uint32_t lo = 0, hi = count - 1;
    while (lo < hi) {
      const uint32_t mid = (lo + hi) / 2;
      if (ends[mid + 1] > i) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  }
  SF_HD uint32_t variable_of(size_t i) const { return search(offset(), count, i); }
  SF_HD uint32_t variable_of_block(size_t j) const { return search(first_block(), count, j); }
};

// The host's table for ClipLayout (2 * (sizes.size() + 1) values), and its block count.
inline std::vector<uint64_t> clip_table(const std::vector<size_t>& sizes) {
  std::vector<uint64_t> t(2 * (sizes.size() + 1), 0);
  const size_t v = sizes.size();
  for (size_t i = 0; i < v; ++i) {
    t[i + 1] = t[i] + sizes[i];
    t[v + 2 + i] = t[v + 1 + i] + (sizes[i] + kClipBlock - 1) / kClipBlock;
  }
  return t;
}

// g[i] *= float(1 / *samples): a gradient sum becomes the mean.
struct ScaleToMean {
  float* g;
  const double* samples;
  SF_HD void operator()(size_t i) const { g[i] *= static_cast<float>(1.0 / *samples); }
};

// part[j] = block j's sum of squares (as A stores it).
template <class A>
struct ClipBlockSquares {
  const float* g;
  ClipLayout l;
  double* part;
  SF_HD void operator()(size_t j) const {
    const uint32_t v = l.variable_of_block(j);
    const uint64_t begin = l.offset()[v] + (j - l.first_block()[v]) * kClipBlock;
    const uint64_t end = l.offset()[v + 1] < begin + kClipBlock ? l.offset()[v + 1] : begin + kClipBlock;
    block_squares<A>(g + begin, end - begin).store(part + j);
  }
};

// squares[v] = variable v's blocks added in order (in A, the total as a double).
template <class A>
struct ClipVariableSquares {
  ClipLayout l;
  const double* part;
  double* squares;
  SF_HD void operator()(size_t v) const {
    A acc;
    for (uint64_t j = l.first_block()[v]; j < l.first_block()[v + 1]; ++j) acc.add(A::load(part + j));
    squares[v] = acc.value();
  }
};

// clipnorm: g[i] = g[i] * clipnorm / clipnorm_bound(its variable's squares).
struct ClipEach {
  float* g;
  ClipLayout l;
  const double* squares;
  float clipnorm;
  SF_HD void operator()(size_t i) const { g[i] = g[i] * clipnorm / clipnorm_bound(squares[l.variable_of(i)], clipnorm); }
};

// global_clipnorm: *scale = global_clip_scale(the variables' squares added in order) (one call).
struct GlobalClipScale {
  const double* squares;
  uint32_t count;
  double global_clipnorm;
  double* scale;
  SF_HD void operator()(size_t) const {
    double acc = 0;
    for (uint32_t v = 0; v < count; ++v) acc += squares[v];
    *scale = global_clip_scale(acc, global_clipnorm);
  }
};

// g[i] *= float(*scale).
struct ScaleBy {
  float* g;
  const double* scale;
  SF_HD void operator()(size_t i) const { g[i] *= static_cast<float>(*scale); }
};

}  // namespace skyforge::kernels
