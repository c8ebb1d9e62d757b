// The cpu backend's layers (Keras semantics, NHWC, float32) and the loss.
#include "cpu_ops.hpp"
#include "layer_builders.hpp"

#include <skyforge/kernels/philox.hpp>
#include <skyforge/layer_schema.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

namespace skyforge::cpu {

size_t numel(const Shape& s) {
  size_t n = 1;
  for (uint32_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

float uniform01(Rng& rng) { return static_cast<float>(rng.next() >> 40) * (1.0f / 16777216.0f); }

void ByteReader::raw(void* p, size_t n, const char* what) {
  if (left() < n)
    throw Error(std::string("cpu state: truncated while reading ") + what + " (need " + std::to_string(n) +
                    " bytes, " + std::to_string(left()) + " left)",
                SF_ERR_INVALID);
  std::memcpy(p, b_.data() + pos_, n);
  pos_ += n;
}

void ByteReader::floats(float* p, size_t n, const char* what) {
  const uint64_t have = get<uint64_t>(what);
  if (have != n)
    throw Error(std::string("cpu state: ") + what + " holds " + std::to_string(have) + " values, this model needs " +
                    std::to_string(n),
                SF_ERR_INVALID);
  raw(p, n * sizeof(float), what);
}

std::string Layer::describe() const {
  return type + shape_str(in_shape) + "->" + shape_str(out_shape) + "/p" + std::to_string(param_size());
}

namespace {

const char* act_name(Activation a) {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::softmax: return "softmax";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::tanh: return "tanh";
    case Activation::sigmoid: return "sigmoid";
    default: return "linear";
  }
}

// A training forward's values before an activation whose backward needs them (gelu).
class PreActivation {
 public:
  // Where the forward stores them: n floats, or nullptr when the backward needs none.
  float* keep(Activation act, bool training, size_t n) {
    if (!training || !k::needs_pre_activation(act)) return nullptr;
    if (v_.size() < n) v_.resize(n);
    return v_.data();
  }
  const float* data() const { return v_.empty() ? nullptr : v_.data(); }

 private:
  std::vector<float> v_;
};

// ---- dense ---------------------------------------------------------------------------------
// Keras Dense: acts on the last axis (a rank-3 input is a batch of rows).
class Dense final : public Layer {
 public:
  uint32_t units = 0;
  bool use_bias = true;
  Activation act = Activation::linear;
  size_t fin = 0;

  size_t param_size() const override { return fin * units + (use_bias ? units : 0); }
  size_t rows(uint32_t batch) const { return batch * (numel(in_shape) / fin); }
  void forward(const float* x, float* y, uint32_t batch, bool training) override {
    const size_t M = rows(batch);
    k::gemm(false, false, M, units, fin, 1.f, x, fin, p_, units, 0.f, y, units, exec_);
    k::bias_activation(y, use_bias ? p_ + fin * units : nullptr, M, units, act, exec_, pre_.keep(act, training, M * units));
  }
  void backward(const float* x, const float* y, float* dy, float* dx, uint32_t batch) override {
    const size_t M = rows(batch);
    k::activation_backward(y, dy, M, units, act, exec_, pre_.data());
    k::gemm(true, false, fin, units, M, 1.f, x, fin, dy, units, 0.f, g_, units, exec_);
    if (use_bias) k::bias_grad(dy, M, units, exec_, g_ + fin * units);
    if (dx) k::gemm(false, true, M, fin, units, 1.f, dy, units, p_, units, 0.f, dx, fin, exec_);
  }
  std::string describe() const override {
    return Layer::describe() + "/" + act_name(act) + (use_bias ? "/b" : "");
  }

 private:
  PreActivation pre_;
};

// ---- conv2d --------------------------------------------------------------------------------
// im2col + GEMM. The kernel is Keras' (kh, kw, in_channels, filters), so a col row
// (kh, kw, c) times the kernel matrix [kh*kw*C, F] gives one output pixel. The batch is
// processed in chunks of samples whose col buffer stays under kColBytes (sized for the core's
// L2: a col written and read back at once never goes out to memory); the backward rebuilds each
// chunk's col (a copy of x) unless the whole batch fit in one chunk, whose forward col it reuses.
// Per chunk the backward adds col^T dy into the weight gradient (beta 1 after the first chunk:
// a fixed split, so results never depend on the thread count), computes dcol = dy W^T into the
// col buffer and scatters it back (col2im).
class Conv2D final : public Layer {
 public:
  static constexpr size_t kColBytes = size_t{512} << 10;
  uint32_t filters = 0, kh = 1, kw = 1, sh = 1, sw = 1;
  bool same = false, use_bias = true;
  Activation act = Activation::linear;
  uint32_t H = 0, W = 0, C = 0, Ho = 0, Wo = 0, pt = 0, pl = 0;

  size_t kkc() const { return size_t{kh} * kw * C; }
  size_t param_size() const override { return kkc() * filters + (use_bias ? filters : 0); }
  bool direct() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1; }  // 1x1: x is its own col
  size_t chunk_samples() const {
    const size_t per = size_t{Ho} * Wo * kkc() * sizeof(float);
    return std::max<size_t>(1, kColBytes / std::max<size_t>(per, 1));
  }
  simd::ConvGeom geom() const { return {H, W, C, kh, kw, sh, sw, pt, pl, Ho, Wo}; }
  void reserve(uint32_t batch) override {
    if (direct() || simd::kernels()) return;  // the SIMD path works on small per-thread panels
    const size_t n = std::min<size_t>(batch, chunk_samples()) * Ho * Wo * kkc();
    if (col_.size() < n) col_.assign(n, 0.f);
  }
  // How many threads share work over `n` items of `per` floats each.
  size_t split(size_t n, size_t per) const {
    return k::par(n * per, exec_) ? std::min<size_t>(static_cast<size_t>(exec_.threads), n) : 1;
  }
  // f(t, begin, end) over [n0, n1) split into T parts (each sample's rows are independent).
  template <class F>
  void over(size_t n0, size_t n1, size_t T, F&& f) const {
    const size_t n = n1 - n0;
    if (T <= 1) {
      f(size_t{0}, n0, n1);
      return;
    }
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(T))
    for (size_t t = 0; t < T; ++t) f(t, n0 + n * t / T, n0 + n * (t + 1) / T);
  }
  // Per-thread panel buffers of the SIMD convolutions (simd.hpp): 128 KiB (an L2 share), at least
  // 24 col rows.
  static constexpr size_t kPanelFloats = (size_t{128} << 10) / sizeof(float);
  size_t panel_floats() const { return std::max<size_t>(kPanelFloats, 24 * kkc() + 16); }  // + im2col's slack
  float* panels(size_t T) {
    const size_t n = T * panel_floats();
    if (panel_.size() < n) panel_.resize(n);
    return panel_.data();
  }
  void im2col(const float* x, size_t n0, size_t n1, float* col) const {
    const size_t K = kkc(), rowlen = size_t{kw} * C;
#pragma omp parallel for collapse(2) schedule(static) num_threads(exec_.threads) \
    if (k::par((n1 - n0) * Ho * Wo * K, exec_))
    for (size_t n = n0; n < n1; ++n)
      for (size_t oh = 0; oh < Ho; ++oh) {
        const float* xs = x + n * H * W * C;
        float* out = col + ((n - n0) * Ho + oh) * Wo * K;
        for (size_t ow = 0; ow < Wo; ++ow, out += K) {
          for (size_t i = 0; i < kh; ++i) {
            float* o = out + i * rowlen;
            const long ih = static_cast<long>(oh * sh + i) - pt;
            if (ih < 0 || ih >= static_cast<long>(H)) {
              std::memset(o, 0, rowlen * sizeof(float));
              continue;
            }
            const long iw0 = static_cast<long>(ow * sw) - pl;
            if (iw0 >= 0 && iw0 + static_cast<long>(kw) <= static_cast<long>(W)) {
              std::memcpy(o, xs + (ih * W + iw0) * C, rowlen * sizeof(float));
              continue;
            }
            for (size_t j = 0; j < kw; ++j) {
              const long iw = iw0 + static_cast<long>(j);
              if (iw < 0 || iw >= static_cast<long>(W)) std::memset(o + j * C, 0, C * sizeof(float));
              else std::memcpy(o + j * C, xs + (ih * W + iw) * C, C * sizeof(float));
            }
          }
        }
      }
  }
  void col2im(const float* col, size_t n0, size_t n1, float* dx) const {
    const size_t K = kkc();
#pragma omp parallel for schedule(static) num_threads(exec_.threads) if (k::par((n1 - n0) * Ho * Wo * K, exec_))
    for (size_t n = n0; n < n1; ++n) {
      float* ds = dx + n * H * W * C;
      std::memset(ds, 0, size_t{H} * W * C * sizeof(float));
      const float* cs = col + (n - n0) * Ho * Wo * K;
      for (size_t oh = 0; oh < Ho; ++oh)
        for (size_t ow = 0; ow < Wo; ++ow) {
          const float* c = cs + (oh * Wo + ow) * K;
          for (size_t i = 0; i < kh; ++i) {
            const long ih = static_cast<long>(oh * sh + i) - pt;
            if (ih < 0 || ih >= static_cast<long>(H)) continue;
            for (size_t j = 0; j < kw; ++j) {
              const long iw = static_cast<long>(ow * sw + j) - pl;
              if (iw < 0 || iw >= static_cast<long>(W)) continue;
              float* d = ds + (ih * W + iw) * C;
              const float* s = c + (i * kw + j) * C;
#pragma omp simd
              for (size_t q = 0; q < C; ++q) d[q] += s[q];
            }
          }
        }
    }
  }
  void forward(const float* x, float* y, uint32_t batch, bool training) override {
    const size_t K = kkc(), P = size_t{Ho} * Wo;
    const float* bias = use_bias ? p_ + K * filters : nullptr;
    float* pre = pre_.keep(act, training, batch * P * filters);
    reserve(batch);
    if (direct()) {
      k::gemm(false, false, batch * P, filters, K, 1.f, x, K, p_, filters, 0.f, y, filters, exec_);
      k::bias_activation(y, bias, batch * P, filters, act, exec_, pre);
      return;
    }
    if (const simd::Kernels* sk = simd::kernels()) {
      const simd::ConvGeom g = geom();
      const size_t T = split(batch, P * K), pf = panel_floats();
      float* buf = panels(T);
      over(0, batch, T, [&](size_t t, size_t a, size_t b) {
        sk->conv_fwd(g, x, a, b, p_, filters, y, buf + t * pf, pf);
        if (bias || act != Activation::linear)
          k::bias_activation(y + a * P * filters, bias, (b - a) * P, filters, act, Exec{1},
                             pre ? pre + a * P * filters : nullptr);
      });
      return;
    }
    const size_t cs = chunk_samples();
    for (size_t n0 = 0; n0 < batch; n0 += cs) {
      const size_t n1 = std::min<size_t>(batch, n0 + cs);
      float* yc = y + n0 * P * filters;
      im2col(x, n0, n1, col_.data());
      k::gemm(false, false, (n1 - n0) * P, filters, K, 1.f, col_.data(), K, p_, filters, 0.f, yc, filters, exec_);
      if (bias || act != Activation::linear)
        k::bias_activation(yc, bias, (n1 - n0) * P, filters, act, exec_, pre ? pre + n0 * P * filters : nullptr);
    }
    col_batch_ = batch <= cs ? batch : 0;
    col_src_ = x;
  }
  void backward(const float* x, const float* y, float* dy, float* dx, uint32_t batch) override {
    const size_t K = kkc(), P = size_t{Ho} * Wo, M = batch * P;
    k::activation_backward(y, dy, M, filters, act, exec_, pre_.data());
    if (use_bias) k::bias_grad(dy, M, filters, exec_, g_ + K * filters);
    if (direct()) {
      k::gemm(true, false, K, filters, M, 1.f, x, K, dy, filters, 0.f, g_, filters, exec_);
      if (dx) k::gemm(false, true, M, K, filters, 1.f, dy, filters, p_, filters, 0.f, dx, K, exec_);
      return;
    }
    if (dx) {
      // W^T [F, K] once, so every chunk's dcol is a plain GEMM.
      wt_.resize(K * filters);
      for (size_t r = 0; r < K; ++r)
        for (size_t f = 0; f < filters; ++f) wt_[f * K + r] = p_[r * filters + f];
    }
    if (const simd::Kernels* sk = simd::kernels()) {
      const simd::ConvGeom g = geom();
      const size_t pf = panel_floats();
      // dW: rows of the kernel matrix split over the threads (each builds its own panels).
      const size_t Tw = std::min<size_t>(split(K, M * filters), std::max<size_t>(K / 16, 1));
      float* buf = panels(Tw);
      wscratch_.resize(K * filters);  // each thread's rows [a, b) use (b - a) * filters of it
      float* sc = wscratch_.data();
      over(0, K, Tw, [&](size_t t, size_t a, size_t b) {
        sk->conv_wgrad(g, x, batch, dy, filters, a, b, g_, buf + t * pf, pf, sc + a * filters);
      });
      if (dx) {
        const size_t T = split(batch, P * K);
        buf = panels(T);
        over(0, batch, T, [&](size_t t, size_t a, size_t b) {
          sk->conv_dgrad(g, dy, a, b, wt_.data(), filters, dx, buf + t * pf, pf);
        });
      }
      return;
    }
    const size_t cs = chunk_samples();
    const bool reuse = col_batch_ == batch && col_src_ == x;
    for (size_t n0 = 0; n0 < batch; n0 += cs) {
      const size_t n1 = std::min<size_t>(batch, n0 + cs), m = (n1 - n0) * P;
      if (!reuse) im2col(x, n0, n1, col_.data());
      const float* dyc = dy + n0 * P * filters;
      k::gemm(true, false, K, filters, m, 1.f, col_.data(), K, dyc, filters, n0 == 0 ? 0.f : 1.f, g_, filters, exec_);
      if (dx) {
        // col is no longer needed for this chunk: it becomes dcol.
        k::gemm(false, false, m, K, filters, 1.f, dyc, filters, wt_.data(), K, 0.f, col_.data(), K, exec_);
        col2im(col_.data(), n0, n1, dx);
      }
    }
    col_batch_ = 0;
  }
  std::string describe() const override {
    return Layer::describe() + "/k" + std::to_string(kh) + "x" + std::to_string(kw) + "/s" + std::to_string(sh) +
           "x" + std::to_string(sw) + (same ? "/same/" : "/valid/") + act_name(act) + (use_bias ? "/b" : "");
  }

 private:
  std::vector<float> col_, wt_, panel_, wscratch_;
  PreActivation pre_;
  size_t col_batch_ = 0;  // batch whose col_ is current (one chunk only), 0: stale
  const float* col_src_ = nullptr;
};

// ---- batch_normalization -------------------------------------------------------------------
// Normalises the last axis. Training: batch statistics (biased variance, like Keras) and
// moving = moving * momentum + batch * (1 - momentum); inference: moving statistics.
// Data-parallel: statistics are per replica by default (like Keras/PyTorch DDP), so moving
// statistics may differ between nodes while weights stay identical. synchronized = true
// (Keras' BatchNormalization(synchronized=True)) takes them over the global batch: each
// training forward allreduces its [sum x, sum x^2, rows] and each backward its [sum dv,
// sum dv * xhat, rows] (2C + 1 doubles each, C padded to whole SIMD vectors), so every replica
// normalises, updates its moving statistics (bit-identical on every rank) and computes dx exactly
// as one replica holding the whole batch would; gamma/beta's gradients stay local sums, which
// the engine's gradient allreduce sums as every parameter's. The collectives come in layer order
// in the forward and in reverse layer order between the gradient buckets in the backward, the
// same on every rank (the model and the buckets' bounds are); on one rank they are skipped.
// Statistics: sums of x and x^2 in double in one pass (var = E[x^2] - mean^2, in double):
// a float's square is exact in double and the cancellation costs (mean/std)^2 * 2^-53, below
// float's own rounding while |mean| < 2^14 std.
// A ReLU layer right after it is fused (fuse_relu, by the engine): the forward writes
// max(bn(x), 0) and the backward masks dy by that output, the same operations the two layers
// do apart, so fusing does not change a bit.
class BatchNorm final : public Layer {
 public:
  float momentum = 0.99f, epsilon = 1e-3f;
  size_t C = 0;
  std::vector<float> moving_mean, moving_var;

