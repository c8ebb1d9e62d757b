// Embedding lookups (docs/kernels.md, "Embeddings"): Keras' Embedding (a table row per input
// index) and keras_hub's PositionEmbedding (the table's first `seq` rows, the same for every
// sample), forward and backward. The embedding's table gradient adds each row's dy in row order,
// found through a stable sort of the indices by rank counting: no atomics, the same bits on any
// thread count and in both builds.
#pragma once

#include "hd.hpp"

namespace skyforge::kernels {

// An input value's table row: v itself when it is an integer in [0, input_dim), else -1
// (negative, fractional, too large, NaN: the engines report such an input as an error).
SF_HD inline int64_t embedding_index(float v, size_t input_dim) {
  if (!(v >= 0.f) || !(v < 16777216.f)) return -1;  // above 2^24 a float no longer holds every integer
  const int64_t i = static_cast<int64_t>(v);
  return static_cast<float>(i) == v && static_cast<size_t>(i) < input_dim ? i : -1;
}

// Element i of y [rows, dim]: table[index(x[r]), j], or 0 for an invalid index.
struct EmbeddingGather {
  const float* x;
  const float* table;
  float* y;
  size_t input_dim, dim;
  SF_HD void operator()(size_t i) const {
    const int64_t v = embedding_index(x[i / dim], input_dim);
    y[i] = v < 0 ? 0.f : table[static_cast<size_t>(v) * dim + i % dim];
  }
};

// Counts the invalid indices (a column reduction's term over x as [rows, 1]).
struct InvalidIndexTerm {
  const float* x;
  size_t input_dim;
  template <class A>
  SF_HD void operator()(size_t r, size_t, A* a) const { a[0].add(embedding_index(x[r], input_dim) < 0 ? 1.f : 0.f); }
};

// Backward, pass 1, row r: rank[r] = its place in the rows sorted by (index, row), or -1 for an
// invalid index; order[r] = -1 (pass 2 fills the first valid-count entries).
struct EmbeddingRank {
  const float* x;
  size_t rows, input_dim;
  int32_t *rank, *order;
  SF_HD void operator()(size_t r) const {
    order[r] = -1;
    const int64_t v = embedding_index(x[r], input_dim);
    if (v < 0) {
      rank[r] = -1;
      return;
    }
    int32_t before = 0;
    for (size_t q = 0; q < rows; ++q) {
      const int64_t u = embedding_index(x[q], input_dim);
      before += u >= 0 && (u < v || (u == v && q < r)) ? 1 : 0;
    }
    rank[r] = before;
  }
};

// Pass 2, row r: order[rank[r]] = r (the sorted rows).
struct EmbeddingScatter {
  const int32_t* rank;
  int32_t* order;
  SF_HD void operator()(size_t r) const {
    if (rank[r] >= 0) order[rank[r]] = static_cast<int32_t>(r);
  }
};

// Pass 3, element (v, j) of dtable [input_dim, dim]: the float sum, in row order from 0, of
// dy[r, j] over the rows r with index v (found by binary search in order); 0 if none. The cpu
// backend adds the same terms in the same order: the same bits.
struct EmbeddingTableGrad {
  const float* x;
  const float* dy;
  const int32_t* order;
  float* dtable;
  size_t rows, input_dim, dim;
  SF_HD int64_t key(size_t p) const {  // the index at sorted place p; past the valid rows: input_dim
    return order[p] < 0 ? static_cast<int64_t>(input_dim) : embedding_index(x[order[p]], input_dim);
  }
  SF_HD void operator()(size_t i) const {
    const int64_t v = static_cast<int64_t>(i / dim);
    const size_t j = i % dim;
    size_t lo = 0, hi = rows;  // first place whose key is >= v
    while (lo < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      if (key(mid) < v) lo = mid + 1;
      else hi = mid;
    }
    float s = 0.f;
    for (size_t p = lo; p < rows && key(p) == v; ++p) s += dy[static_cast<size_t>(order[p]) * dim + j];
    dtable[i] = s;
  }
};

// Position embedding forward, element i of y [batch, seq, dim]: table[i mod (seq * dim)].
struct PositionBroadcast {
  const float* table;
  float* y;
  size_t per_sample;
  SF_HD void operator()(size_t i) const { y[i] = table[i % per_sample]; }
};

// p[i] = 0 (the position table's rows past the sequence get no gradient).
struct ZeroFloat {
  float* p;
  SF_HD void operator()(size_t i) const { p[i] = 0.f; }
};

}  // namespace skyforge::kernels
