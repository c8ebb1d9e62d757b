// The launch API of the engine's kernels (docs/kernels.md). Two libraries implement it with the
// same signatures and the same math (the functors of this folder):
//   skyforge_kernels_host  g++, Thrust's OpenMP device system: pointers are host memory and
//                          every call has finished when it returns (the stream is ignored);
//   skyforge_kernels_cuda  nvcc: pointers are device memory, calls are queued on `stream` and
//                          return at once (no host synchronisation); launch errors throw.
// Arguments that break a documented limit throw std::invalid_argument before anything runs.
//
// Layouts are row-major. `ws` is a workspace of reduce_workspace(rows, cols) doubles in the
// pointers' memory (reduce.hpp); kernels that take one overwrite it. Their sums, said below to be
// "in double", are in the Stream's reduction: doubles, or with Reduction::fp32 pairs of floats
// (sums.hpp), handed out as double.
#pragma once

#include "clip.hpp"
#include "data.hpp"
#include "hd.hpp"
#include "philox.hpp"
#include "reduce.hpp"
#include "step.hpp"
#include "window.hpp"
#include "xent.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace skyforge::kernels {

// A cudaStream_t in the CUDA build (null: the legacy default stream). In the host build a null
// handle runs each call at once; a handle pointing at a HostRecording records the call instead
// (the host build's stream capture, docs/kernels.md "Graphs"). reduction: the accumulator of
// the deterministic reductions the calls on it run (sums.hpp; docs/kernels.md, "Reductions").
struct Stream {
  void* handle = nullptr;
  Reduction reduction = Reduction::fp64;
};

// The host build's stand-in for a captured CUDA graph: each launch recorded with its arguments
// by value (as a graph's kernel nodes hold theirs), run again in order by replay().
struct HostRecording {
  std::vector<std::function<void()>> calls;
  void replay() const {
    for (const auto& c : calls) c();
  }
};

// Host build: runs f now on a plain stream, or records a copy of it on a capturing one (the
// kernels' launches and the engine's host device layer both go through here).
// (A template, defined here: not one of the library's launch functions.)
template <class F> void run_or_record(Stream s, F&& f) {
  if (s.handle) static_cast<HostRecording*>(s.handle)->calls.emplace_back(std::forward<F>(f));
  else f();
}

// "host" or "cuda": which build this library is.
const char* build_name();

// ---- dense layers ------------------------------------------------------------------------------
// y[r, :] = act(y[r, :] + bias) in place over [rows, width]; bias may be null.
void bias_activation_forward(float* y, const float* bias, size_t rows, size_t width, Activation act, Stream s = {});
// y[i] = act(x[i]) over n elements (x may equal y); every activation but softmax.
void activation_forward(const float* x, float* y, size_t n, Activation act, Stream s = {});
// dy <- dL/d(pre-activation), in place, from the activation's input x and output y: the gelus
// read x, the others only y (x may then be null).
void activation_backward(const float* x, const float* y, float* dy, size_t rows, size_t width, Activation act,
                         Stream s = {});
// The same from y alone: every activation but the gelus.
void activation_backward(const float* y, float* dy, size_t rows, size_t width, Activation act, Stream s = {});
// dbias[j] = sum over rows of dy[r, j] (in double, rounded to float). ws: reduce_workspace(rows, width).
void bias_grad(const float* dy, size_t rows, size_t width, float* dbias, double* ws, Stream s = {});

// ---- loss --------------------------------------------------------------------------------------
// Sparse softmax cross-entropy from logits [rows, classes] (xent.hpp): per-row loss, hit (1 when
// the first argmax is the label, else 0; reduce_sum counts them) and, if dlogits is not null,
// the gradient of each row's loss (softmax - onehot). ws: softmax_xent_workspace(rows, classes)
// doubles (xent.hpp): rows of more than kXentWideClasses classes are then split into slices over
// many threads, in stages (the same bits on any thread count and in both builds); narrower rows,
// and every row when ws is null, take one thread a row.
void softmax_xent(const float* logits, const int32_t* labels, size_t rows, size_t classes, float* loss, float* hit,
                  float* dlogits, double* ws, Stream s = {});
// The same with one thread a row at every width (no workspace).
void softmax_xent(const float* logits, const int32_t* labels, size_t rows, size_t classes, float* loss, float* hit,
                  float* dlogits, Stream s = {});

// ---- reductions ----------------------------------------------------------------------------------
// *out = sum of x[0 .. n), resp. of x^2, in double (reduce.hpp). ws: reduce_workspace(n, 1).
void reduce_sum(const float* x, size_t n, double* out, double* ws, Stream s = {});
void reduce_sum_squares(const float* x, size_t n, double* out, double* ws, Stream s = {});