  bool scale = true, center = true;  // Keras: trainable gamma / beta (else fixed 1 / 0)
  bool synchronized = false;         // statistics over every replica's batch

  void set_communicator(const Communicator& comm) override { comm_ = comm; }

  size_t param_size() const override { return (scale ? C : 0) + (center ? C : 0); }
  bool fuse_relu() override { return relu_ = true; }
  float gamma(size_t c) const { return scale ? p_[c] : 1.f; }
  float beta(size_t c) const { return center ? p_[(scale ? C : 0) + c] : 0.f; }
  size_t rows(uint32_t batch) const { return batch * (numel(in_shape) / C); }
  size_t padded() const { return (C + 7) / 8 * 8; }  // double accumulators: whole SIMD vectors
  void forward(const float* x, float* y, uint32_t batch, bool training) override {
    const size_t M = rows(batch), Cp = padded();
    const simd::Kernels* sk = simd::kernels();
    mean_.resize(C);
    invstd_.resize(C);
    scale_.resize(C);
    shift_.resize(C);
    if (training) {
      acc_.resize(2 * Cp + 1);
      k::reduce_rows(M, 2 * Cp, exec_, acc_.data(), [&](size_t b, size_t e, double* a) {
        if (sk) {
          sk->bn_sums(x + b * C, e - b, C, a, a + Cp);
          return;
        }
        for (size_t r = b; r < e; ++r) {
          const float* row = x + r * C;
#pragma omp simd
          for (size_t c = 0; c < C; ++c) {
            const double v = row[c];
            a[c] += v;
            a[Cp + c] += v * v;
          }
        }
      });
      const double rows = global_rows(M);
      for (size_t c = 0; c < C; ++c) {
        const double mean = acc_[c] / rows;
        const float var = static_cast<float>(std::max(acc_[Cp + c] / rows - mean * mean, 0.0));
        mean_[c] = static_cast<float>(mean);
        invstd_[c] = 1.f / std::sqrt(var + epsilon);
        moving_mean[c] = moving_mean[c] * momentum + mean_[c] * (1.f - momentum);
        moving_var[c] = moving_var[c] * momentum + var * (1.f - momentum);
      }
    } else {
      for (size_t c = 0; c < C; ++c) {
        mean_[c] = moving_mean[c];
        invstd_[c] = 1.f / std::sqrt(moving_var[c] + epsilon);
      }
    }
    for (size_t c = 0; c < C; ++c) {
      scale_[c] = gamma(c) * invstd_[c];
      shift_[c] = beta(c) - mean_[c] * scale_[c];
    }
    const float* sc = scale_.data();
    const float* sf = shift_.data();
    if (sk) {
      over_rows(M, [&](size_t b, size_t e) { sk->bn_apply(x + b * C, y + b * C, e - b, C, sc, sf, relu_); });
      return;
    }
    const bool relu = relu_;
#pragma omp parallel for schedule(static) num_threads(exec_.threads) if (k::par(M * C, exec_))
    for (size_t r = 0; r < M; ++r) {
      const float* xr = x + r * C;
      float* yr = y + r * C;
      if (relu) {
#pragma omp simd
        for (size_t c = 0; c < C; ++c) {
          const float v = xr[c] * sc[c] + sf[c];
          yr[c] = v > 0.f ? v : 0.f;
        }
      } else {
#pragma omp simd
        for (size_t c = 0; c < C; ++c) yr[c] = xr[c] * sc[c] + sf[c];
      }
    }
  }
  void backward(const float* x, const float* y, float* dy, float* dx, uint32_t batch) override {
    const size_t M = rows(batch), Cp = padded();
    const simd::Kernels* sk = simd::kernels();
    const float* relu_y = relu_ ? y : nullptr;  // fused ReLU: dy only flows where y > 0
    acc_.resize(2 * Cp + 1);
    const float* mu = mean_.data();
    const float* is = invstd_.data();
    k::reduce_rows(M, 2 * Cp, exec_, acc_.data(), [&](size_t b, size_t e, double* a) {
      if (sk) {
        sk->bn_bwd_sums(x + b * C, relu_y ? relu_y + b * C : nullptr, dy + b * C, e - b, C, mu, is, a, a + Cp);
        return;
      }
      for (size_t r = b; r < e; ++r) {
        const float* xr = x + r * C;
        const float* d = dy + r * C;
        const float* yr = relu_y ? relu_y + r * C : nullptr;
#pragma omp simd
        for (size_t c = 0; c < C; ++c) {
          const float dv = !yr || yr[c] > 0.f ? d[c] : 0.f;
          a[c] += dv;
          a[Cp + c] += dv * ((xr[c] - mu[c]) * is[c]);
        }
      }
    });
    for (size_t c = 0; c < C; ++c) {
      if (scale) g_[c] = static_cast<float>(acc_[Cp + c]);                 // dgamma = sum dy * xhat
      if (center) g_[(scale ? C : 0) + c] = static_cast<float>(acc_[c]);  // dbeta = sum dy
    }
    if (!dx) return;
    // dx = gamma * invstd / M * (M * dy - sum(dy) - xhat * sum(dy * xhat))
    k1_.resize(C);
    k2_.resize(C);
    const double rows = global_rows(M);
    for (size_t c = 0; c < C; ++c) {
      k1_[c] = static_cast<float>(acc_[c] / rows);
      k2_[c] = static_cast<float>(acc_[Cp + c] / rows);
      scale_[c] = gamma(c) * is[c];
    }
    const float* a1 = k1_.data();
    const float* a2 = k2_.data();
    const float* sc = scale_.data();
    if (sk) {
      over_rows(M, [&](size_t b, size_t e) {
        sk->bn_dx(x + b * C, relu_y ? relu_y + b * C : nullptr, dy + b * C, dx + b * C, e - b, C, sc, mu, is, a1, a2);
      });
      return;
    }
#pragma omp parallel for schedule(static) num_threads(exec_.threads) if (k::par(M * C, exec_))
    for (size_t r = 0; r < M; ++r) {
      const float* xr = x + r * C;
      const float* d = dy + r * C;
      const float* yr = relu_y ? relu_y + r * C : nullptr;
      float* o = dx + r * C;
#pragma omp simd
      for (size_t c = 0; c < C; ++c) {
        const float dv = !yr || yr[c] > 0.f ? d[c] : 0.f;
        o[c] = sc[c] * ((dv - a1[c]) - ((xr[c] - mu[c]) * is[c]) * a2[c]);
      }
    }
  }
  std::string describe() const override {
    return Layer::describe() + (scale ? "/scale" : "") + (center ? "/center" : "");
  }
  void moving(std::vector<std::vector<float>*>& out) override {
    out.push_back(&moving_mean);
    out.push_back(&moving_var);
  }
  void load_state(ByteReader& r) override {
    r.floats(moving_mean.data(), C, "batch_normalization moving_mean");
    r.floats(moving_var.data(), C, "batch_normalization moving_variance");
  }

