// The cuda engine's host build on the transformer layers (layer_normalization,
// multi_head_attention with dropout on its weights, embedding, position_embedding): each model
// against the cpu backend in lockstep, two ranks bit-identical, state round trips, captured steps
// replaying the eager ones, and an embedding index outside the table refused as the input's error.
#include "common.hpp"
#include "engine.hpp"

#include <cmath>
#include <functional>
#include <string>

using namespace cuda_test;
using skyforge::Communicator;
using skyforge::Error;
namespace cu = skyforge::cuda;
namespace cpu = skyforge::cpu;

namespace {

constexpr double kLossTol = 1e-5, kParamTol = 1e-5;  // test_engine.cpp's, docs/compute-backends.md
constexpr uint32_t kVocab = 11, kSeq = 6;

// A pre-norm transformer block on (5, 6) samples: layer_normalization, self-attention (2 heads,
// key_dim 3, value_dim 4, dropout on the weights), a residual add, a second layer_normalization
// without scale, pooled to a dense.
ModelSpec block(uint64_t seed, const char* dropout = "0.3", const char* use_bias = "true") {
  ModelSpec m;
  m.input_shape = {5, 6};
  m.layers = {layer("layer_normalization", {{"name", "ln1"}, {"inputs", "input"}}),
              layer("multi_head_attention", {{"num_heads", "2"}, {"key_dim", "3"}, {"value_dim", "4"},
                                             {"dropout", dropout}, {"use_bias", use_bias}, {"name", "att"}}),
              layer("add", {{"inputs", "input,att"}}),
              layer("layer_normalization", {{"scale", "false"}, {"epsilon", "0.01"}}),
              layer("global_average_pooling1d"),
              layer("dense", {{"units", "10"}})};
  m.seed = seed;
  return m;
}

// Token indices through an embedding, plus a learned position embedding (sequence_length 8 for
// sequences of 6: its last rows get no gradient), normalized, attended, pooled.
ModelSpec tokens(uint64_t seed) {
  ModelSpec m;
  m.input_shape = {kSeq};
  m.layers = {layer("embedding", {{"input_dim", "11"}, {"output_dim", "4"}, {"name", "tok"}}),
              layer("position_embedding", {{"sequence_length", "8"}, {"name", "pos"}}),
              layer("add", {{"inputs", "tok,pos"}}),
              layer("layer_normalization"),
              layer("multi_head_attention", {{"num_heads", "2"}, {"key_dim", "2"}, {"dropout", "0.1"}}),
              layer("global_average_pooling1d"),
              layer("dense", {{"units", "10"}})};
  m.seed = seed;
  return m;
}

size_t features(const ModelSpec& m) {
  size_t n = 1;
  for (uint32_t d : m.input_shape) n *= d;
  return n;
}

// A batch for m: tokens' inputs are indices in [0, kVocab) (repeats within a batch included).
Batch batch_for(const ModelSpec& m, uint64_t seed, uint32_t batch) {
  Batch b = make_batch(seed, batch, features(m));
  if (m.layers[0].type == "embedding")
    for (float& v : b.x) v = std::floor(v * kVocab);
  return b;
}

std::pair<sf_status, std::string> status_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.status(), e.what()};
  }
  return {SF_OK, ""};
}

// Steps on the same batches, the cuda engine taking the cpu backend's whole state before each:
// each step's forward, backward (dropout masks included) and update compared.
void expect_lockstep(const ModelSpec& m, uint32_t batch) {
  auto c = cpu::make_engine(m, Communicator{});
  auto g = cu::make_engine(m, Communicator{});
  const std::vector<float> initial = params_of(*g);
  ASSERT_EQ(params_of(*c), initial) << "initial weights differ";
  for (int s = 0; s < 6; ++s) {
    const Batch b = batch_for(m, 200 + s, batch);
    const auto rc = c->train_step(b.x.data(), b.y.data(), batch);
    const auto rg = g->train_step(b.x.data(), b.y.data(), batch);
    EXPECT_NEAR(rg.loss, rc.loss, kLossTol * std::max(1.0, std::fabs(rc.loss))) << "step " << s;
    EXPECT_LE(max_abs_diff(params_of(*c), params_of(*g)), kParamTol) << "step " << s;
    g->load_state(c->state_dict());
  }
  EXPECT_GT(max_abs_diff(initial, params_of(*g)), 1e-3) << "training did not move the parameters";
}

}  // namespace

TEST(CudaTransformer, BlockWithAttentionDropoutFollowsTheCpuEngine) { expect_lockstep(block(51), 6); }

