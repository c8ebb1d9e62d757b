// The cpu backend's engine on its own (no host, no pool): CpuEngine::train_step on the two
// example models, 1 thread, batch 64 and 32, on real Fashion-MNIST rows (synthetic rows when
// the dataset is missing).
//
//   cmake --build build --target bench_cpu_engine
//   build/bin/bench_cpu_engine [--benchmark_filter=convnet] [--benchmark_repetitions=5]
//
// Models: `mlp` is examples/fashion-mnist.toml (Flatten, Dense(128, relu), Dense(10)); `convnet`
// is examples/fashion-mnist-convnet.toml (the Keras multi-device guide's). Adam(1e-3) both.
// Each benchmark first trains `warmup` steps (the MLP: one epoch of 938 batches of 64, so the
// timed steps see the optimizer state of epochs 2+, where tiny Adam moments used to turn into
// denormals) and then times train_step over the following batches of the shuffled-once
// training set. Counters: items_per_second (samples/s) and step (seconds per step). The
// machine may be shared: read the CPU column and the counters, which use CPU time.
#include "cpu_engine.hpp"
#include "cpu_ops.hpp"
#include "simd.hpp"

#include <benchmark/benchmark.h>
#include <skyforge/datasets.hpp>

#include <cstdio>
#include <numeric>

