// The cuda engine's host build (backends/cuda) against the cpu backend, the reference engine:
// docs/compute-backends.md, "The cuda engine", states the tolerances checked here.
#include "arch.hpp"
#include "common.hpp"
#include "engine.hpp"

#include <skyforge/layer_schema.hpp>

#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>
#include <functional>
#include <memory>
#include <regex>
#include <string>

using namespace cuda_test;
using skyforge::Communicator;
using skyforge::Error;
namespace cu = skyforge::cuda;
namespace cpu = skyforge::cpu;

namespace {

// Documented in docs/compute-backends.md, "Tolerance". Every model is checked in lockstep for
// kSteps steps on the same batches: before each step the cuda engine takes the cpu backend's
// whole state (weights, optimizer slots, moving statistics, step), so each step's forward,
// backward and update are compared on their own: the step's mean loss to kLossTol (relative),
// every parameter after it to the model's tolerance (absolute). The MLP is also checked
// free-running, each engine on its own for kSteps. The convnets are not: their trajectories are
// chaotic enough (batch normalization, Adam's normalised step m / sqrt(v) on parameters whose
// gradient is 0 up to rounding) that a rounding-level difference grows at a pace set by the BLAS
// kernel's summation order, not by the engine (measured on one machine, the convnet's parameters
// after 20 free steps: 9.8e-6 apart with OpenBLAS's Cooper Lake kernels, 5.6e-4 with its Haswell,
// Zen or Prescott ones, while in lockstep every kernel stays within 1.6e-6).
constexpr int kSteps = 20;
constexpr double kLossTol = 1e-5;
constexpr double kParamTol = 1e-5;
// The convnet's parameters: its conv gradients are sums over many more terms whose order
// differs (col2im gathers where the cpu backend scatters, GEMMs split differently).
constexpr double kConvParamTol = 1e-4;

// SGD with momentum, for the tests that train 2 nodes free-running: Adam's normalised step
// magnifies float-order differences on parameters whose gradient is 0 up to rounding.
ModelSpec with_sgd(ModelSpec m) {
  if (m.optimizer == "sgd") return m;
  m.optimizer = "sgd";
  m.optimizer_options = opts({{"learning_rate", "0.05"}, {"momentum", "0.9"}});
  return m;
}

ModelSpec bn_model(uint64_t seed) {
  // dense on a rank-3 input (a batch of rows), batch_normalization with a fused relu, a softmax
  // layer, flatten and a last dense: every layer kind of the engine but dropout.
  ModelSpec m;
  m.input_shape = {6, 5, 4};
  m.layers = {layer("dense", {{"units", "16"}}),
              layer("batch_normalization"),
              layer("relu"),
              layer("dense", {{"units", "8"}, {"use_bias", "false"}}),
              layer("softmax"),
              layer("flatten"),
              layer("dense", {{"units", "10"}})};
  m.seed = seed;
  return m;
}

struct Agreement {
  double loss = 0, params = 0;  // worst relative loss difference, worst max |param difference|
};

// Trains the cpu backend and the cuda engine on the same batches and measures how far they are
// apart: after every step in lockstep (the cuda engine then takes the cpu backend's state), or
// at the end when free-running.
Agreement train_both(const ModelSpec& spec, int steps, uint32_t batch, bool lockstep) {
  auto c = cpu::make_engine(spec, Communicator{});
  auto g = cu::make_engine(spec, Communicator{});
  const std::vector<float> initial = params_of(*g);
  EXPECT_EQ(params_of(*c), initial);
  Agreement a;
  for (int s = 0; s < steps; ++s) {
    const Batch b = make_batch(100 + s, batch, features(spec));
    const auto rc = c->train_step(b.x.data(), b.y.data(), batch);
    const auto rg = g->train_step(b.x.data(), b.y.data(), batch);
    EXPECT_EQ(rc.samples, rg.samples);
    EXPECT_NEAR(static_cast<double>(rc.correct), static_cast<double>(rg.correct), 1.0) << "step " << s;
    a.loss = std::max(a.loss, std::fabs(rc.loss - rg.loss) / std::max(1.0, std::fabs(rc.loss)));
    if (lockstep) {
      a.params = std::max(a.params, max_abs_diff(params_of(*c), params_of(*g)));
      g->load_state(c->state_dict());
    }
  }
  if (!lockstep) a.params = max_abs_diff(params_of(*c), params_of(*g));
  EXPECT_GT(max_abs_diff(initial, params_of(*g)), 1e-3) << "training did not move the parameters";
  return a;
}

// train_both in lockstep and, with `free_running`, on their own; printed, and checked against
// the loss tolerance and `param_tol`.
void expect_agreement(const char* name, const ModelSpec& spec, uint32_t batch, double param_tol,
                      bool free_running = false) {
  const Agreement l = train_both(spec, kSteps, batch, true);
  std::printf("%s: in lockstep, worst loss difference %.3g (relative), params %.3g (absolute)\n", name, l.loss,
              l.params);
  EXPECT_LE(l.loss, kLossTol) << name << " in lockstep";
  EXPECT_LE(l.params, param_tol) << name << " in lockstep";
  if (!free_running) return;
  const Agreement f = train_both(spec, kSteps, batch, false);
  std::printf("%s: free-running, worst loss difference %.3g (relative), params %.3g (absolute)\n", name, f.loss,
              f.params);
  EXPECT_LE(f.loss, kLossTol) << name << " free-running";
  EXPECT_LE(f.params, param_tol) << name << " free-running";
}

}  // namespace

TEST(CudaEngine, HostBuildIsTheHostBuild) {
  auto e = std::make_unique<cu::CudaEngine>(mlp(1), Communicator{});
  EXPECT_STREQ(e->build(), "host");
  EXPECT_STREQ(skyforge::kernels::build_name(), "host");
}

TEST(CudaEngine, InitialParamsEqualCpuBitForBit) {
  for (uint64_t seed : {1ull, 7ull, 123456789ull}) {
    for (const ModelSpec& spec : {mlp(seed), bn_model(seed)}) {
      auto c = cpu::make_engine(spec, Communicator{});
      auto g = cu::make_engine(spec, Communicator{});
      ASSERT_EQ(c->param_count(), g->param_count());
      const auto pc = params_of(*c), pg = params_of(*g);
      ASSERT_EQ(0, std::memcmp(pc.data(), pg.data(), pc.size() * sizeof(float))) << "seed " << seed;
    }
  }
  // A different seed gives different weights.
  EXPECT_NE(params_of(*cu::make_engine(mlp(1), Communicator{})), params_of(*cu::make_engine(mlp(2), Communicator{})));
}

TEST(CudaEngine, MlpTrainsLikeCpuAdam) {
  expect_agreement("mlp adam", mlp(3), 64, kParamTol, true);
}

TEST(CudaEngine, MlpTrainsLikeCpuSgdNesterov) {
  ModelSpec m = mlp(4);
  m.optimizer = "sgd";
  m.optimizer_options = opts({{"learning_rate", "0.05"}, {"momentum", "0.9"}, {"nesterov", "true"}});
  expect_agreement("mlp sgd", m, 64, kParamTol, true);
}

// AdamW and RMSprop (momentum and centered: all three slots): in lockstep the cpu engine's state
// is loaded into the cuda engine's every step, so their optimizer slots travel between backends.
TEST(CudaEngine, MlpTrainsLikeCpuAdamW) {
  ModelSpec m = mlp(5);
  m.optimizer = "adamw";
  m.optimizer_options = opts({{"learning_rate", "0.001"}, {"weight_decay", "0.1"}});  // Adam's mlp rate
  expect_agreement("mlp adamw", m, 64, kParamTol, true);
}

TEST(CudaEngine, MlpTrainsLikeCpuRmsprop) {
  ModelSpec m = mlp(6);
  m.optimizer = "rmsprop";
  m.optimizer_options = opts({{"learning_rate", "0.001"}, {"momentum", "0.5"}, {"centered", "true"}});
  expect_agreement("mlp rmsprop", m, 64, kParamTol, true);
}

// The convnet of the Keras distributed-training guide (conv2d same/valid with strides,
// batch_normalization + relu, global_average_pooling2d), without its dropout.
ModelSpec convnet_without_dropout(uint64_t seed) {
  ModelSpec m = convnet(seed);
  m.layers.erase(std::remove_if(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.type == "dropout"; }),
                 m.layers.end());
  return m;
}

TEST(CudaEngine, ConvnetTrainsLikeCpu) {
  expect_agreement("convnet adam", convnet_without_dropout(6), 32, kConvParamTol);
}

// The whole convnet of the example, its dropout included: both backends draw the kernels'
// Philox masks from (seed, step, layer, rank), so they train the same model.
TEST(CudaEngine, ConvnetWithDropoutTrainsLikeCpu) {
  expect_agreement("convnet with dropout, adam", convnet(6), 32, kConvParamTol);
}

