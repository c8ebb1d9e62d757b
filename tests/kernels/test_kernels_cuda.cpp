// The CUDA build on a GPU (label gpu): every launch function on device memory against the host
// build's functors run on the host (reference.hpp for the layers). The dropout mask must be
// bit-identical (integer math); float results agree to rounding (the GPU's expf and fused
// multiply-adds differ from the host's). Without a driver or a device, every test skips and says
// which is missing.
#include "reference.hpp"

#include <skyforge/kernels/bf16.hpp>
#include <skyforge/kernels/optimizer.hpp>
#include <skyforge/kernels/window.hpp>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <utility>

namespace sk = skyforge::kernels;

namespace {

template <class T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) { check(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    check(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    check(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  static void check(cudaError_t e) {
    if (e != cudaSuccess) throw std::runtime_error(cudaGetErrorString(e));
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) GTEST_SKIP() << "no usable CUDA driver: " << cudaGetErrorString(e);
    if (n == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    s_.handle = stream_;
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  void sync() { ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }
  cudaStream_t stream_ = nullptr;
  sk::Stream s_;
};

void near(const std::vector<float>& a, const std::vector<double>& b, double tol, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << what << " " << i;
}

TEST_F(Gpu, BuildIsCuda) { EXPECT_STREQ(sk::build_name(), "cuda"); }

TEST_F(Gpu, DropoutMaskIsTheHostMaskBitForBit) {
  const size_t n = (size_t{1} << 20) + 3;
  const sk::DropoutKey key{0xfeedULL, 77, 5, 1};
  const std::vector<float> x = kref::randn(n, 1);
  Dev<float> dx(x), dy(n);
  sk::dropout(dx.get(), dy.get(), n, 0.4f, key, s_);
  sync();
  std::vector<float> want(n);
  const sk::DropoutApply f{x.data(), want.data(), n, key, sk::dropout_cut(0.4f), 1.f / (1.f - 0.4f)};
  for (size_t j = 0; j < (n + 3) / 4; ++j) f(j);
  EXPECT_EQ(dy.host(), want);
}

TEST_F(Gpu, BiasActivationAndLoss) {
  const size_t rows = 513, width = 10;
  const auto z = kref::randn(rows * width, 2, 3.f), b = kref::randn(width, 3);
  const auto bd = kref::to_double(b);
  for (auto act : {sk::Activation::linear, sk::Activation::relu, sk::Activation::softmax}) {
    Dev<float> y(z), bias(b);
    sk::bias_activation_forward(y.get(), bias.get(), rows, width, act, s_);
    sync();
    near(y.host(), kref::bias_act(kref::to_double(z), &bd, rows, width, act), 1e-5, "y");
  }
  std::vector<int32_t> labels(rows);
  for (size_t n = 0; n < rows; ++n) labels[n] = static_cast<int32_t>(n % width);
  Dev<float> l(z), loss(rows), hit(rows), d(rows * width);
  Dev<int32_t> lab(labels);
  Dev<double> ws(sk::reduce_workspace(rows, 1)), total(1);
  sk::softmax_xent(l.get(), lab.get(), rows, width, loss.get(), hit.get(), d.get(), s_);
  sk::reduce_sum(loss.get(), rows, total.get(), ws.get(), s_);
  sync();
  const auto ref = kref::xent(kref::to_double(z), labels, rows, width);
  near(loss.host(), ref, 1e-5, "loss");
  double sum = 0;
  for (double v : ref) sum += v;
  EXPECT_NEAR(total.host()[0], sum, 1e-5 * sum);
}

TEST_F(Gpu, BatchNormTrainingForward) {
  const size_t rows = 4096, C = 24;
  const auto x = kref::randn(rows * C, 4, 2.f, 1.f), g = kref::randn(C, 5, 0.5f, 1.f), b = kref::randn(C, 6);
  Dev<float> dxin(x), dy(rows * C), dg(g), db(b), mean(C), var(C), invstd(C);
  Dev<double> ws(sk::reduce_workspace(rows, C));
  sk::batchnorm_forward_training(dxin.get(), dy.get(), rows, C, dg.get(), db.get(), 1e-3f, true, mean.get(), var.get(),
                                 invstd.get(), ws.get(), s_);
  sync();
  const auto ref = kref::batchnorm(kref::to_double(x), rows, C, kref::to_double(g), kref::to_double(b), 1e-3, true);
  near(dy.host(), ref.y, 1e-5, "y");
  near(mean.host(), ref.mean, 1e-5, "mean");
  near(var.host(), ref.var, 1e-5, "var");
}

// conv_filter_grad's stages as the host build runs them (common.hpp's reduce_stages), from the
// same functors (the host library cannot link beside this one: the same symbols).
template <class A>
std::vector<float> host_conv_filter_grad(const std::vector<float>& x, const std::vector<float>& dy,
                                         const sk::WindowShape& g, size_t filters) {
  const size_t cols = g.col_width() * filters;
  size_t K = sk::reduce_split(g.positions(), cols);
  std::vector<double> ws(sk::conv_filter_grad_workspace(g, filters));
  const sk::ConvFilterPartials<A> first{x.data(), dy.data(), g, filters, cols, K, ws.data()};
  for (size_t i = 0; i < K * cols; ++i) first(i);
  double *in = ws.data(), *spare = ws.data() + 2 * K * cols;
  for (; K > sk::kReduceFanIn; std::swap(in, spare)) {
    const size_t next = sk::reduce_next(K);
    const sk::ColumnPartials<1, sk::PartialsTerm<1>, A> middle{{in, K, cols}, K, cols, next, spare};
    for (size_t i = 0; i < next * cols; ++i) middle(i);
    K = next;
  }
  std::vector<float> dw(cols);
  const sk::ColumnTotals<1, sk::StoreFloat, A> last{{dw.data()}, cols, K, in};
  for (size_t c = 0; c < cols; ++c) last(c);
  return dw;
}

// Products exact and sums in one order: the GPU's kernel gradient is the host's bit for bit, in
// doubles and (Reduction::fp32) in pairs of floats. The seed convnet's thin first layer at batch
// 1024 (802,816 positions, 108 outputs), a strided window whose last row and column run one past
// the image, and a wide one padded by 2 on every side.
TEST_F(Gpu, ConvFilterGradIsTheHostBuildBitForBit) {
  auto window = [](size_t batch, uint32_t H, uint32_t W, uint32_t C, uint32_t k, uint32_t s, uint32_t pad,
                   uint32_t Ho, uint32_t Wo) {
    sk::WindowShape g;
    g.batch = batch, g.H = H, g.W = W, g.C = C, g.kh = g.kw = k, g.sh = g.sw = s, g.pt = g.pl = pad;
    g.Ho = Ho, g.Wo = Wo;
    return g;
  };
  struct Case {
    sk::WindowShape g;
    size_t filters;
  };
  for (const Case& t : {Case{window(1024, 28, 28, 1, 3, 1, 1, 28, 28), 12}, Case{window(37, 14, 14, 3, 3, 2, 0, 7, 7), 5},
                        Case{window(9, 14, 14, 12, 6, 2, 2, 7, 7), 24}}) {
    const sk::WindowShape& g = t.g;
    const auto x = kref::randn(g.batch * g.H * g.W * g.C, 7), dy = kref::randn(g.positions() * t.filters, 8);
    Dev<float> dx(x), ddy(dy), dw(g.col_width() * t.filters);
    Dev<double> ws(sk::conv_filter_grad_workspace(g, t.filters));
    sk::conv_filter_grad(dx.get(), ddy.get(), g, t.filters, dw.get(), ws.get(), s_);
    sync();
    EXPECT_EQ(dw.host(), host_conv_filter_grad<sk::DoubleSum>(x, dy, g, t.filters)) << g.H << "x" << g.W << "x" << g.C;
    sk::conv_filter_grad(dx.get(), ddy.get(), g, t.filters, dw.get(), ws.get(), {s_.handle, sk::Reduction::fp32});
    sync();
    EXPECT_EQ(dw.host(), host_conv_filter_grad<sk::FloatPairSum>(x, dy, g, t.filters)) << "fp32 " << g.H << "x" << g.W;
  }
}

// softmax_xent's wide-row stages as the host build runs them (xent.hpp), from the same functors.
struct HostXent {
  std::vector<float> loss, hit, d;
};
HostXent host_wide_xent(const std::vector<float>& l, const std::vector<int32_t>& labels, size_t classes) {
  const size_t rows = labels.size();
  HostXent o{std::vector<float>(rows), std::vector<float>(rows), std::vector<float>(rows * classes)};
  std::vector<double> ws(sk::softmax_xent_workspace(rows, classes));
  const sk::XentWide w{l.data(), labels.data(), rows, classes, sk::xent_slices(classes), ws.data()};
  for (size_t i = 0; i < w.parts(); ++i) sk::XentSliceMax{w}(i);
  for (size_t n = 0; n < rows; ++n) sk::XentRowMax{w, o.hit.data()}(n);
  for (size_t i = 0; i < w.parts(); ++i) sk::XentSliceSum{w, o.d.data()}(i);
  for (size_t n = 0; n < rows; ++n) sk::XentRowLoss{w, o.loss.data()}(n);
  for (size_t i = 0; i < rows * classes; ++i) sk::XentGrad{w, o.d.data()}(i);
  return o;
}

// A language model's vocabulary at a small batch: the wide path's loss, hits and gradient are
// the host build's bit for bit (portable exp and log, double sums in one order).
TEST_F(Gpu, WideSoftmaxXentIsTheHostBuildBitForBit) {
  const size_t rows = 64, classes = 32768;
  const auto z = kref::randn(rows * classes, 9, 5.f);
  std::vector<int32_t> labels(rows);
  for (size_t n = 0; n < rows; ++n) labels[n] = static_cast<int32_t>((n * 7919) % classes);
  labels[3] = -1;
  Dev<float> l(z), loss(rows), hit(rows), d(rows * classes);
  Dev<int32_t> lab(labels);
  Dev<double> ws(sk::softmax_xent_workspace(rows, classes));
  sk::softmax_xent(l.get(), lab.get(), rows, classes, loss.get(), hit.get(), d.get(), ws.get(), s_);
  sync();
  const HostXent want = host_wide_xent(z, labels, classes);
  const auto gl = loss.host();
  for (size_t n = 0; n < rows; ++n)  // a bad label's NaN: any NaN (the libraries' nanf differ)
    if (std::isnan(want.loss[n])) EXPECT_TRUE(std::isnan(gl[n])) << n;
    else EXPECT_EQ(std::memcmp(&gl[n], &want.loss[n], sizeof(float)), 0) << n << ": " << gl[n] << " vs " << want.loss[n];
  EXPECT_EQ(hit.host(), want.hit);
  EXPECT_EQ(d.host(), want.d);
}

TEST_F(Gpu, MultiTensorAdamMatchesTheHostRule) {
  std::vector<std::vector<float>> p, g;
  std::vector<std::unique_ptr<Dev<float>>> dp, dg, dm, dv;
  std::vector<sk::OptimTensor> t;
  for (size_t i = 0; i < 3 * sk::kMaxTensorsPerLaunch / 2; ++i) {
    const size_t n = 1 + (i * 131) % 3000;
    p.push_back(kref::randn(n, 10 + static_cast<uint32_t>(i)));
    g.push_back(kref::randn(n, 500 + static_cast<uint32_t>(i)));
    dp.push_back(std::make_unique<Dev<float>>(p.back()));
    dg.push_back(std::make_unique<Dev<float>>(g.back()));
    dm.push_back(std::make_unique<Dev<float>>(std::vector<float>(n, 0.f)));
    dv.push_back(std::make_unique<Dev<float>>(std::vector<float>(n, 0.f)));
    t.push_back({dp.back()->get(), dg.back()->get(), dm.back()->get(), dv.back()->get(), n});
  }
  const sk::AdamConfig cfg;
  for (uint64_t step = 0; step < 3; ++step) sk::adam_update(t.data(), t.size(), cfg, step, 0.5f, s_);
  sync();
  for (size_t i = 0; i < p.size(); ++i) {
    std::vector<float> m(p[i].size(), 0.f), v(p[i].size(), 0.f), want = p[i];
    for (uint64_t step = 0; step < 3; ++step) {
      const sk::AdamRule rule{static_cast<float>(1 - cfg.beta_1), static_cast<float>(1 - cfg.beta_2),
                              sk::adam_alpha(cfg, step), static_cast<float>(cfg.epsilon), 0.5f};
      for (size_t j = 0; j < want.size(); ++j) rule(want[j], g[i][j], &m[j], &v[j], nullptr);
    }
    near(dp[i]->host(), kref::to_double(want), 1e-6, "param");
  }
}

}  // namespace

// precision = "bf16"'s operand rounding (bf16.hpp) on the GPU: __float_as_uint's path gives the
// host's memcpy path's bits on every 4099th float bit pattern (a million: every exponent and
// sign, NaNs included) and on each pattern's tie point.
TEST_F(Gpu, Bf16RoundingIsTheHostsBitForBit) {
  std::vector<float> x;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099)
    for (uint32_t v : {static_cast<uint32_t>(u), (static_cast<uint32_t>(u) & 0xffff0000u) | 0x8000u}) {
      float f;
      std::memcpy(&f, &v, sizeof f);
      x.push_back(f);
    }
  Dev<float> dx(x);
  Dev<uint16_t> dy(x.size());
  sk::to_bf16(dx.get(), dy.get(), x.size(), s_);
  sync();
  const std::vector<uint16_t> got = dy.host();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], sk::bf16_bits(x[i])) << i;
}
