// The weights a model starts from, the same on every compute backend, so that a seed means one
// thing whatever the hardware (docs/compute-backends.md, "Initial weights"; `skyforge
// backend-check` compares them with cpu's). Header-only.
//
// One flat float buffer in the layout every backend's get_params/set_params uses: layers in the
// order they run (schema::graph's order: the listing order for a Sequential list); within a layer,
// its weights in Keras' order (schema::LayerShape::weights): a kernel, then its bias;
// batch_normalization's and layer_normalization's gamma, then beta (each only when the layer has
// it); multi_head_attention's query, key, value and output kernels each followed by its bias.
// Kernels are Keras-shaped, row-major: dense (in, units), conv2d (kh, kw, in, filters),
// attention (features, heads, key_dim) and (heads, value_dim, features). Values, drawn from one
// skyforge::Rng(seed) stream in that order: glorot_uniform kernels, U(-limit, limit) with
// limit = sqrt(6 / (fan_in + fan_out)) computed in double and rounded to float, each value
// (2u - 1) * limit with u = (the draw's top 24 bits) / 2^24 in float (attention kernels: fan_in
// and fan_out over their input and output axes, as Keras 3's EinsumDense; position_embedding's
// table (sequence_length, features) as a dense kernel); embedding tables U(-0.05, 0.05) the same
// way (Keras' "uniform"); biases and beta 0; gamma 1.
#pragma once

#include <skyforge/data.hpp>
#include <skyforge/layer_schema.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

namespace skyforge {

// glorot_uniform into w[0, n) from rng, as above.
// U(-limit, limit) into w[0, n) from rng, as above.
inline void uniform_symmetric(float* w, size_t n, float limit, Rng& rng) {
  for (size_t i = 0; i < n; ++i) w[i] = (2.f * (static_cast<float>(rng.next() >> 40) * (1.0f / 16777216.0f)) - 1.f) * limit;
}
inline void glorot_uniform(float* w, size_t n, size_t fan_in, size_t fan_out, Rng& rng) {
  uniform_symmetric(w, n, static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out))), rng);
}

// The initial weights of a model of `layers` on one sample of `input_shape`. Throws
// schema::LayerError when the layers do not make a model (schema::graph).
inline std::vector<float> initial_weights(const std::vector<uint32_t>& input_shape,
                                          const std::vector<schema::LayerConfig>& layers, uint64_t seed) {
  const schema::Graph g = schema::graph(input_shape, layers);
  uint64_t total = 0;
  for (const schema::LayerShape& s : g.shapes) total += s.trainable;
  std::vector<float> w(static_cast<size_t>(total), 0.f);
  Rng rng(seed);
  float* p = w.data();
  for (size_t i : g.order) {
    const schema::LayerConfig& l = layers[i];
    const std::vector<uint32_t>& in = g.in_shapes[i][0];
    const size_t cin = in.back();
    if (l.type() == "dense") {
      const size_t units = l.count("units");
      glorot_uniform(p, cin * units, cin, units, rng);
    } else if (l.type() == "conv2d") {
      const schema::Size2 k = l.size("kernel_size");
      const size_t kk = size_t{k.h} * k.w, filters = l.count("filters");
      glorot_uniform(p, kk * cin * filters, kk * cin, kk * filters, rng);
    } else if ((l.type() == "batch_normalization" || l.type() == "layer_normalization") && l.flag("scale")) {
      std::fill(p, p + cin, 1.f);
    } else if (l.type() == "multi_head_attention") {
      const size_t h = l.count("num_heads"), kd = l.count("key_dim"), vd = l.count("value_dim");
      const size_t bias = l.flag("use_bias") ? 1 : 0;
      float* q = p;
      for (const auto& [fan_in, fan_out] : {std::pair{cin, h * kd}, {cin, h * kd}, {cin, h * vd}, {h * vd, cin}}) {
        glorot_uniform(q, fan_in * fan_out, fan_in, fan_out, rng);
        q += fan_in * fan_out + bias * fan_out;
      }
    } else if (l.type() == "embedding") {
      uniform_symmetric(p, size_t{l.count("input_dim")} * l.count("output_dim"), 0.05f, rng);
    } else if (l.type() == "position_embedding") {
      const size_t length = l.count("sequence_length");
      glorot_uniform(p, length * cin, length, cin, rng);
    }
    p += g.shapes[i].trainable;
  }
  return w;
}

}  // namespace skyforge
