// The cpu engine as a whole: optimizer rules, spec validation, training smoke tests,
// determinism and state_dict, data parallelism over an in-process communicator.
#include "helpers.hpp"
#include "simd.hpp"

#include <skyforge/layer_schema.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

using namespace skyforge::cpu;
using namespace cpu_test;

namespace {

// A learnable synthetic problem: 10 random class prototypes on 28x28x1 plus noise.
struct Synthetic {
  std::vector<float> x;
  std::vector<int32_t> y;
  Synthetic(uint32_t n, uint64_t seed, float noise = 0.5f) : x(n * 784), y(n) {
    skyforge::Rng proto_rng(1234);
    std::vector<float> proto(10 * 784);
    for (auto& v : proto) v = uniform01(proto_rng) < 0.3f ? 1.f : 0.f;
    skyforge::Rng rng(seed);
    for (uint32_t i = 0; i < n; ++i) {
      y[i] = static_cast<int32_t>(rng.below(10));
      for (size_t j = 0; j < 784; ++j) x[i * 784 + j] = proto[y[i] * 784 + j] + noise * (uniform01(rng) - 0.5f);
    }
  }
};

std::vector<float> params_of(const skyforge::Engine& e) {
  std::vector<float> p(e.param_count());
  e.get_params(p.data(), p.size());
  return p;
}

template <class F>
std::string error_of(F&& f, sf_status* status = nullptr) {
  try {
    f();
  } catch (const skyforge::Error& e) {
    if (status) *status = e.status();
    return e.what();
  }
  return "<no error>";
}

}  // namespace

// ---- optimizers --------------------------------------------------------------------------
TEST(Optimizer, SgdPlain) {
  OptimizerConfig c = parse_optimizer("sgd", opts({{"learning_rate", "0.1"}}));
  Optimizer o(c, 2);
  EXPECT_EQ(o.slot_count(), 0u);
  std::vector<float> p = {1.f, -2.f}, g = {2.f, -4.f};  // gradient sums over 4 samples
  o.apply(p.data(), g.data(), 0.25f, 0, Exec{1});
  EXPECT_FLOAT_EQ(p[0], 0.95f);
  EXPECT_FLOAT_EQ(p[1], -1.9f);
}

TEST(Optimizer, SgdMomentum) {
  // v = 0.9 v - 0.1 g; p += v, with g = 0.5: v = -0.05, -0.095, -0.1355; p = 0.95, 0.855, 0.7195
  Optimizer o(parse_optimizer("sgd", opts({{"learning_rate", "0.1"}, {"momentum", "0.9"}})), 1);
  std::vector<float> p = {1.f}, g = {0.5f};
  const float expect[] = {0.95f, 0.855f, 0.7195f};
  for (int t = 0; t < 3; ++t) {
    o.apply(p.data(), g.data(), 1.f, t, Exec{1});
    EXPECT_NEAR(p[0], expect[t], 1e-6) << "step " << t + 1;
  }
  EXPECT_NEAR(o.slots()[0], -0.1355f, 1e-6);
}

TEST(Optimizer, SgdNesterov) {
  // Keras: v = 0.9 v - 0.1 g; p += 0.9 v - 0.1 g: p = 0.905, 0.7695, 0.59755
  Optimizer o(parse_optimizer("sgd", opts({{"learning_rate", "0.1"}, {"momentum", "0.9"}, {"nesterov", "true"}})), 1);
  std::vector<float> p = {1.f}, g = {0.5f};
  const float expect[] = {0.905f, 0.7695f, 0.59755f};
  for (int t = 0; t < 3; ++t) {
    o.apply(p.data(), g.data(), 1.f, t, Exec{1});
    EXPECT_NEAR(p[0], expect[t], 1e-6) << "step " << t + 1;
  }
}

TEST(Optimizer, AdamWithBiasCorrection) {
  Optimizer o(parse_optimizer("adam", opts({{"learning_rate", "0.1"}})), 1);
  EXPECT_EQ(o.slot_count(), 2u);
  std::vector<float> p = {1.f};
  const float grads[] = {0.5f, -1.0f, 2.0f, 0.25f};
  // Hand computation of Keras' rule in double:
  //   alpha_t = lr sqrt(1 - b2^t) / (1 - b1^t); m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2);
  //   p -= alpha_t m / (sqrt(v) + eps)
  // Step 1 (g = 0.5): m = 0.05, v = 0.00025, alpha = 0.1 sqrt(0.001) / 0.1 = 0.0316228,
  //   p = 1 - 0.0316228 * 0.05 / (0.0158114 + 1e-7) = 0.9000006.
  double m = 0, v = 0, ref = 1;
  for (int t = 1; t <= 4; ++t) {
    const double gd = grads[t - 1];
    m += (gd - m) * 0.1;
    v += (gd * gd - v) * 0.001;
    const double alpha = 0.1 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
    ref -= alpha * m / (std::sqrt(v) + 1e-7);
    std::vector<float> g = {grads[t - 1] * 8.f};  // a sum over 8 samples, scaled back
    o.apply(p.data(), g.data(), 0.125f, t - 1, Exec{1});
    if (t == 1) {
      EXPECT_NEAR(p[0], 0.9000006, 2e-6);
    }
    EXPECT_NEAR(p[0], ref, 2e-6) << "step " << t;
  }
}