// ---- bound data (data.hpp) ------------------------------------------------------------------------
// out[r, :] = x[idx[r], :] for r < rows, width floats a row; labels out[r] = y[idx[r]] (y and
// labels may be null together). The caller checks every idx[r] against its set's size.
void gather_rows(const float* x, const int32_t* y, const uint64_t* idx, size_t rows, size_t width, float* out,
                 int32_t* labels, Stream s = {});
// p[0 .. n) = value.
void fill(double* p, size_t n, double value, Stream s = {});
// dst = src^T for a row-major [rows, cols] src (dst: [cols, rows]); src and dst must not overlap.
void transpose(const float* src, size_t rows, size_t cols, float* dst, Stream s = {});
// acc[0 .. n) += x[0 .. n).
void accumulate(double* acc, const double* x, size_t n, Stream s = {});
// A block of rows x width floats from src (rows src_stride apart) to dst (dst_stride apart),
// copied, or with `add` added to dst: concatenate's slices, add's sums, a fan-out's gradient sum.
// src and dst must not overlap.
void copy_block(const float* src, size_t src_stride, float* dst, size_t dst_stride, size_t rows, size_t width,
                bool add, Stream s = {});

// ---- optimizers ----------------------------------------------------------------------------------
// One parameter tensor: its values, gradient and optimizer slots (size floats each).
// Adam: slot0 = m, slot1 = v. SGD with momentum: slot0 = velocity; plain SGD: no slots (null).
// RMSprop: slot0 = mean square, slot1 = momentum (momentum > 0), slot2 = mean gradient (centered).
struct OptimTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* slot0 = nullptr;
  float* slot1 = nullptr;
  size_t size = 0;
  float* slot2 = nullptr;  // after size: {param, grad, slot0, slot1, size} still reads as before
};
struct AdamConfig {  // weight_decay > 0: AdamW
  double learning_rate = 0.001, beta_1 = 0.9, beta_2 = 0.999, epsilon = 1e-7, weight_decay = 0.0;
};
struct RmspropConfig {
  double learning_rate = 0.001, rho = 0.9, momentum = 0.0, epsilon = 1e-7;
  bool centered = false;
};
struct SgdConfig {
  double learning_rate = 0.01, momentum = 0.0;
  bool nesterov = false;
};
// alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) with t = iteration + 1, in double.
float adam_alpha(const AdamConfig& c, uint64_t iteration);
// One update of every tensor from grad * grad_scale; `iteration` counts the updates already
// applied (Keras' optimizer.iterations). One launch per kMaxTensorsPerLaunch tensors.
void adam_update(const OptimTensor* tensors, size_t count, const AdamConfig& c, uint64_t iteration, float grad_scale,
                 Stream s = {});
void sgd_update(const OptimTensor* tensors, size_t count, const SgdConfig& c, float grad_scale, Stream s = {});
void rmsprop_update(const OptimTensor* tensors, size_t count, const RmspropConfig& c, float grad_scale, Stream s = {});
// The same with grad_scale = float(1 / *samples), *samples read on the device when the update
// runs: a step's global sample count that the host has not waited for (null: the gradient is
// the mean already, clip_gradients made it); the learning rate is state->lr (learning_rate_step
// writes it; config.learning_rate is not read) and Adam's iteration state->iteration, read
// there too (its alpha written to state->alpha first). Nothing the host knows of the step is
// an argument, so a captured step replays as the step it is (step.hpp, docs/kernels.md "Graphs").
void adam_update(const OptimTensor* tensors, size_t count, const AdamConfig& c, StepState* state,
                 const double* samples, Stream s = {});
void sgd_update(const OptimTensor* tensors, size_t count, const SgdConfig& c, const StepState* state,
                const double* samples, Stream s = {});
void rmsprop_update(const OptimTensor* tensors, size_t count, const RmspropConfig& c, const StepState* state,
                    const double* samples, Stream s = {});
// state->lr = learning_rate_wide(schedule, state->iteration) (skyforge/lr_schedule.hpp): before a step's update.
void learning_rate_step(const LrSchedule& schedule, StepState* state, Stream s = {});
// ++state->iteration: after a step's update (none while the step is refused).
void advance_step(StepState* state, Stream s = {});
// state->invalid += *count (one double in the pointers' memory: the step's global count of
// invalid inputs), before the step's update: while state->invalid > 0 the updates above and
// advance_step change nothing; the host reports the error and sets it back to 0 (step.hpp).
void refuse_invalid(StepState* state, const double* count, Stream s = {});

