// Multi-head self-attention's own kernels (docs/kernels.md, "Attention"); its GEMMs (the
// projections, q·k^T per (sample, head), weights·v) run on the engine's BLAS, its softmax is
// BiasSoftmaxRow / SoftmaxBackRow (activation.hpp) over the score rows.
//
// Dropout on the attention weights is the dropout layer's mask (philox.hpp, DropoutApply) over
// the weights tensor [batch, heads, seq_q, seq_k] of the replica's batch, with the key's layer
// the attention layer's index: element i = ((b * heads + h) * seq + q) * seq + k.
#pragma once

#include "hd.hpp"

namespace skyforge::kernels {

// Between the projections' layout [batch, seq, heads, dim] (a row per token, Keras' (features,
// heads, dim) kernels flattened) and the per-head layout [batch, heads, seq, dim] the batched
// GEMMs take. split: src is token-major, dst head-major; !split: the reverse. Element i of dst.
struct HeadsPermute {
  const float* src;
  float* dst;
  size_t seq, heads, dim;
  bool split;
  SF_HD void operator()(size_t i) const {
    const size_t d = i % dim;
    size_t t = i / dim;
    if (split) {  // dst [b, h, s, d]
      const size_t s = t % seq;
      t /= seq;
      const size_t h = t % heads, b = t / heads;
      dst[i] = src[((b * seq + s) * heads + h) * dim + d];
    } else {  // dst [b, s, h, d]
      const size_t h = t % heads;
      t /= heads;
      const size_t s = t % seq, b = t / seq;
      dst[i] = src[((b * heads + h) * seq + s) * dim + d];
    }
  }
};

}  // namespace skyforge::kernels
