// The device layer's CUDA build (device.hpp): CUDA runtime memory and one stream, cuBLAS for the
// GEMMs, NCCL for the gradient allreduce and the initial broadcast. Plain C++ against the CUDA
// headers (no device code here: the kernels are kernels/'s). docs/compute-backends.md.
#include "arch.hpp"
#include "device.hpp"

#include <cublasLt.h>
#include <cudnn.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

namespace skyforge::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  // Clear it: the runtime's last error would otherwise fail the next kernel launch's check
  // (for_n reads cudaGetLastError), e.g. after a bound set that did not fit.
  cudaGetLastError();
  throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e), SF_ERR);
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuda: ") + what + ": " + cublasGetStatusString(s), SF_ERR);
}
void check(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS) throw Error(std::string("cuda: ") + what + ": " + cudnnGetErrorString(st), SF_ERR);
}
void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("cuda: ") + what + ": " + ncclGetErrorString(r), SF_ERR);
}


// One fused GEMM's cuBLASLt descriptors and the algorithm its heuristic chose, made at a
// shape's first call and kept (the heuristic query costs more than a small GEMM). The bias
// pointer is the one attribute set per call.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // false: no fused algorithm for this shape, the call falls back
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

const char* fwd_algo_name(cudnnConvolutionFwdAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: return "implicit_gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: return "implicit_precomp_gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM: return "gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT: return "direct";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT: return "fft";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: return "fft_tiling";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: return "winograd";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: return "winograd_nonfused";
    default: return "?";
  }
}
const char* filter_algo_name(cudnnConvolutionBwdFilterAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0: return "algo_0";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1: return "algo_1";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT: return "fft";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3: return "algo_3";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED: return "winograd_nonfused";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING: return "fft_tiling";
    default: return "?";
  }
}
const char* data_algo_name(cudnnConvolutionBwdDataAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0: return "algo_0";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1: return "algo_1";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT: return "fft";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING: return "fft_tiling";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD: return "winograd";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED: return "winograd_nonfused";
    default: return "?";
  }
}

// How cuDNN's convolution algorithms are chosen (DeviceOptions).
struct ConvPolicy {
  bool tf32 = false, deterministic = true, autotune = false, survey = false;
  DeviceOptions::ConvLayout layout = DeviceOptions::ConvLayout::automatic;
  bool nchw_only() const { return layout == DeviceOptions::ConvLayout::nchw; }
  // Whether a direction may run in NCHW: pinned there, or timed against NHWC.
  bool may_nchw() const { return nchw_only() || (autotune && layout == DeviceOptions::ConvLayout::automatic); }
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
  void setup(const kernels::WindowShape& g, size_t filters, const ConvPolicy& policy) {
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
  ~ConvPlan() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    for (cudnnFilterDescriptor_t d : {w, wc})
      if (d) cudnnDestroyFilterDescriptor(d);
    for (cudnnTensorDescriptor_t d : {x, y, xc, yc, wk, wt})
      if (d) cudnnDestroyTensorDescriptor(d);
  }
};

// Plans by shape. A run meets a few shapes per layer (the batch, an epoch's last batch, the
// evaluation batch), so a deep model holds hundreds of plans; past kMaxPlans the cache starts
// over rather than grow without bound (plans hold host descriptors only, no device memory, and
// a captured graph keeps nothing of them). A plan re-made inside a capture cannot time cuDNN's
// candidates, so with autotune it takes the heuristics' choice: past kMaxPlans windows only.
template <class Plan, size_t N>
class PlanCache {
 public:
  using Key = std::array<uint64_t, N>;
  // The plan for key, made by make(plan) at its first use. A make that throws leaves no plan.
  template <class Make>
  Plan& get(const Key& key, const Make& make) {
    if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
    if (plans_.size() >= kMaxPlans) plans_.clear();
    auto plan = std::make_unique<Plan>();
    make(*plan);
    return *plans_.emplace(key, std::move(plan)).first->second;
  }
  void clear() { plans_.clear(); }
  template <class F>
  void for_each(const F& f) const {
    for (const auto& [key, plan] : plans_) f(key, *plan);
  }

 private:
  static constexpr size_t kMaxPlans = 1024;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

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

}  // namespace