TEST(CudaTransformer, BlockWithoutBiasesOrDropoutFollowsTheCpuEngine) { expect_lockstep(block(52, "0", "false"), 4); }

TEST(CudaTransformer, EmbeddingsFollowTheCpuEngine) { expect_lockstep(tokens(53), 7); }

// Data parallel: both replicas hold the same bits after every step (each its own dropout masks).
TEST(CudaTransformer, TwoRanksStayBitIdentical) {
  for (const ModelSpec& m : {block(54), tokens(55)}) {
    std::vector<std::vector<float>> params(2);
    ThreadGroup group(2);
    group.run([&](uint32_t rank) {
      auto e = cu::make_engine(m, Communicator(group.comm(rank)));
      for (int s = 0; s < 4; ++s) {
        const Batch b = batch_for(m, 300 + 10 * s + rank, 5);
        e->train_step(b.x.data(), b.y.data(), 5);
      }
      params[rank] = params_of(*e);
    });
    EXPECT_EQ(params[0], params[1]);
  }
}

// A checkpoint loads in the cpu engine and back: the same state, the same logits; training on
// from a loaded state is training on from the saved one (the dropout masks follow the step).
TEST(CudaTransformer, StateRoundTripsAndMovesBetweenTheEngines) {
  for (const ModelSpec& m : {block(56), tokens(57)}) {
    auto g = cu::make_engine(m, Communicator{});
    const Batch b = batch_for(m, 400, 6);
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
    g->train_step(b.x.data(), b.y.data(), 6);
    back->train_step(b.x.data(), b.y.data(), 6);
    EXPECT_EQ(params_of(*back), params_of(*g));
  }
}

// Bound-data steps captured once and replayed are the eager steps bit for bit: the attention's
// dropout reads its step on the device, the embedding's check counts there.
TEST(CudaTransformer, CapturedStepsReplayTheEagerOnes) {
  for (const ModelSpec& m : {block(58), tokens(59)}) {
    const Batch all = batch_for(m, 500, 24);
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
      EXPECT_EQ(dynamic_cast<const cu::CudaEngine&>(*e).graph_stats().replayed, graphs ? 4u : 0u);
    }
    EXPECT_EQ(params[0], params[1]);
  }
}

// An index outside [0, input_dim), or not an integer, is the input's error: found on the device,
// reported when the step's results are read (plain steps, predict, deferred bound-data steps).
TEST(CudaTransformer, InvalidEmbeddingIndicesAreInvalidInput) {
  const ModelSpec m = tokens(60);
  auto e = cu::make_engine(m, Communicator{});
  Batch b = batch_for(m, 600, 4);
  b.x[7] = static_cast<float>(kVocab);
  b.x[9] = 2.5f;
  auto [status, msg] = status_of([&] { e->train_step(b.x.data(), b.y.data(), 4); });
  EXPECT_EQ(status, SF_ERR_INVALID);
  EXPECT_NE(msg.find("2 input value(s) of layer 0 (embedding)"), std::string::npos) << msg;
  std::vector<float> logits(40);
  EXPECT_EQ(status_of([&] { e->predict(b.x.data(), 4, logits.data()); }).first, SF_ERR_INVALID);
  b.x[7] = 3.f, b.x[9] = 2.f;
  EXPECT_EQ(status_of([&] { e->train_step(b.x.data(), b.y.data(), 4); }).first, SF_OK);  // the count starts afresh

  b.x[0] = -1.f;
  const uint64_t d = e->bind_data(b.x.data(), b.y.data(), 4);
  const std::vector<uint64_t> good{1, 2, 3}, bad{0, 1};
  e->train_step_indexed(d, good.data(), 3, true);
  EXPECT_EQ(status_of([&] { e->take_results(); }).first, SF_OK);
  e->train_step_indexed(d, bad.data(), 2, true);
  EXPECT_EQ(status_of([&] { e->take_results(); }).first, SF_ERR_INVALID);
}

// Two ranks see one rank's invalid index alike (the count travels in the step's allreduced sums).
TEST(CudaTransformer, OneRanksInvalidIndexFailsEveryRank) {
  const ModelSpec m = tokens(61);
  std::vector<sf_status> status(2);
  ThreadGroup group(2);
  group.run([&](uint32_t rank) {
    auto e = cu::make_engine(m, Communicator(group.comm(rank)));
    Batch b = batch_for(m, 700 + rank, 3);
    if (rank == 1) b.x[4] = 99.f;
    status[rank] = status_of([&] { e->train_step(b.x.data(), b.y.data(), 3); }).first;
  });
  EXPECT_EQ(status[0], SF_ERR_INVALID);
  EXPECT_EQ(status[1], SF_ERR_INVALID);
}
