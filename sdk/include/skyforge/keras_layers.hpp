// skyforge/keras_layers.hpp — the Keras-style API's layers: what a layer is, the builders named
// after Keras' layers, and calling a layer on a tensor (Keras' functional API; keras.hpp's
// Model(inputs, outputs) turns the calls into a model).
//
//   auto inputs = K::Input({28, 28, 1});
//   auto x = K::Conv2D(16, 3, {.padding = "same", .name = "stem"})(inputs);
//   auto y = K::ReLU()(K::BatchNormalization()(K::Conv2D(16, 3, {.padding = "same"})(x)));
//   auto z = K::Add()({x, y});
//
// Required arguments are positional, the optional ones Keras' keyword arguments in a struct
// (C++20 designated initializers, in Keras' order, `name` last); an argument left out takes the
// schema's default (layer_schema.hpp: Keras' own).
#pragma once

#include <skyforge/keras_callbacks.hpp>
#include <skyforge/layer_schema.hpp>
#include <skyforge/sdk.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace skyforge::keras {

// A square size from one integer, or (height, width); the layer schema's (layer_schema.hpp).
using Size2 = schema::Size2;

// A builder's optional size argument: 3, {3, 5}, Size2(3), or left out ({} / std::nullopt).
struct OptionalSize2 : std::optional<Size2> {
  OptionalSize2() = default;
  OptionalSize2(std::nullopt_t) {}                                                   // NOLINT
  OptionalSize2(uint32_t s) : std::optional<Size2>(Size2(s)) {}                      // NOLINT
  OptionalSize2(uint32_t h, uint32_t w) : std::optional<Size2>(Size2(h, w)) {}      // NOLINT
  OptionalSize2(Size2 s) : std::optional<Size2>(s) {}                                // NOLINT
};

class Tensor;

// One layer as the user wrote it: a type and the options given (text, the schema's canonical
// forms). The schema (skyforge/layer_schema.hpp, docs/layers.md) holds the defaults, ranges and
// shape rules; compile() hands the backend every option with the defaults filled in.
// type "input" is a Sequential model's Input().
struct Layer {
  std::string type;
  std::vector<std::pair<std::string, std::string>> options;
  std::vector<uint32_t> shape;  // Input only

  Layer() = default;
  explicit Layer(std::string t, std::vector<std::pair<std::string, std::string>> o = {}, std::vector<uint32_t> s = {})
      : type(std::move(t)), options(std::move(o)), shape(std::move(s)) {}

  std::string option(const std::string& key, const std::string& fallback = "") const {
    for (const auto& [k, v] : options)
      if (k == key) return v;
    return fallback;
  }

  // Calls the layer on a tensor (a merge layer on a list of them): the functional API. A layer
  // is called once; its output's shape is inferred here, so a shape that does not fit is refused
  // at the call. MultiHeadAttention's self-attention may also be called as mha(x, x).
  Tensor operator()(const Tensor& x) const;
  Tensor operator()(const std::vector<Tensor>& xs) const;
  Tensor operator()(const Tensor& query, const Tensor& value) const;

 private:
  Tensor call(const std::vector<Tensor>& xs) const;
  // Set by the first call. skyforge gives every call its own weights, so a second call (Keras'
  // shared layer) is refused rather than silently training two layers.
  mutable bool called_ = false;
};

namespace detail {
struct Node;
std::shared_ptr<const Node> node_of(const Tensor& t);
Tensor make_tensor(std::shared_ptr<const Node> n);
}  // namespace detail

// A layer's output, or a model's input (Input()): Keras' KerasTensor. It holds the call that
// made it, and through it every call before; shape() is one sample's (Keras' without None).
class Tensor {
 public:
  Tensor() = default;
  const std::vector<uint32_t>& shape() const;
  // Lets Sequential({K::Input({28, 28, 1}), ...}) list the input; any other tensor is refused.
  operator Layer() const;  // NOLINT: implicit, as Keras' Sequential takes an Input

