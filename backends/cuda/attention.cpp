// The cuda engine's multi_head_attention (attention.hpp).
#include "attention.hpp"

#include <algorithm>
#include <cmath>

namespace skyforge::cuda {

namespace k = skyforge::kernels;

Attention::Attention(const Shape& s) : s_(s), inv_(static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.kd)))) {
  const size_t HK = s.heads * s.kd, HV = s.heads * s.vd;
  size_t at = 0;
  auto take = [&](size_t& where, size_t n, bool present) {
    where = at;
    if (present) at += n;
  };
  take(at_.wq, s.d * HK, true);
  take(at_.bq, HK, s.use_bias);
  take(at_.wk, s.d * HK, true);
  take(at_.bk, HK, s.use_bias);
  take(at_.wv, s.d * HV, true);
  take(at_.bv, HV, s.use_bias);
  take(at_.wo, HV * s.d, true);
  take(at_.bo, s.d, s.use_bias);
}

void Attention::reserve(Device& dev, uint32_t batch, Kept* kept) {
  const size_t rows = size_t{batch} * s_.seq, HK = s_.heads * s_.kd, HV = s_.heads * s_.vd;
  const size_t pairs = size_t{batch} * s_.heads * s_.seq * s_.seq, widest = std::max(HK, HV);
  renew(q_, dev, rows * HK, kept);
  renew(k_, dev, rows * HK, kept);
  renew(v_, dev, rows * HV, kept);
  renew(probs_, dev, pairs, kept);
  if (s_.rate > 0.f) renew(drop_, dev, pairs, kept);
  renew(o_, dev, rows * HV, kept);
  renew(tok_, dev, rows * widest, kept);
  renew(heads_, dev, rows * widest, kept);
  renew(dheads_, dev, rows * widest, kept);
  renew(dprobs_, dev, pairs, kept);
}

size_t Attention::workspace(uint32_t batch) const {
  return k::reduce_workspace(size_t{batch} * s_.seq, std::max({s_.heads * s_.kd, s_.heads * s_.vd, s_.d}));
}

void Attention::project(Device& dev, const float* x, const float* w, const float* b, size_t width, size_t dim,
                        size_t rows, uint32_t batch, float* heads) {
  dev.gemm_bias_act(rows, width, s_.d, x, w, b, k::Activation::linear, tok_.get());
  k::split_heads(tok_.get(), heads, batch, s_.seq, s_.heads, dim, dev.stream());
}

void Attention::forward(Device& dev, const float* x, const float* p, float* y, uint32_t batch, bool training,
                        const k::DropoutKey& key, const k::StepState* state) {
  const k::Stream st = dev.stream();
  const size_t T = s_.seq, rows = size_t{batch} * T, HK = s_.heads * s_.kd, HV = s_.heads * s_.vd;
  const size_t pairs = size_t{batch} * s_.heads, TT = T * T;
  auto bias = [&](size_t off) { return s_.use_bias ? p + off : nullptr; };
  project(dev, x, p + at_.wq, bias(at_.bq), HK, s_.kd, rows, batch, q_.get());
  project(dev, x, p + at_.wk, bias(at_.bk), HK, s_.kd, rows, batch, k_.get());
  project(dev, x, p + at_.wv, bias(at_.bv), HV, s_.vd, rows, batch, v_.get());
  dev.gemm_strided_batched(false, true, T, T, s_.kd, inv_, q_.get(), s_.kd, T * s_.kd, k_.get(), s_.kd, T * s_.kd,
                           0.f, probs_.get(), T, TT, pairs);
  k::bias_activation_forward(probs_.get(), nullptr, pairs * T, T, k::Activation::softmax, st);
  dropped_ = training && s_.rate > 0.f;
  if (dropped_) k::dropout(probs_.get(), drop_.get(), pairs * TT, s_.rate, key, state, st);
  const float* a = dropped_ ? drop_.get() : probs_.get();
  dev.gemm_strided_batched(false, false, T, s_.vd, T, 1.f, a, T, TT, v_.get(), s_.vd, T * s_.vd, 0.f, heads_.get(),
                           s_.vd, T * s_.vd, pairs);
  k::merge_heads(heads_.get(), o_.get(), batch, T, s_.heads, s_.vd, st);
  dev.gemm_bias_act(rows, s_.d, HV, o_.get(), p + at_.wo, bias(at_.bo), k::Activation::linear, y);
}

