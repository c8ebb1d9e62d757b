// The cuda engine's host build on model graphs (schema::graph: named layers, `inputs`, fan-out)
// and the layers of residual nets: each model against the cpu backend in lockstep, two ranks
// bit-identical, checkpoints moving between the engines, a captured step replaying the eager one.
#include "common.hpp"
#include "engine.hpp"

#include <cmath>
#include <string>

using namespace cuda_test;
using skyforge::Communicator;
namespace cu = skyforge::cuda;
namespace cpu = skyforge::cpu;

namespace {

constexpr double kLossTol = 1e-5, kParamTol = 1e-5;  // test_engine.cpp's, docs/compute-backends.md

size_t features(const ModelSpec& m) {
  size_t n = 1;
  for (uint32_t d : m.input_shape) n *= d;
  return n;
}

// A residual block whose skip path fans out from a relu fused into its batch_normalization (BN
// has one consumer, the relu feeds two), added back, pooled by average_pooling2d ('same', edge
// windows counted as Keras does), then global average pooled to a dense.
ModelSpec residual(uint64_t seed) {
  ModelSpec m;
  m.input_shape = {6, 6, 2};
  m.layers = {layer("conv2d", {{"filters", "4"}, {"kernel_size", "3"}, {"padding", "same"}, {"name", "stem"}}),
              layer("batch_normalization", {{"name", "bn"}}),
              layer("relu", {{"name", "a"}}),
              layer("conv2d", {{"filters", "4"}, {"kernel_size", "3"}, {"padding", "same"}, {"activation", "gelu"}}),
              layer("conv2d", {{"filters", "4"}, {"kernel_size", "1"}, {"name", "b"}}),
              layer("add", {{"inputs", "a,b"}, {"name", "sum"}}),
              layer("average_pooling2d", {{"pool_size", "3"}, {"strides", "2"}, {"padding", "same"}}),
              layer("tanh"),
              layer("global_average_pooling2d"),
              layer("dense", {{"units", "10"}})};
  m.seed = seed;
  return m;
}

// Two branches of one input joined by concatenate on the feature axis, one of them through a
// reshape to (steps, features) and global_average_pooling1d; the input itself feeds both.
ModelSpec branches(uint64_t seed) {
  ModelSpec m;
  m.input_shape = {4, 6};
  m.layers = {layer("dense", {{"units", "8"}, {"activation", "sigmoid"}, {"inputs", "input"}, {"name", "d1"}}),
              layer("reshape", {{"target_shape", "8,4"}, {"name", "r"}}),
              layer("global_average_pooling1d", {{"name", "p1"}}),
              layer("dense", {{"units", "5"}, {"activation", "tanh"}, {"inputs", "input"}, {"name", "d2"}}),
              layer("gelu", {{"approximate", "true"}}),
              layer("flatten", {{"name", "f2"}}),
              layer("concatenate", {{"inputs", "p1,f2"}}),
              layer("dense", {{"units", "10"}, {"activation", "gelu"}}),
              layer("sigmoid"),
              layer("dense", {{"units", "10"}})};
  m.seed = seed;
  return m;
}

// kSteps steps on the same batches, the cuda engine taking the cpu backend's whole state
// before each (test_engine.cpp's lockstep): each step's forward, backward and update compared.
void expect_lockstep(const ModelSpec& m, uint32_t batch) {
  auto c = cpu::make_engine(m, Communicator{});
  auto g = cu::make_engine(m, Communicator{});
  const std::vector<float> initial = params_of(*g);
  ASSERT_EQ(params_of(*c), initial) << "initial weights differ";
  for (int s = 0; s < 8; ++s) {
    const Batch b = make_batch(200 + s, batch, features(m));
    const auto rc = c->train_step(b.x.data(), b.y.data(), batch);
    const auto rg = g->train_step(b.x.data(), b.y.data(), batch);
    EXPECT_NEAR(rg.loss, rc.loss, kLossTol * std::max(1.0, std::fabs(rc.loss))) << "step " << s;
    EXPECT_LE(max_abs_diff(params_of(*c), params_of(*g)), kParamTol) << "step " << s;
    g->load_state(c->state_dict());
  }
  EXPECT_GT(max_abs_diff(initial, params_of(*g)), 1e-3) << "training did not move the parameters";
}

}  // namespace

TEST(CudaGraph, ResidualModelFollowsTheCpuEngine) { expect_lockstep(residual(41), 6); }

TEST(CudaGraph, BranchesJoinedByConcatenateFollowTheCpuEngine) { expect_lockstep(branches(42), 7); }

// Data parallel on a graph: both replicas hold the same bits after every step.
TEST(CudaGraph, TwoRanksStayBitIdentical) {
  const ModelSpec m = residual(43);
  std::vector<std::vector<float>> params(2);
  ThreadGroup group(2);
  group.run([&](uint32_t rank) {
    auto e = cu::make_engine(m, Communicator(group.comm(rank)));
    for (int s = 0; s < 4; ++s) {
      const Batch b = make_batch(300 + 10 * s + rank, 5, features(m));
      e->train_step(b.x.data(), b.y.data(), 5);
    }
    params[rank] = params_of(*e);
  });
  EXPECT_EQ(params[0], params[1]);
}

// A graph model's checkpoint loads in the cpu engine and back: the same state, the same logits.
TEST(CudaGraph, StateMovesBetweenTheEngines) {
  const ModelSpec m = residual(44);
  auto g = cu::make_engine(m, Communicator{});
  const Batch b = make_batch(400, 6, features(m));
  for (int s = 0; s < 3; ++s) g->train_step(b.x.data(), b.y.data(), 6);
  auto c = cpu::make_engine(m, Communicator{});
  c->load_state(g->state_dict());
  EXPECT_EQ(params_of(*c), params_of(*g));
  auto back = cu::make_engine(m, Communicator{});
  back->load_state(c->state_dict());
  EXPECT_EQ(back->state_dict(), g->state_dict());
  std::vector<float> lc(60), lg(60);
  c->predict(b.x.data(), 6, lc.data());
  back->predict(b.x.data(), 6, lg.data());
  for (size_t i = 0; i < lc.size(); ++i) EXPECT_NEAR(lg[i], lc[i], 1e-5) << i;
}

// A graph model's bound-data steps captured once and replayed are the eager steps bit for bit
// (the backward plan and its slots are fixed when the engine is built).
TEST(CudaGraph, CapturedStepsReplayTheEagerOnes) {
  for (const ModelSpec& m : {residual(45), branches(46)}) {
    const Batch all = make_batch(500, 24, features(m));
    std::vector<std::vector<float>> params;
    for (bool graphs : {false, true}) {
      cu::EngineOptions o;
      o.graphs = graphs;
      auto e = cu::make_engine(m, Communicator{}, skyforge::Host{}, o);
      const uint64_t d = e->bind_data(all.x.data(), all.y.data(), 24);
      for (uint64_t s = 0; s < 5; ++s) {
        std::vector<uint64_t> idx(6);
        for (uint64_t i = 0; i < 6; ++i) idx[i] = (s * 5 + i * 7) % 24;
        e->train_step_indexed(d, idx.data(), 6, false);
      }
      params.push_back(params_of(*e));
      const cu::GraphStats st = dynamic_cast<const cu::CudaEngine&>(*e).graph_stats();
      EXPECT_EQ(st.replayed, graphs ? 4u : 0u);
    }
    EXPECT_EQ(params[0], params[1]);
  }
}
