// The cpu engine on model graphs (layers naming their `inputs`): gradients of residual,
// concatenating and fan-out models against central finite differences, the Sequential model's
// bits unchanged when its layers name their inputs, 2 replicas against one, state_dict, the
// graph's errors, and the buffer plan's reuse.
#include "helpers.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

using namespace skyforge::cpu;
using namespace cpu_test;

namespace {

ModelSpec model(std::vector<uint32_t> input_shape, std::vector<LayerSpec> layers, uint64_t seed) {
  ModelSpec m;
  m.input_shape = std::move(input_shape);
  m.layers = std::move(layers);
  m.seed = seed;
  m.threads = 1;
  return m;
}

// A conv stem, then conv -> bn -> relu -> conv added back to the stem (a residual block); the
// stem feeds both the block and the add.
ModelSpec residual(const char* synchronized = "false") {
  return model({6, 6, 2}, {
      layer("conv2d", {{"name", "stem"}, {"filters", "4"}, {"kernel_size", "3"}, {"padding", "same"}}),
      layer("conv2d", {{"filters", "4"}, {"kernel_size", "3"}, {"padding", "same"}, {"use_bias", "false"}}),
      layer("batch_normalization", {{"synchronized", synchronized}}),
      layer("relu"),
      layer("conv2d", {{"name", "c2"}, {"filters", "4"}, {"kernel_size", "3"}, {"padding", "same"}}),
      layer("add", {{"inputs", "stem,c2"}}),
      layer("global_average_pooling2d"),
      layer("dense", {{"units", "3"}}),
  }, 11);
}

// Two branches of the input, reshaped to (2, 3) and (3, 3) and joined along axis 1 (the rows),
// then a dense branch joined on the last axis.
ModelSpec concatenating() {
  return model({12}, {
      layer("dense", {{"name", "a"}, {"units", "6"}, {"activation", "relu"}}),
      layer("reshape", {{"name", "ra"}, {"target_shape", "2,3"}}),
      layer("dense", {{"name", "b"}, {"units", "9"}, {"inputs", "input"}}),
      layer("reshape", {{"name", "rb"}, {"target_shape", "3,-1"}}),
      layer("concatenate", {{"name", "rows"}, {"axis", "1"}, {"inputs", "ra,rb"}}),
      layer("flatten", {{"name", "flat"}}),
      layer("dense", {{"name", "c"}, {"units", "5"}, {"inputs", "input"}}),
      layer("concatenate", {{"inputs", "flat,c"}}),
      layer("dense", {{"units", "4"}}),
  }, 12);
}

// A trunk feeding two heads and, twice, the add that sums them: its gradient sums four layers'.
ModelSpec two_heads() {
  return model({5}, {
      layer("dense", {{"name", "trunk"}, {"units", "6"}, {"activation", "relu"}}),
      layer("dense", {{"name", "h1"}, {"units", "6"}}),
      layer("dense", {{"name", "h2"}, {"units", "6"}, {"inputs", "trunk"}}),
      layer("add", {{"inputs", "h1,h2,trunk,trunk"}}),
      layer("dense", {{"units", "3"}}),
  }, 13);
}

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
  Batch(const ModelSpec& m, uint32_t n, uint32_t classes, uint64_t seed) : y(n) {
    size_t per = 1;
    for (uint32_t d : m.input_shape) per *= d;
    x.resize(n * per);
    skyforge::Rng rng(seed);
    for (auto& v : x) v = 2.f * uniform01(rng) - 1.f;
    for (auto& v : y) v = static_cast<int32_t>(rng.below(classes));
  }
};

std::vector<float> params_of(const CpuEngine& e) {
  std::vector<float> p(e.param_count());
  e.get_params(p.data(), p.size());
  return p;
}

