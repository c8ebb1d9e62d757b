// Builders of the cpu layers that live in files of their own (layers_pooling.cpp,
// layers_transformer.cpp); make_layer (layers.cpp) calls them and sets the fields every layer
// has (type, index, shapes).
#pragma once

#include "cpu_engine.hpp"

#include <skyforge/layer_schema.hpp>

#include <memory>

namespace skyforge::cpu {

// average_pooling2d from its checked options and window geometry.
std::unique_ptr<Layer> make_average_pooling2d(const schema::LayerConfig& c, const schema::LayerShape& shape);

// layer_normalization, multi_head_attention, embedding, position_embedding; nullptr for another
// type. seed and rank key multi_head_attention's dropout masks.
std::unique_ptr<Layer> make_transformer_layer(const schema::LayerConfig& c, const Shape& in, uint64_t seed,
                                              uint32_t rank);

}  // namespace skyforge::cpu