TEST(Optimizer, OptionErrors) {
  sf_status st = SF_OK;
  EXPECT_NE(error_of([] { parse_optimizer("adagrad", {}); }, &st).find("unknown optimizer 'adagrad'"),
            std::string::npos);
  EXPECT_EQ(st, SF_ERR_INVALID);
  EXPECT_NE(error_of([] { parse_optimizer("adam", opts({{"learning_rate", "fast"}})); }).find("learning_rate"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_optimizer("sgd", opts({{"beta_1", "0.9"}})); }).find("unknown option 'beta_1'"),
            std::string::npos);
  EXPECT_EQ(error_of([] { parse_optimizer("sgd", opts({{"momentum", "1.5"}})); }),
            "optimizer sgd: option 'momentum': expected a number in [0, 1], got '1.5'");
}

// AdamW: Keras' decoupled decay before the Adam step, p -= p * weight_decay * lr (0.9 * 0.1 *
// 0.5 = 0.045 off p = 1), then Adam's first step, alpha * m / (sqrt(v) + eps) = lr * g / |g|.
TEST(Optimizer, AdamWDecaysBeforeTheAdamStep) {
  Optimizer o(parse_optimizer("adamw", opts({{"learning_rate", "0.1"}, {"weight_decay", "0.5"}})), 1);
  EXPECT_EQ(o.slot_count(), 2u);
  std::vector<float> p = {0.9f}, g = {2.f};
  o.apply(p.data(), g.data(), 1.f, 0, Exec{1});
  EXPECT_NEAR(p[0], 0.9 - 0.045 - 0.1, 1e-6);
  EXPECT_EQ(parse_optimizer("adamw", {}).weight_decay, 0.004);  // Keras' default
}

// RMSprop's slots follow the options (mean square, momentum, mean gradient), and one step of
// the plain rule is lr * g / sqrt((1 - rho) g^2 + eps).
TEST(Optimizer, RmspropSlotsAndFirstStep) {
  EXPECT_EQ(Optimizer(parse_optimizer("rmsprop", {}), 3).slot_count(), 3u);
  EXPECT_EQ(Optimizer(parse_optimizer("rmsprop", opts({{"momentum", "0.9"}})), 3).slot_count(), 6u);
  EXPECT_EQ(Optimizer(parse_optimizer("rmsprop", opts({{"momentum", "0.9"}, {"centered", "true"}})), 3).slot_count(), 9u);
  Optimizer o(parse_optimizer("rmsprop", opts({{"learning_rate", "0.1"}})), 1);
  std::vector<float> p = {1.f}, g = {0.5f};
  o.apply(p.data(), g.data(), 1.f, 0, Exec{1});
  EXPECT_NEAR(p[0], 1 - 0.1 * 0.5 / std::sqrt(0.1 * 0.25 + 1e-7), 1e-6);
  EXPECT_EQ(error_of([] { parse_optimizer("rmsprop", opts({{"rho", "1.5"}})); }),
            "optimizer rmsprop: option 'rho': expected a number in [0, 1], got '1.5'");
}

// Keras' range for Adam's betas is [0, 1): beta_1 = 1 is refused with the optimizer schema's
// message, the same as every backend's (tests/cuda_backend, tests/backend_check).
TEST(Optimizer, BetaOneIsRefusedWithTheSchemasMessage) {
  sf_status st = SF_OK;
  EXPECT_EQ(error_of([] { parse_optimizer("adam", opts({{"beta_1", "1"}})); }, &st),
            "optimizer adam: option 'beta_1': expected a number in [0, 1), got '1'");
  EXPECT_EQ(st, SF_ERR_INVALID);
  const OptimizerConfig sgd = parse_optimizer("sgd", {});
  EXPECT_EQ(sgd.learning_rate, 0.01);  // Keras' SGD default
}

