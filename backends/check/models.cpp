#include "models.hpp"

#include <skyforge/data.hpp>

#include <cstddef>

namespace skyforge::backend_check {

keras::Layer layer(std::string type, Kv options) { return keras::Layer{std::move(type), std::move(options), {}}; }

Model with_sgd(Model m, const char* learning_rate) {
  m.optimizer = "sgd";
  m.optimizer_options = {{"learning_rate", learning_rate}, {"momentum", "0"}};
  return m;
}

Model optimizer_model(const std::string& name) {
  Model m = mlp();
  m.optimizer = name;
  m.optimizer_options = {{"learning_rate", "0.01"}};
  if (name == "sgd") m.optimizer_options.insert(m.optimizer_options.end(), {{"momentum", "0.9"}, {"nesterov", "true"}});
  if (name == "rmsprop") m.optimizer_options.insert(m.optimizer_options.end(), {{"momentum", "0.5"}, {"centered", "true"}});
  if (name == "adamw") m.optimizer_options.push_back({"weight_decay", "0.1"});
  return m;
}

Batch batch_of(const Model& m, uint32_t n, uint64_t seed) {
  size_t per = 1;
  for (uint32_t d : m.input) per *= d;
  Batch b;
  b.n = n;
  b.x.resize(per * n);
  Rng rng(seed);
  for (float& v : b.x) {
    const uint64_t bits = rng.next() >> 40;  // 24 random bits
    v = m.indices ? static_cast<float>((bits * m.indices) >> 24) : static_cast<float>(double(bits) * 0x1.0p-24 * 2.0 - 1.0);
  }
  for (uint32_t i = 0; i < n; ++i) b.y.push_back(static_cast<int32_t>((i + seed) % m.classes));
  return b;
}
Batch slice(const Batch& b, uint32_t from, uint32_t n) {
  const size_t per = b.x.size() / b.n;
  Batch s;
  s.n = n;
  s.x.assign(b.x.begin() + static_cast<std::ptrdiff_t>(from * per), b.x.begin() + static_cast<std::ptrdiff_t>((from + n) * per));
  s.y.assign(b.y.begin() + from, b.y.begin() + from + n);
  return s;
}

namespace {

// A layer fed by other layers (graph.md: `inputs` names them, "input" the model's input).
keras::Layer node(std::string type, std::string name, std::string inputs, Kv options = {}) {
  options.emplace_back("name", std::move(name));
  if (!inputs.empty()) options.emplace_back("inputs", std::move(inputs));
  return layer(std::move(type), std::move(options));
}
Harness plain(Model m, std::string variant = "") { return Harness{std::move(variant), std::move(m), std::nullopt, true}; }
// `m` as its dropout-free harness, and with option `key` of layer `at` at 0.5.
Harness with_dropout(Model m, size_t at, const char* key, std::string variant = "") {
  Model on = m;
  on.layers[at].options.emplace_back(key, "0.5");
  m.layers[at].options.emplace_back(key, "0");
  return Harness{std::move(variant), std::move(m), std::move(on), true};
}

const Kv dense3 = {{"units", "3"}};
const Kv dense5 = {{"units", "5"}};

}  // namespace

std::vector<Harness> harnesses(std::string_view type) {
  const std::string t(type);
  if (type == "dense")
    return {plain(Model{{6}, {layer("dense", {{"units", "5"}, {"activation", "relu"}}), layer("dense", dense3)}}),
            plain(Model{{6},
                        {layer("dense", {{"units", "5"}, {"activation", "gelu"}}),
                         layer("dense", {{"units", "4"}, {"activation", "tanh"}}),
                         layer("dense", {{"units", "4"}, {"activation", "sigmoid"}}), layer("dense", dense3)}},
                  "gelu, tanh, sigmoid"),
            plain(Model{{3, 4}, {layer("dense", {{"units", "5"}, {"activation", "relu"}}), layer("flatten"), layer("dense", dense3)}},
                  "rank-3 input")};
  if (type == "conv2d")  // 'same' stride 1, then 'valid' stride 2
    return {plain(Model{{6, 6, 2},
                        {layer("conv2d", {{"filters", "3"}, {"kernel_size", "3"}, {"padding", "same"}}),
                         layer("conv2d", {{"filters", "2"}, {"kernel_size", "2"}, {"strides", "2"}}), layer("flatten"),
                         layer("dense", dense3)}}),
            plain(Model{{5, 5, 2},
                        {layer("conv2d", {{"filters", "3"}, {"kernel_size", "2"}, {"activation", "gelu"}}),
                         layer("conv2d", {{"filters", "2"}, {"kernel_size", "2"}, {"activation", "tanh"}}),
                         layer("conv2d", {{"filters", "2"}, {"kernel_size", "2"}, {"strides", "2"}, {"activation", "sigmoid"}}),
                         layer("flatten"), layer("dense", dense3)}},
                  "gelu, tanh, sigmoid")};
  if (type == "batch_normalization") {
    Harness h = plain(Model{{6}, {layer("dense", dense5), layer("batch_normalization"), layer("dense", dense3)}});
    h.ranks_follow = false;  // per-replica statistics: the 'synchronized batch_normalization' check
    return {h};
  }
  if (type == "relu" || type == "softmax" || type == "tanh" || type == "sigmoid")
    return {plain(Model{{6}, {layer("dense", dense5), layer(t), layer("dense", dense3)}})};
  if (type == "gelu")  // erf, then the tanh approximation
    return {plain(Model{{6},
                        {layer("dense", dense5), layer("gelu"), layer("dense", dense5),
                         layer("gelu", {{"approximate", "true"}}), layer("dense", dense3)}})};
  if (type == "flatten") return {plain(Model{{3, 2}, {layer("flatten"), layer("dense", dense3)}})};
  if (type == "global_average_pooling2d")
    return {plain(Model{{4, 4, 3},
                        {layer("conv2d", {{"filters", "2"}, {"kernel_size", "2"}}), layer("global_average_pooling2d"),
                         layer("dense", dense3)}})};
  if (type == "max_pooling2d")
    return {plain(Model{{4, 4, 2},
                        {layer("conv2d", {{"filters", "2"}, {"kernel_size", "2"}, {"padding", "same"}}),
                         layer("max_pooling2d", {{"pool_size", "2"}}), layer("flatten"), layer("dense", dense3)}})};
  if (type == "average_pooling2d") {  // 5x5: 'valid' drops the last row and column, 'same' windows overhang
    auto pooled = [](Kv pool) {
      return Model{{5, 5, 2},
                   {layer("conv2d", {{"filters", "2"}, {"kernel_size", "2"}, {"padding", "same"}}),
                    layer("average_pooling2d", std::move(pool)), layer("flatten"), layer("dense", dense3)}};
    };
    return {plain(pooled({{"pool_size", "2"}})),
            plain(pooled({{"pool_size", "3"}, {"strides", "2"}, {"padding", "same"}}), "same padding")};
  }
  if (type == "dropout") return {with_dropout(Model{{6}, {layer("dense", dense5), layer("dropout"), layer("dense", dense3)}}, 1, "rate")};
  if (type == "global_average_pooling1d")
    return {plain(Model{{4, 3}, {layer("dense", dense5), layer("global_average_pooling1d"), layer("dense", dense3)}})};
  if (type == "reshape")  // patches of a strided conv2d as a sequence, as a vision transformer makes them
    return {plain(Model{{4, 4, 2},
                        {layer("conv2d", {{"filters", "3"}, {"kernel_size", "2"}, {"strides", "2"}}),
                         layer("reshape", {{"target_shape", "-1,3"}}), layer("dense", {{"units", "4"}}), layer("flatten"),
                         layer("dense", dense3)}})};
  if (type == "layer_normalization")
    return {plain(Model{{6}, {layer("dense", dense5), layer("layer_normalization"), layer("dense", dense3)}}),
            plain(Model{{3, 4}, {layer("layer_normalization", {{"scale", "false"}}), layer("flatten"), layer("dense", dense3)}},
                  "rank-3 input, scale = false")};
  if (type == "multi_head_attention") {
    auto attention = [](Kv options) {
      return Model{{3, 4},
                   {layer("dense", {{"units", "4"}}), layer("multi_head_attention", std::move(options)),
                    layer("global_average_pooling1d"), layer("dense", dense3)}};
    };
    return {with_dropout(attention({{"num_heads", "2"}, {"key_dim", "2"}, {"value_dim", "3"}}), 1, "dropout"),
            plain(attention({{"num_heads", "1"}, {"key_dim", "3"}, {"use_bias", "false"}}), "use_bias = false")};
  }
  if (type == "embedding") {
    Model m{{5}, {layer("embedding", {{"input_dim", "7"}, {"output_dim", "3"}}), layer("flatten"), layer("dense", dense3)}};
    m.indices = 7;
    return {plain(m)};
  }
  if (type == "position_embedding")  // sequence_length 6 on 4 steps: rows 4 and 5 unused
    return {plain(Model{{4, 3},
                        {node("dense", "x", "", {{"units", "4"}}), node("position_embedding", "p", "x", {{"sequence_length", "6"}}),
                         node("add", "sum", "x,p"), layer("flatten"), layer("dense", dense3)}})};
  if (type == "add")  // a feeds b, c and the sum; the model's input feeds f and the sum
    return {plain(Model{{6},
                        {node("dense", "a", "", dense5), node("dense", "b", "a", {{"units", "5"}, {"activation", "relu"}}),
                         node("dense", "c", "a", dense5), node("add", "sum", "a,b,c"), layer("dense", dense3)}}),
            plain(Model{{6}, {node("dense", "f", "", {{"units", "6"}}), node("add", "sum", "input,f"), layer("dense", dense3)}},
                  "the model's input as an operand")};
  if (type == "concatenate")
    return {plain(Model{{6},
                        {node("dense", "a", "", {{"units", "4"}}), node("dense", "b", "a", {{"units", "3"}, {"activation", "relu"}}),
                         node("concatenate", "ab", "a,b"), layer("dense", dense3)}}),
            plain(Model{{3, 4},
                        {node("dense", "a", "", {{"units", "2"}}), node("dense", "b", "a", {{"units", "2"}, {"activation", "relu"}}),
                         node("concatenate", "ab", "b,a", {{"axis", "1"}}), layer("flatten"), layer("dense", dense3)}},
                  "axis 1 of rank-3 inputs")};
  return {};
}

// The residual block's activations are gelu where a ResNet's are relu: a step of h across relu's
// kink moves finite differences by more than their tolerance (the relu harness has it alone).
std::vector<Harness> graph_blocks() {
  const Kv conv = {{"filters", "3"}, {"kernel_size", "3"}, {"padding", "same"}};
  Kv conv_nobias = conv;
  conv_nobias.emplace_back("use_bias", "false");
  const Kv sync = {{"synchronized", "true"}};
  Harness residual = plain(Model{{4, 4, 2},
                                 {node("conv2d", "stem", "", conv), node("conv2d", "c1", "", conv_nobias),
                                  node("batch_normalization", "bn1", "", sync), node("gelu", "r1", ""),
                                  node("conv2d", "c2", "", conv_nobias), node("batch_normalization", "bn2", "", sync),
                                  node("add", "sum", "stem,bn2"), node("gelu", "out", ""),
                                  layer("global_average_pooling2d"), layer("dense", dense3)}},
                           "residual block");
  Harness transformer =
      plain(Model{{4, 4, 2},
                  {node("conv2d", "patches", "", {{"filters", "4"}, {"kernel_size", "2"}, {"strides", "2"}}),
                   node("reshape", "tokens", "", {{"target_shape", "4,4"}}),
                   node("position_embedding", "pos", "", {{"sequence_length", "4"}}), node("add", "x0", "tokens,pos"),
                   node("layer_normalization", "ln1", ""),
                   node("multi_head_attention", "mha", "", {{"num_heads", "2"}, {"key_dim", "2"}}),
                   node("add", "x1", "x0,mha"), node("layer_normalization", "ln2", ""),
                   node("dense", "mlp1", "", {{"units", "8"}, {"activation", "gelu"}}), node("dense", "mlp2", "", {{"units", "4"}}),
                   node("add", "x2", "x1,mlp2"), layer("global_average_pooling1d"), layer("dense", dense3)}},
            "transformer block");
  return {residual, transformer};
}

Model mlp() {
  return Model{{8}, {layer("dense", {{"units", "16"}, {"activation", "relu"}}), layer("dense", {{"units", "4"}})}, 4};
}

Model convnet() {
  return Model{{8, 8, 1},
               {layer("conv2d", {{"filters", "4"}, {"kernel_size", "3"}, {"padding", "same"}, {"use_bias", "false"}}),
                layer("batch_normalization", {{"scale", "false"}}), layer("relu"),
                layer("conv2d", {{"filters", "6"}, {"kernel_size", "3"}, {"strides", "2"}}), layer("relu"),
                layer("max_pooling2d", {{"pool_size", "2"}, {"padding", "same"}}), layer("global_average_pooling2d"),
                layer("dense", {{"units", "8"}, {"activation", "relu"}}), layer("dense", {{"units", "4"}})},
               4};
}

Model synchronized_batchnorm_model() {
  const Kv sync = {{"synchronized", "true"}};
  return Model{{4, 4, 2},
               {layer("conv2d", {{"filters", "3"}, {"kernel_size", "3"}, {"padding", "same"}, {"use_bias", "false"}}),
                layer("batch_normalization", sync), layer("relu"), layer("flatten"), layer("dense", {{"units", "5"}}),
                layer("batch_normalization", sync), layer("dense", {{"units", "3"}})}};
}

}  // namespace skyforge::backend_check