struct Device::Impl {
  cudaStream_t stream = nullptr;       // every kernel, copy and GEMM
  cudaStream_t collectives = nullptr;  // NCCL's allreduces, overlapping the stream's backward
  cudaEvent_t ready = nullptr;         // recorded on `stream` before an allreduce
  cudaEvent_t summed = nullptr;        // recorded on `collectives` at join_collectives
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;  // the GEMMs with a fused epilogue
  cudnnHandle_t dnn = nullptr;    // conv2d (made at the first one)
  int device = 0;                 // this rank's GPU (cudaSetDevice is per thread)
  // cuDNN's workspace and the conv2d kernels in its layout (KRSC) and their gradients: grown
  // outside captures only (every shape runs eager once before it is captured). A grown-out
  // block is kept until the device goes: a graph captured earlier may still point at it, and
  // cudaFree would wait for the whole device (NCCL's stream too) unwatched.
  struct Grown {
    void* p = nullptr;
    size_t bytes = 0;
  };
  Grown dnn_workspace, kernel_krsc, grad_krsc;
  // A direction run in NCHW (autotune): its input-shaped and output-shaped tensors there
  // (the forward's x and y; the backward's x or dx, and dy), shared by every window.
  Grown nchw_in, nchw_out;
  std::vector<void*> retired;
  std::vector<cudaEvent_t> marks;  // SKYFORGE_CUDA_PROFILE's timing marks, reused
  size_t marks_used = 0;
  PlanCache<LtPlan, 9> lt_plans;       // gemm_bias_act's, by shape, epilogue and alignments
  PlanCache<ConvPlan, 13> conv_plans;  // conv2d's, by window and filters
  void grow(Grown& g, size_t bytes, const char* what) {
    if (g.bytes >= bytes) return;
    no_capture(what);
    if (g.p) retired.push_back(g.p);
    g.p = nullptr;
    g.bytes = 0;
    check(cudaMalloc(&g.p, bytes), "cudaMalloc (conv2d scratch)");
    g.bytes = bytes;
  }
  ncclComm_t nccl = nullptr;
  // upload_async's pinned staging buffers, used in turn; `done` is recorded after each copy.
  struct Staging {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t done = nullptr;
  };
  std::array<Staging, 4> staging{};
  size_t next_staging = 0;
  void* blas_workspace = nullptr;  // cuBLAS's, set once: a captured GEMM may not allocate
  size_t blas_workspace_bytes = 0;  // shared with cuBLASLt (one stream: never at once)
  bool capturing = false;
  DeviceOptions options;  // tf32 for cuBLAS and cuBLASLt; the convolution policy for cuDNN
  ConvPolicy conv_policy;
  // Graphs holding captured NCCL launches: ncclCommAbort waits until none is left, so an abort
  // destroys their executables first (a later replay of one fails).
  std::vector<cudaGraphExec_t*> live_graphs;
  void no_capture(const char* what) const {
    if (capturing)
      throw Error(std::string("cuda: ") + what + " while a step is being captured (it would wait for the device)",
                  SF_ERR);
  }
  bool failed = false;   // a collective failed or timed out: the communicator is aborted
  std::string failure;   // why, for every later call
  std::chrono::milliseconds timeout{300000};

  ~Impl() {
    if (nccl) {
      // A healthy communicator is finalized (its pending work flushed with the peers) within
      // the collective timeout; one that failed, or does not finalize in time, is aborted.
      bool clean = false;
      if (!failed) {
        const ncclResult_t r = ncclCommFinalize(nccl);
        if (r == ncclSuccess || r == ncclInProgress) {
          try {
            settle("ncclCommFinalize");
            clean = true;
          } catch (const std::exception&) {  // settle aborted it
          }
        }
      }
      if (nccl) (clean ? ncclCommDestroy : ncclCommAbort)(nccl);
    }
    for (cudaEvent_t e : marks) cudaEventDestroy(e);
    for (Staging& b : staging) {
      if (b.done) cudaEventDestroy(b.done);
      if (b.host) cudaFreeHost(b.host);
    }
    lt_plans.clear();
    conv_plans.clear();
    if (dnn) cudnnDestroy(dnn);
    for (Grown* g : {&dnn_workspace, &kernel_krsc, &grad_krsc, &nchw_in, &nchw_out})
      if (g->p) cudaFree(g->p);
    for (void* p : retired) cudaFree(p);
    if (lt) cublasLtDestroy(lt);
    if (blas) cublasDestroy(blas);
    if (blas_workspace) cudaFree(blas_workspace);
    if (summed) cudaEventDestroy(summed);
    if (ready) cudaEventDestroy(ready);
    if (collectives) cudaStreamDestroy(collectives);
    if (stream) cudaStreamDestroy(stream);
  }

