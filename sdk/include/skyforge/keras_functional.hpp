// skyforge/keras_functional.hpp — a functional model's layer list from its tensors (keras.hpp's
// Model(inputs, outputs)): each layer's `name` (Keras' for the layers left unnamed) and
// `inputs`, in call order.
#pragma once

#include <skyforge/keras_layers.hpp>
#include <skyforge/layer_schema.hpp>
#include <skyforge/sdk.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace skyforge::keras::detail {

// Keras' names: the name given, else the layer's base name ("activation" for Activation's
// types, the type for the others), then base_1, base_2, ... in listing order, skipping the
// names given.
inline std::vector<std::string> layer_names(const std::vector<Layer>& layers) {
  std::set<std::string> given;
  for (const Layer& l : layers)
    if (!l.option("name").empty()) given.insert(l.option("name"));
  std::map<std::string, int> seen;
  std::vector<std::string> out;
  for (const Layer& l : layers) {
    std::string name = l.option("name");
    if (name.empty()) {
      const schema::LayerDef* def = schema::find(l.type);
      const std::string base = def && def->keras_name == "Activation" ? "activation" : l.type;
      do {
        const int n = seen[base]++;
        name = base + (n ? "_" + std::to_string(n) : "");
      } while (given.count(name));
    }
    out.push_back(std::move(name));
  }
  return out;
}

// A functional model: its input's shape, and its layers in call order (a topological order:
// a layer is called after the layers it takes), each with its `name` (Keras' when none was
// given) and its `inputs`. Walks back from `outputs`; a call `outputs` does not depend on is
// not part of the model (as in Keras).
struct Functional {
  std::vector<uint32_t> input_shape;
  std::vector<Layer> layers;
};
inline Functional functional(const Tensor& inputs, const Tensor& outputs) {
  const auto in = node_of(inputs), out = node_of(outputs);
  if (in->layer.type != "input")
    throw Error("keras: Model(inputs, outputs): inputs must be the tensor Input() made, not " + call_label(in->layer) +
                    "'s output",
                SF_ERR_INVALID);
  if (in == out) throw Error("keras: Model(inputs, outputs): outputs is the input itself; the model has no layers", SF_ERR_INVALID);
  std::vector<std::shared_ptr<const Node>> nodes, todo{out};
  std::set<const Node*> seen{out.get()};
  while (!todo.empty()) {
    const auto n = todo.back();
    todo.pop_back();
    if (n->layer.type == "input") {
      if (n != in)
        throw Error("keras: Model(inputs, outputs): the outputs depend on another Input " +
                        schema::detail::shape_text(n->shape) + " than the model's inputs " +
                        schema::detail::shape_text(in->shape) +
                        " (graph disconnected: a tensor of another model?); a model has one input",
                    SF_ERR_INVALID);
      continue;
    }
    nodes.push_back(n);
    for (const Tensor& t : n->inputs)
      if (seen.insert(node_of(t).get()).second) todo.push_back(node_of(t));
  }
  if (!seen.count(in.get()))
    throw Error("keras: Model(inputs, outputs): the outputs do not depend on the inputs", SF_ERR_INVALID);
  std::sort(nodes.begin(), nodes.end(), [](const auto& a, const auto& b) { return a->serial < b->serial; });

  Functional f{in->shape, {}};
  for (const auto& n : nodes) f.layers.push_back(n->layer);
  const std::vector<std::string> names = layer_names(f.layers);
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (names[i] == names[j])
        throw Error("keras: Model(inputs, outputs): two layers are named '" + names[i] + "' (" +
                        call_label(f.layers[j]) + " and " + call_label(f.layers[i]) + "); names are unique in a model",
                    SF_ERR_INVALID);
  std::map<const Node*, std::string> name_of{{in.get(), std::string(schema::kModelInputName)}};
  for (size_t i = 0; i < nodes.size(); ++i) name_of[nodes[i].get()] = names[i];
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto& options = f.layers[i].options;
    options.erase(std::remove_if(options.begin(), options.end(), [](const auto& kv) { return kv.first == "name"; }),
                  options.end());
    std::string from;
    for (const Tensor& t : nodes[i]->inputs) from += (from.empty() ? "" : ",") + name_of.at(node_of(t).get());
    options.emplace_back("name", names[i]);
    options.emplace_back("inputs", from);
  }
  return f;
}

}  // namespace skyforge::keras::detail