// max_pooling2d, 'valid' and 'same' with overlapping windows, between convolutions.
TEST(CudaEngine, PoolingConvnetTrainsLikeCpu) {
  ModelSpec m;
  m.input_shape = {14, 14, 2};
  m.layers = {layer("conv2d", {{"filters", "6"}, {"kernel_size", "3"}, {"padding", "same"}, {"activation", "relu"}}),
              layer("max_pooling2d"),
              layer("conv2d", {{"filters", "8"}, {"kernel_size", "2,3"}}),
              layer("max_pooling2d", {{"pool_size", "3"}, {"strides", "2"}, {"padding", "same"}}),
              layer("flatten"),
              layer("dense", {{"units", "10"}})};
  m.seed = 16;
  expect_agreement("pooling convnet adam", m, 16, kConvParamTol);
}

// Thin windows take their weight gradient from the engine's column reduction (thin_convnet).
TEST(CudaEngine, ThinConvolutionsTrainLikeCpu) {
  expect_agreement("thin convolutions adam", thin_convnet(17), 16, kConvParamTol);
}

TEST(CudaEngine, BatchNormModelTrainsLikeCpu) {
  // Its first dense's bias feeds batch_normalization, which cancels it: that bias's gradient is 0
  // up to rounding, and Adam's step m / (sqrt(v) + eps) scales the rounding up (measured in
  // lockstep: 0 with OpenBLAS's AVX-512 kernels, 9.4e-6 with its Prescott ones).
  expect_agreement("bn model adam", bn_model(5), 32, kConvParamTol);
}

namespace {
// Trains `m` data-parallel on 2 threads with a real in-process communicator, each rank on its
// half of the global batch (rank r with seed + r: rank 0's weights win the initial broadcast).
// Returns each rank's losses and final parameters.
template <class Make>
std::pair<std::vector<std::vector<double>>, std::vector<std::vector<float>>> train_two(const ModelSpec& m, Make make,
                                                                                        uint32_t global, uint32_t steps,
                                                                                        size_t* allreduces = nullptr) {
  const size_t f = features(m);
  ThreadGroup group(2);
  std::vector<std::vector<float>> params(2);
  std::vector<std::vector<double>> losses(2);
  group.run([&](uint32_t rank) {
    ModelSpec mine = m;
    mine.seed = m.seed + rank;
    auto e = make(mine, Communicator(group.comm(rank)));
    for (uint32_t s = 0; s < steps; ++s) {
      const Batch b = make_batch(200 + s, global, f);
      const size_t half = global / 2, off = rank * half;
      const auto r = e->train_step(b.x.data() + off * f, b.y.data() + off, static_cast<uint32_t>(half));
      EXPECT_EQ(r.samples, global);
      losses[rank].push_back(r.loss);
    }
    params[rank] = params_of(*e);
  });
  if (allreduces) *allreduces = group.allreduce_calls(0);
  EXPECT_EQ(0, std::memcmp(params[0].data(), params[1].data(), params[0].size() * sizeof(float))) << "replicas differ";
  EXPECT_EQ(losses[0], losses[1]);
  return {losses, params};
}
}  // namespace

// Data parallel: 2 ranks on halves of the global batch follow 1 rank on the whole of it (the
// MLP: no per-replica statistics), and both ranks hold the same bits.
TEST(CudaEngine, TwoNodesFollowOneNode) {
  const ModelSpec m = mlp(8);
  constexpr uint32_t kGlobal = 32, kSteps2 = 8;
  auto one = cu::make_engine(m, Communicator{});
  std::vector<double> losses;
  for (uint32_t s = 0; s < kSteps2; ++s) {
    const Batch b = make_batch(200 + s, kGlobal, features(m));
    losses.push_back(one->train_step(b.x.data(), b.y.data(), kGlobal).loss);
  }
  size_t calls = 0;
  const auto [rl, rp] = train_two(
      m,
      [](const ModelSpec& s, Communicator c) {
        cu::EngineOptions o;
        o.bucket_bytes = 1024;  // buckets close on layer boundaries: here one a layer
        return cu::make_engine(s, c, skyforge::Host{}, o);
      },
      kGlobal, kSteps2, &calls);
  EXPECT_EQ(calls, size_t{kSteps2} * 3) << "two gradient buckets and the loss statistics a step";
  for (uint32_t s = 0; s < kSteps2; ++s) EXPECT_NEAR(rl[0][s], losses[s], kLossTol * losses[s]);
  const double d = max_abs_diff(rp[0], params_of(*one));
  std::printf("1 node vs 2 nodes: params %.3g (absolute)\n", d);
  EXPECT_LE(d, kParamTol);
}

// batch_normalization keeps per-replica statistics (as the cpu backend, Keras and PyTorch DDP
// do), so 2 nodes are not 1 on that model: there the cuda engine follows the cpu backend, both on
// 2 nodes.
TEST(CudaEngine, TwoNodesFollowCpuOnTwoNodes) {
  // Free-running, so with SGD (see kSteps): Adam's normalised step magnifies float-order
  // differences on parameters whose gradient is 0 up to rounding.
  for (const auto& [m, tol] : {std::pair{with_sgd(bn_model(14)), kParamTol},
                               std::pair{with_sgd(convnet_without_dropout(15)), kParamTol}}) {
    const auto [gl, gp] = train_two(m, [](const ModelSpec& s, Communicator c) { return cu::make_engine(s, c); }, 32, 8);
    const auto [cl, cp] = train_two(m, [](const ModelSpec& s, Communicator c) { return cpu::make_engine(s, c); }, 32, 8);
    for (size_t s = 0; s < gl[0].size(); ++s) EXPECT_NEAR(gl[0][s], cl[0][s], kLossTol * cl[0][s]);
    const double d = max_abs_diff(gp[0], cp[0]);
    std::printf("2 nodes, cuda vs cpu: params %.3g (absolute)\n", d);
    EXPECT_LE(d, tol);
  }
}

// The convnet with its dropout on 2 nodes, where each rank draws its own masks (rank is in the key).
TEST(CudaEngine, ConvnetWithDropoutOnTwoNodesFollowsCpuOnTwoNodes) {
  const ModelSpec conv = with_sgd(convnet(16));  // free-running: see kSteps
  const auto [gl, gp] = train_two(conv, [](const ModelSpec& s, Communicator c) { return cu::make_engine(s, c); }, 32, 8);
  const auto [cl, cp] = train_two(conv, [](const ModelSpec& s, Communicator c) { return cpu::make_engine(s, c); }, 32, 8);
  for (size_t s = 0; s < gl[0].size(); ++s) EXPECT_NEAR(gl[0][s], cl[0][s], kLossTol * cl[0][s]);
  const double d = max_abs_diff(gp[0], cp[0]);
  std::printf("2 nodes with dropout, cuda vs cpu: params %.3g (absolute)\n", d);
  EXPECT_LE(d, kParamTol);
  EXPECT_EQ(gp[0], gp[1]);  // replicas bit-identical
}

// Bucketing changes when the gradients go out, never their values.
TEST(CudaEngine, BucketSizeDoesNotChangeResults) {
  std::vector<std::vector<float>> out;
  for (size_t bytes : {size_t{256}, size_t{4} << 20}) {
    ThreadGroup group(2);
    std::vector<float> p0;
    group.run([&](uint32_t rank) {
      cu::EngineOptions o;
      o.bucket_bytes = bytes;
      auto e = cu::make_engine(mlp(9), Communicator(group.comm(rank)), skyforge::Host{}, o);
      for (int s = 0; s < 3; ++s) {
        const Batch b = make_batch(300 + s * 2 + rank, 16, 784);
        e->train_step(b.x.data(), b.y.data(), 16);
      }
      if (rank == 0) p0 = params_of(*e);
    });
    out.push_back(p0);
  }
  EXPECT_EQ(out[0], out[1]);
}

TEST(CudaEngine, StateDictRoundTrip) {
  const ModelSpec m = bn_model(10);
  const size_t f = features(m);
  auto a = cu::make_engine(m, Communicator{});
  for (int s = 0; s < 3; ++s) {
    const Batch b = make_batch(400 + s, 16, f);
    a->train_step(b.x.data(), b.y.data(), 16);
  }
  const std::string state = a->state_dict();
  ModelSpec other = m;
  other.seed = 999;  // different initial weights: everything must come from the state
  auto b2 = cu::make_engine(other, Communicator{});
  b2->load_state(state);
  EXPECT_EQ(b2->state_dict(), state);
  const Batch eval = make_batch(499, 16, f);
  EXPECT_EQ(a->eval_step(eval.x.data(), eval.y.data(), 16).loss, b2->eval_step(eval.x.data(), eval.y.data(), 16).loss);
  for (int s = 3; s < 6; ++s) {
    const Batch b = make_batch(400 + s, 16, f);
    EXPECT_EQ(a->train_step(b.x.data(), b.y.data(), 16).loss, b2->train_step(b.x.data(), b.y.data(), 16).loss);
  }
  EXPECT_EQ(params_of(*a), params_of(*b2));
  EXPECT_EQ(a->state_dict(), b2->state_dict());
}