  // The communicator is non-blocking (ncclConfig_t::blocking = 0). NCCL's rule: after a call
  // returns ncclInProgress, poll ncclCommGetAsyncError until ncclSuccess before any other NCCL
  // call or stream work that depends on it. Every wait is bounded by the collective timeout; a
  // lost peer ends in ncclCommAbort and an error, never in a hang, and the device refuses every
  // collective afterwards.
  // Ends a capture that is given up, keeping nothing of it. A failure between an allreduce's
  // fork of the collectives stream and join_collectives would leave the capture unjoined
  // (cudaErrorStreamCaptureUnjoined, and the stream still capturing): join it first.
  void end_partial_capture() noexcept {
    if (!capturing) return;
    capturing = false;
    if (collectives && cudaEventRecord(summed, collectives) == cudaSuccess) cudaStreamWaitEvent(stream, summed, 0);
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
    cudaGetLastError();  // a failed capture leaves its error behind
  }
  [[noreturn]] void abort_nccl(const std::string& why) {
    // The partial graph holds NCCL launches too, and ncclCommAbort waits for every graph that
    // references the communicator: end it first.
    end_partial_capture();
    for (cudaGraphExec_t* exec : live_graphs)
      if (*exec) cudaGraphExecDestroy(*exec), *exec = nullptr;
    if (nccl) ncclCommAbort(nccl);
    nccl = nullptr;
    failed = true;
    failure = "cuda: " + why + "; the NCCL communicator was aborted (a lost or stuck peer?)";
    throw Error(failure, SF_ERR);
  }
  void usable() const {
    if (failed) throw Error(failure + " (earlier)", SF_ERR);
  }
  void pause(int& spins) {
    if (++spins < 1000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  // Until NCCL's state is ncclSuccess (a call returned ncclInProgress).
  void settle(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int spins = 0;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(nccl, &state);
      if (r != ncclSuccess) abort_nccl(std::string(what) + ": ncclCommGetAsyncError: " + ncclGetErrorString(r));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) abort_nccl(std::string(what) + ": NCCL reported " + ncclGetErrorString(state));
      if (std::chrono::steady_clock::now() > deadline)
        abort_nccl(std::string(what) + ": not done after the collective timeout of " +
                   std::to_string(timeout.count() / 1000.0) + " s");
      pause(spins);
    }
  }
  // An NCCL call's result: an error aborts; ncclInProgress is waited out.
  void check_nccl(ncclResult_t r, const char* what) {
    if (r == ncclInProgress) return settle(what);
    if (r != ncclSuccess)
      abort_nccl(std::string(what) + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(nccl) + ")");
  }
  // In place on the collectives stream, after everything `stream` has been given so far.
  void allreduce(void* p, size_t n, ncclDataType_t type) {
    usable();
    if (!nccl || n == 0) return;
    check(cudaEventRecord(ready, stream), "cudaEventRecord");
    check(cudaStreamWaitEvent(collectives, ready, 0), "cudaStreamWaitEvent");
    check_nccl(ncclAllReduce(p, p, n, type, ncclSum, nccl, collectives), "ncclAllReduce");
  }
  // Until the stream is done, watching NCCL meanwhile (a collective on it may wait on a peer).
  void wait_stream(const char* what) {
    wait_until([this] { return cudaStreamQuery(stream); }, what);
  }
  // Until both streams are done, watched the same way: before a call that may wait for the
  // whole device unwatched (cuDNN's Find*Ex times its candidates with synchronizations).
  void quiesce(const char* what) {
    wait_stream(what);
    if (nccl) wait_until([this] { return cudaStreamQuery(collectives); }, what);
  }
  bool may_time();
  ConvPlan* conv_setup(const kernels::WindowShape& g, size_t filters);
  void time_backward_gemm(Device& dev, ConvPlan& c, const kernels::WindowShape& g, size_t filters, const float* x,
                          const float* w, const float* dy, bool dw, bool dx);
  // The NCHW scratch for a window's input-shaped and output-shaped tensors.
  float* nchw_x(const ConvPlan& c) {
    grow(nchw_in, c.x_elems * sizeof(float), "conv2d NCHW scratch");
    return static_cast<float*>(nchw_in.p);
  }
  float* nchw_y(const ConvPlan& c) {
    grow(nchw_out, c.y_elems * sizeof(float), "conv2d NCHW scratch");
    return static_cast<float*>(nchw_out.p);
  }
  // dst (described by dd) = src (described by sd): the same dimensions, another layout.
  void transform(cudnnTensorDescriptor_t sd, const void* src, cudnnTensorDescriptor_t dd, void* dst) {
    const float one = 1.f, zero = 0.f;
    check(cudnnTransformTensor(dnn, &one, sd, src, &zero, dd, dst), "cudnnTransformTensor");
  }
  // The device milliseconds of a direction's NCHW transforms, work() on the stream: its second
  // run (the first loads what it loads, and grows the scratch), with the device idle (after
  // may_time(): nothing else is waited for); -1 where they cannot be done (cuDNN refuses them,
  // or the scratch does not fit in memory): then NCHW is no option for the direction.
  template <class Work>
  float transforms_ms(const Work& work) {
    try {
      return time_ms(work);
    } catch (const Error&) {
      return -1;
    }
  }
  template <class Work>
  float time_ms(const Work& work) {
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
  // Until query() stops saying cudaErrorNotReady (a stream or an event of it), the same way.
  template <class Query>
  void wait_until(const Query& query, const char* what) {
    if (!nccl && !failed) {  // one rank: nothing can hang on a peer
      for (int spins = 0;;) {
        const cudaError_t e = query();
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) check(e, what);
        pause(spins);
      }
    }
    usable();
    settle(what);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int spins = 0;
    for (;;) {
      const cudaError_t e = query();
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) {
        failed = true;  // a CUDA error on the stream: the destructor must not finalize with peers
        check(e, what);
      }
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(nccl, &state) != ncclSuccess || (state != ncclSuccess && state != ncclInProgress))
        abort_nccl(std::string(what) + ": NCCL reported " + ncclGetErrorString(state));
      if (std::chrono::steady_clock::now() > deadline)
        abort_nccl(std::string(what) + ": not done after the collective timeout of " +
                   std::to_string(timeout.count() / 1000.0) + " s");
      pause(spins);
    }
  }
};

