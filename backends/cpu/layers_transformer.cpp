// The transformer layers of the cpu backend (Keras semantics, float32, row-major):
// layer_normalization, multi_head_attention (self-attention), embedding, position_embedding.
// Every sum runs in an order fixed by the shapes, so the thread count changes no bit.
#include "cpu_ops.hpp"
#include "layer_builders.hpp"

#include <skyforge/kernels/philox.hpp>

#include <cmath>

namespace skyforge::cpu {
namespace {

// ---- layer_normalization -------------------------------------------------------------------
// Keras' LayerNormalization over the last axis: per row, mean and variance = mean((x - mean)^2)
// (two passes), y = (x - mean) / sqrt(var + epsilon) * gamma + beta: the row kernels'
// layer_norm (simd.hpp), the same bits on every kernel table.
// The weights: gamma (scale), then beta (center), each only when the layer has it.
class LayerNorm final : public Layer {
 public:
  float epsilon = 1e-3f;
  bool scale = true, center = true;
  size_t C = 0;

  size_t param_size() const override { return (scale ? C : 0) + (center ? C : 0); }
  size_t rows(uint32_t batch) const { return batch * (numel(in_shape) / C); }
  void forward(const float* x, float* y, uint32_t batch, bool) override {
    const size_t M = rows(batch);
    if (mean_.size() < M) mean_.resize(M), invstd_.resize(M);
    const float* g = scale ? p_ : nullptr;
    const float* b = center ? p_ + (scale ? C : 0) : nullptr;
    const simd::RowKernels& rk = simd::row_kernels();
    k::for_rows(M, C, exec_, [&](size_t r0, size_t r1) {
      rk.layer_norm(x + r0 * C, y + r0 * C, r1 - r0, C, g, b, epsilon, mean_.data() + r0, invstd_.data() + r0);
    });
  }
  // xhat = (x - mean) * invstd; dgamma = sum dy * xhat, dbeta = sum dy over the rows;
  // dx = invstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma.
  void backward(const float* x, const float*, float* dy, float* dx, uint32_t batch) override {
    const size_t M = rows(batch);
    const float* g = scale ? p_ : nullptr;
    const float* mu = mean_.data();
    const float* is = invstd_.data();
    if (param_size() > 0) {
      acc_.resize(2 * C);
      k::reduce_rows(M, 2 * C, exec_, acc_.data(), [&](size_t b, size_t e, double* a) {
        for (size_t r = b; r < e; ++r) {
          const float* xr = x + r * C;
          const float* d = dy + r * C;
          for (size_t j = 0; j < C; ++j) {
            a[j] += d[j] * ((xr[j] - mu[r]) * is[r]);
            a[C + j] += d[j];
          }
        }
      });
      float* out = g_;
      if (scale)
        for (size_t j = 0; j < C; ++j) *out++ = static_cast<float>(acc_[j]);
      if (center)
        for (size_t j = 0; j < C; ++j) *out++ = static_cast<float>(acc_[C + j]);
    }
    if (!dx) return;
    const simd::RowKernels& rk = simd::row_kernels();
    k::for_rows(M, C, exec_, [&](size_t r0, size_t r1) {
      rk.layer_norm_dx(x + r0 * C, dy + r0 * C, dx + r0 * C, r1 - r0, C, g, mu + r0, is + r0);
    });
  }
  std::string describe() const override {
    return Layer::describe() + (scale ? "/scale" : "") + (center ? "/center" : "");
  }

 private:
  std::vector<float> mean_, invstd_;  // per row, of the last forward
  std::vector<double> acc_;
};

// ---- embedding -----------------------------------------------------------------------------
// Keras' Embedding: each input value, an integer index carried as a float, becomes its row of
// the (input_dim, output_dim) table. A value that is not an integer in [0, input_dim) is the
// caller's error: the forward gives it a row of zeros and no gradient and counts it
// (invalid_inputs), and the engine refuses the step on every replica (SF_ERR_INVALID naming the
// layer and the sample) before any update. No gradient reaches the input.
class Embedding final : public Layer {
 public:
  uint32_t input_dim = 0, output_dim = 0;
  std::string label;  // "layer 0 (embedding 'tokens')", for messages