// ---- validation ----------------------------------------------------------------------------
TEST(Validation, ClearErrorsNameTheLayer) {
  auto fails_with = [](ModelSpec m, const std::string& needle) {
    sf_status st = SF_OK;
    const std::string msg = error_of([&] { CpuEngine e(m, skyforge::Communicator()); }, &st);
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
    EXPECT_EQ(st, SF_ERR_INVALID) << msg;
  };
  ModelSpec m = mlp();
  m.layers[1].type = "dens";
  fails_with(m, "layer 1 (dens): unknown layer type 'dens'");

  m = mlp();
  m.layers.insert(m.layers.begin() + 1, layer("conv2d", {{"filters", "4"}, {"kernel_size", "3"}}));
  fails_with(m, "layer 1 (conv2d): expects an input of rank 3 (height, width, channels)");

  m = mlp();
  m.layers[1] = layer("dense", {{"units", "abc"}});
  fails_with(m, "layer 1 (dense): option 'units': expected an integer between 1 and 2147483647, got 'abc'");

  m = mlp();
  m.layers[1] = layer("dense", {{"unit", "12"}});
  fails_with(m, "layer 1 (dense): option 'units' is required");

  m = mlp();
  m.layers[1] = layer("dense", {{"units", "12"}, {"activaton", "relu"}});
  fails_with(m, "layer 1 (dense): unknown option 'activaton'");

  m = mlp();
  m.layers[2] = layer("dense", {{"units", "10"}, {"activation", "swish"}});
  fails_with(m, "layer 2 (dense): option 'activation': expected one of");

  m = convnet();
  m.layers[3] = layer("conv2d", {{"filters", "4"}, {"kernel_size", "40"}});
  fails_with(m, "layer 3 (conv2d): window 40 is larger than the input's height 28");

  m = convnet();
  m.layers[0] = layer("conv2d", {{"filters", "4"}, {"kernel_size", "3"}, {"padding", "full"}});
  fails_with(m, "layer 0 (conv2d): option 'padding'");

  m = convnet();
  m.layers[11] = layer("dropout", {{"rate", "1"}});
  fails_with(m, "layer 11 (dropout): option 'rate'");

  m = convnet();
  m.layers.erase(m.layers.begin() + 9);  // no GAP: the output stays an image
  m.layers.resize(9);
  fails_with(m, "must be (classes,)");

  m = mlp();
  m.optimizer = "adagrad";
  fails_with(m, "unknown optimizer 'adagrad'");

  m = mlp();
  m.loss = "mse";
  fails_with(m, "unknown loss 'mse'");

  m = mlp();
  m.layers.clear();
  fails_with(m, "no layers");
}

TEST(Validation, StepArguments) {
  CpuEngine e(mlp(1, 1), skyforge::Communicator());
  std::vector<float> x(784 * 2, 0.f);
  std::vector<int32_t> y = {3, 10};
  sf_status st = SF_OK;
  EXPECT_NE(error_of([&] { e.train_step(x.data(), y.data(), 2); }, &st).find("label 10 of sample 1"),
            std::string::npos);
  EXPECT_EQ(st, SF_ERR_INVALID);
  EXPECT_NE(error_of([&] { e.train_step(x.data(), y.data(), 0); }).find("batch must be > 0"), std::string::npos);
  std::vector<float> p(3);
  EXPECT_NE(error_of([&] { e.set_params(p.data(), 3); }).find("param_count"), std::string::npos);
}

// ---- shapes, parameters, initialisation ----------------------------------------------------
TEST(Engine, ParamCountsAndKerasInit) {
  CpuEngine e(mlp(1, 1), skyforge::Communicator());
  EXPECT_EQ(e.param_count(), 784u * 128 + 128 + 128 * 10 + 10);
  auto p = params_of(e);
  const float limit = std::sqrt(6.f / (784 + 128));
  float mx = 0;
  for (size_t i = 0; i < 784 * 128; ++i) mx = std::max(mx, std::fabs(p[i]));
  EXPECT_LE(mx, limit);
  EXPECT_GT(mx, 0.95f * limit);
  for (size_t i = 784 * 128; i < 784 * 128 + 128; ++i) EXPECT_EQ(p[i], 0.f);

  CpuEngine c(convnet(1, 1), skyforge::Communicator());
  // conv 3*3*1*12 | bn beta 12 | conv 6*6*12*24 | beta 24 | conv 6*6*24*32 + 32 | beta 32 |
  // dense 32*256 + 256 | dense 256*10 + 10
  EXPECT_EQ(c.param_count(),
            108u + 12 + 10368 + 24 + 27648 + 32 + 32 + 8192 + 256 + 2560 + 10);
  EXPECT_EQ(c.layer(3).out_shape, (Shape{12, 12, 24}));
  EXPECT_EQ(c.layer(6).out_shape, (Shape{6, 6, 32}));
  EXPECT_EQ(c.classes(), 10u);
}