namespace {

using skyforge::LayerSpec;
using skyforge::ModelSpec;
using skyforge::Options;

Options opts(std::initializer_list<std::pair<const char*, const char*>> kv) {
  std::vector<sf_kv> v;
  for (auto& [k, val] : kv) v.push_back(sf_kv{k, val});
  return Options(v.data(), v.size());
}
LayerSpec layer(const char* type, std::initializer_list<std::pair<const char*, const char*>> kv = {}) {
  return LayerSpec{type, opts(kv)};
}

ModelSpec mlp() {
  ModelSpec m;
  m.input_shape = {28, 28, 1};
  m.layers = {layer("flatten"), layer("dense", {{"units", "128"}, {"activation", "relu"}}),
              layer("dense", {{"units", "10"}})};
  return m;
}

// examples/fashion-mnist-convnet.toml (batch_normalization with Keras' defaults: scale and center).
ModelSpec convnet() {
  ModelSpec m;
  m.input_shape = {28, 28, 1};
  m.layers = {
      layer("conv2d", {{"filters", "12"}, {"kernel_size", "3"}, {"padding", "same"}, {"use_bias", "false"}}),
      layer("batch_normalization"),
      layer("relu"),
      layer("conv2d", {{"filters", "24"}, {"kernel_size", "6"}, {"use_bias", "false"}, {"strides", "2"}}),
      layer("batch_normalization"),
      layer("relu"),
      layer("conv2d", {{"filters", "32"}, {"kernel_size", "6"}, {"padding", "same"}, {"strides", "2"}}),
      layer("batch_normalization"),
      layer("relu"),
      layer("global_average_pooling2d"),
      layer("dense", {{"units", "256"}, {"activation", "relu"}}),
      layer("dropout", {{"rate", "0.5"}}),
      layer("dense", {{"units", "10"}}),
  };
  return m;
}

struct Data {
  std::vector<float> x;
  std::vector<int32_t> y;
  size_t n = 0;
};

const Data& data() {
  static const Data d = [] {
    Data out;
    try {
      auto tt = skyforge::datasets::load_fashion_mnist();
      out.n = tt.train.y.size();
      // One fixed shuffle, so consecutive batches mix classes like a training epoch does.
      std::vector<size_t> order(out.n);
      std::iota(order.begin(), order.end(), size_t{0});
      skyforge::Rng rng(7);
      for (size_t i = out.n; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
      out.x.resize(out.n * 784);
      out.y.resize(out.n);
      for (size_t i = 0; i < out.n; ++i) {
        std::copy_n(tt.train.x.data() + order[i] * 784, 784, out.x.data() + i * 784);
        out.y[i] = static_cast<int32_t>(tt.train.y[order[i]]);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_cpu_engine: %s; using synthetic data\n", e.what());
      out.n = 8192;
      out.x.resize(out.n * 784);
      out.y.resize(out.n);
      skyforge::Rng rng(7);
      for (auto& v : out.x) v = skyforge::cpu::uniform01(rng);
      for (auto& v : out.y) v = static_cast<int32_t>(rng.below(10));
    }
    return out;
  }();
  return d;
}

void train(benchmark::State& state, ModelSpec spec, uint32_t batch, size_t warmup) {
  const Data& d = data();
  spec.seed = 42;
  spec.threads = 1;
  auto engine = skyforge::cpu::make_engine(spec, skyforge::Communicator());
  const size_t batches = d.n / batch;
  size_t next = 0;
  auto step = [&] {
    const size_t off = (next++ % batches) * batch;
    return engine->train_step(d.x.data() + off * 784, d.y.data() + off, batch);
  };
  for (size_t i = 0; i < warmup; ++i) step();
  double loss = 0;
  for (auto _ : state) {
    const skyforge::StepResult r = step();
    loss = r.loss;
    benchmark::DoNotOptimize(loss);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * batch);
  // Seconds per step of CPU time (shown with an SI prefix: 550u is 550 microseconds).
  state.counters["step"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                              benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_mlp(benchmark::State& s) {
  const uint32_t b = static_cast<uint32_t>(s.range(0));
  train(s, mlp(), b, 60000 / b);
}
void BM_convnet(benchmark::State& s) { train(s, convnet(), static_cast<uint32_t>(s.range(0)), 20); }

// The GEMMs of those models' steps at batch 64 in OpenBLAS (cblas_sgemm, 1 thread): what a Dense
// layer runs without the AVX-512 table (with it, BM_tile_gemm), and what Conv2D runs after
// im2col on CPUs without the SIMD kernels (the convnet figures with SKYFORGE_CPU_ISA=none).
// Args: ta, tb, M, N, K.
// A GEMM benchmark's shape (args ta, tb, M, N, K) and operands, A and B random.
struct GemmCase {
  bool ta, tb;
  size_t M, N, K;
  std::vector<float> a, b, c;
  explicit GemmCase(const benchmark::State& s)
      : ta(s.range(0) != 0), tb(s.range(1) != 0), M(static_cast<size_t>(s.range(2))),
        N(static_cast<size_t>(s.range(3))), K(static_cast<size_t>(s.range(4))), a(M * K), b(K * N), c(M * N) {
    skyforge::Rng rng(3);
    for (auto& v : a) v = skyforge::cpu::uniform01(rng) - 0.5f;
    for (auto& v : b) v = skyforge::cpu::uniform01(rng) - 0.5f;
  }
  void count(benchmark::State& s) const {
    s.counters["GFLOPS"] = benchmark::Counter(2.0 * M * N * K * static_cast<double>(s.iterations()) * 1e-9,
                                              benchmark::Counter::kIsRate);
  }
};

void BM_gemm(benchmark::State& s) {
  GemmCase g(s);
  auto& [ta, tb, M, N, K, a, b, c] = g;
  openblas_set_num_threads(1);
  for (auto _ : s) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
                static_cast<int>(N), static_cast<int>(K), 1.f, a.data(), static_cast<int>(ta ? M : K), b.data(),
                static_cast<int>(tb ? K : N), 0.f, c.data(), static_cast<int>(N));
    benchmark::DoNotOptimize(c.data());
  }
  g.count(s);
}

// The same plain GEMMs in simd.hpp's register tiles (what k::gemm runs instead of OpenBLAS with
// the AVX-512 table, see cpu_ops.hpp). Args as BM_gemm; op(B) = B only. Skipped without AVX2.
void BM_tile_gemm(benchmark::State& s) {
  const skyforge::cpu::simd::Kernels* sk = skyforge::cpu::simd::kernels();
  if (!sk) {
    s.SkipWithError("no SIMD kernels on this CPU (or SKYFORGE_CPU_ISA=none)");
    return;
  }
  GemmCase g(s);
  for (auto _ : s) {
    sk->gemm(g.M, g.N, g.K, g.a.data(), g.ta ? 1 : g.K, g.ta ? g.M : 1, g.b.data(), g.N, g.c.data(), g.N, false);
    benchmark::DoNotOptimize(g.c.data());
  }
  g.count(s);
}

// The SIMD convolution kernels (simd.hpp) on the convnet's three Conv2D layers at batch 64, 1
// thread: forward, input gradient (dgrad) and weight gradient (wgrad), each 2*M*K*F flops.
// Args: layer (0, 1, 2), pass (0 fwd, 1 dgrad, 2 wgrad). Skipped without AVX2.
void BM_conv(benchmark::State& s) {
  namespace simd = skyforge::cpu::simd;
  const simd::Kernels* sk = simd::kernels();
  if (!sk) {
    s.SkipWithError("no SIMD kernels on this CPU (or SKYFORGE_CPU_ISA=none)");
    return;
  }
  struct L {
    size_t H, W, C, k, stride, F;
    bool same;
  };
  static const L layers[3] = {{28, 28, 1, 3, 1, 12, true}, {28, 28, 12, 6, 2, 24, false}, {12, 12, 24, 6, 2, 32, true}};
  const L& l = layers[s.range(0)];
  const size_t Ho = l.same ? (l.H + l.stride - 1) / l.stride : (l.H - l.k) / l.stride + 1;
  const size_t Wo = l.same ? (l.W + l.stride - 1) / l.stride : (l.W - l.k) / l.stride + 1;
  const size_t ph = l.same ? std::max<long>(0, static_cast<long>((Ho - 1) * l.stride + l.k) - static_cast<long>(l.H)) : 0;
  const size_t pw = l.same ? std::max<long>(0, static_cast<long>((Wo - 1) * l.stride + l.k) - static_cast<long>(l.W)) : 0;
  const simd::ConvGeom g{l.H, l.W, l.C, l.k, l.k, l.stride, l.stride, ph / 2, pw / 2, Ho, Wo};
  const size_t batch = 64, K = l.k * l.k * l.C, M = batch * Ho * Wo;
  std::vector<float> x(batch * l.H * l.W * l.C), w(K * l.F), y(M * l.F), dw(K * l.F), scratch(K * l.F);
  skyforge::Rng rng(5);
  for (auto& v : x) v = skyforge::cpu::uniform01(rng) - 0.5f;
  for (auto& v : w) v = skyforge::cpu::uniform01(rng) - 0.5f;
  for (auto& v : y) v = skyforge::cpu::uniform01(rng) - 0.5f;
  const size_t pf = std::max<size_t>((size_t{128} << 10) / sizeof(float), 24 * K);
  std::vector<float> buf(pf);
  for (auto _ : s) {
    switch (s.range(1)) {
      case 0: sk->conv_fwd(g, x.data(), 0, batch, w.data(), l.F, y.data(), buf.data(), pf); break;
      case 1: sk->conv_dgrad(g, y.data(), 0, batch, w.data(), l.F, x.data(), buf.data(), pf); break;
      default: sk->conv_wgrad(g, x.data(), batch, y.data(), l.F, 0, K, dw.data(), buf.data(), pf, scratch.data());
    }
    benchmark::ClobberMemory();
  }
  s.counters["GFLOPS"] = benchmark::Counter(2.0 * M * K * l.F * static_cast<double>(s.iterations()) * 1e-9,
                                            benchmark::Counter::kIsRate);
}

// The ViT example's GEMMs at batch 64 (49 tokens of 64: 3,136 rows), op(B) = B: a projection
// of attention or the MLP's Dense layers, forward and weight gradient, and one (sample, head)
// product of attention (49x16 keys, 49x49 weights).
void vit_gemms(benchmark::internal::Benchmark* b) {
  b->Args({0, 0, 3136, 64, 64})    // projection forward
      ->Args({1, 0, 64, 64, 3136})   // projection weight gradient
      ->Args({0, 0, 3136, 128, 64})  // mlp dense 1 forward
      ->Args({1, 0, 64, 128, 3136})  // mlp dense 1 weight gradient
      ->Args({0, 0, 3136, 64, 128})  // mlp dense 2 forward
      ->Args({0, 0, 49, 49, 16})     // attention scores of one (sample, head), K^T copied
      ->Args({0, 0, 49, 16, 49});    // attention weights times values
}

}  // namespace

BENCHMARK(BM_conv)->ArgNames({"layer", "pass"})->ArgsProduct({{0, 1, 2}, {0, 1, 2}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gemm)
    ->ArgNames({"ta", "tb", "M", "N", "K"})
    ->Args({0, 0, 50176, 12, 9})     // conv 1 forward
    ->Args({0, 0, 9216, 24, 432})    // conv 2 forward
    ->Args({1, 0, 432, 24, 9216})    // conv 2 weight gradient
    ->Args({0, 1, 9216, 432, 24})    // conv 2 input gradient (col)
    ->Args({0, 0, 2304, 32, 864})    // conv 3 forward
    ->Args({1, 0, 864, 32, 2304})    // conv 3 weight gradient
    ->Args({0, 1, 2304, 864, 32})    // conv 3 input gradient (col)
    ->Args({0, 0, 64, 128, 784})     // mlp dense 1 forward
    ->Args({1, 0, 784, 128, 64})     // mlp dense 1 weight gradient
    ->Apply(vit_gemms)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_tile_gemm)
    ->ArgNames({"ta", "tb", "M", "N", "K"})
    ->Args({0, 0, 64, 128, 784})  // mlp dense 1 forward
    ->Args({1, 0, 784, 128, 64})  // mlp dense 1 weight gradient
    ->Args({0, 0, 64, 10, 128})   // mlp dense 2 forward
    ->Apply(vit_gemms)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_mlp)->ArgName("batch")->Arg(64)->Arg(32)->Unit(benchmark::kMicrosecond)->MinTime(2.0);
BENCHMARK(BM_convnet)->ArgName("batch")->Arg(64)->Arg(32)->Unit(benchmark::kMicrosecond)->MinTime(3.0);

BENCHMARK_MAIN();
