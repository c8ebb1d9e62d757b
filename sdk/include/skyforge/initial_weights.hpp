// The weights a model starts from, the same on every compute backend, so that a seed means one
// thing whatever the hardware (docs/compute-backends.md, "Initial weights"; `skyforge
// backend-check` compares them with cpu's). Header-only.
//
// One flat float buffer in the layout every backend's get_params/set_params uses: layers in
// order; a layer's kernel, then its bias; batch_normalization's gamma, then beta (each only when
// the layer has it). Kernels are Keras-shaped, row-major: dense (in, units), conv2d (kh, kw, in,
// filters). Values, drawn from one skyforge::Rng(seed) stream in that order: glorot_uniform
// kernels, U(-limit, limit) with limit = sqrt(6 / (fan_in + fan_out)) computed in double and
// rounded to float, each value (2u - 1) * limit with u = (the draw's top 24 bits) / 2^24 in
// float; biases and beta 0; gamma 1.
#pragma once

#include <skyforge/data.hpp>
#include <skyforge/layer_schema.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

namespace skyforge {

// glorot_uniform into w[0, n) from rng, as above.
inline void glorot_uniform(float* w, size_t n, size_t fan_in, size_t fan_out, Rng& rng) {
  const float limit = static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)));
  for (size_t i = 0; i < n; ++i) w[i] = (2.f * (static_cast<float>(rng.next() >> 40) * (1.0f / 16777216.0f)) - 1.f) * limit;
}

// The initial weights of a model of `layers` on one sample of `input_shape`. Throws
// schema::LayerError when a layer cannot take its input (the schema's shape rule).
inline std::vector<float> initial_weights(const std::vector<uint32_t>& input_shape,
                                          const std::vector<schema::LayerConfig>& layers, uint64_t seed) {
  std::vector<uint64_t> sizes;
  std::vector<uint32_t> in = input_shape;
  uint64_t total = 0;
  for (const schema::LayerConfig& l : layers) {
    const schema::LayerShape s = l.infer(in);
    sizes.push_back(s.trainable);
    total += s.trainable;
    in = s.output;
  }
  std::vector<float> w(static_cast<size_t>(total), 0.f);
  Rng rng(seed);
  in = input_shape;
  float* p = w.data();
  for (size_t i = 0; i < layers.size(); ++i) {
    const schema::LayerConfig& l = layers[i];
    const size_t cin = in.back();
    if (l.type() == "dense") {
      const size_t units = l.count("units");
      glorot_uniform(p, cin * units, cin, units, rng);
    } else if (l.type() == "conv2d") {
      const schema::Size2 k = l.size("kernel_size");
      const size_t kk = size_t{k.h} * k.w, filters = l.count("filters");
      glorot_uniform(p, kk * cin * filters, kk * cin, kk * filters, rng);
    } else if (l.type() == "batch_normalization" && l.flag("scale")) {
      std::fill(p, p + cin, 1.f);
    }
    p += sizes[i];
    in = l.infer(in).output;
  }
  return w;
}

}  // namespace skyforge