 private:
  // acc_ holds this replica's 2 * padded() sums of its M rows; synchronized, they become the
  // global batch's (one allreduce, the row count with them). Returns the rows they cover.
  double global_rows(size_t M) {
    const size_t n = 2 * padded();
    acc_[n] = static_cast<double>(M);
    if (synchronized) comm_.allreduce(acc_.data(), n + 1, SF_REDUCE_SUM);
    return acc_[n];
  }
  // f(begin, end) over [0, M) rows, split over the threads.
  template <class F>
  void over_rows(size_t M, F&& f) const {
    if (!k::par(M * C, exec_)) {
      f(size_t{0}, M);
      return;
    }
    const size_t T = static_cast<size_t>(exec_.threads);
#pragma omp parallel for schedule(static) num_threads(exec_.threads)
    for (size_t t = 0; t < T; ++t) f(M * t / T, M * (t + 1) / T);
  }
  std::vector<float> mean_, invstd_, scale_, shift_, k1_, k2_;
  std::vector<double> acc_;
  bool relu_ = false;
  Communicator comm_;
};

// ---- activations / reshapes ----------------------------------------------------------------
class ActivationLayer final : public Layer {
 public:
  Activation act = Activation::relu;
  void forward(const float* x, float* y, uint32_t batch, bool) override {
    const size_t n = batch * numel(in_shape);
    if (act == Activation::relu) {
      k::for_range(n, exec_, [&](size_t b, size_t e) {
#pragma omp simd
        for (size_t i = b; i < e; ++i) {
          const float v = x[i];
          y[i] = v > 0.f ? v : 0.f;  // (std::max's reference defeats the vectoriser)
        }
      });
    } else {
      k::copy(x, y, n, exec_);
      const size_t w = in_shape.back();
      k::bias_activation(y, nullptr, n / w, w, act, exec_);
    }
  }
  void backward(const float* x, const float* y, float* dy, float* dx, uint32_t batch) override {
    if (!dx) return;
    const size_t n = batch * numel(in_shape), w = in_shape.back();
    k::activation_backward(y, dy, n / w, w, act, exec_, x);
    k::copy(dy, dx, n, exec_);
  }
};

// flatten and reshape: the input's bytes under another shape.
class Flatten final : public Layer {
 public:
  bool is_view() const override { return true; }
  void forward(const float* x, float* y, uint32_t batch, bool) override {
    k::copy(x, y, batch * numel(in_shape), exec_);
  }
  void backward(const float*, const float*, float* dy, float* dx, uint32_t batch) override {
    if (dx) k::copy(dy, dx, batch * numel(in_shape), exec_);
  }
};

// Inverted dropout: training keeps each value with probability 1 - rate and scales it by
// 1 / (1 - rate); inference is the identity. The mask is the kernels' Philox function of (model
// seed, optimizer step, layer index, replica rank) (kernels/include/skyforge/kernels/philox.hpp,
// docs/kernels.md): the cuda engine draws the very same masks, so the two backends agree on
// models with dropout, and a resumed run needs no generator state.
class Dropout final : public Layer {
 public:
  float rate = 0.f;
  skyforge::kernels::DropoutKey key;  // layer and rank set at creation; seed and step by begin_step
  bool frozen = false;      // tests: keep the first mask (finite differences need one function)