// The runtime's first call fails without a usable driver (cudaErrorInsufficientDriver, or no
// libcuda at all) and with cudaErrorNoDevice where the driver sees no GPU (none, or
// CUDA_VISIBLE_DEVICES naming none): the second is "no device", not a driver problem. A device
// runs this build when CMAKE_CUDA_ARCHITECTURES carries code for it (arch.hpp).
void Device::probe() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0))
    throw Error("cuda: no CUDA device visible (CUDA_VISIBLE_DEVICES?)", SF_ERR_UNSUPPORTED);
  if (e != cudaSuccess)
    throw Error(std::string("cuda: no usable CUDA driver (") + cudaGetErrorString(e) + ")", SF_ERR_UNSUPPORTED);
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  if (auto why = arch_refusal(prop.major, prop.minor, prop.name, {SKYFORGE_CUDA_REAL_ARCHS}, {SKYFORGE_CUDA_PTX_ARCHS},
                              SKYFORGE_CUDA_ARCHS))
    throw Error(*why, SF_ERR_UNSUPPORTED);
}

namespace {
// Where a rank's GPU is: its host and PCI bus id, fixed-size for an allgather.
struct GpuPlace {
  char host[64] = {};
  char bus[32] = {};
};
}  // namespace

Device::Device(const Communicator& comm, const Host& host, const DeviceOptions& options)
    : impl_(std::make_unique<Impl>()) {
  probe();
  impl_->options = options;
  impl_->conv_policy = {options.tf32, options.deterministic, options.autotune, options.survey, options.conv_layout};
  impl_->timeout =
      std::chrono::milliseconds(static_cast<int64_t>(std::max(options.collective_timeout_s, 0.001) * 1000.0));
  // One GPU per rank. The local provider gives each node its own (CUDA_VISIBLE_DEVICES), so a
  // node sees one and uses device 0; where a process sees several, its local rank picks one
  // (the rank, off a pool: several ranks in one process, as `skyforge backend-check` makes).
  int count = 1;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  uint32_t local = comm.rank();
  if (host.on_node()) local = host.instance_info().local_rank;
  const int device = static_cast<int>(local % static_cast<uint32_t>(count));
  impl_->device = device;
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_.handle = impl_->stream;
  check(cublasCreate(&impl_->blas), "cublasCreate");
  check(cublasSetStream(impl_->blas, impl_->stream), "cublasSetStream");
  check(cublasSetMathMode(impl_->blas, options.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  // A workspace of its own for cuBLAS (32 MiB, what NVIDIA advises for Hopper), so that no GEMM
  // allocates while a step is captured as a graph.
  constexpr size_t kBlasWorkspace = size_t{32} << 20;
  check(cudaMalloc(&impl_->blas_workspace, kBlasWorkspace), "cudaMalloc (cuBLAS workspace)");
  check(cublasSetWorkspace(impl_->blas, impl_->blas_workspace, kBlasWorkspace), "cublasSetWorkspace");
  impl_->blas_workspace_bytes = kBlasWorkspace;
  check(cublasLtCreate(&impl_->lt), "cublasLtCreate");
  if (comm.size() <= 1) return;

  // NCCL cannot put two ranks on one GPU: every rank learns where every other one is, and all
  // refuse together (a refusal on one rank alone would leave the others waiting in NCCL's init).
  GpuPlace mine;
  gethostname(mine.host, sizeof mine.host - 1);
  check(cudaDeviceGetPCIBusId(mine.bus, sizeof mine.bus, device), "cudaDeviceGetPCIBusId");
  std::vector<GpuPlace> all(comm.size());
  comm.allgather(&mine, sizeof mine, all.data());
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = a + 1; b < all.size(); ++b)
      if (std::strcmp(all[a].host, all[b].host) == 0 && std::strcmp(all[a].bus, all[b].bus) == 0)
        throw Error("cuda: ranks " + std::to_string(a) + " and " + std::to_string(b) + " would share GPU " + all[a].bus +
                        " on " + all[a].host + ", and NCCL needs one GPU per rank (one node per GPU: [pool] "
                        "accelerator = \"cuda\")",
                    SF_ERR_UNSUPPORTED);

  // Rank 0's unique id over the pool's communicator, with a flag so that its failure fails
  // every rank at once.
  struct {
    int32_t ok = 0;
    ncclUniqueId id{};
  } root;
  if (comm.rank() == 0) root.ok = ncclGetUniqueId(&root.id) == ncclSuccess;
  comm.broadcast(&root, sizeof root, 0);
  if (!root.ok) throw Error("cuda: ncclGetUniqueId failed on rank 0", SF_ERR);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&impl_->nccl, static_cast<int>(comm.size()), root.id,
                                                static_cast<int>(comm.rank()), &config);
  impl_->check_nccl(r, "ncclCommInitRankConfig");
  check(cudaStreamCreateWithFlags(&impl_->collectives, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreateWithFlags(&impl_->ready, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventCreateWithFlags(&impl_->summed, cudaEventDisableTiming), "cudaEventCreate");
}
Device::~Device() = default;

const char* Device::build_name() { return "cuda"; }

void* Device::alloc(size_t bytes) {
  impl_->no_capture("a device allocation");
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}
void Device::free(void* p) noexcept { cudaFree(p); }
void Device::make_current() { check(cudaSetDevice(impl_->device), "cudaSetDevice"); }
void Device::upload(void* dst, const void* src, size_t bytes) {
  impl_->no_capture("upload");
  if (!bytes) return;
  // A copy from pageable memory may wait for the stream inside the driver, with no timeout:
  // with collectives on it, wait first, watched (a collective stuck on a lost peer aborts
  // instead of hanging here). Without, nothing on the stream can wait forever.
  if (impl_->nccl) synchronize();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, impl_->stream), "upload");
  synchronize();
}
void Device::upload_async(void* dst, const void* src, size_t bytes) {
  impl_->no_capture("upload_async");
  if (!bytes) return;
  Impl::Staging& b = impl_->staging[impl_->next_staging++ % impl_->staging.size()];
  if (b.done) impl_->wait_until([&] { return cudaEventQuery(b.done); }, "upload_async");  // its last copy
  else check(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming), "cudaEventCreate");
  if (b.capacity < bytes) {
    if (b.host) synchronize();  // cudaFreeHost waits for the device: wait first, watched
    if (b.host) check(cudaFreeHost(b.host), "cudaFreeHost");
    b.host = nullptr;
    b.capacity = 0;
    check(cudaMallocHost(&b.host, bytes), "cudaMallocHost");
    b.capacity = bytes;
  }
  std::memcpy(b.host, src, bytes);
  check(cudaMemcpyAsync(dst, b.host, bytes, cudaMemcpyHostToDevice, impl_->stream), "upload_async");
  check(cudaEventRecord(b.done, impl_->stream), "cudaEventRecord");
}
void Device::download(void* dst, const void* src, size_t bytes) {
  impl_->no_capture("download");
  if (!bytes) return;
  // A copy to pageable memory returns only once done, i.e. after everything before it on the
  // stream, inside the driver and with no timeout: with collectives, wait first, watched, as
  // upload does (a step's read-back without NCCL stays one wait).
  if (impl_->nccl) synchronize();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, impl_->stream), "download");
  synchronize();
}
void Device::copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_->stream), "copy");
}
void Device::zero(void* p, size_t bytes) {
  if (bytes) check(cudaMemsetAsync(p, 0, bytes, impl_->stream), "memset");
}

