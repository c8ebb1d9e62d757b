// Builders of the cpu layers that live in files of their own (layers_pooling.cpp,
// layers_transformer.cpp); make_layer (layers.cpp) calls them and sets the fields every layer
// has (type, index, shapes).
#pragma once

#include "cpu_engine.hpp"

#include <skyforge/layer_schema.hpp>

#include <memory>

namespace skyforge::cpu {

// A pooling layer's window (max_pooling2d, average_pooling2d: the same fields) from its checked
// options and the schema's window geometry.
template <class Pool>
void set_pool_window(Pool& l, const schema::LayerConfig& c, const schema::LayerShape& shape) {
  const schema::Size2 p = c.size("pool_size"), s = c.size("strides");
  l.ph = p.h, l.pw = p.w, l.sh = s.h, l.sw = s.w;
  l.same = c.choice("padding") == "same";
  l.pt = shape.rows.pad;
  l.pl = shape.cols.pad;
}

// average_pooling2d from its checked options and window geometry.
std::unique_ptr<Layer> make_average_pooling2d(const schema::LayerConfig& c, const schema::LayerShape& shape);

// layer_normalization, multi_head_attention, embedding, position_embedding; nullptr for another
// type. seed and rank key multi_head_attention's dropout masks.
std::unique_ptr<Layer> make_transformer_layer(const schema::LayerConfig& c, const Shape& in, uint64_t seed,
                                              uint32_t rank);

}  // namespace skyforge::cpu
