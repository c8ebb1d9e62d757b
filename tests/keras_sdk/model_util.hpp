// Small synthetic data and models shared by the Keras model tests.
#pragma once

#include <skyforge/keras.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace model_util {

namespace K = skyforge::keras;

// 3 separable classes of 2x3x1 "images": class k has +2 on feature k, uniform noise of +-0.5.
struct Synthetic {
  std::vector<float> x;
  std::vector<int32_t> y;
};
inline Synthetic make_data(size_t n, uint64_t seed) {
  Synthetic d;
  skyforge::Rng rng(seed);
  for (size_t i = 0; i < n; ++i) {
    const auto k = static_cast<int32_t>(rng.below(3));
    d.y.push_back(k);
    for (int j = 0; j < 6; ++j)
      d.x.push_back((j == k ? 2.0f : 0.0f) + static_cast<float>(rng.below(1001)) / 1000.0f - 0.5f);
  }
  return d;
}
inline Synthetic slice(const Synthetic& d, size_t begin, size_t count) {
  Synthetic s;
  s.x.assign(d.x.begin() + static_cast<std::ptrdiff_t>(begin * 6),
             d.x.begin() + static_cast<std::ptrdiff_t>((begin + count) * 6));
  s.y.assign(d.y.begin() + static_cast<std::ptrdiff_t>(begin), d.y.begin() + static_cast<std::ptrdiff_t>(begin + count));
  return s;
}

// Softmax regression on the 6 features: 6 x classes kernel + classes biases.
inline K::Sequential small_model(uint32_t classes = 3) {
  return K::Sequential({K::Input({2, 3, 1}), K::Flatten(), K::Dense(classes)});
}

// Fit options that print nothing: `epochs` epochs of `batch_size` samples.
inline K::FitOptions quiet_fit(uint32_t epochs, uint32_t batch_size) {
  K::FitOptions o;
  o.epochs = epochs;
  o.batch_size = batch_size;
  o.verbose = 0;
  return o;
}

// The exception text of f(), or "" when it returns.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace model_util