TEST(CudaEngine, BadStateIsRefusedAndChangesNothing) {
  auto e = cu::make_engine(mlp(11), Communicator{});
  const std::string good = e->state_dict();
  const std::vector<float> before = params_of(*e);
  auto refused = [&](std::string bytes, const char* what) {
    try {
      e->load_state(bytes);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& err) {
      EXPECT_EQ(err.status(), SF_ERR_INVALID) << what;
      EXPECT_NE(std::string(err.what()).find("cuda: engine state: "), std::string::npos) << err.what();
    }
    EXPECT_EQ(params_of(*e), before) << what;
  };
  refused(good.substr(0, good.size() - 3), "truncated");
  refused(good + "x", "trailing byte");
  std::string magic = good;
  magic[0] = 'X';
  refused(magic, "bad magic");
  refused(cu::make_engine(bn_model(11), Communicator{})->state_dict(), "another model");
  refused(cpu::make_engine(bn_model(11), Communicator{})->state_dict(), "another model's, from cpu");
}

// Checkpoints move between backends (skyforge/engine_state.hpp): train k steps on one backend,
// save, resume on the other (made with another seed: weights, optimizer slots, moving statistics,
// step and the run's seed all come from the state) and go on; the result follows an
// uninterrupted run on the first backend within the tolerance the two backends keep anyway.
// Both ways, on the example convnet with its dropout and batch normalization.
TEST(CudaEngine, CheckpointsMoveBetweenCpuAndCuda) {
  using MakeFn = std::unique_ptr<skyforge::Engine> (*)(const ModelSpec&);
  const MakeFn make_cpu = [](const ModelSpec& m) { return cpu::make_engine(m, Communicator{}); };
  const MakeFn make_cuda = [](const ModelSpec& m) { return cu::make_engine(m, Communicator{}); };
  const ModelSpec spec = convnet(21);
  ModelSpec other = spec;
  other.seed = 999;
  const uint32_t batch = 16;
  for (const auto& [from, to, name] : {std::tuple{make_cpu, make_cuda, "cpu -> cuda"}, std::tuple{make_cuda, make_cpu, "cuda -> cpu"}}) {
    auto straight = from(spec);
    auto first = from(spec);
    for (int s = 0; s < 4; ++s) {
      const Batch b = make_batch(300 + s, batch, features(spec));
      straight->train_step(b.x.data(), b.y.data(), batch);
      first->train_step(b.x.data(), b.y.data(), batch);
    }
    auto resumed = to(other);
    resumed->load_state(first->state_dict());
    EXPECT_EQ(params_of(*resumed), params_of(*first)) << name;
    double worst_loss = 0;
    for (int s = 4; s < 8; ++s) {
      const Batch b = make_batch(300 + s, batch, features(spec));
      const auto rs = straight->train_step(b.x.data(), b.y.data(), batch);
      const auto rr = resumed->train_step(b.x.data(), b.y.data(), batch);
      worst_loss = std::max(worst_loss, std::fabs(rs.loss - rr.loss) / std::max(1.0, std::fabs(rs.loss)));
    }
    const double d = max_abs_diff(params_of(*straight), params_of(*resumed));
    std::printf("%s: resumed after 4 steps, 4 more: loss %.3g (relative), params %.3g (absolute)\n", name, worst_loss, d);
    EXPECT_LE(worst_loss, kLossTol) << name;
    EXPECT_LE(d, kConvParamTol) << name;
    // The state the resumed engine writes is the one it would hand back: same layout, same run.
    auto again = from(other);
    again->load_state(resumed->state_dict());
    EXPECT_EQ(params_of(*again), params_of(*resumed)) << name;
  }
}

// Every layer of the schema's catalogue builds and trains a step on this engine, on the kind of
// input it takes: images (8, 8, 3), sequences (2, 4) for the layers of sequences, integer
// indices for embedding; a merge layer joins two branches. A layer added to the schema without
// kernels here is refused with SF_ERR_UNSUPPORTED naming it, and fails this test.
TEST(CudaEngine, EveryLayerOfTheSchemaIsSupported) {
  namespace schema = skyforge::schema;
  for (const schema::LayerDef& def : schema::catalogue()) {
    const std::string type(def.type);
    std::vector<std::pair<std::string, std::string>> given;  // required options: small values
    for (const schema::OptionDef& o : def.options)
      if (o.required())
        given.emplace_back(o.name, o.kind == schema::OptionKind::real ? "0.5" : o.kind == schema::OptionKind::dims ? "-1" : "2");
    const bool sequence = type == "global_average_pooling1d" || type == "multi_head_attention" ||
                          type == "position_embedding";
    ModelSpec m;
    m.input_shape = type == "embedding" ? std::vector<uint32_t>{2} : sequence ? std::vector<uint32_t>{2, 4}
                                                                              : std::vector<uint32_t>{8, 8, 3};
    if (def.takes_many()) {
      given.emplace_back("inputs", "a,b");
      m.layers = {layer("relu", {{"name", "a"}}), layer("sigmoid", {{"name", "b"}, {"inputs", "input"}})};
    }
    std::vector<sf_kv> kv;
    for (const auto& [k, v] : given) kv.push_back(sf_kv{k.c_str(), v.c_str()});
    m.layers.push_back(LayerSpec{type, skyforge::Options(kv.data(), kv.size())});
    m.layers.push_back(layer("flatten"));
    m.layers.push_back(layer("dense", {{"units", "10"}}));
    try {
      auto e = cu::make_engine(m, Communicator{});
      Batch b = make_batch(900, 4, features(m));
      if (type == "embedding")
        for (size_t i = 0; i < b.x.size(); ++i) b.x[i] = static_cast<float>(i % 2);  // indices in [0, input_dim)
      EXPECT_TRUE(std::isfinite(e->train_step(b.x.data(), b.y.data(), 4).loss)) << type;
    } catch (const Error& e) {
      ADD_FAILURE() << type << ": " << e.what();
      EXPECT_EQ(e.status(), SF_ERR_UNSUPPORTED) << e.what();
      EXPECT_NE(std::string(e.what()).find("(" + type), std::string::npos);
    }
  }
}

TEST(CudaEngine, BadSpecsAndBatchesAreInvalid) {
  ModelSpec unknown = mlp(1);
  unknown.layers[1] = layer("densse", {{"units", "3"}});
  auto [s1, m1] = status_of([&] { cu::make_engine(unknown, Communicator{}); });
  EXPECT_EQ(s1, SF_ERR_INVALID);
  EXPECT_NE(m1.find("layer 1 (densse): unknown layer type"), std::string::npos) << m1;
  ModelSpec badopt = mlp(1);
  badopt.layers[1] = layer("dense", {{"units", "0"}});
  auto [s2, m2] = status_of([&] { cu::make_engine(badopt, Communicator{}); });
  EXPECT_EQ(s2, SF_ERR_INVALID);
  EXPECT_NE(m2.find("layer 1 (dense): option 'units'"), std::string::npos) << m2;
  ModelSpec badopt2 = mlp(1);
  badopt2.optimizer_options = opts({{"learning_rate", "-1"}});
  EXPECT_EQ(status_of([&] { cu::make_engine(badopt2, Communicator{}); }).first, SF_ERR_INVALID);
  // Keras' range for Adam's betas is [0, 1), the optimizer schema's message: the cpu engine's too.
  ModelSpec beta1 = mlp(1);
  beta1.optimizer = "adam";
  beta1.optimizer_options = opts({{"beta_1", "1"}});
  EXPECT_EQ(status_of([&] { cu::make_engine(beta1, Communicator{}); }),
            std::make_pair(SF_ERR_INVALID, std::string("optimizer adam: option 'beta_1': expected a number in [0, 1), got '1'")));
  ModelSpec noflat = mlp(1);
  noflat.layers.erase(noflat.layers.begin());
  EXPECT_EQ(status_of([&] { cu::make_engine(noflat, Communicator{}); }).first, SF_ERR_INVALID);

  auto e = cu::make_engine(mlp(1), Communicator{});
  Batch b = make_batch(1, 4, 784);
  b.y[2] = 10;
  auto [s3, m3] = status_of([&] { e->train_step(b.x.data(), b.y.data(), 4); });
  EXPECT_EQ(s3, SF_ERR_INVALID);
  EXPECT_NE(m3.find("label 10 of sample 2"), std::string::npos) << m3;
  EXPECT_EQ(status_of([&] { e->train_step(b.x.data(), b.y.data(), 0); }).first, SF_ERR_INVALID);
  std::vector<float> p(3);
  EXPECT_EQ(status_of([&] { e->get_params(p.data(), p.size()); }).first, SF_ERR_INVALID);
}

TEST(CudaEngine, PredictAndEvalAgreeWithCpu) {
  const ModelSpec m = bn_model(12);
  auto c = cpu::make_engine(m, Communicator{});
  auto g = cu::make_engine(m, Communicator{});
  const Batch b = make_batch(600, 8, features(m));
  std::vector<float> lc(8 * 10), lg(8 * 10);
  c->predict(b.x.data(), 8, lc.data());
  g->predict(b.x.data(), 8, lg.data());
  EXPECT_LE(max_abs_diff(lc, lg), kParamTol);
  const auto rc = c->eval_step(b.x.data(), b.y.data(), 8), rg = g->eval_step(b.x.data(), b.y.data(), 8);
  EXPECT_NEAR(rc.loss, rg.loss, kLossTol * rc.loss);
  EXPECT_EQ(rc.correct, rg.correct);
}