  void begin_step(uint64_t seed, uint64_t step) override {
    if (frozen && has_mask_) return;
    key.seed = seed;
    key.step = step;
  }
  void reserve(uint32_t batch) override {
    if (mask_.size() < batch * numel(in_shape)) mask_.resize(batch * numel(in_shape), 1.f);
  }
  void forward(const float* x, float* y, uint32_t batch, bool training) override {
    const size_t n = batch * numel(in_shape);
    if (!training || rate == 0.f) {
      k::copy(x, y, n, exec_);
      active_ = false;
      return;
    }
    reserve(batch);
    if (!frozen || !has_mask_ || mask_n_ != n) {
      // One Philox block gives the keep bits of 4 consecutive elements; any split of the blocks
      // over threads gives the same mask.
      const float scale = 1.f / (1.f - rate);
      const uint32_t cut = skyforge::kernels::dropout_cut(rate);
      float* m = mask_.data();
      const skyforge::kernels::DropoutKey kk = key;
      k::for_range((n + 3) / 4, exec_, [&](size_t b, size_t e) {
        for (size_t j = b; j < e; ++j) {
          const skyforge::kernels::Philox4x32 w = skyforge::kernels::dropout_block(kk, j);
          for (size_t t = 0; t < 4 && 4 * j + t < n; ++t) m[4 * j + t] = (w.v[t] >> 8) >= cut ? scale : 0.f;
        }
      });
      has_mask_ = true;
      mask_n_ = n;
    }
    const float* m = mask_.data();
    k::for_range(n, exec_, [&](size_t b, size_t e) {
#pragma omp simd
      for (size_t i = b; i < e; ++i) y[i] = x[i] * m[i];
    });
    active_ = true;
  }
  void backward(const float*, const float*, float* dy, float* dx, uint32_t batch) override {
    if (!dx) return;
    const size_t n = batch * numel(in_shape);
    if (!active_) {
      k::copy(dy, dx, n, exec_);
      return;
    }
    const float* m = mask_.data();
    k::for_range(n, exec_, [&](size_t b, size_t e) {
#pragma omp simd
      for (size_t i = b; i < e; ++i) dx[i] = dy[i] * m[i];
    });
  }
  std::string describe() const override { return Layer::describe() + "/r" + std::to_string(rate); }