// ---- gradient clipping (clip.hpp) -------------------------------------------------------------------
// grad <- grad * float(1 / *samples) (the mean), then Keras' clipping of each variable of
// `layout` (clipnorm > 0) or of all of them (global_clipnorm > 0), the norms summed as clip.hpp
// sums them. ws: clip_workspace(layout) doubles. Then the update runs with samples = null.
size_t clip_workspace(const ClipLayout& layout);
void clip_gradients(float* grad, const ClipLayout& layout, const ClipConfig& c, const double* samples, double* ws,
                    Stream s = {});

// ---- dropout -------------------------------------------------------------------------------------
// Inverted dropout (philox.hpp): out[i] = in[i] * (kept ? 1 / (1 - rate) : 0), the mask a pure
// function of (key, i). The forward passes x, the backward dy with the same key: no mask is
// stored. rate in [0, 1); key.layer, key.rank < 2^16; n <= 2^34. in may equal out.
void dropout(const float* in, float* out, size_t n, float rate, const DropoutKey& key, Stream s = {});
// The same with key.step = state->iteration, read when the kernel runs.
void dropout(const float* in, float* out, size_t n, float rate, const DropoutKey& key, const StepState* state,
             Stream s = {});

// ---- batch normalization (batchnorm.hpp) -----------------------------------------------------------
// Training forward over [rows, C]: the batch's mean, biased variance and 1/sqrt(var + eps) into
// mean, var, invstd (C floats each), then y = gamma * (x - mean) * invstd + beta (ReLU'd if
// relu). ws: reduce_workspace(rows, C). rows >= 1.
void batchnorm_forward_training(const float* x, float* y, size_t rows, size_t C, const float* gamma, const float* beta,
                                float epsilon, bool relu, float* mean, float* var, float* invstd, double* ws,
                                Stream s = {});
// Inference forward: the same with the moving statistics.
void batchnorm_forward_inference(const float* x, float* y, size_t rows, size_t C, const float* gamma,
                                 const float* beta, float epsilon, bool relu, const float* moving_mean,
                                 const float* moving_var, Stream s = {});
// moving = moving * momentum + batch * (1 - momentum), for mean and variance; unless state
// (may be null) refuses the step in progress (refuse_invalid).
void batchnorm_update_moving(float* moving_mean, float* moving_var, const float* mean, const float* var, size_t C,
                             float momentum, const StepState* state = nullptr, Stream s = {});
// Backward from the training forward's mean and invstd: dgamma = sum dv * xhat, dbeta = sum dv
// (either may be null), and dx (may be null, may equal dy), with dv = dy masked by relu_y > 0
// when relu_y (the fused ReLU's output) is not null. ws: reduce_workspace(rows, C).
void batchnorm_backward(const float* x, const float* relu_y, const float* dy, float* dx, size_t rows, size_t C,
                        const float* gamma, const float* mean, const float* invstd, float* dgamma, float* dbeta,
                        double* ws, Stream s = {});
// Synchronized batch normalization (statistics over every replica's batch, docs/layers.md):
// the training forward and the backward in two halves each, around the caller's sum over the
// replicas of `sums` (2C + 1 doubles in the pointers' memory: [C channel sums, C channel sums,
// rows]). Unsummed (one replica), the halves give the bits of the calls above.
// Forward: sums = [sum x, sum x^2, rows] (ws: reduce_workspace(rows, C)); then the summed
// batch's mean, var, invstd and y as batchnorm_forward_training's.
void batchnorm_forward_sums(const float* x, size_t rows, size_t C, double* sums, double* ws, Stream s = {});
void batchnorm_forward_normalize(const float* x, float* y, size_t rows, size_t C, const float* gamma,
                                 const float* beta, float epsilon, bool relu, const double* sums, float* mean,
                                 float* var, float* invstd, Stream s = {});
// Backward: sums = [sum dv, sum dv * xhat, rows] and this replica's dgamma, dbeta (those local
// sums; either may be null); then dx from the summed sums (which it overwrites).
void batchnorm_backward_sums(const float* x, const float* relu_y, const float* dy, size_t rows, size_t C,
                             const float* mean, const float* invstd, float* dgamma, float* dbeta, double* sums,
                             double* ws, Stream s = {});
void batchnorm_backward_dx(const float* x, const float* relu_y, const float* dy, float* dx, size_t rows, size_t C,
                           const float* gamma, const float* mean, const float* invstd, double* sums, Stream s = {});

