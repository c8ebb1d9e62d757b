// The cuda engine's host build on the transformer layers (layer_normalization,
// multi_head_attention with dropout on its weights, embedding, position_embedding): each model
// against the cpu backend in lockstep, two ranks bit-identical, state round trips, captured steps
// replaying the eager ones, and an embedding index outside the table refused as the input's error.
#include "common.hpp"
#include "engine.hpp"

#include <cmath>
#include <string>

using namespace cuda_test;
using skyforge::Communicator;
namespace cu = skyforge::cuda;
namespace cpu = skyforge::cpu;

namespace {

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

// A batch for m: tokens' inputs are indices in [0, kVocab) (repeats within a batch included).
Batch batch_for(const ModelSpec& m, uint64_t seed, uint32_t batch) {
  Batch b = make_batch(seed, batch, features(m));
  if (m.layers[0].type == "embedding")
    for (float& v : b.x) v = std::floor(v * kVocab);
  return b;
}

// The cpu backend in lockstep (common.hpp) on m's own kind of batches.
void expect_lockstep_on(const ModelSpec& m, uint32_t batch) {
  expect_lockstep(m, batch, [&](uint64_t seed, uint32_t n) { return batch_for(m, seed, n); });
}

}  // namespace

TEST(CudaTransformer, BlockWithAttentionDropoutFollowsTheCpuEngine) { expect_lockstep_on(block(51), 6); }

TEST(CudaTransformer, BlockWithoutBiasesOrDropoutFollowsTheCpuEngine) {
  expect_lockstep_on(block(52, "0", "false"), 4);
}

TEST(CudaTransformer, EmbeddingsFollowTheCpuEngine) { expect_lockstep_on(tokens(53), 7); }

// Data parallel: both replicas hold the same bits after every step (each its own dropout masks).
TEST(CudaTransformer, TwoRanksStayBitIdentical) {
  for (const ModelSpec& m : {block(54), tokens(55)})
    expect_two_ranks_bit_identical(m, [&](uint64_t seed, uint32_t n) { return batch_for(m, seed, n); });
}

// A checkpoint moves between the engines, and training on from it is training on from the
// saved state (the dropout masks follow the step).
TEST(CudaTransformer, StateRoundTripsAndMovesBetweenTheEngines) {
  for (const ModelSpec& m : {block(56), tokens(57)}) expect_state_moves_between_engines(m, batch_for(m, 400, 6));
}

// Bound-data steps captured once and replayed are the eager steps bit for bit: the attention's
// dropout reads its step on the device, the embedding's check counts there.
TEST(CudaTransformer, CapturedStepsReplayTheEagerOnes) {
  for (const ModelSpec& m : {block(58), tokens(59)}) expect_replays_equal_eager_steps(m, batch_for(m, 500, 24));
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

// A step that meets an invalid index is refused before any update, as on the cpu engine: on 1
// rank and on 2 (the last rank holding the index), for every optimizer and with clipping, every
// rank's whole state (weights, optimizer slots, a synchronized BatchNorm's moving statistics,
// step) stays the bits it was, after a plain step and after deferred steps (an invalid one
// refuses the valid one after it until take_results reports them); then the engine trains on as
// if the refused steps had never run.
TEST(CudaTransformer, RefusedStepsLeaveEveryRanksStateAsItWas) {
  const std::vector<std::pair<const char*, Options>> optimizers = {
      {"adam", opts({{"clipnorm", "0.5"}})},
      {"adamw", opts({{"weight_decay", "0.1"}})},
      {"sgd", opts({{"learning_rate", "0.05"}, {"momentum", "0.9"}, {"nesterov", "true"}, {"global_clipnorm", "1"}})},
      {"sgd", opts({{"learning_rate", "0.05"}})},
      {"rmsprop", opts({{"momentum", "0.5"}, {"centered", "true"}})}};
  for (const auto& [optimizer, options] : optimizers)
    for (uint32_t ranks : {1u, 2u}) {
      SCOPED_TRACE(std::string(optimizer) + " on " + std::to_string(ranks) + " rank(s)");
      ModelSpec m = tokens(62);
      m.layers.insert(m.layers.end() - 1, layer("batch_normalization", {{"synchronized", "true"}}));
      m.optimizer = optimizer;
      m.optimizer_options = options;
      std::vector<std::string> trained[2];  // by refusing: each rank's state at the end
      for (bool refusing : {false, true}) {
        trained[refusing].resize(ranks);
        ThreadGroup group(ranks);
        group.run([&](uint32_t rank) {
          auto e = cu::make_engine(m, Communicator(group.comm(rank)));
          const Batch b = batch_for(m, 710 + rank, 3);
          e->train_step(b.x.data(), b.y.data(), 3);
          if (refusing) {
            const std::string before = e->state_dict();
            Batch bad = b;
            if (rank == ranks - 1) bad.x[kSeq + 4] = 99.f;  // sample 1
            EXPECT_EQ(status_of([&] { e->train_step(bad.x.data(), bad.y.data(), 3); }).first, SF_ERR_INVALID);
            EXPECT_TRUE(e->state_dict() == before) << "a plain step changed rank " << rank << "'s state";
            const uint64_t d = e->bind_data(bad.x.data(), bad.y.data(), 3);
            const std::vector<uint64_t> invalid{1, 0}, valid{0, 2};
            e->train_step_indexed(d, invalid.data(), 2, true);
            e->train_step_indexed(d, valid.data(), 2, true);
            EXPECT_EQ(status_of([&] { e->take_results(); }).first, SF_ERR_INVALID);
            EXPECT_TRUE(e->state_dict() == before) << "deferred steps changed rank " << rank << "'s state";
          }
          e->train_step(b.x.data(), b.y.data(), 3);
          const uint64_t d = e->bind_data(b.x.data(), b.y.data(), 3);
          const std::vector<uint64_t> all{2, 0, 1};
          e->train_step_indexed(d, all.data(), 3, true);
          EXPECT_EQ(status_of([&] { e->take_results(); }).first, SF_OK);
          trained[refusing][rank] = e->state_dict();
        });
      }
      EXPECT_TRUE(trained[true] == trained[false]) << "the refused steps changed how the engine trains on";
    }
}
