// skyforge/model_summary.hpp — a model's Keras-style summary table from the layer schema's graph
// (layer_schema.hpp): what the train app prints on the head node and `skyforge validate` prints.
//
// A Sequential model (no layer names another) gets Keras' Sequential table (Layer (type), Output
// Shape, Param #); a model graph gets Keras' functional table: an InputLayer row first, the
// layers in the order they run, and a "Connected to" column naming each layer's inputs. A layer
// without a `name` is called as Keras calls it: its type, then _1, _2, ... for the next ones;
// the model, when not named, as Keras calls it: "sequential" or "functional".
// Header-only, C++20, the standard library only.
#pragma once

#include <skyforge/layer_schema.hpp>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace skyforge::schema {

inline std::string summary(const std::vector<uint32_t>& input_shape, const std::vector<LayerConfig>& layers,
                           std::string model_name = "") {
  const Graph g = graph(input_shape, layers);
  const bool functional = !g.sequential();
  if (model_name.empty()) model_name = functional ? "functional" : "sequential";
  std::vector<std::string> names;  // per layer, listing order
  std::map<std::string, int> seen;
  for (const LayerConfig& c : layers) {
    if (!c.name().empty()) {
      names.push_back(c.name());
      continue;
    }
    const int n = seen[std::string(c.type())]++;
    names.push_back(std::string(c.type()) + (n ? "_" + std::to_string(n) : ""));
  }
  const size_t width = functional ? 98 : 65;
  const std::string rule(width, '_'), dbl(width, '=');
  std::string out = "Model: \"" + model_name + "\"\n" + rule + "\n";
  char buf[512];
  // One row; a "name (Class)" too wide for its column puts the class on a line below.
  auto row = [&](std::string name, const std::string& shape, uint64_t params, const std::string& connected) {
    std::string below;
    if (const size_t paren = name.find(" ("); name.size() >= 27 && paren != std::string::npos) {
      below = " " + name.substr(paren + 1) + "\n";
      name.resize(paren);
    }
    if (functional)
      std::snprintf(buf, sizeof buf, " %-27s%-26s%-12llu%s\n", name.c_str(), shape.c_str(),
                    static_cast<unsigned long long>(params), connected.c_str());
    else
      std::snprintf(buf, sizeof buf, " %-27s%-26s%llu\n", name.c_str(), shape.c_str(), static_cast<unsigned long long>(params));
    out += buf + below;
  };
  if (functional)
    std::snprintf(buf, sizeof buf, "%-28s%-26s%-12s%s\n", " Layer (type)", "Output Shape", "Param #", "Connected to");
  else
    std::snprintf(buf, sizeof buf, "%-28s%-26s%s\n", " Layer (type)", "Output Shape", "Param #");
  out += buf + dbl + "\n";
  if (functional) {
    row(std::string(kModelInputName) + " (InputLayer)", detail::shape_text(input_shape), 0, "-");
    out += rule + "\n";
  }
  uint64_t trainable = 0, non_trainable = 0;
  for (size_t k = 0; k < g.order.size(); ++k) {
    const size_t i = g.order[k];
    const LayerShape& s = g.shapes[i];
    std::string connected;
    for (size_t j : g.inputs[i])
      connected += (connected.empty() ? "" : ", ") + (j == Graph::kInput ? std::string(kModelInputName) : names[j]);
    row(names[i] + " (" + std::string(layers[i].def().keras_name) + ")", detail::shape_text(s.output),
        s.trainable + s.non_trainable, connected);
    out += (k + 1 < g.order.size() ? rule : dbl) + "\n";
    trainable += s.trainable;
    non_trainable += s.non_trainable;
  }
  out += "Total params: " + std::to_string(trainable + non_trainable) + "\n";
  out += "Trainable params: " + std::to_string(trainable) + "\n";
  out += "Non-trainable params: " + std::to_string(non_trainable) + "\n";
  return out;
}

}  // namespace skyforge::schema