// cuBLAS is column-major: a row-major [M, N] matrix is its column-major transpose, so
// C^T = op(B)^T op(A)^T is the same call with the operands swapped.
void Device::gemm(bool ta, bool tb, size_t M, size_t N, size_t K, float alpha, const float* A, size_t lda,
                  const float* B, size_t ldb, float beta, float* C, size_t ldc) {
  check(cublasSgemm(impl_->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
                    static_cast<int>(M), static_cast<int>(K), &alpha, B, static_cast<int>(ldb), A,
                    static_cast<int>(lda), &beta, C, static_cast<int>(ldc)),
        "cublasSgemm");
}


// Column-major, as gemm(): C^T[N, M] = B^T[N, K] A^T[K, M], the bias one value per row of C^T
// (a unit), which is what cuBLASLt's BIAS epilogues add (a vector of the output's rows).
void Device::gemm_bias_act(size_t M, size_t N, size_t K, const float* A, const float* B, const float* bias,
                           kernels::Activation act, float* C) {
  auto fallback = [&] {
    gemm(false, false, M, N, K, 1.f, A, K, B, N, 0.f, C, N);
    kernels::bias_activation_forward(C, bias, M, N, act, stream_);
  };
  if (act == kernels::Activation::softmax || (!bias && act == kernels::Activation::linear)) return fallback();
  if (bias && reinterpret_cast<uintptr_t>(bias) % 16 != 0) return fallback();  // the BIAS epilogues need 16 bytes
  const cublasLtEpilogue_t epilogue = act == kernels::Activation::relu
                                          ? (bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU)
                                          : CUBLASLT_EPILOGUE_BIAS;
  // The heuristic assumes 256-byte aligned operands unless told: a layer's weights are a slice
  // of the flat parameter buffer, aligned to 4 bytes only. The alignments are part of the key.
  auto alignment = [](const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return static_cast<uint32_t>(std::min<uintptr_t>(a & (~a + 1), 256));
  };
  const uint32_t align_a = alignment(B), align_b = alignment(A), align_c = alignment(C);
  // The heuristic also reads the bias pointer's alignment off the descriptor (cublasLt.h, BIAS_POINTER).
  const uint32_t align_bias = bias ? alignment(bias) : 0;
  const size_t ws = impl_->blas_workspace_bytes;
  auto make = [&](LtPlan& d) {
    const cublasOperation_t no = CUBLAS_OP_N;
    check(cublasLtMatmulDescCreate(&d.op, impl_->options.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F),
          "cublasLtMatmulDescCreate");
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &no, sizeof no), "cublasLt TRANSA");
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof no), "cublasLt TRANSB");
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
          "cublasLt EPILOGUE");
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
          "cublasLt BIAS_POINTER");
    check(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_32F, N, K, N), "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_32F, K, M, K), "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, N, M, N), "cublasLtMatrixLayoutCreate");
    check(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate");
    check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
          "cublasLt MAX_WORKSPACE_BYTES");
    check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                               sizeof align_a),
          "cublasLt MIN_ALIGNMENT_A_BYTES");
    check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                               sizeof align_b),
          "cublasLt MIN_ALIGNMENT_B_BYTES");
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check(cublasLtMatmulPreferenceSetAttribute(d.pref, attr, &align_c, sizeof align_c),
            "cublasLt MIN_ALIGNMENT_C/D");
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t asked =
        cublasLtMatmulAlgoGetHeuristic(impl_->lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found);
    d.found = asked == CUBLAS_STATUS_SUCCESS && found > 0;
    if (d.found) d.algo = heuristic.algo;
  };
  LtPlan& d = impl_->lt_plans.get(
      {M, N, K, static_cast<uint64_t>(epilogue), align_a, align_b, align_c, align_bias, ws}, make);
  if (!d.found) return fallback();  // no fused algorithm for this shape
  // This call's bias (of the alignment the plan was chosen for); a bias-less epilogue ignores it.
  check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
        "cublasLt BIAS_POINTER");
  const float alpha = 1.f, beta = 0.f;
  const cublasStatus_t st = cublasLtMatmul(impl_->lt, d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c, C, d.c, &d.algo,
                                           impl_->blas_workspace, ws, impl_->stream);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    d.found = false;  // and every later call of this shape falls back at once
    return fallback();
  }
  check(st, "cublasLtMatmul");
}

