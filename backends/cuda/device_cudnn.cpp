// The CUDA build's conv2d on cuDNN (device.hpp, docs/compute-backends.md "Convolution
// algorithms"): a plan per window (device_cudnn.hpp), each direction's algorithm and layout chosen
// once under the policy (cuDNN's heuristics, or with autotune the fastest candidate timed, the
// engine's im2col + GEMM backward among them), and the calls, in NHWC or around NCHW transforms.
#include "device_cuda_impl.hpp"

#include <vector>

namespace skyforge::cuda {

void ConvPlan::setup(const kernels::WindowShape& g, size_t filters, const ConvPolicy& policy) {
  const int64_t trail_h = int64_t{g.Ho - 1} * g.sh + g.kh - g.H - g.pt;
  const int64_t trail_w = int64_t{g.Wo - 1} * g.sw + g.kw - g.W - g.pl;
  if (trail_h > g.pt || trail_w > g.pl) return;
  const int n = static_cast<int>(g.batch), f = static_cast<int>(filters), C = static_cast<int>(g.C);
  const int H = static_cast<int>(g.H), W = static_cast<int>(g.W), Ho = static_cast<int>(g.Ho),
            Wo = static_cast<int>(g.Wo), kh = static_cast<int>(g.kh), kw = static_cast<int>(g.kw);
  x_elems = size_t{g.batch} * g.C * g.H * g.W;
  y_elems = size_t{g.batch} * filters * g.Ho * g.Wo;
  auto tensors = [&](cudnnTensorFormat_t layout, cudnnTensorDescriptor_t& tx, cudnnTensorDescriptor_t& ty,
                     cudnnFilterDescriptor_t& tw) {
    check(cudnnCreateTensorDescriptor(&tx), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&ty), "cudnnCreateTensorDescriptor");
    check(cudnnCreateFilterDescriptor(&tw), "cudnnCreateFilterDescriptor");
    check(cudnnSetTensor4dDescriptor(tx, layout, CUDNN_DATA_FLOAT, n, C, H, W), "cudnnSetTensor4dDescriptor");
    check(cudnnSetTensor4dDescriptor(ty, layout, CUDNN_DATA_FLOAT, n, f, Ho, Wo), "cudnnSetTensor4dDescriptor");
    check(cudnnSetFilter4dDescriptor(tw, CUDNN_DATA_FLOAT, layout, f, C, kh, kw), "cudnnSetFilter4dDescriptor");
  };
  tensors(CUDNN_TENSOR_NHWC, x, y, w);
  if (policy.survey || policy.may_nchw()) {
    tensors(CUDNN_TENSOR_NCHW, xc, yc, wc);
    check(cudnnCreateTensorDescriptor(&wk), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&wt), "cudnnCreateTensorDescriptor");
    // Keras' kernel[i][j][c][f] is at ((i·kw + j)·C + c)·F + f.
    check(cudnnSetTensor4dDescriptorEx(wk, CUDNN_DATA_FLOAT, f, C, kh, kw, 1, f, kw * C * f, C * f),
          "cudnnSetTensor4dDescriptorEx");
    check(cudnnSetTensor4dDescriptor(wt, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, f, C, kh, kw),
          "cudnnSetTensor4dDescriptor");
  }
  check(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
  check(cudnnSetConvolution2dDescriptor(conv, static_cast<int>(g.pt), static_cast<int>(g.pl),
                                        static_cast<int>(g.sh), static_cast<int>(g.sw), 1, 1,
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        "cudnnSetConvolution2dDescriptor");
  // Plain FP32 unless TF32 is allowed (then cuDNN ranks tensor-op algorithms too).
  check(cudnnSetConvolutionMathType(conv, policy.asked()), "cudnnSetConvolutionMathType");
  int on = 0, oc = 0, oh = 0, ow = 0;
  check(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &on, &oc, &oh, &ow),
        "cudnnGetConvolution2dForwardOutputDim");
  ok = oh == Ho && ow == Wo;
}
ConvPlan::~ConvPlan() {
  if (conv) cudnnDestroyConvolutionDescriptor(conv);
  for (cudnnFilterDescriptor_t d : {w, wc})
    if (d) cudnnDestroyFilterDescriptor(d);
  for (cudnnTensorDescriptor_t d : {x, y, xc, yc, wk, wt})
    if (d) cudnnDestroyTensorDescriptor(d);
}