// Adding a layer to the schema (skyforge/layer_schema.hpp) without kernels here must fail this
// test: every layer type the schema lists builds, with the parameter count its shape rule gives.
TEST(Engine, EveryLayerOfTheSchemaIsBuiltWithTheSchemasParameterCount) {
  namespace schema = skyforge::schema;
  for (const schema::LayerDef& def : schema::catalogue()) {
    std::vector<std::pair<std::string, std::string>> given;
    for (const schema::OptionDef& o : def.options)
      if (o.required())
        given.emplace_back(o.name, o.kind == schema::OptionKind::real   ? "0.5"
                                   : o.kind == schema::OptionKind::dims ? "-1"
                                                                        : "2");
    std::vector<sf_kv> kv;
    for (const auto& [k, v] : given) kv.push_back(sf_kv{k.c_str(), v.c_str()});
    const skyforge::LayerSpec spec{std::string(def.type), skyforge::Options(kv.data(), kv.size())};
    std::unique_ptr<Layer> layer;
    // (height, width, channels), or (steps, features) for the layers of sequences.
    const bool sequence = def.type == "global_average_pooling1d" || def.type == "multi_head_attention" ||
                          def.type == "position_embedding";
    const Shape in = sequence ? Shape{2, 3} : Shape{8, 8, 3};  // sequence_length 2 covers 2 steps
    const std::vector<Shape> inputs(def.takes_many() ? 2 : 1, in);  // a merge layer: two of them
    ASSERT_NO_THROW(layer = make_layer(spec, inputs, 0, 1, 0)) << def.type;
    const schema::LayerShape shape = schema::parse(def.type, given, 0).infer_inputs(inputs);
    EXPECT_EQ(layer->param_size(), shape.trainable) << def.type;
    EXPECT_EQ(layer->out_shape, shape.output) << def.type;
  }
}

// ---- training ------------------------------------------------------------------------------
TEST(Training, MlpLearnsSyntheticProblem) {
  ModelSpec m = mlp(3);
  CpuEngine e(m, skyforge::Communicator());
  Synthetic train(512, 1), test(256, 2);
  const uint32_t B = 64;
  double first = 0, last = 0;
  for (int epoch = 0; epoch < 3; ++epoch)
    for (uint32_t i = 0; i < 512; i += B) {
      auto r = e.train_step(train.x.data() + i * 784, train.y.data() + i, B);
      EXPECT_EQ(r.samples, B);
      if (epoch == 0 && i == 0) first = r.loss;
      last = r.loss;
    }
  EXPECT_LT(last, 0.25 * first) << "first " << first << " last " << last;
  auto ev = e.eval_step(test.x.data(), test.y.data(), 256);
  EXPECT_GT(ev.correct, 230u);
  EXPECT_EQ(e.step(), 24u);

  // Rough step time at batch 64 (printed, not asserted).
  const int reps = 50;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) e.train_step(train.x.data() + (i % 8) * B * 784, train.y.data() + (i % 8) * B, B);
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  std::printf("[ timing ] mlp train_step batch 64: %.0f us (%d threads)\n", us, e.threads());
}

TEST(Training, SgdMomentumMlpLearns) {
  ModelSpec m = mlp(4, 1);
  m.optimizer = "sgd";
  m.optimizer_options = opts({{"learning_rate", "0.05"}, {"momentum", "0.9"}});
  CpuEngine e(m, skyforge::Communicator());
  Synthetic train(256, 3);
  double first = 0, last = 0;
  for (int epoch = 0; epoch < 4; ++epoch)
    for (uint32_t i = 0; i < 256; i += 32) {
      auto r = e.train_step(train.x.data() + i * 784, train.y.data() + i, 32);
      if (epoch == 0 && i == 0) first = r.loss;
      last = r.loss;
    }
  EXPECT_LT(last, 0.5 * first);
}

TEST(Training, KerasGuideConvnetBuildsAndSteps) {
  ModelSpec m = convnet(5);
  CpuEngine e(m, skyforge::Communicator());
  Synthetic data(16, 4);
  const auto before = params_of(e);
  double first = 0, last = 0;
  for (int s = 0; s < 4; ++s) {
    auto r = e.train_step(data.x.data(), data.y.data(), 16);
    ASSERT_TRUE(std::isfinite(r.loss));
    EXPECT_EQ(r.samples, 16u);
    if (s == 0) first = r.loss;
    last = r.loss;
  }
  EXPECT_LT(last, first);
  EXPECT_NE(params_of(e), before);
  auto ev = e.eval_step(data.x.data(), data.y.data(), 16);
  EXPECT_TRUE(std::isfinite(ev.loss));
  std::vector<float> logits(8 * 10);
  e.predict(data.x.data(), 8, logits.data());
  for (float v : logits) EXPECT_TRUE(std::isfinite(v));
  // A different (smaller, then larger) batch reuses / grows the preallocated buffers.
  e.train_step(data.x.data(), data.y.data(), 3);
  Synthetic big(40, 5);
  EXPECT_EQ(e.train_step(big.x.data(), big.y.data(), 40).samples, 40u);
}

