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


}  // namespace

TEST(CudaGraph, ResidualModelFollowsTheCpuEngine) { expect_lockstep(residual(41), 6); }

TEST(CudaGraph, BranchesJoinedByConcatenateFollowTheCpuEngine) { expect_lockstep(branches(42), 7); }

// The loss's gradient reaches the layer under an output that is a view or a fused relu: a conv
// whose windows cover the image, flattened into the logits; a batch_normalization + relu last.
TEST(CudaGraph, AnOutputThatIsAViewOrAFusedReluTrains) {
  ModelSpec view;
  view.input_shape = {6, 6, 2};
  view.layers = {layer("conv2d", {{"filters", "10"}, {"kernel_size", "6"}}), layer("flatten")};
  view.seed = 43;
  expect_lockstep(view, 5);
  ModelSpec fused;
  fused.input_shape = {12};
  fused.layers = {layer("dense", {{"units", "10"}}), layer("batch_normalization"), layer("relu")};
  fused.seed = 44;
  expect_lockstep(fused, 5);
}

// Data parallel on a graph: both replicas hold the same bits after every step.
TEST(CudaGraph, TwoRanksStayBitIdentical) {
  expect_two_ranks_bit_identical(residual(43));
}

// A graph model's checkpoint loads in the cpu engine and back: the same state, the same logits.
TEST(CudaGraph, StateMovesBetweenTheEngines) {
  const ModelSpec m = residual(44);
  expect_state_moves_between_engines(m, make_batch(400, 6, features(m)));
}

// A graph model's bound-data steps captured once and replayed are the eager steps bit for bit
// (the backward plan and its slots are fixed when the engine is built).
TEST(CudaGraph, CapturedStepsReplayTheEagerOnes) {
  for (const ModelSpec& m : {residual(45), branches(46)})
    expect_replays_equal_eager_steps(m, make_batch(500, 24, features(m)));
}