 private:
  friend std::shared_ptr<const detail::Node> detail::node_of(const Tensor& t);
  friend Tensor detail::make_tensor(std::shared_ptr<const detail::Node> n);
  explicit Tensor(std::shared_ptr<const detail::Node> n) : node_(std::move(n)) {}
  std::shared_ptr<const detail::Node> node_;
};

namespace detail {
// One call of a layer: the layer, the tensors it took, its output's shape, and when it was made
// (the serial: a layer is called after every layer it takes from, so serials order a model).
struct Node {
  Layer layer;  // type "input": a model's input
  std::vector<Tensor> inputs;
  std::vector<uint32_t> shape;
  uint64_t serial = 0;
};
inline std::atomic<uint64_t> next_serial{0};

inline std::shared_ptr<const Node> node_of(const Tensor& t) {
  if (!t.node_) throw Error("keras: an empty Tensor (one not made by Input() or a layer call)", SF_ERR_INVALID);
  return t.node_;
}
inline Tensor make_tensor(std::shared_ptr<const Node> n) { return Tensor(std::move(n)); }

inline std::string num(double v) { return format_double(v); }
inline std::string boolean(bool b) { return b ? "true" : "false"; }

// Builds a Layer from the arguments a builder was given; arguments left out stay out (the
// schema's default applies).
class LayerArgs {
 public:
  explicit LayerArgs(const char* type) : layer_(type) {}
  LayerArgs& set(const char* key, uint32_t v) { return put(key, std::to_string(v)); }
  LayerArgs& set(const char* key, int32_t v) { return put(key, std::to_string(v)); }
  LayerArgs& set(const char* key, const Size2& v) { return put(key, v.text()); }
  LayerArgs& set(const char* key, double v) { return put(key, num(v)); }
  LayerArgs& set(const char* key, bool v) { return put(key, boolean(v)); }
  LayerArgs& set(const char* key, const std::string& v) { return v.empty() ? *this : put(key, v); }
  template <class T>
  LayerArgs& set(const char* key, const std::optional<T>& v) {
    return v ? set(key, *v) : *this;
  }
  Layer done() { return std::move(layer_); }

 private:
  LayerArgs& put(const char* key, std::string text) {
    layer_.options.emplace_back(key, std::move(text));
    return *this;
  }
  Layer layer_;
};

// The schema's LayerError as the Keras API's Error (SF_ERR_INVALID).
template <class F>
auto schema_call(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const schema::LayerError& e) {
    throw Error(e.what(), SF_ERR_INVALID);
  }
}
// The layer checked against the schema, defaults filled in; `index` names it in messages.
inline schema::LayerConfig config(const Layer& l, size_t index) {
  return schema_call([&] { return schema::parse(l.type, l.options, index); });
}
// The schema's shape rule: output shape and parameter counts.
inline schema::LayerShape infer(const schema::LayerConfig& c, const std::vector<uint32_t>& in) {
  return schema_call([&] { return c.infer(in); });
}
// MaxPooling2D's and AveragePooling2D's options (Pooling2DOptions).
template <class Options>
Layer pooling2d(const char* type, const Options& o) {
  return LayerArgs(type)
      .set("pool_size", o.pool_size)
      .set("strides", o.strides)
      .set("padding", o.padding)
      .set("name", o.name)
      .done();
}
// How a call's messages name a layer: Keras' class and the name given, "Conv2D 'stem'".
inline std::string call_label(const Layer& l) {
  const schema::LayerDef* def = schema::find(l.type);
  const std::string name = l.option("name");
  return (def ? std::string(def->keras_name) : l.type) + (name.empty() ? "" : " '" + name + "'");
}
}  // namespace detail

// ---- calling a layer --------------------------------------------------------------------------
inline const std::vector<uint32_t>& Tensor::shape() const { return detail::node_of(*this)->shape; }