TEST(Training, EvalIsDeterministicAndLeavesStateAlone) {
  CpuEngine e(convnet(6, 1), skyforge::Communicator());
  Synthetic d(8, 6);
  e.train_step(d.x.data(), d.y.data(), 8);
  const std::string s = e.state_dict();
  auto a = e.eval_step(d.x.data(), d.y.data(), 8);
  auto b = e.eval_step(d.x.data(), d.y.data(), 8);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(e.state_dict(), s);
}

// ---- determinism and state -----------------------------------------------------------------
TEST(Determinism, SameSeedSameParamsBitForBit) {
  Synthetic d(24, 7);
  CpuEngine a(convnet(42, 2), skyforge::Communicator()), b(convnet(42, 2), skyforge::Communicator());
  EXPECT_EQ(params_of(a), params_of(b));
  for (int s = 0; s < 3; ++s) {
    const auto ra = a.train_step(d.x.data() + s * 8 * 784, d.y.data() + s * 8, 8);
    const auto rb = b.train_step(d.x.data() + s * 8 * 784, d.y.data() + s * 8, 8);
    EXPECT_EQ(ra.loss, rb.loss);
  }
  const auto pa = params_of(a), pb = params_of(b);
  ASSERT_EQ(pa.size(), pb.size());
  EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)));
  EXPECT_EQ(a.state_dict(), b.state_dict());

  CpuEngine c(convnet(43, 2), skyforge::Communicator());
  CpuEngine fresh(convnet(42, 2), skyforge::Communicator());
  EXPECT_NE(params_of(c), params_of(fresh));
}

TEST(Determinism, ThreadCountDoesNotChangeResults) {
  // Every kernel's split follows the data's shape, never the thread count (cpu_ops.hpp): the
  // same bits on 1, 2 and 3 threads, for the kernel table this process runs (CTest runs this
  // test once per table: the CPU's best, avx2 and the portable OpenBLAS path).
  Synthetic d(128, 8);
  ModelSpec conv = convnet(9, 1);
  conv.layers[11] = layer("dropout", {{"rate", "0.5"}});
  for (ModelSpec m : {mlp(9, 1), conv}) {
    SCOPED_TRACE(std::to_string(m.layers.size()) + " layers");
    std::vector<std::vector<float>> params;
    for (uint32_t threads : {1u, 2u, 3u}) {
      m.threads = threads;
      CpuEngine e(m, skyforge::Communicator());
      for (int s = 0; s < 2; ++s) e.train_step(d.x.data() + s * 64 * 784, d.y.data() + s * 64, 64);
      params.push_back(params_of(e));
    }
    for (size_t t = 1; t < params.size(); ++t) {
      ASSERT_EQ(params[0].size(), params[t].size());
      EXPECT_EQ(0, std::memcmp(params[0].data(), params[t].data(), params[0].size() * sizeof(float)))
          << "1 thread vs " << t + 1;
    }
  }
}

TEST(Determinism, StateDictResumesIdentically) {
  Synthetic d(32, 10);
  for (const char* opt : {"adam", "sgd"}) {
    ModelSpec m = convnet(11, 2);
    m.optimizer = opt;
    if (std::string(opt) == "sgd") m.optimizer_options = opts({{"momentum", "0.9"}, {"nesterov", "true"}});
    CpuEngine a(m, skyforge::Communicator());
    a.train_step(d.x.data(), d.y.data(), 8);
    a.train_step(d.x.data() + 8 * 784, d.y.data() + 8, 8);
    const std::string saved = a.state_dict();

    ModelSpec m2 = m;
    m2.seed = 999;  // different initial weights: all of them come from the state
    CpuEngine b(m2, skyforge::Communicator());
    b.load_state(saved);
    EXPECT_EQ(b.step(), 2u);
    EXPECT_EQ(b.state_dict(), saved);
    for (int s = 2; s < 4; ++s) {
      const auto ra = a.train_step(d.x.data() + s * 8 * 784, d.y.data() + s * 8, 8);
      const auto rb = b.train_step(d.x.data() + s * 8 * 784, d.y.data() + s * 8, 8);
      EXPECT_EQ(ra.loss, rb.loss) << opt;
    }
    EXPECT_EQ(params_of(a), params_of(b)) << opt;
    EXPECT_EQ(a.state_dict(), b.state_dict()) << opt;
  }
}