namespace {
ConvPlan& conv_plan(PlanCache<ConvPlan, 13>& cache, const kernels::WindowShape& g, size_t filters,
                    const ConvPolicy& policy) {
  return cache.get({g.batch, g.H, g.W, g.C, g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, g.Ho, g.Wo, filters},
                   [&](ConvPlan& c) { c.setup(g, filters, policy); });
}
}  // namespace

// A window's plan, with cuDNN's workspace and the KRSC kernel its calls use grown to fit (outside
// captures only: every shape runs eager first), or null where cuDNN cannot express the window.
ConvPlan* Device::Impl::conv_setup(const kernels::WindowShape& g, size_t filters) {
  ConvPlan& c = conv_plan(conv_plans, g, filters, conv_policy);
  if (!c.ok) return nullptr;
  grow(dnn_workspace, kDnnWorkspace, "conv2d workspace");  // once: every algorithm taken fits
  grow(kernel_krsc, g.col_width() * filters * sizeof(float), "conv2d kernel");
  return &c;
}

// Whether cuDNN may run kernels to time its candidates now (autotune, survey): never inside a
// capture (a plan is new there only if the cache started over); first, the device's work is
// waited for, watched, as Find*Ex's own synchronizations would not be.
bool Device::Impl::may_time() {
  const ConvPolicy& p = conv_policy;
  if (capturing || !(p.autotune || p.survey)) return false;
  quiesce("waiting for the device before timing cuDNN's convolution algorithms");
  return true;
}