 private:
  std::vector<float> mask_;
  size_t mask_n_ = 0;
  bool has_mask_ = false, active_ = false;
};

// global_average_pooling2d and 1d: the mean over every axis but the last (channels, features).
class GlobalAvgPool final : public Layer {
 public:
  void forward(const float* x, float* y, uint32_t batch, bool) override {
    const size_t C = in_shape.back(), HW = numel(in_shape) / C;
    const float inv = 1.f / static_cast<float>(HW);
#pragma omp parallel for schedule(static) num_threads(exec_.threads) if (k::par(batch * HW * C, exec_))
    for (size_t n = 0; n < batch; ++n) {
      float* o = y + n * C;
      std::fill(o, o + C, 0.f);
      const float* xs = x + n * HW * C;
      for (size_t p = 0; p < HW; ++p) {
#pragma omp simd
        for (size_t c = 0; c < C; ++c) o[c] += xs[p * C + c];
      }
#pragma omp simd
      for (size_t c = 0; c < C; ++c) o[c] *= inv;
    }
  }
  void backward(const float*, const float*, float* dy, float* dx, uint32_t batch) override {
    if (!dx) return;
    const size_t C = in_shape.back(), HW = numel(in_shape) / C;
    const float inv = 1.f / static_cast<float>(HW);
#pragma omp parallel for schedule(static) num_threads(exec_.threads) if (k::par(batch * HW * C, exec_))
    for (size_t n = 0; n < batch; ++n) {
      const float* d = dy + n * C;
      float* o = dx + n * HW * C;
      for (size_t p = 0; p < HW; ++p) {
#pragma omp simd
        for (size_t c = 0; c < C; ++c) o[p * C + c] = d[c] * inv;
      }
    }
  }
};

class MaxPool final : public Layer {
 public:
  uint32_t ph = 2, pw = 2, sh = 2, sw = 2, pt = 0, pl = 0;
  bool same = false;