inline Tensor::operator Layer() const {
  const auto n = detail::node_of(*this);
  if (n->layer.type != "input")
    throw Error("keras: a Sequential model lists layers and its Input(); this tensor is " +
                    detail::call_label(n->layer) + "'s output (build a functional Model(inputs, outputs) from it)",
                SF_ERR_INVALID);
  return n->layer;
}

inline Tensor Layer::operator()(const Tensor& x) const { return call({x}); }
inline Tensor Layer::operator()(const std::vector<Tensor>& xs) const { return call(xs); }
inline Tensor Layer::operator()(const Tensor& query, const Tensor& value) const {
  if (type != "multi_head_attention")
    throw Error("keras: " + detail::call_label(*this) +
                    " takes one tensor (a merge layer a list: Add()({x, y})), not (query, value)",
                SF_ERR_INVALID);
  if (detail::node_of(query) != detail::node_of(value))
    throw Error("keras: " + detail::call_label(*this) +
                    " is self-attention here: call it on one tensor, mha(x) or mha(x, x); attention of one "
                    "tensor over another (query and value differ) is not supported",
                SF_ERR_INVALID);
  return call({query});
}

inline Tensor Layer::call(const std::vector<Tensor>& xs) const {
  const std::string label = detail::call_label(*this);
  if (type == "input") throw Error("keras: Input() is a model's input, not a layer to call", SF_ERR_INVALID);
  if (called_)
    throw Error("keras: " + label +
                    " was already called on a tensor: a layer is called once here (Keras' shared layers, one "
                    "layer's weights used by two calls, are not supported); build a layer for each call",
                SF_ERR_INVALID);
  auto node = std::make_shared<detail::Node>();
  std::vector<std::vector<uint32_t>> shapes;
  for (const Tensor& x : xs) shapes.push_back(detail::node_of(x)->shape);
  try {
    node->shape = schema::parse(type, options, 0).infer_inputs(shapes).output;
  } catch (const schema::LayerError& e) {
    // The schema names the layer "layer 0 (type 'name')": here the call names it.
    std::string why = e.what();
    if (why.rfind("layer 0 (", 0) == 0 && why.find("): ") != std::string::npos) why.erase(0, why.find("): ") + 3);
    std::string on;
    for (const auto& s : shapes) on += (on.empty() ? "" : ", ") + schema::detail::shape_text(s);
    throw Error("keras: " + label + " called on " + on + ": " + why, SF_ERR_INVALID);
  }
  node->layer = *this;
  node->inputs = xs;
  node->serial = detail::next_serial++;
  called_ = true;
  return detail::make_tensor(std::move(node));
}

