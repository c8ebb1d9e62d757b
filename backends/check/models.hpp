// The suite's models and data: a small model around each layer type of the schema (harness), the
// MLP and convnet that the whole-model checks train, and deterministic batches for them.
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
  std::string optimizer = "adam";
  Kv optimizer_options = {{"learning_rate", "0.01"}};
};

// The model with plain SGD (no momentum) at this learning rate.
Model with_sgd(Model m, const char* learning_rate);
// The MLP with optimizer `name` and options that use every slot it keeps (sgd: Nesterov
// momentum; rmsprop: momentum and centered; adamw: a weight decay).
Model optimizer_model(const std::string& name);

// Deterministic samples: x uniform in [-1, 1), labels cycling through the classes.
struct Batch {
  Vec x;
  std::vector<int32_t> y;
  uint32_t n = 0;
};
Batch batch_of(const Model& m, uint32_t n, uint64_t seed);
// Samples [from, from + n) of b.
Batch slice(const Batch& b, uint32_t from, uint32_t n);

// A small model around each layer type of the schema, its gradient flowing through the layer.
// None for a layer type the suite does not know.
std::optional<Model> harness(std::string_view type);

Model mlp();
// The convnet example's layers, small (no dropout: see agreement()).
Model convnet();
// conv2d, a synchronized batch_normalization (+ relu), dense, another one, dense.
Model synchronized_batchnorm_model();

}  // namespace skyforge::backend_check