bool Device::conv_forward(const kernels::WindowShape& g, size_t filters, const float* x, const float* w, float* y) {
  Impl& d = *impl_;
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
    choose(c.forward, d.conv_policy, d.may_time(), d.dnn, c.conv, kForward,
           ConvCall<cudnnTensorDescriptor_t, cudnnFilterDescriptor_t, cudnnTensorDescriptor_t>{
               c.x, c.xc, c.w, c.wc, c.y, c.yc, x, krsc, y, ws, wsb},
           [&] {  // x and the kernel to NCHW, y back (what it writes, the call below overwrites)
             return d.transforms_ms([&] {
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
  if (!c.filter.asked && (dw || d.conv_policy.survey))
    choose(c.filter, d.conv_policy, d.may_time(), d.dnn, c.conv, kFilter,
           ConvCall<cudnnTensorDescriptor_t, cudnnTensorDescriptor_t, cudnnFilterDescriptor_t>{
               c.x, c.xc, c.y, c.yc, c.w, c.wc, x, dy, dkrsc, ws, wsb},
           [&] {  // x and dy to NCHW, the kernel's gradient back
             return d.transforms_ms([&] {
               float *xc = d.nchw_x(c), *yc = d.nchw_y(c);
               d.transform(c.x, x, c.xc, xc);
               d.transform(c.y, dy, c.yc, yc);
               d.transform(c.wt, dkrsc, c.wk, dw_timed);
             });
           });
  // Timed where it takes milliseconds at most (up to 2^32 products; the convnet's widest window
  // at batch 1024, 1.0e9 of them, took 2.7 ms on an H100): a wide layer's would take seconds.
  constexpr size_t kMaxSurveyedProducts = size_t{1} << 32;
  if (d.conv_policy.survey && c.reduction_ms < 0 && g.positions() * kkc * filters <= kMaxSurveyedProducts &&
      kernels::conv_filter_grad_workspace(g, filters) * sizeof(double) <= wsb && d.may_time())
    c.reduction_ms = d.time_ms(
        [&] { kernels::conv_filter_grad(x, dy, g, filters, dkrsc, static_cast<double*>(ws), stream_); });
  if (dx && !c.data.asked)
    choose(c.data, d.conv_policy, d.may_time(), d.dnn, c.conv, kData,
           ConvCall<cudnnFilterDescriptor_t, cudnnTensorDescriptor_t, cudnnTensorDescriptor_t>{
               c.w, c.wc, c.y, c.yc, c.x, c.xc, krsc, dy, dx, ws, wsb},
           [&] {  // dy and the kernel to NCHW, dx back
             return d.transforms_ms([&] {
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
  if (!(d.conv_policy.autotune || d.conv_policy.survey) || (!dw && !dx) || (dw && !c.filter.found) ||
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
  c.gemm_ms = d.time_ms(
      [&] { conv_backward_gemm(dev, g, filters, x, w, dy, static_cast<float*>(col.p), false, dw_scratch, dx_scratch); });
  const float f = dw ? chosen_ms(c.filter) : 0.f, dd = dx ? chosen_ms(c.data) : 0.f;
  if (f >= 0 && dd >= 0) c.cudnn_ms = f + dd;
  c.by_gemm = d.conv_policy.autotune && c.cudnn_ms >= 0 && c.gemm_ms < c.cudnn_ms;
}

void Device::allreduce_sum(float* p, size_t n) { impl_->allreduce(p, n, ncclFloat32); }
void Device::allreduce_sum(double* p, size_t n) { impl_->allreduce(p, n, ncclFloat64); }
void Device::join_collectives() {
  impl_->usable();
  if (!impl_->nccl) return;
  check(cudaEventRecord(impl_->summed, impl_->collectives), "cudaEventRecord");
  check(cudaStreamWaitEvent(impl_->stream, impl_->summed, 0), "cudaStreamWaitEvent");
}
void Device::broadcast(void* p, size_t bytes, uint32_t root) {
  impl_->usable();
  if (!impl_->nccl || bytes == 0) return;
  impl_->check_nccl(ncclBroadcast(p, p, bytes, ncclUint8, static_cast<int>(root), impl_->nccl, impl_->stream),
                    "ncclBroadcast");
}
namespace {
struct CudaGraph : Device::Graph {
  std::vector<cudaGraphExec_t*>* registry;
  cudaGraphExec_t exec = nullptr;
  explicit CudaGraph(std::vector<cudaGraphExec_t*>& r) : registry(&r) { registry->push_back(&exec); }
  ~CudaGraph() override {
    std::erase(*registry, &exec);
    if (exec) cudaGraphExecDestroy(exec);
  }
};
}  // namespace

// Stream capture in this thread's mode: the collectives stream joins the capture through the
// events allreduce_sum and join_collectives record (fork and join), and NCCL's kernels are
// captured with the rest (NCCL supports CUDA graphs from 2.9).
void Device::begin_capture() {
  impl_->usable();
  if (impl_->capturing) throw Error("cuda: begin_capture inside a capture", SF_ERR);
  // ThreadLocal, not Global: a non-blocking NCCL communicator launches its kernels from a thread
  // of its own (ncclGroupEnd), and Global mode would refuse that thread's unsafe calls.
  check(cudaStreamBeginCapture(impl_->stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  impl_->capturing = true;
}
std::unique_ptr<Device::Graph> Device::end_capture() {
  if (!impl_->capturing) throw Error("cuda: end_capture without begin_capture", SF_ERR);
  impl_->capturing = false;
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(impl_->stream, &graph), "cudaStreamEndCapture");
  auto g = std::make_unique<CudaGraph>(impl_->live_graphs);
  const cudaError_t e = cudaGraphInstantiate(&g->exec, graph, 0);
  cudaGraphDestroy(graph);
  check(e, "cudaGraphInstantiate");
  return g;
}
void Device::abort_capture() noexcept { impl_->end_partial_capture(); }
void Device::replay(const Graph& g) {
  impl_->usable();
  impl_->no_capture("replay");
  const cudaGraphExec_t exec = static_cast<const CudaGraph&>(g).exec;
  if (!exec) throw Error("cuda: replay of a graph destroyed with its NCCL communicator", SF_ERR);
  check(cudaGraphLaunch(exec, impl_->stream), "cudaGraphLaunch");
}
bool Device::capturing() const { return impl_->capturing; }

size_t Device::mark() {
  Impl& d = *impl_;
  d.no_capture("a timing mark");
  if (d.marks_used == d.marks.size()) {
    cudaEvent_t e = nullptr;
    check(cudaEventCreate(&e), "cudaEventCreate");
    d.marks.push_back(e);
  }
  check(cudaEventRecord(d.marks[d.marks_used], d.stream), "cudaEventRecord");
  return d.marks_used++;
}
double Device::seconds(size_t from, size_t to) const {
  const Impl& d = *impl_;
  if (from >= d.marks_used || to >= d.marks_used) throw Error("cuda: seconds: no such timing mark", SF_ERR);
  float ms = 0;
  check(cudaEventElapsedTime(&ms, d.marks[from], d.marks[to]), "cudaEventElapsedTime");
  return ms / 1e3;
}
void Device::clear_marks() { impl_->marks_used = 0; }

namespace {
constexpr const char* kEngineReduction = "the engine's column reduction (deterministic)";

template <class Algo>
std::string choice_text(const ConvPlan::Choice<Algo>& c, const char* (*name)(Algo)) {
  if (!c.asked) return "not asked";
  if (!c.found) return "none fits: im2col + GEMM";
  return std::string(name(c.algo)) + (c.math == CUDNN_FMA_MATH ? "" : " (tensor ops)") + (c.nchw ? " in NCHW" : "") +
         (c.timed ? ", timed" : "");
}
// A direction's timed candidates, fastest first: "name 0.123 ms", marked when cuDNN ranks it
// under tensor-op math (TF32 on tensor cores for FP32 data) or it adds with atomics
// (nondeterministic), and when the policy refuses it.
void timed_text(std::string& out, const char* direction, const char* layout, const std::vector<ConvPlan::Timed>& ts,
                float transforms_ms = -1) {
  if (ts.empty()) return;
  out += std::string("      ") + direction + " " + layout;
  if (transforms_ms >= 0) {
    char t[64];
    std::snprintf(t, sizeof t, " (+ %.3f ms of transforms)", static_cast<double>(transforms_ms));
    out += t;
  }
  out += ":";
  char item[128];
  for (const ConvPlan::Timed& t : ts) {
    std::snprintf(item, sizeof item, " %s%s%s %.3f ms%s,", t.name, t.math == CUDNN_FMA_MATH ? "" : " (tensor ops)",
                  t.deterministic ? "" : " (nondeterministic)", static_cast<double>(t.ms), t.admitted ? "" : " [refused]");
    out += item;
  }
  out.back() = '\n';
}
}  // namespace

std::string Device::describe_convolutions() const {
  std::string out;
  const ConvPolicy& p = impl_->conv_policy;
  impl_->conv_plans.for_each([&](const auto& k, const ConvPlan& c) {
    // k: batch, H, W, C, kh, kw, sh, sw, pt, pl, Ho, Wo, filters (conv_plan's key)
    char line[200];
    std::snprintf(line, sizeof line, "batch %llu, %llux%llux%llu -> %llux%llux%llu, kernel %llux%llu, stride %llux%llu: ",
                  static_cast<unsigned long long>(k[0]), static_cast<unsigned long long>(k[1]),
                  static_cast<unsigned long long>(k[2]), static_cast<unsigned long long>(k[3]),
                  static_cast<unsigned long long>(k[10]), static_cast<unsigned long long>(k[11]),
                  static_cast<unsigned long long>(k[12]), static_cast<unsigned long long>(k[4]),
                  static_cast<unsigned long long>(k[5]), static_cast<unsigned long long>(k[6]),
                  static_cast<unsigned long long>(k[7]));
    out += line;
    if (!c.ok) {
      const bool thin = k[3] * k[4] * k[5] <= kernels::kThinWindow;  // C * kh * kw
      out += std::string("im2col + GEMM (cuDNN cannot pad this window)") +
             (thin ? ", the weight gradient " + std::string(kEngineReduction) : std::string()) + "\n";
      return;
    }
    out += "forward " + choice_text(c.forward, fwd_algo_name) + ", " +
           (c.by_gemm ? std::string("backward the engine's im2col + GEMM, timed") +
                            (c.filter_by_engine ? std::string(" (filter ") + kEngineReduction + ")" : std::string())
                      : "filter " +
                            (c.filter_by_engine ? std::string(kEngineReduction)
                                                : choice_text(c.filter, filter_algo_name)) +
                            ", data " + choice_text(c.data, data_algo_name)) +
           "\n";
    timed_text(out, "forward", "NHWC", c.forward.nhwc);
    timed_text(out, "forward", "NCHW", c.forward.nchw_timed, c.forward.transforms_ms);
    timed_text(out, "filter", "NHWC", c.filter.nhwc);
    timed_text(out, "filter", "NCHW", c.filter.nchw_timed, c.filter.transforms_ms);
    if (c.reduction_ms >= 0) {
      char t[96];
      std::snprintf(t, sizeof t, "      filter, %s: %.3f ms\n", kEngineReduction, static_cast<double>(c.reduction_ms));
      out += t;
    }
    timed_text(out, "data", "NHWC", c.data.nhwc);
    timed_text(out, "data", "NCHW", c.data.nchw_timed, c.data.transforms_ms);
    if (c.gemm_ms >= 0) {
      char t[160];
      if (c.cudnn_ms >= 0)
        std::snprintf(t, sizeof t, "      backward, the engine's im2col + GEMM: %.3f ms (cuDNN's chosen: %.3f ms)\n",
                      static_cast<double>(c.gemm_ms), static_cast<double>(c.cudnn_ms));
      else
        std::snprintf(t, sizeof t, "      backward, the engine's im2col + GEMM: %.3f ms\n", static_cast<double>(c.gemm_ms));
      out += t;
    }
  });
  if (!out.empty() && (p.autotune || p.survey || p.nchw_only()))
    out = std::string("    (chosen ") + (p.autotune ? "by time" : "by cuDNN's heuristics") + ", among " +
          (p.deterministic ? "deterministic" : "all") + " algorithms in " + (p.tf32 ? "FP32 or TF32" : "FP32") +
          ", in " + (p.nchw_only() ? "NCHW" : p.may_nchw() ? "NHWC or NCHW" : "NHWC") +
          (p.autotune || p.survey ? "; times: cudnnFind*Ex, each candidate once, at the window's first use)\n" : ")\n") +
          out;
  return out;
}

void Device::synchronize() {
  impl_->no_capture("synchronize");
  if (!impl_->nccl && !impl_->failed) {
    check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
    return;
  }
  impl_->wait_stream("waiting for the stream");
}

}  // namespace skyforge::cuda