// Dropout's mask is Philox of (seed, step, layer, rank) (docs/kernels.md): the same seed gives
// the same training, inference ignores it, and rate 0 is the identity.
TEST(CudaEngine, DropoutIsReproducibleAndTrainingOnly) {
  auto with_rate = [](const char* rate) {
    ModelSpec m = mlp(13);
    m.layers.insert(m.layers.begin() + 2, layer("dropout", {{"rate", rate}}));
    return m;
  };
  auto run = [](const ModelSpec& m) {
    auto e = cu::make_engine(m, Communicator{});
    std::vector<double> l;
    for (int s = 0; s < 4; ++s) {
      const Batch b = make_batch(700 + s, 16, 784);
      l.push_back(e->train_step(b.x.data(), b.y.data(), 16).loss);
    }
    return std::make_pair(l, params_of(*e));
  };
  EXPECT_EQ(run(with_rate("0.5")), run(with_rate("0.5")));
  EXPECT_EQ(run(with_rate("0")), run(mlp(13)));
  EXPECT_NE(run(with_rate("0.5")).second, run(mlp(13)).second);
  auto a = cu::make_engine(with_rate("0.5"), Communicator{}), b = cu::make_engine(mlp(13), Communicator{});
  const Batch x = make_batch(800, 8, 784);
  std::vector<float> la(80), lb(80);
  a->predict(x.x.data(), 8, la.data());
  b->predict(x.x.data(), 8, lb.data());
  EXPECT_EQ(la, lb);
}

// Buffers grow with the batch and are reused for smaller ones (the last batch of an epoch).
TEST(CudaEngine, VaryingBatchSizesTrainLikeCpu) {
  ModelSpec m = convnet_without_dropout(17);
  auto c = cpu::make_engine(m, Communicator{});
  auto g = cu::make_engine(m, Communicator{});
  int step = 0;
  for (uint32_t batch : {8u, 24u, 5u, 24u, 1u}) {
    const Batch b = make_batch(1000 + step++, batch, features(m));
    const double lc = c->train_step(b.x.data(), b.y.data(), batch).loss;
    const double lg = g->train_step(b.x.data(), b.y.data(), batch).loss;
    EXPECT_NEAR(lg, lc, kLossTol * lc) << "batch " << batch;
  }
  EXPECT_LE(max_abs_diff(params_of(*c), params_of(*g)), kConvParamTol);
}

// ---- bound data (abi.h ABI 1.8; docs/compute-backends.md, "Bound data") ----------------------
namespace {

// A data set of n samples and the batches of one shuffled epoch over it.
struct Epoch {
  Batch all;
  std::vector<std::vector<uint64_t>> steps;
};
Epoch make_epoch(uint64_t seed, uint32_t n, size_t f, uint32_t batch) {
  Epoch e;
  e.all = make_batch(seed, n, f);
  std::vector<uint64_t> perm(n);
  for (uint32_t i = 0; i < n; ++i) perm[i] = (i * 7919u + 13u) % n;  // n prime to 7919: a permutation
  for (uint32_t at = 0; at < n; at += batch)
    e.steps.emplace_back(perm.begin() + at, perm.begin() + std::min(n, at + batch));
  return e;
}
Batch gathered(const Batch& all, const std::vector<uint64_t>& idx, size_t f) {
  Batch b;
  for (uint64_t i : idx) {
    b.x.insert(b.x.end(), all.x.begin() + static_cast<ptrdiff_t>(i * f), all.x.begin() + static_cast<ptrdiff_t>((i + 1) * f));
    b.y.push_back(all.y[i]);
  }
  return b;
}

}  // namespace

// A bound set's steps are the plain steps on the same samples, bit for bit (the batch gathered
// on the device is the batch the host would have copied), whether their results are returned
// or deferred; the deferred sums are the sums of the results; eval on bound data likewise.
TEST(CudaEngine, BoundDataStepsEqualPlainStepsBitForBit) {
  for (const ModelSpec& m : {convnet(21), bn_model(22)}) {
    const size_t f = features(m);
    const Epoch ep = make_epoch(40, 101, f, 16);  // 7 steps, the last of 5 samples
    auto plain = cu::make_engine(m, Communicator{});
    auto bound = cu::make_engine(m, Communicator{});
    const uint64_t id = bound->bind_data(ep.all.x.data(), ep.all.y.data(), 101);
    double loss_sum = 0;
    uint64_t correct = 0, samples = 0;
    for (size_t s = 0; s < ep.steps.size(); ++s) {
      const auto& idx = ep.steps[s];
      const Batch b = gathered(ep.all, idx, f);
      const auto rp = plain->train_step(b.x.data(), b.y.data(), static_cast<uint32_t>(idx.size()));
      if (s == 3) {  // one step asks for its result: it is returned, not added to the pending sums
        const auto rb = bound->train_step_indexed(id, idx.data(), static_cast<uint32_t>(idx.size()), false);
        EXPECT_EQ(rb.loss, rp.loss);
        EXPECT_EQ(rb.correct, rp.correct);
        continue;
      }
      bound->train_step_indexed(id, idx.data(), static_cast<uint32_t>(idx.size()), true);
      loss_sum += rp.loss * static_cast<double>(rp.samples);
      correct += rp.correct;
      samples += rp.samples;
    }
    const auto sums = bound->take_results();
    EXPECT_EQ(sums.samples, samples);
    EXPECT_EQ(sums.correct, correct);
    EXPECT_NEAR(sums.loss, loss_sum / static_cast<double>(samples), 1e-12 * sums.loss);
    const auto empty = bound->take_results();  // taking empties them
    EXPECT_EQ(empty.samples, 0u);
    EXPECT_EQ(empty.loss, 0.0);
    const std::vector<float> pp = params_of(*plain), pb = params_of(*bound);
    EXPECT_EQ(0, std::memcmp(pp.data(), pb.data(), pp.size() * sizeof(float))) << "params differ";
    EXPECT_TRUE(plain->state_dict() == bound->state_dict());  // slots, moving statistics, step too

    const auto& idx = ep.steps[1];
    const Batch b = gathered(ep.all, idx, f);
    const auto ep_plain = plain->eval_step(b.x.data(), b.y.data(), static_cast<uint32_t>(idx.size()));
    const auto ep_bound = bound->eval_step_indexed(id, idx.data(), static_cast<uint32_t>(idx.size()), false);
    EXPECT_EQ(ep_plain.loss, ep_bound.loss);
    EXPECT_EQ(ep_plain.correct, ep_bound.correct);
    bound->eval_step_indexed(id, idx.data(), static_cast<uint32_t>(idx.size()), true);
    EXPECT_EQ(bound->take_results().loss, ep_plain.loss);
    bound->release_data(id);
  }
}

// Data parallel on bound data: each rank binds its own shard and defers every step; the
// replicas stay bit-identical and equal the plain 2-rank run, and each rank's sums cover the
// global batches.
TEST(CudaEngine, BoundDataOnTwoNodesFollowsPlainSteps) {
  const ModelSpec m = with_sgd(convnet(23));
  const size_t f = features(m);
  std::vector<std::vector<float>> plain(2), bound(2);
  std::vector<skyforge::StepResult> sums(2);
  for (bool use_bound : {false, true}) {
    ThreadGroup group(2);
    group.run([&](uint32_t rank) {
      const Epoch ep = make_epoch(50 + rank, 61, f, 12);
      auto e = cu::make_engine(m, Communicator(group.comm(rank)));
      const uint64_t id = use_bound ? e->bind_data(ep.all.x.data(), ep.all.y.data(), 61) : 0;
      for (const auto& idx : ep.steps) {
        if (use_bound) {
          e->train_step_indexed(id, idx.data(), static_cast<uint32_t>(idx.size()), true);
        } else {
          const Batch b = gathered(ep.all, idx, f);
          e->train_step(b.x.data(), b.y.data(), static_cast<uint32_t>(idx.size()));
        }
      }
      if (use_bound) {
        sums[rank] = e->take_results();
        // 5 steps of 12 (eager, captured, 3 replays; allreduces inside the graph) and one of 1.
        const cu::GraphStats g = dynamic_cast<const cu::CudaEngine&>(*e).graph_stats();
        EXPECT_EQ(g.replayed, 4u);
        EXPECT_EQ(g.eager, 2u);
      }
      (use_bound ? bound : plain)[rank] = params_of(*e);
    });
  }
  EXPECT_EQ(bound[0], bound[1]) << "replicas differ";
  EXPECT_EQ(bound[0], plain[0]);
  EXPECT_EQ(sums[0].samples, 122u);  // both ranks' 61 samples
  EXPECT_EQ(sums[0].samples, sums[1].samples);
  EXPECT_EQ(sums[0].correct, sums[1].correct);
  EXPECT_EQ(sums[0].loss, sums[1].loss);
}