namespace {

// One direction of a convolution as cuDNN's legacy API has it: every function takes its three
// descriptors in the same order (a, b, the convolution, d), and Find*Ex their buffers beside them.
template <class A, class B, class D, class Algo, class Perf>
struct ConvDirection {
  cudnnStatus_t (*heuristic)(cudnnHandle_t, A, B, cudnnConvolutionDescriptor_t, D, int, int*, Perf*);  // _v7
  cudnnStatus_t (*find)(cudnnHandle_t, A, const void*, B, const void*, cudnnConvolutionDescriptor_t, D, void*, int,
                        int*, Perf*, void*, size_t);  // Find*Ex
  cudnnStatus_t (*workspace)(cudnnHandle_t, A, B, cudnnConvolutionDescriptor_t, D, Algo, size_t*);
  const char* (*name)(Algo);
};
const ConvDirection<cudnnTensorDescriptor_t, cudnnFilterDescriptor_t, cudnnTensorDescriptor_t, cudnnConvolutionFwdAlgo_t,
                    cudnnConvolutionFwdAlgoPerf_t>
    kForward{cudnnGetConvolutionForwardAlgorithm_v7, cudnnFindConvolutionForwardAlgorithmEx,
             cudnnGetConvolutionForwardWorkspaceSize, fwd_algo_name};
const ConvDirection<cudnnTensorDescriptor_t, cudnnTensorDescriptor_t, cudnnFilterDescriptor_t,
                    cudnnConvolutionBwdFilterAlgo_t, cudnnConvolutionBwdFilterAlgoPerf_t>
    kFilter{cudnnGetConvolutionBackwardFilterAlgorithm_v7, cudnnFindConvolutionBackwardFilterAlgorithmEx,
            cudnnGetConvolutionBackwardFilterWorkspaceSize, filter_algo_name};
const ConvDirection<cudnnFilterDescriptor_t, cudnnTensorDescriptor_t, cudnnTensorDescriptor_t,
                    cudnnConvolutionBwdDataAlgo_t, cudnnConvolutionBwdDataAlgoPerf_t>
    kData{cudnnGetConvolutionBackwardDataAlgorithm_v7, cudnnFindConvolutionBackwardDataAlgorithmEx,
          cudnnGetConvolutionBackwardDataWorkspaceSize, data_algo_name};

// Where one call of a direction reads and writes: the descriptors in NHWC (the engine's layout)
// and in NCHW (null unless a survey or the layout policy may use them), the buffers, cuDNN's
// workspace.
template <class A, class B, class D>
struct ConvCall {
  A a, a_nchw;
  B b, b_nchw;
  D d, d_nchw;
  const void* pa;
  const void* pb;
  void* pd;
  void* ws;
  size_t ws_bytes;
};

// One direction's algorithm and layout, chosen once per plan (docs/compute-backends.md,
// "Convolution algorithms"). can_time: cuDNN may run kernels now (not inside a capture; the
// device idle). With autotune, the fastest admitted candidate Find*Ex timed over the call's own
// buffers (what it writes there is overwritten by the call that follows): in NHWC, or in NCHW
// when the layout is pinned there, or (auto) when that candidate's time plus nchw_transforms()
// (the milliseconds this direction's tensors take to reach NCHW and come back, -1 where they
// cannot) is less. Else, or when none ran, the first admitted one the heuristic ranks, in NHWC
// or the pinned NCHW, whose workspace, asked of cuDNN for it (the heuristic's figure is an
// estimate), fits. A survey times every candidate in both layouts, and the transforms, and only
// records them.
template <class A, class B, class D, class Algo, class Perf, class Transforms>
void choose(ConvPlan::Choice<Algo>& c, const ConvPolicy& p, bool can_time, cudnnHandle_t h,
            cudnnConvolutionDescriptor_t conv, const ConvDirection<A, B, D, Algo, Perf>& dir,
            const ConvCall<A, B, D>& call, const Transforms& nchw_transforms) {
  if (c.asked) return;
  c.asked = true;
  constexpr int kMax = 16;  // more than cuDNN has algorithms in any direction, with math variants
  Perf perf[kMax];
  int n = 0;
  auto timed = [&](A a, B b, D d, std::vector<ConvPlan::Timed>& into) {
    n = 0;
    check(cudnnSetConvolutionMathType(conv, p.asked()), "cudnnSetConvolutionMathType");
    if (dir.find(h, a, call.pa, b, call.pb, conv, d, call.pd, kMax, &n, perf, call.ws, call.ws_bytes) !=
        CUDNN_STATUS_SUCCESS)
      n = 0;             // nothing timed: the heuristics decide
    cudaGetLastError();  // a candidate that failed to launch must not fail the next kernel's check
    for (int i = 0; i < n; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS)
        into.push_back({dir.name(perf[i].algo), static_cast<int>(perf[i].algo), perf[i].mathType, perf[i].time,
                        perf[i].memory, perf[i].determinism == CUDNN_DETERMINISTIC,
                        p.admits(perf[i].status, perf[i].determinism, perf[i].mathType)});
  };
  // The fastest admitted candidate that fits, or null.
  auto fastest = [](const std::vector<ConvPlan::Timed>& ts) {
    const ConvPlan::Timed* best = nullptr;
    for (const ConvPlan::Timed& t : ts)
      if (t.admitted && t.memory <= kDnnWorkspace && (!best || t.ms < best->ms)) best = &t;
    return best;
  };
  // Pinned to NCHW, the transforms are what the layout costs, not a reason against it.
  const bool nchw_only = p.nchw_only() && call.a_nchw;
  if (can_time && (p.autotune || p.survey)) {
    if (call.a_nchw) {
      timed(call.a_nchw, call.b_nchw, call.d_nchw, c.nchw_timed);
      c.transforms_ms = nchw_transforms();
    }
    if (!nchw_only || p.survey) timed(call.a, call.b, call.d, c.nhwc);
    if (p.autotune) {
      const ConvPlan::Timed* best = nchw_only ? nullptr : fastest(c.nhwc);
      if (const ConvPlan::Timed* other = p.may_nchw() ? fastest(c.nchw_timed) : nullptr;
          other && c.transforms_ms >= 0 && (nchw_only || !best || other->ms + c.transforms_ms < best->ms)) {
        best = other;
        c.nchw = true;
      }
      if (best) {
        c.found = c.timed = true;
        c.algo = static_cast<Algo>(best->algo);
        c.math = best->math;
        return;
      }
    }
  }
  // A heuristic that fails for this window leaves it to im2col + GEMM, as one with no fit does.
  n = 0;
  const A a = nchw_only ? call.a_nchw : call.a;
  const B b = nchw_only ? call.b_nchw : call.b;
  const D d = nchw_only ? call.d_nchw : call.d;
  check(cudnnSetConvolutionMathType(conv, p.asked()), "cudnnSetConvolutionMathType");
  if (dir.heuristic(h, a, b, conv, d, kMax, &n, perf) != CUDNN_STATUS_SUCCESS) return;
  for (int i = 0; i < n; ++i) {
    if (!p.admits(perf[i].status, perf[i].determinism, perf[i].mathType)) continue;
    size_t bytes = 0;
    check(cudnnSetConvolutionMathType(conv, perf[i].mathType), "cudnnSetConvolutionMathType");
    if (dir.workspace(h, a, b, conv, d, perf[i].algo, &bytes) == CUDNN_STATUS_SUCCESS && bytes <= kDnnWorkspace) {
      c.found = true;
      c.nchw = nchw_only;
      c.algo = perf[i].algo;
      c.math = perf[i].mathType;
      return;
    }
  }
}

// What a direction's chosen algorithm took where its candidates were timed (autotune, survey),
// with its NCHW transforms, or -1.
template <class Algo>
float chosen_ms(const ConvPlan::Choice<Algo>& c) {
  if (!c.found || (c.nchw && c.transforms_ms < 0)) return -1;
  for (const ConvPlan::Timed& t : c.nchw ? c.nchw_timed : c.nhwc)
    if (t.algo == static_cast<int>(c.algo) && t.math == c.math) return t.ms + (c.nchw ? c.transforms_ms : 0.f);
  return -1;
}

// The milliseconds work() takes on the stream: its second run (the first loads what it loads).
template <class Work>
float time_ms(cudaStream_t stream, const Work& work) {
  work();
  struct Events {
    cudaEvent_t from = nullptr, to = nullptr;
    ~Events() {
      if (from) cudaEventDestroy(from);
      if (to) cudaEventDestroy(to);
    }
  } e;
  check(cudaEventCreate(&e.from), "cudaEventCreate");
  check(cudaEventCreate(&e.to), "cudaEventCreate");
  check(cudaEventRecord(e.from, stream), "cudaEventRecord");
  work();
  check(cudaEventRecord(e.to, stream), "cudaEventRecord");
  check(cudaEventSynchronize(e.to), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, e.from, e.to), "cudaEventElapsedTime");
  return ms;
}