// Every parameter tensor's gradient against central differences of the training-mode loss
// (batch statistics, no update): the tensor's largest entries and a spread of others.
void check_gradients(const ModelSpec& m, uint32_t batch) {
  CpuEngine e(m, skyforge::Communicator());
  const Batch b(m, batch, e.classes(), 5);
  std::vector<float> g;
  e.gradients(b.x.data(), b.y.data(), batch, g);
  const std::vector<float> p0 = params_of(e);
  auto loss_at = [&](size_t i, float h) {
    std::vector<float> p = p0;
    p[i] += h;
    e.set_params(p.data(), p.size());
    std::vector<float> unused;
    return e.gradients(b.x.data(), b.y.data(), batch, unused).loss;
  };
  const float h = 3e-3f;
  size_t offset = 0, checked = 0;
  namespace schema = skyforge::schema;
  std::vector<schema::LayerConfig> configs;
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const auto& all = m.layers[i].options.all();
    configs.push_back(schema::parse(m.layers[i].type, {all.begin(), all.end()}, i));
  }
  const schema::Graph graph = schema::graph(m.input_shape, configs);
  for (size_t layer : graph.order)
    for (uint64_t size : graph.shapes[layer].weights) {
      size_t largest = offset;
      for (size_t i = offset; i < offset + size; ++i)
        if (std::fabs(g[i]) > std::fabs(g[largest])) largest = i;
      for (size_t i : {largest, offset, offset + size / 2, offset + size - 1}) {
        const double fd = (loss_at(i, h) - loss_at(i, -h)) / (2.0 * h);
        EXPECT_NEAR(g[i], fd, 1e-3 + 0.02 * std::fabs(fd))
            << configs[layer].label() << " parameter " << i - offset << " of " << size;
        ++checked;
      }
      offset += size;
    }
  EXPECT_EQ(offset, p0.size());
  EXPECT_GT(checked, 0u);
}

// The message and status of the error building `m` throws.
std::pair<std::string, sf_status> build_error(const ModelSpec& m) {
  try {
    CpuEngine e(m, skyforge::Communicator());
  } catch (const skyforge::Error& err) {
    return {err.what(), err.status()};
  }
  return {"<built>", SF_OK};
}

}  // namespace

TEST(Graph, ResidualBlockGradientsMatchFiniteDifferences) { check_gradients(residual(), 4); }

TEST(Graph, ConcatenateGradientsMatchFiniteDifferences) { check_gradients(concatenating(), 6); }

// The trunk's gradient is the sum of what its consumers send back, a name repeated included.
TEST(Graph, FanOutGradientsAreSummed) { check_gradients(two_heads(), 6); }

// A layer may name one listed after it: the layers run (and their parameters lie) in the graph's
// order, the trunk first here.
TEST(Graph, ALayerListedBeforeItsInputRunsAfterIt) {
  ModelSpec m = two_heads();
  m.layers[0] = layer("dense", {{"name", "h2"}, {"units", "6"}, {"inputs", "trunk"}});
  m.layers[1] = layer("dense", {{"name", "h1"}, {"units", "6"}, {"inputs", "trunk"}});
  m.layers[2] = layer("dense", {{"name", "trunk"}, {"units", "6"}, {"activation", "relu"}, {"inputs", "input"}});
  CpuEngine e(m, skyforge::Communicator());
  EXPECT_EQ(params_of(e), params_of(CpuEngine(two_heads(), skyforge::Communicator())));  // trunk, h2, h1, ...
  check_gradients(m, 6);
}

// A Sequential model whose layers name their inputs explicitly is the same graph: the same bits,
// in training, evaluation and state_dict (the architecture text included).
TEST(Graph, SequentialWithNamedInputsGivesTheSameBits) {
  ModelSpec plain = convnet(3, 2);
  ModelSpec named = plain;
  for (size_t i = 0; i < named.layers.size(); ++i) {
    const std::string name = "l" + std::to_string(i), in = i == 0 ? "input" : "l" + std::to_string(i - 1);
    named.layers[i] = layer(plain.layers[i].type.c_str(), {});
    std::vector<sf_kv> kv;
    for (const auto& [k, v] : plain.layers[i].options.all()) kv.push_back(sf_kv{k.c_str(), v.c_str()});
    kv.push_back(sf_kv{"name", name.c_str()});
    kv.push_back(sf_kv{"inputs", in.c_str()});
    named.layers[i].options = skyforge::Options(kv.data(), kv.size());
  }
  CpuEngine a(plain, skyforge::Communicator()), b(named, skyforge::Communicator());
  const Batch d(plain, 3 * 8, 10, 9);
  for (int s = 0; s < 3; ++s) {
    const StepResult ra = a.train_step(d.x.data() + s * 8 * 784, d.y.data() + s * 8, 8);
    const StepResult rb = b.train_step(d.x.data() + s * 8 * 784, d.y.data() + s * 8, 8);
    EXPECT_EQ(ra.loss, rb.loss);
  }
  EXPECT_EQ(params_of(a), params_of(b));
  EXPECT_EQ(a.eval_step(d.x.data(), d.y.data(), 8).loss, b.eval_step(d.x.data(), d.y.data(), 8).loss);
  EXPECT_EQ(a.state_dict(), b.state_dict());
}