TEST(CudaEngine, BoundDataRefusesBadInput) {
  auto e = cu::make_engine(mlp(24), Communicator{});
  Batch all = make_batch(60, 10, 784);
  all.y[7] = 12;
  auto [s1, m1] = status_of([&] { e->bind_data(all.x.data(), all.y.data(), 10); });
  EXPECT_EQ(s1, SF_ERR_INVALID);
  EXPECT_NE(m1.find("bind_data: label 12 of sample 7 is outside [0, 10)"), std::string::npos) << m1;
  all.y[7] = 1;
  EXPECT_EQ(status_of([&] { e->bind_data(all.x.data(), all.y.data(), 0); }).first, SF_ERR_INVALID);
  const uint64_t id = e->bind_data(all.x.data(), all.y.data(), 10);
  const std::vector<uint64_t> idx = {0, 9, 10};
  auto [s2, m2] = status_of([&] { e->train_step_indexed(id, idx.data(), 3, true); });
  EXPECT_EQ(s2, SF_ERR_INVALID);
  EXPECT_NE(m2.find("index 10 at position 2 is outside bound set " + std::to_string(id) + " of 10 samples"),
            std::string::npos)
      << m2;
  EXPECT_EQ(status_of([&] { e->train_step_indexed(id, idx.data(), 0, true); }).first, SF_ERR_INVALID);
  EXPECT_EQ(e->take_results().samples, 0u) << "a refused step left sums behind";
  EXPECT_EQ(params_of(*e), params_of(*cu::make_engine(mlp(24), Communicator{}))) << "a refused step trained";
  e->release_data(id);
  auto [s3, m3] = status_of([&] { e->eval_step_indexed(id, idx.data(), 2, false); });
  EXPECT_EQ(s3, SF_ERR_INVALID);
  EXPECT_NE(m3.find("no bound data set " + std::to_string(id)), std::string::npos) << m3;
  EXPECT_EQ(status_of([&] { e->release_data(id); }).first, SF_ERR_INVALID);
}

// ---- graphs (docs/compute-backends.md, "Graphs") ----------------------------------------------
namespace {
cu::GraphStats stats_of(const skyforge::Engine& e) { return dynamic_cast<const cu::CudaEngine&>(e).graph_stats(); }
}  // namespace

// A bound-data step captured once and replayed is the eager step bit for bit, epoch after epoch:
// the step counter (Adam's bias correction, dropout's key), the sample count and the pending
// sums are read from device memory when the replay runs, never baked into the graph. The host
// build's capture records every call with its arguments by value, as a CUDA graph does, so a
// value that should change per step and is captured instead shows here as a difference.
TEST(CudaEngine, GraphsReplayTheEagerStepsBitForBit) {
  for (const ModelSpec& m : {convnet(31), bn_model(32), with_sgd(mlp(33))}) {
    const size_t f = features(m);
    const Epoch ep = make_epoch(60, 101, f, 16);  // 6 steps of 16 and one of 5 an epoch
    cu::EngineOptions eager_only;
    eager_only.graphs = false;
    auto a = cu::make_engine(m, Communicator{}, skyforge::Host{}, eager_only);
    auto b = cu::make_engine(m, Communicator{});
    const uint64_t da = a->bind_data(ep.all.x.data(), ep.all.y.data(), 101);
    const uint64_t db = b->bind_data(ep.all.x.data(), ep.all.y.data(), 101);
    for (int epoch = 0; epoch < 3; ++epoch) {
      for (const auto& idx : ep.steps) {
        a->train_step_indexed(da, idx.data(), static_cast<uint32_t>(idx.size()), true);
        b->train_step_indexed(db, idx.data(), static_cast<uint32_t>(idx.size()), true);
      }
      for (size_t s = 0; s < 2; ++s) {  // a deferred eval pass, and one whose result is returned
        a->eval_step_indexed(da, ep.steps[s].data(), 16, s == 0);
        const auto rb = b->eval_step_indexed(db, ep.steps[s].data(), 16, s == 0);
        if (s == 1) {
          const auto ra = a->eval_step_indexed(da, ep.steps[s].data(), 16, false);
          EXPECT_EQ(ra.loss, rb.loss);
        }
      }
      const auto ta = a->take_results(), tb = b->take_results();
      EXPECT_EQ(ta.loss, tb.loss) << "epoch " << epoch;
      EXPECT_EQ(ta.correct, tb.correct);
      EXPECT_EQ(ta.samples, tb.samples);
    }
    EXPECT_TRUE(a->state_dict() == b->state_dict()) << "graphs trained other bits";
    // b: 21 train steps of 2 shapes and 6 eval steps of one (deferred or not: the same graph,
    // whose sums a returned step takes back out of the pending ones): each of the 3 shapes
    // eager once, then captured, then replayed. a: every step eager (3 evals an epoch).
    const cu::GraphStats ga = stats_of(*a), gb = stats_of(*b);
    EXPECT_EQ(ga.captured, 0u);
    EXPECT_EQ(ga.eager, 21u + 9u);
    EXPECT_EQ(gb.captured, 3u);
    EXPECT_EQ(gb.eager, 3u);
    EXPECT_EQ(gb.replayed, 21u + 6u - 3u);
    EXPECT_EQ(gb.kept, 3u);
    b->release_data(db);
    EXPECT_EQ(stats_of(*b).kept, 0u) << "a released set's graphs are kept";
  }
}

// A graph holds buffers, a set and the seed by value. Buffers that grow are kept for the graphs
// that point at them (so growing on one rank alone changes no rank's choice of graph), and a shape
// first run before the growth is captured after it without an allocation inside the capture; a
// released set takes its own graphs along, and a loaded state every graph (the seed in dropout's key).
TEST(CudaEngine, GraphsOutliveAGrowthAndGoWithWhatTheyHold) {
  const ModelSpec m = convnet(34);
  const size_t f = features(m);
  const Epoch ep = make_epoch(61, 64, f, 8);
  auto e = cu::make_engine(m, Communicator{});
  cu::EngineOptions eager_only;
  eager_only.graphs = false;
  auto ref = cu::make_engine(m, Communicator{}, skyforge::Host{}, eager_only);
  const uint64_t d = e->bind_data(ep.all.x.data(), ep.all.y.data(), 64);
  const uint64_t r = ref->bind_data(ep.all.x.data(), ep.all.y.data(), 64);
  auto both = [&](const std::vector<uint64_t>& idx) {
    e->train_step_indexed(d, idx.data(), static_cast<uint32_t>(idx.size()), true);
    ref->train_step_indexed(r, idx.data(), static_cast<uint32_t>(idx.size()), true);
  };
  // The device bytes e holds beyond ref's (same buffers, but no graphs to keep old ones for).
  auto extra = [&] {
    const auto bytes = [](const skyforge::Engine& x) { return dynamic_cast<const cu::CudaEngine&>(x).device_bytes(); };
    return static_cast<ptrdiff_t>(bytes(*e)) - static_cast<ptrdiff_t>(bytes(*ref));
  };
  const std::vector<uint64_t> four(ep.steps[0].begin(), ep.steps[0].begin() + 4);
  for (int s = 0; s < 3; ++s) both(ep.steps[s]);
  both(four);  // batch 4: eager once, before the growth
  EXPECT_EQ(stats_of(*e).kept, 1u);
  EXPECT_EQ(extra(), 0);
  std::vector<uint64_t> wide(ep.steps[0]);
  wide.insert(wide.end(), ep.steps[1].begin(), ep.steps[1].end());  // 16 > the capacity of 8
  both(wide);
  EXPECT_EQ(stats_of(*e).kept, 1u) << "the buffers grew and the graph of batch 8 went";
  const ptrdiff_t old_set = extra();
  EXPECT_GT(old_set, 0) << "the graph of batch 8 kept none of the buffers it points at";
  for (int s = 3; s < 6; ++s) both(ep.steps[s]);  // replays of batch 8, on its old buffers
  both(four);                                     // captured (the convnet's im2col remade at the growth)
  both(wide);
  both(wide);
  const cu::GraphStats g = stats_of(*e);
  EXPECT_EQ(g.kept, 3u);
  EXPECT_EQ(g.captured, 3u);
  EXPECT_EQ(g.eager, 3u);  // batches 8, 4 and 16 once each
  EXPECT_EQ(g.replayed, 8u);
  EXPECT_TRUE(e->state_dict() == ref->state_dict()) << "a graph replayed after the growth trained other bits";
  // Another set's graphs go with it, and this set's stay.
  const uint64_t d2 = e->bind_data(ep.all.x.data(), ep.all.y.data(), 64);
  const uint64_t r2 = ref->bind_data(ep.all.x.data(), ep.all.y.data(), 64);
  for (int s = 0; s < 2; ++s) {
    e->train_step_indexed(d2, ep.steps[s].data(), 8, true);
    ref->train_step_indexed(r2, ep.steps[s].data(), 8, true);
  }
  EXPECT_EQ(stats_of(*e).kept, 4u);
  e->release_data(d2);
  ref->release_data(r2);
  EXPECT_EQ(stats_of(*e).kept, 3u) << "a released set's graphs are kept, or another set's went with it";
  EXPECT_EQ(extra(), old_set) << "the buffers of batch 8 went while a graph points at them";
  const std::string saved = ref->state_dict();
  e->load_state(saved);
  ref->load_state(saved);
  EXPECT_EQ(stats_of(*e).kept, 0u);
  EXPECT_EQ(extra(), 0) << "the buffers of batch 8 outlived every graph that points at them";
  for (int s = 0; s < 4; ++s) both(ep.steps[s]);
  EXPECT_TRUE(e->state_dict() == ref->state_dict());
  EXPECT_EQ(stats_of(*e).kept, 1u);
}