// The device milliseconds of a direction's NCHW transforms, work() on the stream: its second
// run (the first loads what it loads, and grows the scratch), with the device idle (after
// may_time(): nothing else is waited for); -1 where they cannot be done (cuDNN refuses them,
// or the scratch does not fit in memory): then NCHW is no option for the direction.
template <class Work>
float transforms_ms(cudaStream_t stream, const Work& work) {
  try {
    return time_ms(stream, work);
  } catch (const Error&) {
    return -1;
  }
}

}  // namespace

float* Device::Impl::nchw_x(const ConvPlan& c) {
  grow(nchw_in, c.x_elems * sizeof(float), "conv2d NCHW scratch");
  return static_cast<float*>(nchw_in.p);
}
float* Device::Impl::nchw_y(const ConvPlan& c) {
  grow(nchw_out, c.y_elems * sizeof(float), "conv2d NCHW scratch");
  return static_cast<float*>(nchw_out.p);
}
void Device::Impl::transform(cudnnTensorDescriptor_t sd, const void* src, cudnnTensorDescriptor_t dd, void* dst) {
  const float one = 1.f, zero = 0.f;
  check(cudnnTransformTensor(dnn, &one, sd, src, &zero, dd, dst), "cudnnTransformTensor");
}

// A window's plan, with cuDNN's workspace and the KRSC kernel its calls use grown to fit (outside
// captures only: every shape runs eager first), or null where cuDNN cannot express the window.
ConvPlan* Device::Impl::conv_setup(const kernels::WindowShape& g, size_t filters) {
  ConvPlan& c = conv_plans.get({g.batch, g.H, g.W, g.C, g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, g.Ho, g.Wo, filters},
                               [&](ConvPlan& plan) { plan.setup(g, filters, options); });
  if (!c.ok) return nullptr;
  grow(dnn_workspace, kDnnWorkspace, "conv2d workspace");  // once: every algorithm taken fits
  grow(kernel_krsc, g.col_width() * filters * sizeof(float), "conv2d kernel");
  return &c;
}

