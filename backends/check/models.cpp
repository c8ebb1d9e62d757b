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
  for (float& v : b.x) v = static_cast<float>(static_cast<double>(rng.next() >> 40) * 0x1.0p-24 * 2.0 - 1.0);
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

std::optional<Model> harness(std::string_view type) {
  const Kv dense3 = {{"units", "3"}};
  if (type == "dense") return Model{{6}, {layer("dense", {{"units", "5"}, {"activation", "relu"}}), layer("dense", dense3)}};
  if (type == "conv2d")  // 'same' stride 1, then 'valid' stride 2
    return Model{{6, 6, 2},
                 {layer("conv2d", {{"filters", "3"}, {"kernel_size", "3"}, {"padding", "same"}}),
                  layer("conv2d", {{"filters", "2"}, {"kernel_size", "2"}, {"strides", "2"}}), layer("flatten"),
                  layer("dense", dense3)}};
  if (type == "batch_normalization")
    return Model{{6}, {layer("dense", {{"units", "5"}}), layer("batch_normalization"), layer("dense", dense3)}};
  if (type == "relu" || type == "softmax")
    return Model{{6}, {layer("dense", {{"units", "5"}}), layer(std::string(type)), layer("dense", dense3)}};
  if (type == "flatten") return Model{{3, 2}, {layer("flatten"), layer("dense", dense3)}};
  if (type == "global_average_pooling2d")
    return Model{{4, 4, 3},
                 {layer("conv2d", {{"filters", "2"}, {"kernel_size", "2"}}), layer("global_average_pooling2d"),
                  layer("dense", dense3)}};
  if (type == "max_pooling2d")
    return Model{{4, 4, 2},
                 {layer("conv2d", {{"filters", "2"}, {"kernel_size", "2"}, {"padding", "same"}}),
                  layer("max_pooling2d", {{"pool_size", "2"}}), layer("flatten"), layer("dense", dense3)}};
  if (type == "dropout")
    return Model{{6}, {layer("dense", {{"units", "5"}}), layer("dropout", {{"rate", "0.5"}}), layer("dense", dense3)}};
  return std::nullopt;
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