// Nothing that waits for the device may run inside a capture: the device refuses it by name, and
// after abort_capture() it runs calls at once again.
TEST(CudaEngine, ACaptureRefusesWhatWouldWaitForTheDevice) {
  cu::Device dev(Communicator{}, skyforge::Host{});
  cu::Buffer<float> buf(dev, 4);
  const float ones[4] = {1, 1, 1, 1};
  float out[4] = {};
  dev.begin_capture();
  EXPECT_TRUE(dev.capturing());
  dev.zero(buf.get(), sizeof ones);  // recorded, not run
  try {
    dev.download(out, buf.get(), sizeof out);
    ADD_FAILURE() << "download inside a capture";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("download while a step is being captured"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dev.upload_async(buf.get(), ones, sizeof ones), Error);
  // A buffer made during a capture would be one the graph does not own (and cudaMalloc may
  // wait for the device): the engine makes every buffer before, so one made here is a bug.
  try {
    cu::Buffer<float> late(dev, 4);
    ADD_FAILURE() << "an allocation inside a capture";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a device allocation while a step is being captured"), std::string::npos)
        << e.what();
  }
  dev.abort_capture();
  EXPECT_FALSE(dev.capturing());
  dev.upload(buf.get(), ones, sizeof ones);
  dev.begin_capture();
  dev.zero(buf.get(), sizeof ones);
  const auto g = dev.end_capture();
  dev.download(out, buf.get(), sizeof out);
  EXPECT_EQ(out[0], 1.f) << "a captured call ran at capture time";
  dev.replay(*g);
  dev.download(out, buf.get(), sizeof out);
  EXPECT_EQ(out[0], 0.f) << "the replay did not run the captured call";
}

// Capturing an NCCL launch is collective (every rank captures the same step, and replays the
// graph of that capture), so data parallel every rank chooses its graph by every rank's batch:
// from step_batches (the schedule the ranks share: no exchange), or else gathered each step.
// Ranks whose batches differ at an epoch's end, one rank whose buffers grew (a larger predict()
// there alone), a step whose sums one rank reads back while the other defers them: the ranks
// still choose alike at every step, and train the same bits as eager steps.
TEST(CudaEngine, DataParallelRanksChooseGraphsAlike) {
  const ModelSpec m = with_sgd(convnet(35));
  const size_t f = features(m);
  enum Mode { schedule, gathered, eager };
  std::map<Mode, std::vector<cu::GraphStats>> stats;
  std::map<Mode, std::vector<std::vector<float>>> params;
  std::map<Mode, std::vector<std::vector<double>>> losses;  // per epoch: the returned step's, the pending ones'
  std::map<Mode, std::vector<size_t>> allgathers;
  for (Mode mode : {schedule, gathered, eager}) {
    ThreadGroup group(2);
    stats[mode].resize(2), params[mode].resize(2), losses[mode].resize(2), allgathers[mode].resize(2);
    group.run([&](uint32_t rank) {
      const Batch all = make_batch(70 + rank, 48, f);
      cu::EngineOptions o;
      o.graphs = mode != eager;
      auto e = cu::make_engine(m, Communicator(group.comm(rank)), skyforge::Host{}, o);
      const uint64_t d = e->bind_data(all.x.data(), all.y.data(), 48);
      // Rank 0: 12, 12, 12, 5 an epoch; rank 1: 12, 12, 12, 12.
      const std::vector<std::vector<uint32_t>> sizes = {{12, 12}, {12, 12}, {12, 12}, {5, 12}};
      const size_t before = group.allgather_calls(rank);
      for (int epoch = 0; epoch < 4; ++epoch) {
        if (epoch == 2 && rank == 0) {  // rank 0 alone grows its buffers
          std::vector<float> logits(40 * 10);
          e->predict(all.x.data(), 40, logits.data());
        }
        uint64_t at = 0;
        for (size_t s = 0; s < sizes.size(); ++s) {
          const uint32_t b = sizes[s][rank];
          std::vector<uint64_t> idx(b);
          for (uint32_t i = 0; i < b; ++i) idx[i] = (at + i + epoch * 7) % 48;
          at += b;
          if (mode == schedule) e->step_batches(sizes[s]);
          const bool returned = rank == 0 && s == 1;  // rank 0 reads this step's sums back
          const StepResult r = e->train_step_indexed(d, idx.data(), b, !returned);
          if (returned) losses[mode][rank].push_back(r.loss);
        }
        losses[mode][rank].push_back(e->take_results().loss);
      }
      allgathers[mode][rank] = group.allgather_calls(rank) - before;
      params[mode][rank] = params_of(*e);
      stats[mode][rank] = dynamic_cast<const cu::CudaEngine&>(*e).graph_stats();
    });
  }
  for (Mode mode : {schedule, gathered}) {
    const auto& st = stats[mode];
    EXPECT_EQ(st[0].eager, st[1].eager);
    EXPECT_EQ(st[0].captured, st[1].captured);
    EXPECT_EQ(st[0].replayed, st[1].replayed);
    // The shapes (12,12) and (5,12) eager once, then captured and replayed; rank 0's growth
    // keeps its graphs (they keep the buffers they point at), so nothing is captured again.
    EXPECT_EQ(st[0].eager, 2u);
    EXPECT_EQ(st[0].captured, 2u);
    EXPECT_EQ(st[0].replayed, 14u);
    EXPECT_EQ(params[mode][0], params[mode][1]);
    EXPECT_EQ(params[mode][0], params[eager][0]) << "graphs trained other bits";
    EXPECT_EQ(losses[mode][0], losses[eager][0]) << "a returned step's sums were pending too, or went missing";
    EXPECT_EQ(losses[mode][1], losses[eager][1]);
  }
  EXPECT_EQ(allgathers[schedule][0], 0u) << "step_batches: no exchange is needed";
  EXPECT_EQ(allgathers[gathered][0], 16u) << "without it, one a step";
  EXPECT_EQ(allgathers[eager][0], 0u);
}

// step_batches names every rank's batch: one per rank, this rank's its step's own. A wrong one
// fails the step; it applies to the next step only.
TEST(CudaEngine, StepBatchesAreCheckedAndLastOneStep) {
  const ModelSpec m = mlp(43);
  const Batch b = make_batch(401, 8, features(m));
  auto e = cu::make_engine(m, Communicator{});
  const uint64_t d = e->bind_data(b.x.data(), b.y.data(), 8);
  const std::vector<uint64_t> idx = {0, 1, 2, 3};
  try {
    e->step_batches(std::vector<uint32_t>{4, 4});
    ADD_FAILURE() << "two batches for one rank";
  } catch (const Error& err) {
    EXPECT_EQ(err.status(), SF_ERR_INVALID);
    EXPECT_NE(std::string(err.what()).find("2 batches for a pool of 1 ranks"), std::string::npos) << err.what();
  }
  e->step_batches(std::vector<uint32_t>{3});
  try {
    e->train_step_indexed(d, idx.data(), 4, true);
    ADD_FAILURE() << "a step of 4 named 3";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("step_batches gave rank 0 a batch of 3, but its step has 4 samples"),
              std::string::npos)
        << err.what();
  }
  e->train_step_indexed(d, idx.data(), 4, true);  // the wrong one was that step's alone
  e->step_batches(std::vector<uint32_t>{4});
  e->train_step_indexed(d, idx.data(), 4, true);
  EXPECT_EQ(e->take_results().samples, 8u);
}