void Attention::project_backward(Device& dev, const float* x, const float* w, float* gw, float* gb,
                                 const float* dheads, size_t width, size_t dim, size_t rows, uint32_t batch,
                                 double* ws, float* dx, bool accumulate) {
  k::merge_heads(dheads, tok_.get(), batch, s_.seq, s_.heads, dim, dev.stream());
  dev.gemm(true, false, s_.d, width, rows, 1.f, x, s_.d, tok_.get(), width, 0.f, gw, width);
  if (s_.use_bias) k::bias_grad(tok_.get(), rows, width, gb, ws, dev.stream());
  if (dx) dev.gemm(false, true, rows, s_.d, width, 1.f, tok_.get(), width, w, width, accumulate ? 1.f : 0.f, dx, s_.d);
}

void Attention::backward(Device& dev, const float* x, const float* p, const float* dy, float* g, float* dx,
                         uint32_t batch, double* ws, const k::DropoutKey& key, const k::StepState* state) {
  const k::Stream st = dev.stream();
  const size_t T = s_.seq, rows = size_t{batch} * T, HK = s_.heads * s_.kd, HV = s_.heads * s_.vd;
  const size_t pairs = size_t{batch} * s_.heads, TT = T * T;
  // The output projection; dO into the heads' layout (heads_).
  dev.gemm(true, false, HV, s_.d, rows, 1.f, o_.get(), HV, dy, s_.d, 0.f, g + at_.wo, s_.d);
  if (s_.use_bias) k::bias_grad(dy, rows, s_.d, g + at_.bo, ws, st);
  dev.gemm(false, true, rows, HV, s_.d, 1.f, dy, s_.d, p + at_.wo, s_.d, 0.f, tok_.get(), HV);
  k::split_heads(tok_.get(), heads_.get(), batch, T, s_.heads, s_.vd, st);
  // dA = dO V^T, through the dropout and the softmax: dS (the scores' gradient, before the scale).
  dev.gemm_strided_batched(false, true, T, T, s_.vd, 1.f, heads_.get(), s_.vd, T * s_.vd, v_.get(), s_.vd,
                           T * s_.vd, 0.f, dprobs_.get(), T, TT, pairs);
  if (dropped_) k::dropout(dprobs_.get(), dprobs_.get(), pairs * TT, s_.rate, key, state, st);
  k::activation_backward(probs_.get(), dprobs_.get(), pairs * T, T, k::Activation::softmax, st);
  // dQ = dS K / sqrt(kd), dK = dS^T Q / sqrt(kd), dV = A^T dO; dx = dQ Wq^T + dK Wk^T + dV Wv^T.
  dev.gemm_strided_batched(false, false, T, s_.kd, T, inv_, dprobs_.get(), T, TT, k_.get(), s_.kd, T * s_.kd, 0.f,
                           dheads_.get(), s_.kd, T * s_.kd, pairs);
  project_backward(dev, x, p + at_.wq, g + at_.wq, g + at_.bq, dheads_.get(), HK, s_.kd, rows, batch, ws, dx, false);
  dev.gemm_strided_batched(true, false, T, s_.kd, T, inv_, dprobs_.get(), T, TT, q_.get(), s_.kd, T * s_.kd, 0.f,
                           dheads_.get(), s_.kd, T * s_.kd, pairs);
  project_backward(dev, x, p + at_.wk, g + at_.wk, g + at_.bk, dheads_.get(), HK, s_.kd, rows, batch, ws, dx, true);
  const float* a = dropped_ ? drop_.get() : probs_.get();
  dev.gemm_strided_batched(true, false, T, s_.vd, T, 1.f, a, T, TT, heads_.get(), s_.vd, T * s_.vd, 0.f,
                           dheads_.get(), s_.vd, T * s_.vd, pairs);
  project_backward(dev, x, p + at_.wv, g + at_.wv, g + at_.bv, dheads_.get(), HV, s_.vd, rows, batch, ws, dx, true);
}

}  // namespace skyforge::cuda