  void reserve(uint32_t batch) override {
    if (arg_.size() < batch * numel(out_shape)) arg_.resize(batch * numel(out_shape));
  }
  void forward(const float* x, float* y, uint32_t batch, bool) override {
    reserve(batch);
    const size_t H = in_shape[0], W = in_shape[1], C = in_shape[2], Ho = out_shape[0], Wo = out_shape[1];
    int32_t* arg = arg_.data();
#pragma omp parallel for collapse(2) schedule(static) num_threads(exec_.threads) \
    if (k::par(batch * Ho * Wo * C * ph * pw, exec_))
    for (size_t n = 0; n < batch; ++n)
      for (size_t oh = 0; oh < Ho; ++oh) {
        const float* xs = x + n * H * W * C;
        for (size_t ow = 0; ow < Wo; ++ow) {
          const size_t o = ((n * Ho + oh) * Wo + ow) * C;
          float* yo = y + o;
          int32_t* ao = arg + o;
          for (size_t c = 0; c < C; ++c) {
            yo[c] = -std::numeric_limits<float>::infinity();
            ao[c] = -1;
          }
          for (size_t i = 0; i < ph; ++i) {
            const long ih = static_cast<long>(oh * sh + i) - pt;
            if (ih < 0 || ih >= static_cast<long>(H)) continue;
            for (size_t j = 0; j < pw; ++j) {
              const long iw = static_cast<long>(ow * sw + j) - pl;
              if (iw < 0 || iw >= static_cast<long>(W)) continue;
              const size_t base = (static_cast<size_t>(ih) * W + static_cast<size_t>(iw)) * C;
              for (size_t c = 0; c < C; ++c) {
                const float v = xs[base + c];
                if (v > yo[c] || ao[c] < 0) {
                  yo[c] = v;
                  ao[c] = static_cast<int32_t>(base + c);
                }
              }
            }
          }
        }
      }
  }
  void backward(const float*, const float*, float* dy, float* dx, uint32_t batch) override {
    if (!dx) return;
    const size_t in_n = numel(in_shape), out_n = numel(out_shape);
    const int32_t* arg = arg_.data();
#pragma omp parallel for schedule(static) num_threads(exec_.threads) if (k::par(batch * in_n, exec_))
    for (size_t n = 0; n < batch; ++n) {
      float* d = dx + n * in_n;
      std::memset(d, 0, in_n * sizeof(float));
      const float* g = dy + n * out_n;
      const int32_t* a = arg + n * out_n;
      for (size_t o = 0; o < out_n; ++o) d[a[o]] += g[o];
    }
  }
  std::string describe() const override {
    return Layer::describe() + "/p" + std::to_string(ph) + "x" + std::to_string(pw) + "/s" + std::to_string(sh) +
           "x" + std::to_string(sw) + (same ? "/same" : "/valid");
  }