// The sums of a fan-out and the merge layers split their loops over the threads elementwise:
// the thread count changes no bit (batches large enough for the loops to be split).
TEST(Graph, ThreadCountChangesNoBit) {
  for (const ModelSpec& base : {residual(), concatenating()}) {
    std::vector<float> params[2];
    for (uint32_t threads : {1u, 3u}) {
      ModelSpec m = base;
      m.threads = threads;
      CpuEngine e(m, skyforge::Communicator());
      const uint32_t batch = 3000 / (m.input_shape.size() == 1 ? 1 : 10);
      const Batch d(m, batch, e.classes(), 4);
      for (int s = 0; s < 2; ++s) e.train_step(d.x.data(), d.y.data(), batch);
      params[threads == 1 ? 0 : 1] = params_of(e);
    }
    EXPECT_EQ(params[0], params[1]);
  }
}

// Replicas stay bit-identical and match one engine on the global batch (synchronized BatchNorm:
// the statistics of the global batch too).
TEST(Graph, TwoReplicasMatchOneOnTheGlobalBatch) {
  const ModelSpec m = residual("true");
  const Batch d(m, 3 * 8, 3, 21);
  CpuEngine single(m, skyforge::Communicator());
  std::vector<double> losses;
  for (int s = 0; s < 3; ++s) losses.push_back(single.train_step(d.x.data() + s * 8 * 72, d.y.data() + s * 8, 8).loss);
  ThreadGroup g(2);
  std::vector<float> params[2];
  std::vector<double> rl[2];
  g.run([&](uint32_t rank) {
    ModelSpec mine = m;
    mine.seed = m.seed + rank;  // rank 0's weights are broadcast
    EngineOptions eo;
    eo.bucket_bytes = 256;  // several buckets
    CpuEngine e(mine, skyforge::Communicator(g.comm(rank)), eo);
    for (int s = 0; s < 3; ++s) {
      const uint32_t off = rank == 0 ? 0 : 5, n = rank == 0 ? 5 : 3;
      rl[rank].push_back(e.train_step(d.x.data() + (s * 8 + off) * 72, d.y.data() + s * 8 + off, n).loss);
    }
    params[rank] = params_of(e);
  });
  EXPECT_EQ(params[0], params[1]);
  const std::vector<float> ps = params_of(single);
  ASSERT_EQ(ps.size(), params[0].size());
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_NEAR(ps[i], params[0][i], 1e-4) << i;
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(rl[0][s], rl[1][s]);
    EXPECT_NEAR(rl[0][s], losses[s], 1e-4);
  }
}

TEST(Graph, StateDictResumesIdentically) {
  const ModelSpec m = concatenating();
  const Batch d(m, 4 * 6, 4, 3);
  CpuEngine a(m, skyforge::Communicator());
  for (int s = 0; s < 2; ++s) a.train_step(d.x.data() + s * 6 * 12, d.y.data() + s * 6, 6);
  ModelSpec other = m;
  other.seed = 99;
  CpuEngine b(other, skyforge::Communicator());
  b.load_state(a.state_dict());
  EXPECT_EQ(a.state_dict(), b.state_dict());
  for (int s = 2; s < 4; ++s)
    EXPECT_EQ(a.train_step(d.x.data() + s * 6 * 12, d.y.data() + s * 6, 6).loss,
              b.train_step(d.x.data() + s * 6 * 12, d.y.data() + s * 6, 6).loss);
  EXPECT_EQ(params_of(a), params_of(b));
  // Another graph of the same layers is another model.
  ModelSpec rewired = m;
  rewired.layers[7] = layer("concatenate", {{"inputs", "c,flat"}});
  CpuEngine c(rewired, skyforge::Communicator());
  EXPECT_THROW(c.load_state(a.state_dict()), skyforge::Error);
}

