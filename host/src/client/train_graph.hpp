// [[train.layers]] as a model graph: each layer's `name` and `inputs` keys, the whole model
// checked by the layer schema's graph (skyforge/layer_schema.hpp) with every error at its
// layer's line, and the model's Keras-style summary (`skyforge validate` prints it).
#pragma once

#include "manifest.hpp"
#include "toml_reader.hpp"

#include <functional>
#include <string>
#include <string_view>

namespace skyforge {

// A layer table's `name` (a string) and `inputs` (a string or an array of strings: layer names
// or "input") as the layer's text options (inputs "a,b"); problems at their values.
void read_layer_links(toml_in::Reader& r, const toml_in::Value& layer, const std::string& where,
                      const std::function<void(std::string_view, std::string)>& put);

// Checks the model [train] describes (config already read, layers = the [[train.layers]] array):
// names, inputs, run order and every shape on the dataset's samples, and that the output is
// (classes,). A problem goes to the layer's `inputs`, `name` or `type` line.
void check_train_graph(toml_in::Reader& r, const toml_in::Value& layers, const TrainSpec& train);

// The model's summary table (skyforge/model_summary.hpp); `train` must be valid.
std::string train_model_summary(const TrainSpec& train);

}  // namespace skyforge