// ---- builders -----------------------------------------------------------------------------------
// Named after Keras' layers; option keys are Keras' argument names. Each is also reachable as
// skyforge::keras::layers::X.
inline namespace layers {

// A layer's name (Keras' `name`): unique in a model; a functional model names the layers left
// unnamed as Keras does (conv2d, conv2d_1, ...).
struct Named {
  std::string name{};
};

// A functional model's input: one sample's shape (Keras' Input(shape=...)). Listed first in a
// Sequential model it sets the sample shape.
inline Tensor Input(std::vector<uint32_t> shape) {
  if (shape.empty()) throw Error("keras: Input needs a shape, e.g. Input({28, 28, 1})", SF_ERR_INVALID);
  for (uint32_t d : shape)
    if (d == 0) throw Error("keras: Input shape " + schema::detail::shape_text(shape) + " has a zero", SF_ERR_INVALID);
  auto node = std::make_shared<detail::Node>();
  node->layer = Layer("input", {}, shape);
  node->shape = std::move(shape);
  node->serial = detail::next_serial++;
  return detail::make_tensor(std::move(node));
}

struct DenseOptions {
  std::optional<std::string> activation{};  // linear (default), relu, softmax, gelu, tanh, sigmoid
  std::optional<bool> use_bias{};
  std::string name{};
};
inline Layer Dense(uint32_t units, const DenseOptions& o) {
  return detail::LayerArgs("dense")
      .set("units", units)
      .set("activation", o.activation)
      .set("use_bias", o.use_bias)
      .set("name", o.name)
      .done();
}
inline Layer Dense(uint32_t units, std::optional<std::string> activation = {}, std::optional<bool> use_bias = {}) {
  return Dense(units, DenseOptions{std::move(activation), use_bias, {}});
}

struct Conv2DOptions {
  OptionalSize2 strides{};
  std::optional<std::string> padding{};
  std::optional<std::string> activation{};
  std::optional<bool> use_bias{};
  std::string name{};
};
inline Layer Conv2D(uint32_t filters, Size2 kernel_size, const Conv2DOptions& o) {
  return detail::LayerArgs("conv2d")
      .set("filters", filters)
      .set("kernel_size", kernel_size)
      .set("strides", o.strides)
      .set("padding", o.padding)
      .set("use_bias", o.use_bias)
      .set("activation", o.activation)
      .set("name", o.name)
      .done();
}
inline Layer Conv2D(uint32_t filters, Size2 kernel_size, OptionalSize2 strides = {},
                    std::optional<std::string> padding = {}, std::optional<bool> use_bias = {},
                    std::optional<std::string> activation = {}) {
  return Conv2D(filters, kernel_size, Conv2DOptions{strides, std::move(padding), std::move(activation), use_bias, {}});
}

// synchronized: statistics over every replica's batch (docs/layers.md).
struct BatchNormalizationOptions {
  std::optional<double> momentum{};
  std::optional<double> epsilon{};
  std::optional<bool> center{};
  std::optional<bool> scale{};
  std::optional<bool> synchronized{};
  std::string name{};
};
inline Layer BatchNormalization(const BatchNormalizationOptions& o) {
  return detail::LayerArgs("batch_normalization")
      .set("momentum", o.momentum)
      .set("epsilon", o.epsilon)
      .set("center", o.center)
      .set("scale", o.scale)
      .set("synchronized", o.synchronized)
      .set("name", o.name)
      .done();
}
inline Layer BatchNormalization(std::optional<double> momentum = {}, std::optional<double> epsilon = {},
                                std::optional<bool> center = {}, std::optional<bool> scale = {},
                                std::optional<bool> synchronized = {}) {
  return BatchNormalization(BatchNormalizationOptions{momentum, epsilon, center, scale, synchronized, {}});
}

struct LayerNormalizationOptions {
  std::optional<double> epsilon{};
  std::optional<bool> center{};
  std::optional<bool> scale{};
  std::string name{};
};
inline Layer LayerNormalization(const LayerNormalizationOptions& o = {}) {
  return detail::LayerArgs("layer_normalization")
      .set("epsilon", o.epsilon)
      .set("center", o.center)
      .set("scale", o.scale)
      .set("name", o.name)
      .done();
}

// Self-attention over (sequence, features): mha(x) or Keras' mha(x, x).
struct MultiHeadAttentionOptions {
  std::optional<uint32_t> value_dim{};  // default: key_dim
  std::optional<double> dropout{};
  std::optional<bool> use_bias{};
  std::string name{};
};
inline Layer MultiHeadAttention(uint32_t num_heads, uint32_t key_dim, const MultiHeadAttentionOptions& o = {}) {
  return detail::LayerArgs("multi_head_attention")
      .set("num_heads", num_heads)
      .set("key_dim", key_dim)
      .set("value_dim", o.value_dim)
      .set("dropout", o.dropout)
      .set("use_bias", o.use_bias)
      .set("name", o.name)
      .done();
}

// strides default to pool_size, as in Keras.
struct Pooling2DOptions {
  OptionalSize2 pool_size{};
  OptionalSize2 strides{};
  std::optional<std::string> padding{};
  std::string name{};
};
inline Layer MaxPooling2D(const Pooling2DOptions& o) { return detail::pooling2d("max_pooling2d", o); }
inline Layer MaxPooling2D(OptionalSize2 pool_size = {}, OptionalSize2 strides = {},
                          std::optional<std::string> padding = {}) {
  return MaxPooling2D(Pooling2DOptions{pool_size, strides, std::move(padding), {}});
}
inline Layer AveragePooling2D(const Pooling2DOptions& o) { return detail::pooling2d("average_pooling2d", o); }
inline Layer AveragePooling2D(OptionalSize2 pool_size = {}, OptionalSize2 strides = {},
                              std::optional<std::string> padding = {}) {
  return AveragePooling2D(Pooling2DOptions{pool_size, strides, std::move(padding), {}});
}

// axis counts the batch as 0, as Keras does; -1 (default) is the last.
struct ConcatenateOptions {
  std::optional<int32_t> axis{};
  std::string name{};
};
inline Layer Concatenate(const ConcatenateOptions& o = {}) {
  return detail::LayerArgs("concatenate").set("axis", o.axis).set("name", o.name).done();
}
inline Layer Concatenate(int32_t axis, const Named& n = {}) { return Concatenate(ConcatenateOptions{axis, n.name}); }

// One sample's new shape; one entry may be -1.
inline Layer Reshape(const std::vector<int32_t>& target_shape, const Named& n = {}) {
  std::string text;
  for (int32_t d : target_shape) text += (text.empty() ? "" : ",") + std::to_string(d);
  return detail::LayerArgs("reshape").set("target_shape", text).set("name", n.name).done();
}

// Integer indices (carried as floats) in [0, input_dim) -> vectors of output_dim.
inline Layer Embedding(uint32_t input_dim, uint32_t output_dim, const Named& n = {}) {
  return detail::LayerArgs("embedding").set("input_dim", input_dim).set("output_dim", output_dim).set("name", n.name).done();
}
// keras_hub's PositionEmbedding: a learned vector per position, NOT added to its input (add it:
// Add()({x, PositionEmbedding(len)(x)})).
inline Layer PositionEmbedding(uint32_t sequence_length, const Named& n = {}) {
  return detail::LayerArgs("position_embedding").set("sequence_length", sequence_length).set("name", n.name).done();
}

inline Layer Dropout(double rate, const Named& n = {}) {
  return detail::LayerArgs("dropout").set("rate", rate).set("name", n.name).done();
}
inline Layer ReLU(const Named& n = {}) { return detail::LayerArgs("relu").set("name", n.name).done(); }
inline Layer Softmax(const Named& n = {}) { return detail::LayerArgs("softmax").set("name", n.name).done(); }
inline Layer Flatten(const Named& n = {}) { return detail::LayerArgs("flatten").set("name", n.name).done(); }
inline Layer GlobalAveragePooling2D(const Named& n = {}) {
  return detail::LayerArgs("global_average_pooling2d").set("name", n.name).done();
}
inline Layer GlobalAveragePooling1D(const Named& n = {}) {
  return detail::LayerArgs("global_average_pooling1d").set("name", n.name).done();
}
// Sums two or more tensors of one shape: Add()({x, y}).
inline Layer Add(const Named& n = {}) { return detail::LayerArgs("add").set("name", n.name).done(); }

// Keras' Activation layer: "relu", "softmax", "gelu", "tanh" or "sigmoid" (each the layer type
// of that name).
inline Layer Activation(const std::string& activation, const Named& n = {}) {
  for (const char* type : {"relu", "softmax", "gelu", "tanh", "sigmoid"})
    if (activation == type) return detail::LayerArgs(type).set("name", n.name).done();
  throw Error("keras: Activation('" + activation + "'): expected relu, softmax, gelu, tanh or sigmoid", SF_ERR_INVALID);
}

}  // namespace layers
}  // namespace skyforge::keras