// collectives_alone (test-only): one rank takes the data-parallel path — the loss sums and the
// gradient buckets go to the device's collectives, eager and captured — and trains the same bits
// as without (a sum over one rank is itself). The gpu tests run it through NCCL.
TEST(CudaEngine, OneRankTakesTheDataParallelPathWhenAsked) {
  const ModelSpec m = mlp(41);
  const size_t f = features(m);
  const Epoch ep = make_epoch(60, 101, f, 16);
  std::vector<std::vector<float>> params;
  std::vector<uint64_t> collectives;
  for (bool alone : {false, true})
    for (bool graphs : {false, true}) {
      cu::EngineOptions o;
      o.collectives_alone = alone;
      o.graphs = graphs;
      o.bucket_bytes = 1024;  // two buckets a step (TwoNodesFollowOneNode)
      ThreadGroup one(1);
      auto e = cu::make_engine(m, Communicator(one.comm(0)), skyforge::Host{}, o);
      const uint64_t d = e->bind_data(ep.all.x.data(), ep.all.y.data(), 101);
      for (int epoch = 0; epoch < 2; ++epoch)
        for (const auto& idx : ep.steps) e->train_step_indexed(d, idx.data(), static_cast<uint32_t>(idx.size()), true);
      e->take_results();
      params.push_back(params_of(*e));
      collectives.push_back(dynamic_cast<const cu::CudaEngine&>(*e).collectives());
    }
  EXPECT_EQ(params[1], params[0]);
  EXPECT_EQ(params[2], params[0]) << "the data-parallel path trained other bits";
  EXPECT_EQ(params[3], params[0]) << "its captured steps trained other bits";
  EXPECT_EQ(collectives[0], 0u);
  EXPECT_EQ(collectives[1], 0u);
  // The initial parameters' broadcast, then 14 steps of 2 shapes, 3 collectives each (the loss
  // sums and 2 buckets): every step eager, or each shape eager once and captured once (a replay
  // gives the device nothing anew).
  EXPECT_EQ(collectives[2], 1u + 14u * 3);
  EXPECT_EQ(collectives[3], 1u + 2u * 2 * 3);
}

// A data-parallel step that fails on one rank after it began leaves that rank out of step: its
// peers wait in collectives it will not join, and its next step's collectives would pair with
// theirs of this one. Rank 1 leaves the group after one step, so rank 0's second step fails in
// its collectives; from then on rank 0 refuses every step without a collective call.
TEST(CudaEngine, ARankWhoseStepFailsAmongPeersRefusesEveryLaterStep) {
  const ModelSpec m = mlp(42);
  const size_t f = features(m);
  const Batch b = make_batch(400, 8, f);
  ThreadGroup group(2);
  struct Left {};
  EXPECT_THROW(group.run([&](uint32_t rank) {
                 auto e = cu::make_engine(m, Communicator(group.comm(rank)));
                 e->train_step(b.x.data(), b.y.data(), 8);
                 if (rank == 1) throw Left{};
                 EXPECT_THROW(e->train_step(b.x.data(), b.y.data(), 8), skyforge::Error);
                 const size_t calls = group.allreduce_calls(0);
                 const auto [st, msg] = status_of([&] { e->train_step(b.x.data(), b.y.data(), 8); });
                 EXPECT_EQ(st, SF_ERR);
                 EXPECT_NE(msg.find("train_step failed on rank 0 of 2 after it began"), std::string::npos) << msg;
                 EXPECT_NE(msg.find("refuses every later step"), std::string::npos) << msg;
                 EXPECT_NE(msg.find("(earlier)"), std::string::npos) << msg;
                 EXPECT_EQ(status_of([&] { e->eval_step(b.x.data(), b.y.data(), 8); }).first, SF_ERR);
                 EXPECT_EQ(status_of([&] { e->take_results(); }).first, SF_ERR);
                 const uint64_t d = e->bind_data(b.x.data(), b.y.data(), 8);
                 const std::vector<uint64_t> idx{0, 1, 2, 3};
                 EXPECT_EQ(status_of([&] { e->train_step_indexed(d, idx.data(), 4, false); }).first, SF_ERR);
                 EXPECT_EQ(group.allreduce_calls(0), calls) << "a refused step reached the collectives";
               }),
               Left);
}

// A batch one rank alone refuses (a label out of range there) is such a failure too: its peers
// go on into the step. The refusal keeps its own status; later steps are refused as above.
TEST(CudaEngine, ABadBatchOnOneRankFailsThatRanksEngine) {
  const ModelSpec m = mlp(43);
  const size_t f = features(m);
  Batch b = make_batch(401, 8, f);
  ThreadGroup group(2);
  struct Refused {};
  EXPECT_THROW(group.run([&](uint32_t rank) {
                 auto e = cu::make_engine(m, Communicator(group.comm(rank)));
                 if (rank == 0) {  // its peer leaves the step: its collectives fail
                   EXPECT_THROW(e->train_step(b.x.data(), b.y.data(), 8), skyforge::Error);
                   return;
                 }
                 Batch mine = b;
                 mine.y[3] = 12;
                 EXPECT_EQ(status_of([&] { e->train_step(mine.x.data(), mine.y.data(), 8); }).first, SF_ERR_INVALID);
                 const auto [st, msg] = status_of([&] { e->train_step(b.x.data(), b.y.data(), 8); });
                 EXPECT_EQ(st, SF_ERR);
                 EXPECT_NE(msg.find("label 12 of sample 3 is outside [0, 10)"), std::string::npos) << msg;
                 EXPECT_NE(msg.find("refuses every later step"), std::string::npos) << msg;
                 throw Refused{};
               }),
               Refused);
}

// Device::probe's architecture rule (arch.hpp), with the default CMAKE_CUDA_ARCHITECTURES
// "80-real;90-real;90-virtual" as CMake hands it over: real {80, 90}, PTX {90}.
TEST(CudaArch, ABuildRunsWhereItsCodeOrItsPtxRuns) {
  const auto refusal = [](int major, int minor, std::initializer_list<int> real, std::initializer_list<int> ptx) {
    return skyforge::cuda::arch_refusal(major, minor, "GPU", real, ptx, "80-real, 90-real, 90-virtual");
  };
  EXPECT_FALSE(refusal(8, 0, {80, 90, 0}, {90, 0}));   // A100: its own machine code
  EXPECT_FALSE(refusal(8, 6, {80, 90, 0}, {90, 0}));   // sm_80 code runs on 8.6 (same major, above)
  EXPECT_FALSE(refusal(8, 9, {80, 90, 0}, {90, 0}));   // L40S
  EXPECT_FALSE(refusal(9, 0, {80, 90, 0}, {90, 0}));   // H100, H200
  EXPECT_FALSE(refusal(10, 0, {80, 90, 0}, {90, 0}));  // B200: compute_90 PTX, compiled at load
  EXPECT_FALSE(refusal(12, 0, {80, 90, 0}, {90, 0}));
  EXPECT_EQ(refusal(7, 5, {80, 90, 0}, {90, 0}).value_or(""),
            "cuda: device 0 (GPU) has compute capability 7.5; this build carries code for 80-real, 90-real, "
            "90-virtual (rebuild with -DCMAKE_CUDA_ARCHITECTURES=75)");
  // Real code alone does not run on a newer major, nor on an older minor.
  EXPECT_TRUE(refusal(10, 0, {80, 90, 0}, {0}));
  EXPECT_TRUE(refusal(8, 0, {86, 0}, {0}));
  // PTX runs on anything at or above it, never below.
  EXPECT_FALSE(refusal(9, 0, {0}, {80, 0}));
  EXPECT_TRUE(refusal(7, 0, {0}, {80, 0}));
  // "all", "native": no number; CMake hands PTX {1}, and nothing is refused.
  EXPECT_FALSE(refusal(3, 5, {0}, {1, 0}));
}

// SKYFORGE_CUDA_PROFILE=1 (docs/compute-backends.md, "Profiling"): every train step, plain or on
// bound data, runs eager and is timed layer by layer; the table goes to stderr when the engine
// is destroyed; the numbers trained are the same bits as without it.
TEST(CudaEngine, ProfileTimesEveryLayerOfEagerStepsAndChangesNoResult) {
  const ModelSpec m = bn_model(41);
  const size_t f = features(m);
  const Batch data = make_batch(42, 96, f);
  auto train = [&](cu::CudaEngine& e) {
    for (uint32_t s = 0; s < 3; ++s) {
      const Batch b = make_batch(43 + s, 16, f);
      e.train_step(b.x.data(), b.y.data(), 16);
    }
    const uint64_t set = e.bind_data(data.x.data(), data.y.data(), 96);
    std::vector<uint64_t> idx(16);
    for (uint32_t s = 0; s < 4; ++s) {
      for (uint32_t i = 0; i < 16; ++i) idx[i] = (s * 16 + i * 5) % 96;
      e.train_step_indexed(set, idx.data(), 16, false);
    }
    return params_of(e);
  };
  ::unsetenv("SKYFORGE_CUDA_PROFILE");
  cu::CudaEngine plain(m, Communicator{});
  const std::vector<float> expected = train(plain);
  EXPECT_GT(plain.graph_stats().captured, 0u) << "without the profile, the bound steps run as graphs";

  ::setenv("SKYFORGE_CUDA_PROFILE", "1", 1);
  auto profiled = std::make_unique<cu::CudaEngine>(m, Communicator{});
  ::unsetenv("SKYFORGE_CUDA_PROFILE");
  EXPECT_EQ(train(*profiled), expected);
  EXPECT_EQ(profiled->graph_stats().captured, 0u) << "a profiled step runs eager";
  testing::internal::CaptureStderr();
  profiled.reset();
  const std::string table = testing::internal::GetCapturedStderr();
  EXPECT_NE(table.find("skyforge cuda profile (rank 0, host build): 6 train steps (and 1 left out: the first of each batch size), "
                       "16.0 samples/step"),
            std::string::npos) << table;
  for (const char* row : {"0     dense (None, 6, 5, 4)->(None, 6, 5, 16)", "batch_normalization", "(fused)",
                          "flatten (None, 6, 5, 8)->(None, 240) (view)", "loss", "optimizer", "train step total"})
    EXPECT_NE(table.find(row), std::string::npos) << row << "\n" << table;
  // Every timed row is a number of microseconds, the total at least the layers' sum.
  std::smatch layers, total;
  ASSERT_TRUE(std::regex_search(table, layers, std::regex(R"(\n  layers +([0-9.]+) +([0-9.]+)\n)"))) << table;
  ASSERT_TRUE(std::regex_search(table, total, std::regex(R"(train step total +([0-9.]+)\n)"))) << table;
  EXPECT_GT(std::stod(layers[1]), 0.0);
  EXPECT_GE(std::stod(total[1]) + 1e-3, std::stod(layers[1]) + std::stod(layers[2]));

  // A run whose every step was its batch size's first has nothing to average, and says so.
  ::setenv("SKYFORGE_CUDA_PROFILE", "1", 1);
  auto once = std::make_unique<cu::CudaEngine>(m, Communicator{});
  ::unsetenv("SKYFORGE_CUDA_PROFILE");
  const Batch b = make_batch(50, 16, f);
  once->train_step(b.x.data(), b.y.data(), 16);
  testing::internal::CaptureStderr();
  once.reset();
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("skyforge cuda profile (rank 0, host build): no train step after the first of its batch size "
                      "(1 left out); nothing timed"),
            std::string::npos)
      << said;
}