  size_t param_size() const override { return size_t{input_dim} * output_dim; }
  bool valid(float v) const { return v >= 0.f && v < static_cast<float>(input_dim) && v == std::floor(v); }
  void forward(const float* x, float* y, uint32_t batch, bool) override {
    const size_t per = numel(in_shape), n = batch * per, D = output_dim;
    invalid_ = 0;
    first_invalid_.clear();
    for (size_t i = 0; i < n; ++i)
      if (!valid(x[i]) && invalid_++ == 0)
        first_invalid_ = label + ": sample " + std::to_string(i / per) + " holds " + schema::detail::number_text(x[i]) +
                         " at position " + std::to_string(i % per) + "; expected an integer index in [0, " +
                         std::to_string(input_dim) + ")";
    k::for_rows(n, D, exec_, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        if (valid(x[i]))
          std::memcpy(y + i * D, p_ + static_cast<size_t>(x[i]) * D, D * sizeof(float));
        else
          std::fill(y + i * D, y + (i + 1) * D, 0.f);
      }
    });
  }
  uint64_t invalid_inputs(std::string& first) const override {
    if (invalid_ > 0 && first.empty()) first = first_invalid_;
    return invalid_;
  }
  void backward(const float* x, const float*, float* dy, float* dx, uint32_t batch) override {
    const size_t n = batch * numel(in_shape), D = output_dim;
    std::fill(g_, g_ + param_size(), 0.f);
    for (size_t i = 0; i < n; ++i) {  // in input order: a row's sum never depends on the threads
      if (!valid(x[i])) continue;
      float* row = g_ + static_cast<size_t>(x[i]) * D;
      const float* d = dy + i * D;
#pragma omp simd
      for (size_t j = 0; j < D; ++j) row[j] += d[j];
    }
    if (dx) std::fill(dx, dx + n, 0.f);
  }

 private:
  uint64_t invalid_ = 0;       // of the last forward
  std::string first_invalid_;  // its first, described
};

// ---- position_embedding --------------------------------------------------------------------
// keras_hub's PositionEmbedding: the first `sequence` rows of a learned (sequence_length,
// features) table, the same for every sample; the input gives only the shape and gets no
// gradient.
class PositionEmbedding final : public Layer {
 public:
  uint32_t length = 0;

  size_t param_size() const override { return size_t{length} * in_shape[1]; }
  void forward(const float*, float* y, uint32_t batch, bool) override {
    const size_t n = numel(in_shape);
    k::for_rows(batch, n, exec_, [&](size_t b, size_t e) {
      for (size_t s = b; s < e; ++s) std::memcpy(y + s * n, p_, n * sizeof(float));
    });
  }
  void backward(const float*, const float*, float* dy, float* dx, uint32_t batch) override {
    const size_t n = numel(in_shape);
    k::bias_grad(dy, batch, n, exec_, g_);
    std::fill(g_ + n, g_ + param_size(), 0.f);  // rows past the sequence
    if (dx) std::fill(dx, dx + batch * n, 0.f);
  }
};

// ---- multi_head_attention ------------------------------------------------------------------
// Keras' MultiHeadAttention(query=x, value=x) on (T, D) samples, h heads:
//   Q = (x Wq + bq) / sqrt(key_dim), K = x Wk + bk, V = x Wv + bv    (rows of h heads)
//   per sample and head: P = softmax(Q K^T) over the keys, A = dropout(P), O = A V
//   y = O Wo + bo                                                     (O: the heads side by side)
// The projections are one GEMM each over every row of the batch; the per-(sample, head) GEMMs are
// shared out over the threads, each through the engine's gemm on one thread. Dropout on P
// (training, rate > 0) is the dropout layer's Philox mask (kernels::DropoutApply) of (seed, step,
// this layer's index, rank) over the batch's (sample, head, query, key) elements, so the backward
// redraws it instead of storing it.
class MultiHeadAttention final : public Layer {
 public:
  uint32_t heads = 1, kd = 1, vd = 1;
  float rate = 0.f;
  bool use_bias = true;
  std::string label;        // "layer 3 (multi_head_attention 'att')", for messages
  kernels::DropoutKey key;  // layer and rank set at creation; seed and step by begin_step

