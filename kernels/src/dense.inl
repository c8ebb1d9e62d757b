// launch.hpp's dense-layer, loss, reduction and dropout calls, written once for both builds
// (common.hpp says how); included after the build's for_n.
#include "common.hpp"

#include <skyforge/kernels/activation.hpp>
#include <skyforge/kernels/xent.hpp>

namespace skyforge::kernels {

void bias_activation_forward(float* y, const float* bias, size_t rows, size_t width, Activation act, Stream s) {
  constexpr const char* what = "bias_activation_forward";
  if (rows == 0 || width == 0) return;
  if (act == Activation::softmax) {
    for_n(s, rows, BiasSoftmaxRow{y, bias, width}, what);
    return;
  }
  if (!bias && act == Activation::linear) return;
  for_n(s, rows * width, BiasActElem{y, y, bias, width, act}, what);
}

void activation_forward(const float* x, float* y, size_t n, Activation act, Stream s) {
  constexpr const char* what = "activation_forward";
  impl::require(act != Activation::softmax, what, "softmax is a row's, not an element's (bias_activation_forward)");
  if (n) for_n(s, n, BiasActElem{x, y, nullptr, 1, act}, what);
}

void activation_backward(const float* x, const float* y, float* dy, size_t rows, size_t width, Activation act,
                         Stream s) {
  constexpr const char* what = "activation_backward";
  if (rows == 0 || width == 0 || act == Activation::linear) return;
  impl::require(x || !slope_reads_input(act), what, "gelu's gradient needs the activation's input x");
  if (act == Activation::softmax) for_n(s, rows, SoftmaxBackRow{y, dy, width}, what);
  else for_n(s, rows * width, ActBackElem{x, y, dy, act}, what);
}

void activation_backward(const float* y, float* dy, size_t rows, size_t width, Activation act, Stream s) {
  activation_backward(nullptr, y, dy, rows, width, act, s);
}

void bias_grad(const float* dy, size_t rows, size_t width, float* dbias, double* ws, Stream s) {
  if (width == 0) return;
  impl::column_reduce<1>(s, rows, width, SumTerm{dy, width}, StoreFloat{dbias}, ws, "bias_grad");
}

void softmax_xent(const float* logits, const int32_t* labels, size_t rows, size_t classes, float* loss, float* hit,
                  float* dlogits, double* ws, Stream s) {
  constexpr const char* what = "softmax_xent";
  if (rows == 0) return;
  impl::require(classes > 0, what, "classes must be at least 1");
  impl::require(loss && hit, what, "loss and hit are required");
  if (!ws || classes <= kXentWideClasses) {
    for_n(s, rows, XentRow{logits, labels, classes, loss, hit, dlogits}, what);
    return;
  }
  const XentWide w{logits, labels, rows, classes, xent_slices(classes), ws};
  for_n(s, w.parts(), XentSliceMax{w}, what);
  for_n(s, rows, XentRowMax{w, hit}, what);
  for_n(s, w.parts(), XentSliceSum{w, dlogits}, what);
  for_n(s, rows, XentRowLoss{w, loss}, what);
  if (dlogits) for_n(s, rows * classes, XentGrad{w, dlogits}, what);
}

void softmax_xent(const float* logits, const int32_t* labels, size_t rows, size_t classes, float* loss, float* hit,
                  float* dlogits, Stream s) {
  softmax_xent(logits, labels, rows, classes, loss, hit, dlogits, nullptr, s);
}

void reduce_sum(const float* x, size_t n, double* out, double* ws, Stream s) {
  impl::column_reduce<1>(s, n, 1, SumTerm{x, 1}, StoreDouble{out}, ws, "reduce_sum");
}

void reduce_sum_squares(const float* x, size_t n, double* out, double* ws, Stream s) {
  impl::column_reduce<1>(s, n, 1, SumSquaresTerm{x, 1}, StoreDouble{out}, ws, "reduce_sum_squares");
}

namespace {
void dropout_with(const float* in, float* out, size_t n, float rate, const DropoutKey& key, const uint64_t* step,
                  Stream s) {
  constexpr const char* what = "dropout";
  impl::require(rate >= 0.f && rate < 1.f, what, "rate must be in [0, 1)");
  impl::require(key.layer < kDropoutMaxLayer && key.rank < kDropoutMaxRank, what, "layer and rank must be below 65536");
  impl::require(n <= kDropoutMaxElements, what, "at most 2^34 elements per layer and step");
  if (n == 0) return;
  for_n(s, (n + 3) / 4, DropoutApply{in, out, n, key, dropout_cut(rate), 1.f / (1.f - rate), step}, what);
}
}  // namespace

void dropout(const float* in, float* out, size_t n, float rate, const DropoutKey& key, Stream s) {
  dropout_with(in, out, n, rate, key, nullptr, s);
}

void dropout(const float* in, float* out, size_t n, float rate, const DropoutKey& key, const StepState* state,
             Stream s) {
  impl::require(state != nullptr, "dropout", "state is null");
  dropout_with(in, out, n, rate, key, &state->iteration, s);
}

}  // namespace skyforge::kernels