// Learning-rate schedules and gradient clipping (docs/compute-backends.md, "Learning-rate
// schedules", "Gradient clipping"): the rate comes from the device's step counter, the clipped
// mean gradient from the cpu engine's sums (clip.hpp). Each schedule type, each clipping norm
// (small enough to clip every step), in lockstep with the cpu backend: the step travels with the
// state, so the schedule runs on where the cpu engine's is.
namespace {
ModelSpec scheduled(uint64_t seed, const char* optimizer, std::initializer_list<std::pair<const char*, const char*>> options) {
  ModelSpec m = mlp(seed);
  m.optimizer = optimizer;
  m.optimizer_options = opts(options);
  return m;
}
}  // namespace

TEST(CudaEngine, CosineDecayWithWarmupAndGlobalClipnormTrainLikeCpu) {
  expect_agreement("mlp adam, cosine_decay with warmup, global_clipnorm",
                   scheduled(21, "adam",
                             {{"learning_rate_schedule", "cosine_decay"},
                              {"learning_rate_schedule.initial_learning_rate", "0"},
                              {"learning_rate_schedule.decay_steps", "12"},
                              {"learning_rate_schedule.warmup_target", "0.002"},
                              {"learning_rate_schedule.warmup_steps", "5"},
                              {"global_clipnorm", "0.5"}}),
                   64, kParamTol);
}

TEST(CudaEngine, ExponentialDecayAndClipnormTrainLikeCpu) {
  expect_agreement("mlp sgd, exponential_decay staircase, clipnorm",
                   scheduled(22, "sgd",
                             {{"momentum", "0.9"},
                              {"learning_rate_schedule", "exponential_decay"},
                              {"learning_rate_schedule.initial_learning_rate", "0.1"},
                              {"learning_rate_schedule.decay_steps", "3"},
                              {"learning_rate_schedule.decay_rate", "0.5"},
                              {"learning_rate_schedule.staircase", "true"},
                              {"clipnorm", "0.2"}}),
                   64, kParamTol);
}

TEST(CudaEngine, PiecewiseConstantDecayTrainsLikeCpu) {
  for (const char* optimizer : {"rmsprop", "adamw"})
    expect_agreement((std::string("mlp ") + optimizer + ", piecewise_constant_decay").c_str(),
                     scheduled(23, optimizer,
                               {{"learning_rate_schedule", "piecewise_constant_decay"},
                                {"learning_rate_schedule.boundaries", "4,9"},
                                {"learning_rate_schedule.values", "0.002,0.001,0.0002"}}),
                     64, kParamTol);
}

// The device's parameter layout: every layer's slice starts on a 256-byte boundary (the convnet's
// slices of 108 (conv2d), 12 (BatchNorm's beta), ... floats leave gaps of zeros), while get_params, the state
// and the clipping norms see the model's layout without gaps: the convnet, clipped per variable
// and globally, still trains in lockstep with the cpu backend, and its state moves between them.
TEST(CudaEngine, ParameterSlicesStartOn256ByteBoundaries) {
  ModelSpec m = convnet(24);
  cu::CudaEngine e(m, Communicator{});
  const std::vector<size_t> offsets = e.param_offsets();
  ASSERT_FALSE(offsets.empty());
  for (size_t i = 0; i < offsets.size(); ++i)
    EXPECT_EQ(offsets[i] * sizeof(float) % 256, 0u) << "layer slice " << i << " at float " << offsets[i];
  EXPECT_GT(e.device_param_count(), e.param_count()) << "no gaps: the test would not see the layout";
  std::vector<float> p(e.param_count());
  e.get_params(p.data(), p.size());
  auto c = cpu::make_engine(m, Communicator{});
  EXPECT_EQ(p, params_of(*c)) << "get_params is the model's layout";
  for (const char* clip : {"clipnorm", "global_clipnorm"}) {  // SGD: see TwoNodesFollowCpuOnTwoNodes
    m.optimizer = "sgd";
    m.optimizer_options = opts({{"learning_rate", "0.05"}, {"momentum", "0.9"}, {clip, "0.05"}});
    expect_agreement((std::string("convnet sgd, ") + clip + ", aligned slices").c_str(), m, 16, kParamTol);
  }
  expect_state_moves_between_engines(m, make_batch(25, 6, features(m)));
}

// A diverged step (a NaN input) with global_clipnorm scales every gradient, the layout's gaps
// too, by NaN; a state loaded after it must train as it does in a fresh engine, not carry the
// NaN gaps into every later norm.
TEST(CudaEngine, AStateLoadedAfterADivergedStepTrainsAsInAFreshEngine) {
  ModelSpec m = convnet(27);
  m.optimizer = "sgd";
  m.optimizer_options = opts({{"learning_rate", "0.05"}, {"global_clipnorm", "0.5"}});
  const Batch good = make_batch(28, 6, features(m));
  Batch bad = good;
  bad.x[5] = std::numeric_limits<float>::quiet_NaN();
  auto e = cu::make_engine(m, Communicator{});
  e->train_step(good.x.data(), good.y.data(), 6);
  const std::string saved = e->state_dict();
  e->train_step(bad.x.data(), bad.y.data(), 6);
  ASSERT_TRUE(std::isnan(params_of(*e)[0])) << "the step did not diverge: the test would not see the gaps";
  e->load_state(saved);
  auto fresh = cu::make_engine(m, Communicator{});
  fresh->load_state(saved);
  e->train_step(good.x.data(), good.y.data(), 6);
  fresh->train_step(good.x.data(), good.y.data(), 6);
  EXPECT_EQ(params_of(*e), params_of(*fresh));
}

// More than 4096 classes (a vocabulary's softmax) take the loss's staged path, each row split
// over many threads (docs/kernels.md, "Wide rows"): in lockstep with the cpu backend as the
// per-row path is.
TEST(CudaEngine, ManyClassesTrainLikeCpu) {
  ModelSpec m;
  m.input_shape = {8, 8, 1};
  m.layers = {layer("flatten"), layer("dense", {{"units", "32"}, {"activation", "relu"}}),
              layer("dense", {{"units", "5000"}})};
  m.seed = 26;
  expect_lockstep(m, 12, [](uint64_t seed, uint32_t n) { return make_batch(seed, n, 64, 5000); });
}

// Clipping on 2 ranks: each replica clips the same allreduced mean, so both hold the same bits,
// and they follow the cpu backend on 2 ranks.
TEST(CudaEngine, ClippedScheduledTwoNodesAreIdentical) {
  for (const char* norm : {"clipnorm", "global_clipnorm"}) {
    const ModelSpec m = scheduled(24, "sgd",
                                  {{"momentum", "0.9"},
                                   {"learning_rate_schedule", "exponential_decay"},
                                   {"learning_rate_schedule.initial_learning_rate", "0.05"},
                                   {"learning_rate_schedule.decay_steps", "2"},
                                   {"learning_rate_schedule.decay_rate", "0.8"},
                                   {norm, "0.3"}});
    const auto [gl, gp] = train_two(m, [](const ModelSpec& s, Communicator c) { return cu::make_engine(s, c); }, 32, 6);
    const auto [cl, cp] = train_two(m, [](const ModelSpec& s, Communicator c) { return cpu::make_engine(s, c); }, 32, 6);
    for (size_t s = 0; s < gl[0].size(); ++s) EXPECT_NEAR(gl[0][s], cl[0][s], kLossTol * cl[0][s]) << norm;
    EXPECT_LE(max_abs_diff(gp[0], cp[0]), kParamTol) << norm;
  }
}
