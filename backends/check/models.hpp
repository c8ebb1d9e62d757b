// The suite's models and data: small models around each layer type of the schema (harnesses) and
// around the model graph's blocks, the MLP and convnet that the whole-model checks train, and
// deterministic batches for them.
#pragma once

#include <skyforge/keras.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace skyforge::backend_check {

using Vec = std::vector<float>;
using Kv = std::vector<std::pair<std::string, std::string>>;

keras::Layer layer(std::string type, Kv options = {});

struct Model {
  std::vector<uint32_t> input;
  std::vector<keras::Layer> layers;
  uint32_t classes = 3;  // units of the last dense layer
  uint32_t indices = 0;  // > 0: the inputs are integer indices in [0, indices) (embedding)
  std::string optimizer = "adam";
  Kv optimizer_options = {{"learning_rate", "0.01"}};
};

// The model with plain SGD (no momentum) at this learning rate.
Model with_sgd(Model m, const char* learning_rate);
// The MLP with optimizer `name` and options that use every slot it keeps (sgd: Nesterov
// momentum; rmsprop: momentum and centered; adamw: a weight decay).
Model optimizer_model(const std::string& name);

// Deterministic samples: x uniform in [-1, 1) (or indices, uniform in [0, m.indices)), labels
// cycling through the classes.
struct Batch {
  Vec x;
  std::vector<int32_t> y;
  uint32_t n = 0;
};
Batch batch_of(const Model& m, uint32_t n, uint64_t seed);
// Samples [from, from + n) of b.
Batch slice(const Batch& b, uint32_t from, uint32_t n);

// A small model around a layer type of the schema (or a block of layers), its gradient flowing
// through the layer, and what the suite holds it to (checks.hpp, harness()).
struct Harness {
  std::string variant;              // what tells it from the type's other harnesses; "" for the first
  Model model;                      // dropout off
  std::optional<Model> dropout_on;  // the same parameters with dropout on, for a layer that has dropout
  // 2 ranks on halves of a batch follow 1 rank on all of it: false where the loss mixes samples
  // in a way replicas do not share (per-replica batch statistics).
  bool ranks_follow = true;
};
// The harnesses of a layer type; none for a layer type the suite does not know.
std::vector<Harness> harnesses(std::string_view type);
// Blocks of the model graph as the examples build them: a residual block (with synchronized
// batch_normalization) and a transformer block (patches, position embedding, attention, MLP).
std::vector<Harness> graph_blocks();

Model mlp();
// The convnet example's layers, small (no dropout: see agreement()).
Model convnet();
// conv2d, a synchronized batch_normalization (+ relu), dense, another one, dense.
Model synchronized_batchnorm_model();

}  // namespace skyforge::backend_check
