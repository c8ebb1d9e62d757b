// The [train] table of a manifest (the built-in train job, docs/training.md): its own keys, and
// [[train.layers]] checked against the SDK's layer schema (skyforge/layer_schema.hpp).
#pragma once

#include "manifest.hpp"
#include "toml_reader.hpp"

#include <string>

namespace skyforge {

// Reads [train] into `train` (flat "train.*" config keys, canonical text); problems go to `r`.
void read_train(toml_in::Reader& r, const toml_in::Value& t, const std::string& dir, TrainSpec& train);
// Reads [search] (its grid's values checked as the [train] table `train` would hold them) into
// `search` (flat "search.*" config keys); problems go to `r`.
void read_search(toml_in::Reader& r, const toml_in::Value& t, const toml_in::Value& train, const std::string& dir,
                 SearchSpec& search);

}  // namespace skyforge