 private:
  std::vector<int32_t> arg_;  // flat input index (within the sample) of each output's maximum
};

}  // namespace

// The layer's options and shape come from the SDK's layer schema (skyforge/layer_schema.hpp,
// docs/layers.md): this file only turns them into kernels.
std::unique_ptr<Layer> make_layer(const LayerSpec& spec, const std::vector<Shape>& inputs, size_t index,
                                  uint64_t seed, uint32_t rank) {
  const std::vector<std::pair<std::string, std::string>> options(spec.options.all().begin(),
                                                                  spec.options.all().end());
  // The engine's errors are skyforge::Error with a status (SF_ERR_INVALID for bad input).
  auto checked = [&]<class F>(F&& f) {
    try {
      return f();
    } catch (const schema::LayerError& e) {
      throw Error(e.what(), SF_ERR_INVALID);
    }
  };
  const schema::LayerConfig c = checked([&] { return schema::parse(spec.type, options, index); });
  const schema::LayerShape shape = checked([&] { return c.infer_inputs(inputs); });
  const Shape& in = inputs[0];
  auto activation = [&] {
    const std::string& a = c.choice("activation");
    for (Activation v : {Activation::relu, Activation::softmax, Activation::gelu, Activation::tanh, Activation::sigmoid})
      if (a == act_name(v)) return v;
    return Activation::linear;
  };
  std::unique_ptr<Layer> layer;
  const std::string& t = spec.type;
  if (t == "dense") {
    auto l = std::make_unique<Dense>();
    l->units = c.count("units");
    l->act = activation();
    l->use_bias = c.flag("use_bias");
    l->fin = in.back();
    layer = std::move(l);
  } else if (t == "conv2d") {
    auto l = std::make_unique<Conv2D>();
    l->filters = c.count("filters");
    const schema::Size2 k = c.size("kernel_size"), s = c.size("strides");
    l->kh = k.h, l->kw = k.w, l->sh = s.h, l->sw = s.w;
    l->same = c.choice("padding") == "same";
    l->use_bias = c.flag("use_bias");
    l->act = activation();
    l->H = in[0], l->W = in[1], l->C = in[2];
    l->Ho = shape.rows.out, l->pt = shape.rows.pad;
    l->Wo = shape.cols.out, l->pl = shape.cols.pad;
    layer = std::move(l);
  } else if (t == "batch_normalization") {
    auto l = std::make_unique<BatchNorm>();
    l->momentum = static_cast<float>(c.real("momentum"));
    l->epsilon = static_cast<float>(c.real("epsilon"));
    l->scale = c.flag("scale");
    l->center = c.flag("center");
    l->synchronized = c.flag("synchronized");
    l->C = in.back();
    l->moving_mean.assign(l->C, 0.f);
    l->moving_var.assign(l->C, 1.f);
    layer = std::move(l);
  } else if (t == "relu" || t == "softmax" || t == "tanh" || t == "sigmoid") {
    auto l = std::make_unique<ActivationLayer>();
    l->act = t == "relu" ? Activation::relu : t == "softmax" ? Activation::softmax : t == "tanh" ? Activation::tanh
                                                                                                   : Activation::sigmoid;
    layer = std::move(l);
  } else if (t == "gelu") {
    auto l = std::make_unique<ActivationLayer>();
    l->act = c.flag("approximate") ? Activation::gelu_tanh : Activation::gelu;
    layer = std::move(l);
  } else if (t == "dropout") {
    auto l = std::make_unique<Dropout>();
    l->rate = static_cast<float>(c.real("rate"));
    if (index >= skyforge::kernels::kDropoutMaxLayer || rank >= skyforge::kernels::kDropoutMaxRank)
      c.fail("dropout masks are keyed by layer and rank below 65536");
    l->key = skyforge::kernels::DropoutKey{seed, 0, static_cast<uint32_t>(index), rank};
    layer = std::move(l);
  } else if (c.def().takes_many()) {
    layer = make_merge_layer(c, inputs);
  } else if (t == "flatten" || t == "reshape") {
    layer = std::make_unique<Flatten>();
  } else if (t == "global_average_pooling2d" || t == "global_average_pooling1d") {
    layer = std::make_unique<GlobalAvgPool>();
  } else if (t == "average_pooling2d") {
    layer = make_average_pooling2d(c, shape);
  } else if (t == "max_pooling2d") {
    auto l = std::make_unique<MaxPool>();
    set_pool_window(*l, c, shape);
    layer = std::move(l);
  } else if (auto l = checked([&] { return make_transformer_layer(c, in, seed, rank); })) {
    layer = std::move(l);
  } else {
    c.fail("the schema has this layer but the cpu backend has no kernels for it");
  }
  layer->type = t;
  layer->index = index;
  layer->in_shape = in;
  layer->out_shape = shape.output;
  return layer;
}