// ---- windows over NHWC images (window.hpp) ---------------------------------------------------------
// conv2d as a GEMM: col [g.positions(), g.col_width()] from x [g.batch, H, W, C] (zeros in the
// padding), and col2im, its adjoint: dx[n, y, x, c] = the sum of the col entries im2col read from
// it (overwrites dx). Dimensions must be >= 1, strides >= 1, Ho/Wo those of the schema.
void im2col(const float* x, float* col, const WindowShape& g, Stream s = {});
void col2im(const float* col, float* dx, const WindowShape& g, Stream s = {});
// conv2d's kernel gradient without a GEMM: dw[ky, kx, c, f] (Keras' layout, overwritten) = the
// sum over every position p of x under (ky, kx, c) at p times dy[p, f], products exact and sums
// in the stream's accumulator in a shape-only order (window.hpp, ConvFilterPartials):
// deterministic, and bit-identical between the two builds. For thin windows (thin_window), where it is the fastest deterministic
// way; any window works, x and dy each below 2^31 elements. ws: conv_filter_grad_workspace(g,
// filters) doubles.
void conv_filter_grad(const float* x, const float* dy, const WindowShape& g, size_t filters, float* dw, double* ws,
                      Stream s = {});
// Global average pooling: y[n, c] = mean over the hw positions of x[n, :, c]; the backward
// dx[n, p, c] = dy[n, c] / hw (overwrites dx).
void global_avg_pool_forward(const float* x, float* y, size_t batch, size_t hw, size_t C, Stream s = {});
void global_avg_pool_backward(const float* dy, float* dx, size_t batch, size_t hw, size_t C, Stream s = {});
// Max pooling with the window g (kh x kw the pool size): y [g.batch, Ho, Wo, C] and arg, the
// index within its sample of each output's input (the first maximum); the backward routes dy to
// those inputs (overwrites dx). H * W * C < 2^31.
void max_pool_forward(const float* x, float* y, int32_t* arg, const WindowShape& g, Stream s = {});
void max_pool_backward(const float* dy, const int32_t* arg, float* dx, const WindowShape& g, Stream s = {});
// Average pooling with the window g (avg_pool.hpp): each output the mean of the window's
// positions inside the input (Keras' 'same' leaves the padding out of the count); the backward
// spreads dy over them (overwrites dx).
void avg_pool_forward(const float* x, float* y, const WindowShape& g, Stream s = {});
void avg_pool_backward(const float* dy, float* dx, const WindowShape& g, Stream s = {});

// ---- transformer layers (norm.hpp, attention.hpp, embedding.hpp) ------------------------------------
// Layer normalization over the last axis of [rows, F]: y = (x - mean) * invstd * gamma + beta per
// row (gamma, beta may be null), mean and invstd (rows floats each) kept for the backward.
void layer_norm_forward(const float* x, float* y, size_t rows, size_t F, const float* gamma, const float* beta,
                        float epsilon, float* mean, float* invstd, Stream s = {});
// dgamma = sum dy * xhat, dbeta = sum dy over the rows (either may be null; ws:
// reduce_workspace(rows, F)), and dx (may be null, may equal dy).
void layer_norm_backward(const float* x, const float* dy, float* dx, size_t rows, size_t F, const float* gamma,
                         const float* mean, const float* invstd, float* dgamma, float* dbeta, double* ws,
                         Stream s = {});
// Attention's layouts: split_heads [batch, seq, heads, dim] -> [batch, heads, seq, dim], and
// merge_heads back; src and dst must not overlap.
void split_heads(const float* src, float* dst, size_t batch, size_t seq, size_t heads, size_t dim, Stream s = {});
void merge_heads(const float* src, float* dst, size_t batch, size_t seq, size_t heads, size_t dim, Stream s = {});
// Embedding: y[r, :] = table[x[r], :] for x [rows] of indices carried as floats, table
// [input_dim, dim]; an index that is not an integer in [0, input_dim) gives a zero row and, if
// invalid is not null, counts in *invalid (ws: reduce_workspace(rows, 1)). rows < 2^31.
void embedding_forward(const float* x, const float* table, float* y, size_t rows, size_t input_dim, size_t dim,
                       double* invalid, double* ws, Stream s = {});
// dtable [input_dim, dim] (overwritten) = for each row v, the sum of dy[r, :] over the rows with
// index v, in row order (invalid indices add nothing). ws: embedding_backward_workspace(rows).
inline size_t embedding_backward_workspace(size_t rows) { return 2 * rows; }
void embedding_backward(const float* x, const float* dy, float* dtable, size_t rows, size_t input_dim, size_t dim,
                        int32_t* ws, Stream s = {});
// Position embedding: y [batch, seq, dim] = table[:seq] for every sample; the backward writes
// the whole table's gradient dtable [length, dim]: the sum over the batch for the first seq
// rows, 0 after. ws: reduce_workspace(batch, seq * dim).
void position_embedding_forward(const float* table, float* y, size_t batch, size_t seq, size_t dim, Stream s = {});
void position_embedding_backward(const float* dy, float* dtable, size_t batch, size_t seq, size_t length, size_t dim,
                                 double* ws, Stream s = {});

}  // namespace skyforge::kernels
