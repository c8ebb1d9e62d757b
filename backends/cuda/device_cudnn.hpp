// cuDNN's convolutions in the CUDA build (device_cudnn.cpp): the policy that admits an algorithm
// (DeviceOptions' tf32, deterministic, autotune, conv_layout) and the plan kept per conv2d window,
// with the algorithms chosen for it and, with autotune or a survey, what each candidate took.
// Device::Impl holds the plans (device_cuda_impl.hpp); device_profile.cpp describes them.
#pragma once

#include "device.hpp"

#include <cudnn.h>

#include <cstddef>
#include <vector>

namespace skyforge::cuda {

// How cuDNN's convolution algorithms are chosen: the device's options, and what follows from them.
struct ConvPolicy : DeviceOptions {
  bool nchw_only() const { return conv_layout == ConvLayout::nchw; }
  // Whether a direction may run in NCHW: pinned there, or timed against NHWC.
  bool may_nchw() const { return nchw_only() || (autotune && conv_layout == ConvLayout::automatic); }
  // The math type the descriptor is set to before asking: FMA (FP32), or tensor ops with tf32.
  cudnnMathType_t asked() const { return tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH; }
  // Whether a candidate may run: it succeeded, adds deterministically unless that is waived,
  // and computes in FP32 (or on TF32 tensor cores with tf32; never with FP16 down-conversion).
  bool admits(cudnnStatus_t status, cudnnDeterminism_t determinism, cudnnMathType_t m) const {
    const bool precise = m == CUDNN_FMA_MATH || (tf32 && (m == CUDNN_TENSOR_OP_MATH || m == CUDNN_DEFAULT_MATH));
    return status == CUDNN_STATUS_SUCCESS && (determinism == CUDNN_DETERMINISTIC || !deterministic) && precise;
  }
};

constexpr size_t kDnnWorkspace = size_t{64} << 20;

// The descriptors of one conv2d, NHWC float, and the algorithms chosen for it (each chosen at
// its first use), kept per window. cuDNN pads both sides alike, so a window whose trailing
// padding exceeds its leading one is not expressible (ok stays false).
struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  // The same window in NCHW (KCRS filters), made for autotune and surveys: cuDNN's algorithms
  // are timed in that layout too, and with autotune a direction may run in it, its tensors
  // transformed to NCHW scratch and back around the call (the engine's tensors are NHWC).
  // wk: the kernel as it lies in the parameters (Keras' kh, kw, C, F) described as an
  // (F, C, kh, kw) tensor with those strides; wt: the same dimensions packed (KCRS), so that
  // cudnnTransformTensor converts between the two.
  cudnnTensorDescriptor_t xc = nullptr, yc = nullptr, wk = nullptr, wt = nullptr;
  cudnnFilterDescriptor_t wc = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  bool ok = false;
  // One candidate cuDNN timed (cudnnFind*Ex): its name and algorithm, math type,
  // milliseconds, workspace, determinism, and whether the policy admits it.
  struct Timed {
    const char* name;
    int algo;
    cudnnMathType_t math;
    float ms;
    size_t memory;
    bool deterministic, admitted;
  };
  // An algorithm: not asked yet, none fits (the engine runs im2col + GEMM), or this one, with
  // the math type it was ranked or timed under (set on the descriptor before each call);
  // timed: chosen by its time (autotune), else by cuDNN's heuristics; nchw: run in NCHW, with
  // its tensors transformed around the call (autotune only). nhwc, nchw_timed: every candidate
  // that ran in each layout, fastest first, and transforms_ms what the NCHW transforms of
  // this direction took (< 0: not timed) (autotune, survey).
  template <class Algo>
  struct Choice {
    bool asked = false, found = false, timed = false, nchw = false;
    Algo algo{};
    cudnnMathType_t math = CUDNN_FMA_MATH;
    std::vector<Timed> nhwc, nchw_timed;
    float transforms_ms = -1;
  };
  Choice<cudnnConvolutionFwdAlgo_t> forward;
  Choice<cudnnConvolutionBwdFilterAlgo_t> filter;
  Choice<cudnnConvolutionBwdDataAlgo_t> data;
  // The engine takes the kernel gradient itself (Device::conv_backward without dw: a thin
  // window, kernels::conv_filter_grad); reduction_ms: that reduction's time, in a survey.
  bool filter_by_engine = false;
  float reduction_ms = -1;
  // The engine's im2col + GEMM backward (conv_backward_gemm) for the directions asked of the
  // first backward call, timed with autotune or in a survey (gemm_ms; < 0: not timed) beside what
  // cuDNN's chosen algorithms took (cudnn_ms; < 0: not all of them timed); by_gemm: autotune
  // found it faster, and conv_backward leaves the backward to the engine.
  bool gemm_asked = false, by_gemm = false;
  float gemm_ms = -1, cudnn_ms = -1;
  size_t x_elems = 0, y_elems = 0;  // n·C·H·W, n·F·Ho·Wo
  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  // Not in the constructor: a failure there would leave what it made to no destructor.
  void setup(const kernels::WindowShape& g, size_t filters, const ConvPolicy& policy);
  ~ConvPlan();
};

// The names cuDNN's algorithms go by in describe_convolutions() (device_profile.cpp).
const char* fwd_algo_name(cudnnConvolutionFwdAlgo_t a);
const char* filter_algo_name(cudnnConvolutionBwdFilterAlgo_t a);
const char* data_algo_name(cudnnConvolutionBwdDataAlgo_t a);

}  // namespace skyforge::cuda