// Checkpoints in the cpu backend's own version-1 format (before the backend-neutral engine state,
// and before dropout masks came from the seed: a 32-byte generator per dropout layer, no seed)
// still load: the generator is read and dropped, the engine keeps its own seed. Written here by
// hand, field by field, as that format has it (backends/cpu/engine.cpp).
TEST(Determinism, VersionOneStatesStillLoad) {
  ModelSpec m;
  m.input_shape = {6};
  m.layers = {layer("dense", {{"units", "8"}}), layer("batch_normalization"), layer("dropout", {{"rate", "0.5"}}),
              layer("dense", {{"units", "4"}})};
  m.seed = 3;
  CpuEngine a(m, skyforge::Communicator());
  std::vector<float> params(a.param_count());
  a.get_params(params.data(), params.size());
  for (float& p : params) p += 0.25f;  // not the initial weights: they must come from the state
  std::string v1("SFCPUENG", 8);
  auto put = [&](const void* p, size_t n) { v1.append(static_cast<const char*>(p), n); };
  auto u32 = [&](uint32_t v) { put(&v, 4); };
  auto u64 = [&](uint64_t v) { put(&v, 8); };
  auto floats = [&](const std::vector<float>& v) {
    u64(v.size());
    put(v.data(), v.size() * sizeof(float));
  };
  u32(1);
  u32(0);
  u64(a.v1_architecture().size());
  put(a.v1_architecture().data(), a.v1_architecture().size());
  u64(5);                                                   // step
  floats(params);
  floats(std::vector<float>(2 * params.size(), 0.f));       // adam m, v
  u32(4);                                                   // layers
  floats(std::vector<float>(8, 0.5f));                      // moving mean
  floats(std::vector<float>(8, 2.f));                       // moving variance
  v1.append(32, '\x5a');                                    // the dropout generator
  CpuEngine b(m, skyforge::Communicator());
  b.load_state(v1);
  EXPECT_EQ(b.step(), 5u);
  EXPECT_EQ(params_of(b), params);
  // Written again it is the backend-neutral state, which another engine reads back to the same bytes.
  EXPECT_TRUE(skyforge::is_engine_state(b.state_dict()));
  CpuEngine c(m, skyforge::Communicator());
  c.load_state(b.state_dict());
  EXPECT_EQ(c.state_dict(), b.state_dict());
  EXPECT_NE(error_of([&] { b.load_state(v1.substr(0, v1.size() - 1)); }).find("dropout generator (version 1)"),
            std::string::npos);
  EXPECT_EQ(params_of(b), params);  // a refused load changed nothing
}

TEST(Determinism, LoadStateRejectsBadInput) {
  CpuEngine e(convnet(1, 1), skyforge::Communicator());
  const std::string good = e.state_dict();
  const std::string before = good;
  sf_status st = SF_OK;
  EXPECT_NE(error_of([&] { e.load_state("garbage!garbage!"); }, &st).find("bad magic"), std::string::npos);
  EXPECT_EQ(st, SF_ERR_INVALID);
  EXPECT_NE(error_of([&] { e.load_state(std::string_view(good).substr(0, good.size() - 5)); }).find("truncated"),
            std::string::npos);
  EXPECT_NE(error_of([&] { e.load_state(good + "xx"); }).find("trailing"), std::string::npos);
  std::string v3 = good;
  v3[8] = 3;
  EXPECT_NE(error_of([&] { e.load_state(v3); }).find("version 3 is not supported"), std::string::npos);
  CpuEngine other(mlp(1, 1), skyforge::Communicator());
  EXPECT_NE(error_of([&] { other.load_state(good); }).find("different model"), std::string::npos);
  ModelSpec sgd = convnet(1, 1);
  sgd.optimizer = "sgd";
  CpuEngine o2(sgd, skyforge::Communicator());
  EXPECT_NE(error_of([&] { o2.load_state(good); }).find("saved adam, this engine sgd"), std::string::npos);
  EXPECT_EQ(e.state_dict(), before);  // failed loads changed nothing
}

