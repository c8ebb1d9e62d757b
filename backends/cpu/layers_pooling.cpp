// average_pooling2d on the cpu backend: Keras' AveragePooling2D over NHWC windows.
#include "cpu_ops.hpp"
#include "layer_builders.hpp"

namespace skyforge::cpu {
namespace {

// Each output is the mean of its window's positions inside the input: with 'valid' every
// window lies inside; with 'same' the padding's positions are left out of the count too
// (TensorFlow's and Keras' rule). Samples are split over the threads; each one's sums run in a
// fixed order, so the thread count changes no bit.
class AveragePool2D final : public Layer {
 public:
  uint32_t ph = 2, pw = 2, sh = 2, sw = 2, pt = 0, pl = 0;
  bool same = false;

  // f(oh, ow, h0, h1, w0, w1, inv): each output pixel with its window clipped to the input
  // ([h0, h1) x [w0, w1)) and 1 / (the window's positions inside the input).
  template <class F>
  void windows(F&& f) const {
    const long H = in_shape[0], W = in_shape[1];
    for (size_t oh = 0; oh < out_shape[0]; ++oh) {
      const long r = static_cast<long>(oh * sh) - pt, h0 = std::max(r, 0L), h1 = std::min(r + long{ph}, H);
      for (size_t ow = 0; ow < out_shape[1]; ++ow) {
        const long c = static_cast<long>(ow * sw) - pl, w0 = std::max(c, 0L), w1 = std::min(c + long{pw}, W);
        f(oh, ow, static_cast<size_t>(h0), static_cast<size_t>(h1), static_cast<size_t>(w0), static_cast<size_t>(w1),
          1.f / static_cast<float>((h1 - h0) * (w1 - w0)));
      }
    }
  }
  void forward(const float* x, float* y, uint32_t batch, bool) override {
    const size_t W = in_shape[1], C = in_shape[2], Wo = out_shape[1], in_n = numel(in_shape), out_n = numel(out_shape);
#pragma omp parallel for schedule(static) num_threads(exec_.threads) if (k::par(batch * in_n, exec_))
    for (size_t n = 0; n < batch; ++n) {
      const float* xs = x + n * in_n;
      windows([&](size_t oh, size_t ow, size_t h0, size_t h1, size_t w0, size_t w1, float inv) {
        float* o = y + n * out_n + (oh * Wo + ow) * C;
        std::fill(o, o + C, 0.f);
        for (size_t i = h0; i < h1; ++i)
          for (size_t j = w0; j < w1; ++j) {
            const float* s = xs + (i * W + j) * C;
#pragma omp simd
            for (size_t q = 0; q < C; ++q) o[q] += s[q];
          }
#pragma omp simd
        for (size_t q = 0; q < C; ++q) o[q] *= inv;
      });
    }
  }
  void backward(const float*, const float*, float* dy, float* dx, uint32_t batch) override {
    if (!dx) return;
    const size_t W = in_shape[1], C = in_shape[2], Wo = out_shape[1], in_n = numel(in_shape), out_n = numel(out_shape);
#pragma omp parallel for schedule(static) num_threads(exec_.threads) if (k::par(batch * in_n, exec_))
    for (size_t n = 0; n < batch; ++n) {
      float* ds = dx + n * in_n;
      std::fill(ds, ds + in_n, 0.f);
      windows([&](size_t oh, size_t ow, size_t h0, size_t h1, size_t w0, size_t w1, float inv) {
        const float* g = dy + n * out_n + (oh * Wo + ow) * C;
        for (size_t i = h0; i < h1; ++i)
          for (size_t j = w0; j < w1; ++j) {
            float* d = ds + (i * W + j) * C;
#pragma omp simd
            for (size_t q = 0; q < C; ++q) d[q] += g[q] * inv;
          }
      });
    }
  }
  std::string describe() const override {
    return Layer::describe() + "/p" + std::to_string(ph) + "x" + std::to_string(pw) + "/s" + std::to_string(sh) +
           "x" + std::to_string(sw) + (same ? "/same" : "/valid");
  }
};

}  // namespace

std::unique_ptr<Layer> make_average_pooling2d(const schema::LayerConfig& c, const schema::LayerShape& shape) {
  auto l = std::make_unique<AveragePool2D>();
  set_pool_window(*l, c, shape);
  return l;
}

}  // namespace skyforge::cpu
