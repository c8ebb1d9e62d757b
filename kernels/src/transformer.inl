// launch.hpp's transformer-layer calls (layer normalization, attention's head layouts, the
// embeddings), written once for both builds (common.hpp says how); included after the build's
// for_n.
#include "common.hpp"

#include <skyforge/kernels/attention.hpp>
#include <skyforge/kernels/embedding.hpp>
#include <skyforge/kernels/norm.hpp>

namespace skyforge::kernels {

void layer_norm_forward(const float* x, float* y, size_t rows, size_t F, const float* gamma, const float* beta,
                        float epsilon, float* mean, float* invstd, Stream s) {
  constexpr const char* what = "layer_norm_forward";
  if (rows == 0) return;
  impl::require(F > 0, what, "needs at least one feature");
  impl::require(x && y && mean && invstd, what, "x, y, mean and invstd are required");
  for_n(s, rows, LayerNormRow{x, y, F, gamma, beta, epsilon, mean, invstd}, what);
}

void layer_norm_backward(const float* x, const float* dy, float* dx, size_t rows, size_t F, const float* gamma,
                         const float* mean, const float* invstd, float* dgamma, float* dbeta, double* ws, Stream s) {
  constexpr const char* what = "layer_norm_backward";
  if (F == 0) return;
  if (dgamma || dbeta)
    impl::column_reduce<2>(s, rows, F, LayerNormParamTerm{x, dy, mean, invstd, F}, LayerNormParamFinish{dgamma, dbeta},
                           ws, what);
  if (dx && rows) for_n(s, rows, LayerNormDxRow{x, dy, dx, F, gamma, mean, invstd}, what);
}

namespace {
void permute_heads(const float* src, float* dst, size_t batch, size_t seq, size_t heads, size_t dim, bool split,
                   Stream s, const char* what) {
  const size_t n = batch * seq * heads * dim;
  if (n == 0) return;
  impl::require(src && dst && src != dst, what, "src and dst are required and distinct");
  for_n(s, n, HeadsPermute{src, dst, seq, heads, dim, split}, what);
}
}  // namespace

void split_heads(const float* src, float* dst, size_t batch, size_t seq, size_t heads, size_t dim, Stream s) {
  permute_heads(src, dst, batch, seq, heads, dim, true, s, "split_heads");
}

void merge_heads(const float* src, float* dst, size_t batch, size_t seq, size_t heads, size_t dim, Stream s) {
  permute_heads(src, dst, batch, seq, heads, dim, false, s, "merge_heads");
}

namespace {
void check_embedding(size_t rows, size_t input_dim, size_t dim, const char* what) {
  impl::require(input_dim > 0 && dim > 0, what, "input_dim and dim must be at least 1");
  impl::require(rows < (size_t{1} << 31), what, "rows must be below 2^31");
}
}  // namespace

void embedding_forward(const float* x, const float* table, float* y, size_t rows, size_t input_dim, size_t dim,
                       double* invalid, double* ws, Stream s) {
  constexpr const char* what = "embedding_forward";
  check_embedding(rows, input_dim, dim, what);
  if (rows == 0) {
    if (invalid) fill(invalid, 1, 0.0, s);
    return;
  }
  for_n(s, rows * dim, EmbeddingGather{x, table, y, input_dim, dim}, what);
  if (invalid) impl::column_reduce<1>(s, rows, 1, InvalidIndexTerm{x, input_dim}, StoreDouble{invalid}, ws, what);
}

void embedding_backward(const float* x, const float* dy, float* dtable, size_t rows, size_t input_dim, size_t dim,
                        int32_t* ws, Stream s) {
  constexpr const char* what = "embedding_backward";
  check_embedding(rows, input_dim, dim, what);
  impl::require(rows == 0 || ws != nullptr, what, "needs a workspace of embedding_backward_workspace(rows) int32s");
  int32_t *rank = ws, *order = ws + rows;
  if (rows) {
    for_n(s, rows, EmbeddingRank{x, rows, input_dim, rank, order}, what);
    for_n(s, rows, EmbeddingScatter{rank, order}, what);
  }
  for_n(s, input_dim * dim, EmbeddingTableGrad{x, dy, order, dtable, rows, input_dim, dim}, what);
}

void position_embedding_forward(const float* table, float* y, size_t batch, size_t seq, size_t dim, Stream s) {
  if (batch * seq * dim == 0) return;
  for_n(s, batch * seq * dim, PositionBroadcast{table, y, seq * dim}, "position_embedding_forward");
}

void position_embedding_backward(const float* dy, float* dtable, size_t batch, size_t seq, size_t length, size_t dim,
                                 double* ws, Stream s) {
  constexpr const char* what = "position_embedding_backward";
  impl::require(seq <= length, what, "seq must not exceed length");
  if (seq * dim > 0) impl::column_reduce<1>(s, batch, seq * dim, SumTerm{dy, seq * dim}, StoreFloat{dtable}, ws, what);
  for_n(s, (length - seq) * dim, ZeroFloat{dtable + seq * dim}, what);
}

}  // namespace skyforge::kernels