void dropout_freeze_mask(Layer& layer, bool frozen) {
  auto* d = dynamic_cast<Dropout*>(&layer);
  if (!d) throw Error("dropout_freeze_mask: layer " + std::to_string(layer.index) + " is " + layer.type);
  d->frozen = frozen;
}

double sparse_xent(const float* logits, const int32_t* labels, uint32_t batch, uint32_t classes, float* dlogits,
                   uint64_t* correct, const Exec& ex) {
  static thread_local std::vector<double> per;
  static thread_local std::vector<uint8_t> hit;
  per.resize(batch);
  hit.resize(batch);
  // thread_local: OpenMP's worker threads must write through the calling thread's buffers.
  double* const per_row = per.data();
  uint8_t* const hit_row = hit.data();
#pragma omp parallel for schedule(static) num_threads(ex.threads) if (k::par(size_t{batch} * classes * 8, ex))
  for (size_t n = 0; n < batch; ++n) {
    const float* l = logits + n * classes;
    size_t am = 0;
    for (size_t j = 1; j < classes; ++j)
      if (l[j] > l[am]) am = j;
    const float m = l[am];
    float s = 0.f;
    for (size_t j = 0; j < classes; ++j) s += std::exp(l[j] - m);
    const float lse = m + std::log(s);
    const size_t y = static_cast<size_t>(labels[n]);
    per_row[n] = static_cast<double>(lse - l[y]);
    hit_row[n] = am == y;
    if (dlogits) {
      float* d = dlogits + n * classes;
      for (size_t j = 0; j < classes; ++j) d[j] = std::exp(l[j] - lse);
      d[y] -= 1.f;
    }
  }
  double sum = 0;
  uint64_t c = 0;
  for (size_t n = 0; n < batch; ++n) {
    sum += per[n];
    c += hit[n];
  }
  if (correct) *correct = c;
  return sum;
}

}  // namespace skyforge::cpu