// ---- data parallelism ----------------------------------------------------------------------
// Two replicas with unequal local batches (5 + 3) against one engine on the global batch of 8:
// same loss/accuracy, parameters equal to float tolerance, and the replicas bit-identical to
// each other even though their seeds differ (rank 0's weights are broadcast).
TEST(DataParallel, MatchesSingleReplicaOnGlobalBatch) {
  Synthetic d(8 * 4, 12);
  ModelSpec m = mlp(21, 1);
  m.layers[1] = layer("dense", {{"units", "32"}, {"activation", "relu"}});
  CpuEngine single(m, skyforge::Communicator());
  std::vector<StepResult> single_r;
  for (int s = 0; s < 4; ++s) single_r.push_back(single.train_step(d.x.data() + s * 8 * 784, d.y.data() + s * 8, 8));

  ThreadGroup g(2);
  std::vector<float> params[2];
  std::vector<StepResult> results[2];
  g.run([&](uint32_t rank) {
    ModelSpec mine = m;
    mine.seed = m.seed + rank * 1000;
    EngineOptions eo;
    eo.bucket_bytes = 1 << 10;  // one bucket per dense layer (1.3 KiB and 100 KiB of gradients)
    CpuEngine e(mine, skyforge::Communicator(g.comm(rank)), eo);
    for (int s = 0; s < 4; ++s) {
      const uint32_t off = rank == 0 ? 0 : 5, n = rank == 0 ? 5 : 3;
      results[rank].push_back(e.train_step(d.x.data() + (s * 8 + off) * 784, d.y.data() + s * 8 + off, n));
    }
    params[rank] = params_of(e);
  });
  ASSERT_EQ(params[0].size(), params[1].size());
  EXPECT_EQ(0, std::memcmp(params[0].data(), params[1].data(), params[0].size() * sizeof(float)));
  const auto ps = params_of(single);
  double worst = 0;
  for (size_t i = 0; i < ps.size(); ++i) worst = std::max(worst, double{std::fabs(ps[i] - params[0][i])});
  EXPECT_LT(worst, 1e-5);
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(results[0][s].samples, 8u);
    EXPECT_EQ(results[1][s].samples, 8u);
    EXPECT_EQ(results[0][s].loss, results[1][s].loss);
    EXPECT_NEAR(results[0][s].loss, single_r[s].loss, 1e-5);
    EXPECT_EQ(results[0][s].correct, single_r[s].correct);
  }
  // 1 stats + 2 or more gradient buckets per step.
  EXPECT_GE(g.allreduce_calls(0), 4u * 3);
}

TEST(DataParallel, ConvnetReplicasStayIdentical) {
  // BN statistics are per replica; trainable weights still stay bit-identical.
  Synthetic d(12, 13);
  ThreadGroup g(2);
  std::vector<float> params[2];
  StepResult ev[2];
  g.run([&](uint32_t rank) {
    CpuEngine e(convnet(rank + 1, 1), skyforge::Communicator(g.comm(rank)));
    for (int s = 0; s < 2; ++s) e.train_step(d.x.data() + rank * 6 * 784, d.y.data() + rank * 6, 6);
    ev[rank] = e.eval_step(d.x.data() + rank * 6 * 784, d.y.data() + rank * 6, 6);
    params[rank] = params_of(e);
  });
  EXPECT_EQ(params[0], params[1]);
  EXPECT_EQ(ev[0].samples, 12u);
  EXPECT_EQ(ev[0].loss, ev[1].loss);
}

// ---- hand-written SIMD kernels and fusion --------------------------------------------------
namespace {

// Trains `m` for `steps` steps with the kernel table `isa` (simd::set_isa is process-wide, so it
// is set before every call) and returns the parameters.
std::vector<float> trained_with(simd::Isa isa, const ModelSpec& m, const Synthetic& d, int steps,
                                EngineOptions eo = {}) {
  simd::set_isa(isa);
  CpuEngine e(m, skyforge::Communicator(), eo);
  for (int s = 0; s < steps; ++s) e.train_step(d.x.data() + s * 16 * 784, d.y.data() + s * 16, 16);
  auto p = params_of(e);
  simd::set_isa(simd::supported());
  return p;
}

// The largest difference between two trainings' updates (params - start), relative to the
// largest update: the summation orders differ (fma chains vs OpenBLAS' blocking), the
// mathematics does not.
double update_mismatch(const std::vector<float>& start, const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), start.size());
  EXPECT_EQ(b.size(), start.size());
  double worst = 0, largest = 0;
  for (size_t i = 0; i < start.size() && i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(double{a[i]} - b[i]));
    largest = std::max(largest, std::fabs(double{b[i]} - start[i]));
  }
  EXPECT_GT(largest, 0.0) << "training moved nothing";
  return worst / largest;
}

}  // namespace