// Whether cuDNN may run kernels to time its candidates now (autotune, survey): never inside a
// capture (a plan is new there only if the cache evicted it); first, the device's work is
// waited for, watched, as Find*Ex's own synchronizations would not be.
bool Device::Impl::may_time() {
  const ConvPolicy& p = options;
  if (capturing || !(p.autotune || p.survey)) return false;
  quiesce("waiting for the device before timing cuDNN's convolution algorithms");
  return true;
}

bool Device::conv_forward(const kernels::WindowShape& g, size_t filters, const float* x, const float* w, float* y) {
  Impl& d = *impl_;
  if (d.bf16()) return false;  // im2col + the bf16 GEMM (device.hpp)
  if (!d.dnn) {
    d.no_capture("the first conv2d");
    check(cudaSetDevice(d.device), "cudaSetDevice");
    check(cudnnCreate(&d.dnn), "cudnnCreate");
    check(cudnnSetStream(d.dnn, d.stream), "cudnnSetStream");
  }
  ConvPlan* plan = d.conv_setup(g, filters);
  if (!plan) return false;
  ConvPlan& c = *plan;
  auto* krsc = static_cast<float*>(d.kernel_krsc.p);
  void* ws = d.dnn_workspace.p;
  const size_t wsb = d.dnn_workspace.bytes;
  if (!c.forward.asked)
    choose(c.forward, d.options, d.may_time(), d.dnn, c.conv, kForward,
           ConvCall<cudnnTensorDescriptor_t, cudnnFilterDescriptor_t, cudnnTensorDescriptor_t>{
               c.x, c.xc, c.w, c.wc, c.y, c.yc, x, krsc, y, ws, wsb},
           [&] {  // x and the kernel to NCHW, y back (what it writes, the call below overwrites)
             return transforms_ms(d.stream, [&] {
               float *xc = d.nchw_x(c), *yc = d.nchw_y(c);
               d.transform(c.x, x, c.xc, xc);
               d.transform(c.wk, w, c.wt, krsc);
               d.transform(c.yc, yc, c.y, y);
             });
           });
  if (!c.forward.found) return false;
  const float one = 1.f, zero = 0.f;
  check(cudnnSetConvolutionMathType(c.conv, c.forward.math), "cudnnSetConvolutionMathType");
  if (c.forward.nchw) {
    float *xc = d.nchw_x(c), *yc = d.nchw_y(c);
    d.transform(c.x, x, c.xc, xc);
    d.transform(c.wk, w, c.wt, krsc);  // (kh, kw, C, F) -> (F, C, kh, kw)
    check(cudnnConvolutionForward(d.dnn, &one, c.xc, xc, c.wc, krsc, c.conv, c.forward.algo, ws, wsb, &zero, c.yc, yc),
          "cudnnConvolutionForward");
    d.transform(c.yc, yc, c.y, y);
    return true;
  }
  kernels::transpose(w, g.col_width(), filters, krsc, stream_);  // (kh, kw, C, F) -> (F, kh, kw, C)
  check(cudnnConvolutionForward(d.dnn, &one, c.x, x, c.w, krsc, c.conv, c.forward.algo, ws, wsb, &zero, c.y, y),
        "cudnnConvolutionForward");
  return true;
}

