// Shared helpers of the cpu backend tests: model specs, and the SDK's in-process communicator.
#pragma once

#include "cpu_engine.hpp"

#include <skyforge/thread_group.hpp>

#include <vector>

namespace cpu_test {

using skyforge::LayerSpec;
using skyforge::ModelSpec;
using skyforge::Options;
using skyforge::StepResult;

inline Options opts(std::initializer_list<std::pair<const char*, const char*>> kv) {
  std::vector<sf_kv> v;
  for (auto& [k, val] : kv) v.push_back(sf_kv{k, val});
  return Options(v.data(), v.size());
}

inline LayerSpec layer(const char* type, std::initializer_list<std::pair<const char*, const char*>> kv = {}) {
  return LayerSpec{type, opts(kv)};
}

inline ModelSpec mlp(uint64_t seed = 1, uint32_t threads = 0) {
  ModelSpec m;
  m.input_shape = {28, 28, 1};
  m.layers = {layer("flatten"), layer("dense", {{"units", "128"}, {"activation", "relu"}}),
              layer("dense", {{"units", "10"}})};
  m.seed = seed;
  m.threads = threads;
  return m;
}

// The convnet of the Keras distributed-training guide.
inline ModelSpec convnet(uint64_t seed = 1, uint32_t threads = 0) {
  ModelSpec m;
  m.input_shape = {28, 28, 1};
  m.layers = {
      layer("conv2d", {{"filters", "12"}, {"kernel_size", "3"}, {"padding", "same"}, {"use_bias", "false"}}),
      layer("batch_normalization", {{"scale", "false"}, {"center", "true"}}),
      layer("relu"),
      layer("conv2d", {{"filters", "24"}, {"kernel_size", "6"}, {"use_bias", "false"}, {"strides", "2"}}),
      layer("batch_normalization", {{"scale", "false"}, {"center", "true"}}),
      layer("relu"),
      layer("conv2d", {{"filters", "32"}, {"kernel_size", "6"}, {"padding", "same"}, {"strides", "2"}}),
      layer("batch_normalization", {{"scale", "false"}, {"center", "true"}}),
      layer("relu"),
      layer("global_average_pooling2d"),
      layer("dense", {{"units", "256"}, {"activation", "relu"}}),
      layer("dropout", {{"rate", "0.5"}}),
      layer("dense", {{"units", "10"}}),
  };
  m.seed = seed;
  m.threads = threads;
  return m;
}

// The in-process communicator of the SDK (skyforge/thread_group.hpp).
using skyforge::ThreadGroup;

}  // namespace cpu_test