TEST(Graph, ErrorsNameTheLayer) {
  auto fails_with = [](const ModelSpec& m, const std::string& needle) {
    const auto [message, status] = build_error(m);
    EXPECT_NE(message.find(needle), std::string::npos) << message;
    EXPECT_EQ(status, SF_ERR_INVALID) << message;
  };
  ModelSpec m = residual();
  m.layers[5] = layer("add", {{"name", "sum"}, {"inputs", "stem,nope"}});
  fails_with(m, "layer 5 (add 'sum'): input 'nope' names no layer");
  m = residual();
  m.layers[5] = layer("add", {{"inputs", "c2"}});
  fails_with(m, "layer 5 (add): takes two or more inputs, 1 named");
  m = residual();
  m.layers[4] = layer("conv2d", {{"name", "c2"}, {"filters", "3"}, {"kernel_size", "3"}});
  fails_with(m, "layer 5 (add): inputs must have one shape");
  m = residual();
  m.layers[1] = layer("conv2d", {{"filters", "4"}, {"kernel_size", "3"}, {"padding", "same"}, {"inputs", "c2"}});
  fails_with(m, "form a cycle");
  m = two_heads();
  m.layers[3] = layer("add", {{"inputs", "h1,trunk"}});
  fails_with(m, "layer 2 (dense 'h2'): its output feeds no layer");
}

// Inference reuses an activation slot once its last reader ran; the backward reuses gradient
// slots once consumed, and sums a fan-out through a scratch slot.
TEST(Graph, PlanReusesBuffersByLiveness) {
  // Sequential: dense x 4 (widths 8, 9, 7, 3): two activation slots ping-pong in inference, two
  // gradient slots in the backward, one slot per output in training.
  std::vector<PlanLayer> seq = {{{GraphPlan::kInput}, 8, true, false},
                                {{0}, 9, true, false},
                                {{1}, 7, true, false},
                                {{2}, 3, true, false}};
  GraphPlan p = plan_graph(seq, {0, 1, 2, 3}, 3);
  EXPECT_EQ(p.infer_slot, (std::vector<size_t>{0, 1, 0, 1}));
  EXPECT_EQ(p.act_width.size(), 4u);
  EXPECT_EQ(p.grad_width.size(), 2u);
  ASSERT_EQ(p.backward.size(), 4u);
  EXPECT_EQ(p.backward[3].dx, (std::vector<size_t>{GraphPlan::kNone}));  // the first layer: no dx

  // a = f(x); b = g(a); c = a + b (an alias of b in between): a's gradient is b's dx, then c's
  // contribution through a scratch slot added into it.
  std::vector<PlanLayer> res = {{{GraphPlan::kInput}, 4, true, false},
                                {{0}, 4, true, false},
                                {{1}, 4, false, true},
                                {{0, 2}, 4, false, false}};
  p = plan_graph(res, {0, 1, 2, 3}, 3);
  EXPECT_EQ(p.value[2], 1u);
  ASSERT_EQ(p.backward.size(), 3u);  // the add, layer 1, layer 0 (the alias has none)
  EXPECT_EQ(p.backward[0].layer, 3u);
  EXPECT_EQ(p.backward[0].sum_into, (std::vector<size_t>{GraphPlan::kNone, GraphPlan::kNone}));
  EXPECT_EQ(p.backward[1].layer, 1u);
  EXPECT_EQ(p.backward[1].sum_into, (std::vector<size_t>{p.backward[0].dx[0]}));
  EXPECT_NE(p.backward[1].dx[0], p.backward[0].dx[0]);
}