bool Device::conv_backward(const kernels::WindowShape& g, size_t filters, const float* x, const float* w,
                           const float* dy, float* dw, float* dx) {
  Impl& d = *impl_;
  if (!d.dnn) return false;
  ConvPlan* plan = d.conv_setup(g, filters);
  if (!plan) return false;
  ConvPlan& c = *plan;
  const size_t kkc = g.col_width();
  d.grow(d.grad_krsc, kkc * filters * sizeof(float), "conv2d kernel gradient");
  auto* krsc = static_cast<float*>(d.kernel_krsc.p);
  auto* dkrsc = static_cast<float*>(d.grad_krsc.p);
  void* ws = d.dnn_workspace.p;
  const size_t wsb = d.dnn_workspace.bytes;
  // The timing runs of the NCHW transforms write dw and dx from scratch: the calls below
  // overwrite both.
  // No dw: the engine takes the kernel gradient itself (a thin window: kernels::conv_filter_grad);
  // a survey still times cuDNN's candidates and the engine's reduction beside them.
  c.filter_by_engine = !dw;
  float* dw_timed = dw ? dw : krsc;  // where the survey's timing runs write (krsc is rewritten below)
  if (!c.filter.asked && (dw || d.options.survey))
    choose(c.filter, d.options, d.may_time(), d.dnn, c.conv, kFilter,
           ConvCall<cudnnTensorDescriptor_t, cudnnTensorDescriptor_t, cudnnFilterDescriptor_t>{
               c.x, c.xc, c.y, c.yc, c.w, c.wc, x, dy, dkrsc, ws, wsb},
           [&] {  // x and dy to NCHW, the kernel's gradient back
             return transforms_ms(d.stream, [&] {
               float *xc = d.nchw_x(c), *yc = d.nchw_y(c);
               d.transform(c.x, x, c.xc, xc);
               d.transform(c.y, dy, c.yc, yc);
               d.transform(c.wt, dkrsc, c.wk, dw_timed);
             });
           });
  // Timed where it takes milliseconds at most (up to 2^32 products; the convnet's widest window
  // at batch 1024, 1.0e9 of them, took 2.7 ms on an H100): a wide layer's would take seconds.
  constexpr size_t kMaxSurveyedProducts = size_t{1} << 32;
  if (d.options.survey && c.reduction_ms < 0 && g.positions() * kkc * filters <= kMaxSurveyedProducts &&
      kernels::conv_filter_grad_workspace(g, filters) * sizeof(double) <= wsb && d.may_time())
    c.reduction_ms = time_ms(
        d.stream, [&] { kernels::conv_filter_grad(x, dy, g, filters, dkrsc, static_cast<double*>(ws), stream_); });
  if (dx && !c.data.asked)
    choose(c.data, d.options, d.may_time(), d.dnn, c.conv, kData,
           ConvCall<cudnnFilterDescriptor_t, cudnnTensorDescriptor_t, cudnnTensorDescriptor_t>{
               c.w, c.wc, c.y, c.yc, c.x, c.xc, krsc, dy, dx, ws, wsb},
           [&] {  // dy and the kernel to NCHW, dx back
             return transforms_ms(d.stream, [&] {
               float *xc = d.nchw_x(c), *yc = d.nchw_y(c);
               d.transform(c.y, dy, c.yc, yc);
               d.transform(c.wk, w, c.wt, krsc);
               d.transform(c.xc, xc, c.x, dx);
             });
           });
  if (!c.gemm_asked) d.time_backward_gemm(*this, c, g, filters, x, w, dy, dw != nullptr, dx != nullptr);
  if (c.by_gemm) return false;  // the engine's im2col + GEMM, faster here
  if ((dw && !c.filter.found) || (dx && !c.data.found)) return false;
  const float one = 1.f, zero = 0.f;
  const bool filter_nchw = dw && c.filter.nchw, data_nchw = dx && c.data.nchw;
  float* xc = filter_nchw || data_nchw ? d.nchw_x(c) : nullptr;
  float* yc = filter_nchw || data_nchw ? d.nchw_y(c) : nullptr;
  if (dw) {
    check(cudnnSetConvolutionMathType(c.conv, c.filter.math), "cudnnSetConvolutionMathType");
    if (filter_nchw) {
      d.transform(c.x, x, c.xc, xc);
      d.transform(c.y, dy, c.yc, yc);  // also the data gradient's, below
      check(cudnnConvolutionBackwardFilter(d.dnn, &one, c.xc, xc, c.yc, yc, c.conv, c.filter.algo, ws, wsb, &zero,
                                           c.wc, dkrsc),
            "cudnnConvolutionBackwardFilter");
      d.transform(c.wt, dkrsc, c.wk, dw);  // (F, C, kh, kw) -> (kh, kw, C, F)
    } else {
      check(cudnnConvolutionBackwardFilter(d.dnn, &one, c.x, x, c.y, dy, c.conv, c.filter.algo, ws, wsb, &zero, c.w,
                                           dkrsc),
            "cudnnConvolutionBackwardFilter");
      kernels::transpose(dkrsc, filters, kkc, dw, stream_);  // (F, kh, kw, C) -> (kh, kw, C, F)
    }
  }
  if (!dx) return true;
  check(cudnnSetConvolutionMathType(c.conv, c.data.math), "cudnnSetConvolutionMathType");
  if (data_nchw) {
    if (!filter_nchw) d.transform(c.y, dy, c.yc, yc);
    d.transform(c.wk, w, c.wt, krsc);
    // dx in NCHW into the input-shaped scratch: the filter gradient, in stream order, is done with it.
    check(cudnnConvolutionBackwardData(d.dnn, &one, c.wc, krsc, c.yc, yc, c.conv, c.data.algo, ws, wsb, &zero, c.xc, xc),
          "cudnnConvolutionBackwardData");
    d.transform(c.xc, xc, c.x, dx);
    return true;
  }
  kernels::transpose(w, kkc, filters, krsc, stream_);
  check(cudnnConvolutionBackwardData(d.dnn, &one, c.w, krsc, c.y, dy, c.conv, c.data.algo, ws, wsb, &zero, c.x, dx),
        "cudnnConvolutionBackwardData");
  return true;
}

