// The cuda engine's multi_head_attention (docs/compute-backends.md, "The cuda engine"): Keras'
// MultiHeadAttention(query=x, value=x) on [batch, seq, d] samples, the cpu backend's arithmetic:
//   Q = x Wq + bq, K = x Wk + bk, V = x Wv + bv          (one GEMM each over the batch's rows)
//   per (sample, head): P = softmax(Q K^T / sqrt(key_dim)), A = dropout(P), O = A V
//   y = O Wo + bo                                          (O: the heads side by side)
// The per-(sample, head) products are strided-batched GEMMs on the heads' layout
// [batch, heads, seq, dim] (kernels' split_heads / merge_heads); dropout is the dropout layer's
// Philox mask over P (kernels/attention.hpp), redrawn by the backward. Nothing reads the host
// mid-step, so a step with it is captured as a graph like any other.
#pragma once

#include "device.hpp"

namespace skyforge::cuda {

class Attention {
 public:
  struct Shape {
    size_t seq = 0, d = 0, heads = 0, kd = 0, vd = 0;
    bool use_bias = true;
    float rate = 0.f;  // dropout on the attention weights, training only
  };
  explicit Attention(const Shape& s);

  // Buffers for batches up to `batch` (outside a capture; the old ones go to `kept` when
  // given: graphs still point at them), and the doubles of `ws` the backward's bias sums need.
  void reserve(Device& dev, uint32_t batch, Kept* kept = nullptr);
  size_t workspace(uint32_t batch) const;

  // p: the layer's parameters in Keras' order (wq, bq, wk, bk, wv, bv, wo, bo; the biases with
  // use_bias); key: the layer's dropout key, its step read from state.
  void forward(Device& dev, const float* x, const float* p, float* y, uint32_t batch, bool training,
               const kernels::DropoutKey& key, const kernels::StepState* state);
  // From the last forward: g (the parameters' gradients, overwritten) and, if not null, dx
  // (overwritten). dy is left as it was.
  void backward(Device& dev, const float* x, const float* p, const float* dy, float* g, float* dx, uint32_t batch,
                double* ws, const kernels::DropoutKey& key, const kernels::StepState* state);

 private:
  struct Offsets {
    size_t wq, bq, wk, bk, wv, bv, wo, bo;
  };
  // out[rows, width] = x W + b; then its heads' layout into heads.
  void project(Device& dev, const float* x, const float* w, const float* b, size_t width, size_t dim, size_t rows,
               uint32_t batch, float* heads);
  // From the gradient of one projection in the heads' layout: its weights' and bias' gradients,
  // and dx = (or +=, when accumulate) d W^T.
  void project_backward(Device& dev, const float* x, const float* w, float* gw, float* gb, const float* dheads,
                        size_t width, size_t dim, size_t rows, uint32_t batch, double* ws, float* dx, bool accumulate);

  Shape s_;
  Offsets at_{};  // where each tensor starts in the layer's parameters
  float inv_ = 1.f;  // 1 / sqrt(key_dim)
  bool dropped_ = false;  // the last forward applied dropout
  // Kept from the forward: Q, K, V in the heads' layout, P (and A when dropped), O by rows.
  Buffer<float> q_, k_, v_, probs_, drop_, o_;
  // Scratch: a [rows, max(HK, HV)] matrix, two in the heads' layout, the gradient of P.
  Buffer<float> tok_, heads_, dheads_, dprobs_;
};

}  // namespace skyforge::cuda
