// The cpu backend's merge layers, which take two or more inputs (schema::LayerDef::takes_many):
// add (elementwise sum of inputs of one shape) and concatenate (along one axis, Keras' axis
// counting the batch as 0). The engine calls forward_inputs/backward_inputs with one buffer per
// input, in the order the layer's `inputs` name them.
#include "cpu_ops.hpp"

#include <skyforge/layer_schema.hpp>

#include <stdexcept>

namespace skyforge::cpu {

namespace {

class Merge : public Layer {
 public:
  void forward(const float*, float*, uint32_t, bool) override { throw std::logic_error(type + ": takes several inputs"); }
  void backward(const float*, const float*, float*, float*, uint32_t) override {
    throw std::logic_error(type + ": takes several inputs");
  }
};

// y = x0 + x1 + ... (left to right); every input's gradient is dy.
class Add final : public Merge {
 public:
  void forward_inputs(std::span<const float* const> xs, float* y, uint32_t batch, bool) override {
    const size_t n = batch * numel(out_shape);
    k::copy(xs[0], y, n, exec_);
    for (size_t i = 1; i < xs.size(); ++i) k::add_into(y, xs[i], n, exec_);
  }
  void backward_inputs(std::span<const float* const>, const float*, float* dy, std::span<float* const> dxs,
                       uint32_t batch) override {
    for (float* dx : dxs)
      if (dx) k::copy(dy, dx, batch * numel(out_shape), exec_);
  }
};

// Per sample, the output is `outer` rows, each the inputs' rows side by side: input k's row is
// its `row[k]` values (its size along the axis times the sizes after it).
class Concatenate final : public Merge {
 public:
  size_t outer = 1;
  std::vector<size_t> row;  // per input
  size_t width = 0;         // the output's row: the inputs' rows together

  void forward_inputs(std::span<const float* const> xs, float* y, uint32_t batch, bool) override {
    over_rows(batch, [&](size_t r, size_t k, size_t at) {
      std::memcpy(y + r * width + at, xs[k] + r * row[k], row[k] * sizeof(float));
    });
  }
  void backward_inputs(std::span<const float* const>, const float*, float* dy, std::span<float* const> dxs,
                       uint32_t batch) override {
    over_rows(batch, [&](size_t r, size_t k, size_t at) {
      if (dxs[k]) std::memcpy(dxs[k] + r * row[k], dy + r * width + at, row[k] * sizeof(float));
    });
  }

 private:
  // f(row, input, offset in the output row) for every row of every input, rows split over threads.
  template <class F>
  void over_rows(uint32_t batch, F&& f) const {
    const size_t rows = batch * outer;
#pragma omp parallel for schedule(static) num_threads(exec_.threads) if (k::par(rows * width, exec_))
    for (size_t r = 0; r < rows; ++r)
      for (size_t k = 0, at = 0; k < row.size(); at += row[k], ++k) f(r, k, at);
  }
};

}  // namespace

std::unique_ptr<Layer> make_merge_layer(const schema::LayerConfig& c, const std::vector<Shape>& in) {
  if (c.type() == "add") return std::make_unique<Add>();
  auto l = std::make_unique<Concatenate>();
  const int64_t rank = static_cast<int64_t>(in[0].size()), given = c.integer("axis");
  const size_t axis = static_cast<size_t>((given < 0 ? given + rank + 1 : given) - 1);  // the schema checked it
  for (size_t d = 0; d < axis; ++d) l->outer *= in[0][d];
  for (const Shape& s : in) {
    size_t r = 1;
    for (size_t d = axis; d < s.size(); ++d) r *= s[d];
    l->row.push_back(r);
    l->width += r;
  }
  return l;
}

}  // namespace skyforge::cpu