TEST(Simd, KernelsTrainLikeThePortablePath) {
  if (simd::supported() == simd::Isa::none) GTEST_SKIP() << "this CPU has no AVX2+FMA: only the OpenBLAS path exists";
  std::printf("kernel table: %s\n", simd::isa_name(simd::supported()));
  Synthetic d(16 * 3, 31);
  for (ModelSpec m : {mlp(5, 1), convnet(5, 1), convnet(6, 2)}) {
    // SGD: an update is linear in the gradient (Adam would magnify rounding in the near-zero
    // gradients into whole learning-rate steps).
    m.optimizer = "sgd";
    m.optimizer_options = opts({{"learning_rate", "0.05"}, {"momentum", "0.9"}});
    const auto start = trained_with(simd::supported(), m, d, 0);
    const auto simd_p = trained_with(simd::supported(), m, d, 3);
    const auto blas_p = trained_with(simd::Isa::none, m, d, 3);
    const double mismatch = update_mismatch(start, simd_p, blas_p);
    std::printf("%zu layers, %u thread(s): updates differ by %.2g of the largest\n", m.layers.size(), m.threads,
                mismatch);
    EXPECT_LT(mismatch, 1e-5);
    EXPECT_EQ(simd_p, trained_with(simd::supported(), m, d, 3)) << "the SIMD path is deterministic";
  }
  // Adam's kernel performs the portable loop's operations in its order: bit-identical.
  skyforge::cpu::Optimizer o(parse_optimizer("adam", opts({{"learning_rate", "0.01"}})), 1000);
  skyforge::cpu::Optimizer o2(parse_optimizer("adam", opts({{"learning_rate", "0.01"}})), 1000);
  std::vector<float> p(1000), g(1000);
  skyforge::Rng rng(3);
  for (size_t i = 0; i < p.size(); ++i) p[i] = uniform01(rng) - 0.5f, g[i] = (uniform01(rng) - 0.5f) * 1e-3f;
  std::vector<float> p2 = p;
  for (uint64_t it = 0; it < 3; ++it) {
    simd::set_isa(simd::supported());
    o.apply(p.data(), g.data(), 0.5f, it, Exec{1});
    simd::set_isa(simd::Isa::none);
    o2.apply(p2.data(), g.data(), 0.5f, it, Exec{1});
  }
  simd::set_isa(simd::supported());
  EXPECT_EQ(0, std::memcmp(p.data(), p2.data(), p.size() * sizeof(float)));
}

TEST(Simd, IsaSwitchCapsAtWhatTheCpuHas) {
  EXPECT_EQ(simd::set_isa(simd::Isa::none), simd::Isa::none);
  EXPECT_EQ(simd::kernels(), nullptr);
  const simd::Isa best = simd::supported();
  EXPECT_EQ(simd::set_isa(simd::Isa::avx512), best);
  EXPECT_EQ(simd::kernels() == nullptr, best == simd::Isa::none);
  if (best != simd::Isa::none) {
    EXPECT_STREQ(simd::kernels()->name, simd::isa_name(best));
  }
}

TEST(Fusion, FusedAndViewLayersGiveTheSameBits) {
  // The engine fuses batch_normalization + relu and passes flatten's input on as a view;
  // unfused, every layer runs apart with its own buffer.
  Synthetic d(16 * 2, 32);
  EngineOptions unfused;
  unfused.fuse = false;
  ModelSpec with_flatten = convnet(8, 1);
  with_flatten.layers[9] = layer("flatten");  // conv ... bn, relu (fused), flatten (view), dense
  for (const ModelSpec& m : {convnet(8, 1), mlp(8, 1), with_flatten})
    for (simd::Isa isa : {simd::Isa::none, simd::supported()}) {
      const auto fused_p = trained_with(isa, m, d, 2);
      const auto plain_p = trained_with(isa, m, d, 2, unfused);
      ASSERT_EQ(fused_p.size(), plain_p.size());
      EXPECT_EQ(0, std::memcmp(fused_p.data(), plain_p.data(), fused_p.size() * sizeof(float)))
          << simd::isa_name(isa) << ", " << m.layers.size() << " layers";
    }
}

#if defined(__x86_64__)
#include <omp.h>
#include <xmmintrin.h>

TEST(Denormals, FlushIsOnlyForTheEngineCall) {
  // The engine flushes denormals on its threads during a call; afterwards neither the caller
  // nor any OpenMP worker (libgomp retires and recreates them between teams of other sizes)
  // may keep FTZ/DAZ.
  const unsigned before = _mm_getcsr();
  ASSERT_EQ(before & 0x8040u, 0u) << "the test process itself runs flushed";
  Synthetic d(16, 40);
  CpuEngine e(convnet(3, 4), skyforge::Communicator());
  for (int s = 0; s < 2; ++s) e.train_step(d.x.data(), d.y.data(), s == 0 ? 16 : 3);  // batch 3: teams of 3
  EXPECT_EQ(_mm_getcsr() & ~0x3Fu, before & ~0x3Fu);  // control bits; 0-5 are sticky exception flags
  for (int team : {4, 2, 6}) {
    std::vector<unsigned> csr(static_cast<size_t>(team), 0);
#pragma omp parallel num_threads(team)
    csr[static_cast<size_t>(omp_get_thread_num())] = _mm_getcsr();
    for (int t = 0; t < team; ++t) EXPECT_EQ(csr[t] & 0x8040u, 0u) << "thread " << t << " of a team of " << team;
  }
}
#endif