// With autotune or in a survey, at a window's first backward: the engine's im2col + GEMM for the
// directions asked (conv_backward_gemm: cuBLAS, deterministic), timed into scratch: a col of its
// own (at most kMaxGemmCol bytes: larger, or not allocatable, it is not a candidate; freed once
// timed: only eager work has seen it), the kernel-gradient scratch for dw, the NCHW input-shaped
// scratch for dx. Not where cuDNN has no algorithm (the engine takes the backward anyway). With
// autotune it replaces cuDNN's algorithms for this window when faster than all of them together,
// as timed.
void Device::Impl::time_backward_gemm(Device& dev, ConvPlan& c, const kernels::WindowShape& g, size_t filters,
                                      const float* x, const float* w, const float* dy, bool dw, bool dx) {
  Impl& d = *this;
  c.gemm_asked = true;
  constexpr size_t kMaxGemmCol = size_t{1} << 30;
  const size_t col_bytes = g.positions() * g.col_width() * sizeof(float);
  if (!(d.options.autotune || d.options.survey) || (!dw && !dx) || (dw && !c.filter.found) ||
      (dx && !c.data.found) || col_bytes > kMaxGemmCol || !d.may_time())
    return;
  float* dx_scratch = nullptr;
  try {
    if (dx) dx_scratch = d.nchw_x(c);
  } catch (const Error&) {
    return;  // no memory for it: cuDNN's algorithms stay
  }
  struct Col {
    void* p = nullptr;
    ~Col() {
      if (p) cudaFree(p);  // the stream is idle: time_ms waited for its last event
    }
  } col;
  if (cudaMalloc(&col.p, col_bytes) != cudaSuccess) {
    cudaGetLastError();  // out of memory is not sticky: cuDNN's algorithms stay
    col.p = nullptr;
    return;
  }
  auto* dw_scratch = dw ? static_cast<float*>(d.grad_krsc.p) : nullptr;
  c.gemm_ms = time_ms(d.stream, [&] {
    conv_backward_gemm(dev, g, filters, x, w, dy, static_cast<float*>(col.p), false, dw_scratch, dx_scratch);
  });
  const float f = dw ? chosen_ms(c.filter) : 0.f, dd = dx ? chosen_ms(c.data) : 0.f;
  if (f >= 0 && dd >= 0) c.cudnn_ms = f + dd;
  c.by_gemm = d.options.autotune && c.cudnn_ms >= 0 && c.gemm_ms < c.cudnn_ms;
}

}  // namespace skyforge::cuda