  // Offsets of the weights in the layer's parameters (Keras' order); biases only with use_bias.
  struct Offsets {
    size_t wq, bq, wk, bk, wv, bv, wo, bo, total;
  };
  Offsets offsets() const {
    const size_t D = in_shape[1], HK = size_t{heads} * kd, HV = size_t{heads} * vd;
    Offsets o{};
    size_t at = 0;
    auto take = [&](size_t& where, size_t n) { where = at, at += n; };
    take(o.wq, D * HK);
    if (use_bias) take(o.bq, HK);
    take(o.wk, D * HK);
    if (use_bias) take(o.bk, HK);
    take(o.wv, D * HV);
    if (use_bias) take(o.bv, HV);
    take(o.wo, HV * D);
    if (use_bias) take(o.bo, D);
    o.total = at;
    return o;
  }
  size_t param_size() const override { return offsets().total; }
  void begin_step(uint64_t seed, uint64_t step) override {
    key.seed = seed;
    key.step = step;
  }

  void forward(const float* x, float* y, uint32_t batch, bool training) override {
    const size_t T = in_shape[0], D = in_shape[1], M = batch * T, HK = size_t{heads} * kd, HV = size_t{heads} * vd;
    const size_t pairs = size_t{batch} * heads, TT = T * T;
    const Offsets w = offsets();
    q_.resize(M * HK), k_.resize(M * HK), v_.resize(M * HV), o_.resize(M * HV), probs_.resize(pairs * TT);
    project(x, M, D, w.wq, w.bq, HK, q_.data());
    project(x, M, D, w.wk, w.bk, HK, k_.data());
    project(x, M, D, w.wv, w.bv, HV, v_.data());
    const float inv = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kd)));
    float* q = q_.data();
    k::for_range(M * HK, exec_, [&](size_t b, size_t e) {
#pragma omp simd
      for (size_t i = b; i < e; ++i) q[i] *= inv;
    });
    over_pairs(batch, T * T * (kd + vd), [&](size_t n, size_t h, size_t pair) {
      float* s = probs_.data() + pair * TT;
      pair_gemm(false, true, T, T, kd, q + n * T * HK + h * kd, HK, k_.data() + n * T * HK + h * kd, HK, s, T);
      simd::row_kernels().softmax(s, T, T);
    });
    dropped_ = training && rate > 0.f;
    if (dropped_) {
      if (pairs * TT > kernels::kDropoutMaxElements)
        throw Error(label + ": " + std::to_string(pairs * TT) + " attention weights in one batch; dropout's masks cover " +
                        std::to_string(kernels::kDropoutMaxElements),
                    SF_ERR_INVALID);
      drop_.resize(pairs * TT);
      dropout(probs_.data(), drop_.data(), pairs * TT);
    }
    const float* a = dropped_ ? drop_.data() : probs_.data();
    over_pairs(batch, TT * vd, [&](size_t n, size_t h, size_t pair) {
      pair_gemm(false, false, T, vd, T, a + pair * TT, T, v_.data() + n * T * HV + h * vd, HV,
                o_.data() + n * T * HV + h * vd, HV);
    });
    k::gemm(false, false, M, D, HV, 1.f, o_.data(), HV, p_ + w.wo, D, 0.f, y, D, exec_);
    k::bias_activation(y, use_bias ? p_ + w.bo : nullptr, M, D, Activation::linear, exec_);
  }

  void backward(const float* x, const float*, float* dy, float* dx, uint32_t batch) override {
    const size_t T = in_shape[0], D = in_shape[1], M = batch * T, HK = size_t{heads} * kd, HV = size_t{heads} * vd;
    const size_t pairs = size_t{batch} * heads, TT = T * T;
    const Offsets w = offsets();
    dq_.resize(M * HK), dk_.resize(M * HK), dv_.resize(M * HV), do_.resize(M * HV), dprobs_.resize(pairs * TT);
    // Output projection.
    k::gemm(true, false, HV, D, M, 1.f, o_.data(), HV, dy, D, 0.f, g_ + w.wo, D, exec_);
    if (use_bias) k::bias_grad(dy, M, D, exec_, g_ + w.bo);
    k::gemm(false, true, M, HV, D, 1.f, dy, D, p_ + w.wo, D, 0.f, do_.data(), HV, exec_);
    // dA = dO V^T, dV = A^T dO per (sample, head).
    const float* a = dropped_ ? drop_.data() : probs_.data();
    over_pairs(batch, TT * vd, [&](size_t n, size_t h, size_t pair) {
      const size_t at = n * T * HV + h * vd;
      pair_gemm(false, true, T, T, vd, do_.data() + at, HV, v_.data() + at, HV, dprobs_.data() + pair * TT, T);
      pair_gemm(true, false, T, vd, T, a + pair * TT, T, do_.data() + at, HV, dv_.data() + at, HV);
    });
    if (dropped_) dropout(dprobs_.data(), dprobs_.data(), pairs * TT);
    // Through the softmax, then dQ = dS K, dK = dS^T Q (Q scaled).
    over_pairs(batch, TT * 2 * kd, [&](size_t n, size_t h, size_t pair) {
      float* ds = dprobs_.data() + pair * TT;
      simd::row_kernels().softmax_grad(probs_.data() + pair * TT, ds, T, T);
      const size_t at = n * T * HK + h * kd;
      pair_gemm(false, false, T, kd, T, ds, T, k_.data() + at, HK, dq_.data() + at, HK);
      pair_gemm(true, false, T, kd, T, ds, T, q_.data() + at, HK, dk_.data() + at, HK);
    });
    const float inv = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kd)));
    float* dq = dq_.data();
    k::for_range(M * HK, exec_, [&](size_t b, size_t e) {
#pragma omp simd
      for (size_t i = b; i < e; ++i) dq[i] *= inv;
    });
    // Input projections: weights, biases, and dx = dQ Wq^T + dK Wk^T + dV Wv^T.
    project_backward(x, M, D, w.wq, w.bq, HK, dq_.data(), dx, false);
    project_backward(x, M, D, w.wk, w.bk, HK, dk_.data(), dx, true);
    project_backward(x, M, D, w.wv, w.bv, HV, dv_.data(), dx, true);
  }
  std::string describe() const override {
    return Layer::describe() + "/h" + std::to_string(heads) + "/k" + std::to_string(kd) + "/v" + std::to_string(vd) +
           "/r" + std::to_string(rate) + (use_bias ? "/b" : "");
  }

 private:
  // C[M, N] = op(A) op(B) for one (sample, head), on the calling thread. These operands sit in
  // L1 and OpenBLAS would spend more on packing them than on the product: with a SIMD table its
  // register tiles run them (B^T, when op(B) is one, copied row-major first), otherwise OpenBLAS.
  static void pair_gemm(bool ta, bool tb, size_t M, size_t N, size_t K, const float* A, size_t lda, const float* B,
                        size_t ldb, float* C, size_t ldc) {
    const simd::Kernels* sk = simd::kernels();
    if (!sk) {
      k::gemm(ta, tb, M, N, K, 1.f, A, lda, B, ldb, 0.f, C, ldc, Exec{1});
      return;
    }
    if (tb) {
      static thread_local std::vector<float> bt;
      bt.resize(K * N);
      for (size_t t = 0; t < K; ++t)
        for (size_t j = 0; j < N; ++j) bt[t * N + j] = B[j * ldb + t];
      B = bt.data(), ldb = N;
    }
    sk->gemm(M, N, K, A, ta ? 1 : lda, ta ? lda : 1, B, ldb, C, ldc, false);
  }

  // out[M, width] = x[M, D] W + b (W at p_ + wk, b at p_ + bk when use_bias).
  void project(const float* x, size_t M, size_t D, size_t wk, size_t bk, size_t width, float* out) const {
    k::gemm(false, false, M, width, D, 1.f, x, D, p_ + wk, width, 0.f, out, width, exec_);
    k::bias_activation(out, use_bias ? p_ + bk : nullptr, M, width, Activation::linear, exec_);
  }
  // The gradients of one projection from d[M, width]; dx (when wanted) gets d W^T, added to it
  // when accumulate.
  void project_backward(const float* x, size_t M, size_t D, size_t wk, size_t bk, size_t width, const float* d,
                        float* dx, bool accumulate) {
    k::gemm(true, false, D, width, M, 1.f, x, D, d, width, 0.f, g_ + wk, width, exec_);
    if (use_bias) k::bias_grad(d, M, width, exec_, g_ + bk);
    if (dx) k::gemm(false, true, M, D, width, 1.f, d, width, p_ + wk, width, accumulate ? 1.f : 0.f, dx, D, exec_);
  }
  // f(sample, head, pair index) for every pair of the batch, shared out over the threads when
  // the pairs hold enough work (`work` multiply-adds each).
  template <class F>
  void over_pairs(uint32_t batch, size_t work, F&& f) const {
    const size_t pairs = size_t{batch} * heads;
#pragma omp parallel for schedule(static) num_threads(exec_.threads) if (pairs > 1 && k::par(pairs * work, exec_))
    for (size_t pair = 0; pair < pairs; ++pair) f(pair / heads, pair % heads, pair);
  }
  // out = in * the mask of this step (in place allowed), over n attention weights.
  void dropout(const float* in, float* out, size_t n) const {
    const kernels::DropoutApply apply{in, out, n, key, kernels::dropout_cut(rate), 1.f / (1.f - rate)};
    k::for_range((n + 3) / 4, exec_, [&](size_t b, size_t e) {
      for (size_t j = b; j < e; ++j) apply(j);
    });
  }

  std::vector<float> q_, k_, v_, o_, probs_, drop_;  // of the last forward
  std::vector<float> dq_, dk_, dv_, do_, dprobs_;
  bool dropped_ = false;  // the last forward applied dropout
};

}  // namespace

std::unique_ptr<Layer> make_transformer_layer(const schema::LayerConfig& c, const Shape& in, uint64_t seed,
                                              uint32_t rank) {
  const std::string_view t = c.type();
  if (t == "layer_normalization") {
    auto l = std::make_unique<LayerNorm>();
    l->epsilon = static_cast<float>(c.real("epsilon"));
    l->scale = c.flag("scale");
    l->center = c.flag("center");
    l->C = in.back();
    return l;
  }
  if (t == "embedding") {
    auto l = std::make_unique<Embedding>();
    l->input_dim = c.count("input_dim");
    l->output_dim = c.count("output_dim");
    l->label = c.label();
    return l;
  }
  if (t == "position_embedding") {
    auto l = std::make_unique<PositionEmbedding>();
    l->length = c.count("sequence_length");
    return l;
  }
  if (t == "multi_head_attention") {
    auto l = std::make_unique<MultiHeadAttention>();
    l->heads = c.count("num_heads");
    l->kd = c.count("key_dim");
    l->vd = c.count("value_dim");
    l->rate = static_cast<float>(c.real("dropout"));
    l->use_bias = c.flag("use_bias");
    l->label = c.label();
    if (c.index() >= kernels::kDropoutMaxLayer || rank >= kernels::kDropoutMaxRank)
      c.fail("dropout masks are keyed by layer and rank below 65536");
    l->key = kernels::DropoutKey{seed, 0, static_cast<uint32_t>(c.index()), rank};
    return l;
  }
  return nullptr;
}

}  // namespace skyforge::cpu
