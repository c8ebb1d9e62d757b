// The CUDA build's Device::Impl (device.hpp): the state its files share, by concern, and how
// they report a failed CUDA, cuBLAS, cuDNN or NCCL call. Plain C++ against the CUDA headers (no
// device code: the kernels are kernels/'s). The files, each one concern:
//   device_cuda.cpp     setup, probe, memory, copies and the stream
//   device_blas.cpp     GEMMs on cuBLAS, and with a fused epilogue on cuBLASLt
//   device_cudnn.cpp    conv2d on cuDNN: plans, the algorithm policy, autotune
//   device_nccl.cpp     the NCCL communicator, its collectives, the watch that bounds each wait
//   device_graphs.cpp   CUDA graphs: stream capture and replay
//   device_profile.cpp  SKYFORGE_CUDA_PROFILE: timing marks, the convolutions' description
#pragma once

#include "device.hpp"
#include "device_cudnn.hpp"
#include "plan_cache.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace skyforge::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  // Clear it: the runtime's last error would otherwise fail the next kernel launch's check
  // (for_n reads cudaGetLastError), e.g. after a bound set that did not fit.
  cudaGetLastError();
  throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e), SF_ERR);
}
inline void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuda: ") + what + ": " + cublasGetStatusString(s), SF_ERR);
}
inline void check(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS) throw Error(std::string("cuda: ") + what + ": " + cudnnGetErrorString(st), SF_ERR);
}
inline void check(ncclResult_t r, const char* what) {
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

struct Device::Impl {
  // ---- setup, memory and the stream (device_cuda.cpp) ----
  int device = 0;                  // this rank's GPU (cudaSetDevice is per thread)
  cudaStream_t stream = nullptr;   // every kernel, copy and GEMM
  ConvPolicy options;              // tf32 for cuBLAS and cuBLASLt; the convolution policy for cuDNN
  // upload_async's pinned staging buffers, used in turn; `done` is recorded after each copy.
  struct Staging {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t done = nullptr;
  };
  std::array<Staging, 4> staging{};
  size_t next_staging = 0;
  // A copy between pageable host memory and the device, returned from once done.
  void pageable_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what);
  void synchronize();  // Device::synchronize
  ~Impl();

  // ---- cuBLAS and cuBLASLt (device_blas.cpp) ----
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;    // the GEMMs with a fused epilogue
  void* blas_workspace = nullptr;  // cuBLAS's, set once: a captured GEMM may not allocate
  size_t blas_workspace_bytes = 0;  // shared with cuBLASLt (one stream: never at once)
  PlanCache<LtPlan, 9> lt_plans;       // gemm_bias_act's, by shape, epilogue and alignments
  void init_blas();  // the handles and the workspace, on `stream`


  // ---- cuDNN (device_cudnn.cpp) ----
  cudnnHandle_t dnn = nullptr;    // conv2d (made at the first one)
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
  void grow(Grown& g, size_t bytes, const char* what) {
    if (g.bytes >= bytes) return;
    no_capture(what);
    if (g.p) retired.push_back(g.p);
    g.p = nullptr;
    g.bytes = 0;
    check(cudaMalloc(&g.p, bytes), (std::string("cudaMalloc (") + what + ")").c_str());
    g.bytes = bytes;
  }
  // precision bf16 (device_blas.cpp): a GEMM operand (operand_span) rounded to bfloat16
  // (kernels/bf16.hpp) into bf16_a or bf16_b, grown outside captures (every shape runs eager before it is captured).
  bool bf16() const { return options.precision == DeviceOptions::Precision::bf16; }
  Grown bf16_a, bf16_b;
  const void* bf16_operand(const float* p, size_t rows, size_t cols, size_t ld, size_t batch, size_t stride,
                           Grown& scratch);
  PlanCache<ConvPlan, 13> conv_plans;  // conv2d's, by window and filters
  bool may_time();
  ConvPlan* conv_setup(const kernels::WindowShape& g, size_t filters);
  void time_backward_gemm(Device& dev, ConvPlan& c, const kernels::WindowShape& g, size_t filters, const float* x,
                          const float* w, const float* dy, bool dw, bool dx);
  // The NCHW scratch for a window's input-shaped and output-shaped tensors.
  float* nchw_x(const ConvPlan& c);
  float* nchw_y(const ConvPlan& c);
  // dst (described by dd) = src (described by sd): the same dimensions, another layout.
  void transform(cudnnTensorDescriptor_t sd, const void* src, cudnnTensorDescriptor_t dd, void* dst);

  // ---- NCCL (device_nccl.cpp) ----
  // The communicator is non-blocking (ncclConfig_t::blocking = 0). NCCL's rule: after a call
  // returns ncclInProgress, poll ncclCommGetAsyncError until ncclSuccess before any other NCCL
  // call or stream work that depends on it. Every wait is bounded by the collective timeout; a
  // lost peer ends in ncclCommAbort and an error, never in a hang, and the device refuses every
  // collective afterwards.
  ncclComm_t nccl = nullptr;
  cudaStream_t collectives = nullptr;  // NCCL's allreduces, overlapping the stream's backward
  cudaEvent_t ready = nullptr;         // recorded on `stream` before an allreduce
  cudaEvent_t summed = nullptr;        // recorded on `collectives` at join_collectives
  bool failed = false;   // a collective failed or timed out: the communicator is aborted
  std::string failure;   // why, for every later call
  std::chrono::milliseconds timeout{300000};
  // The communicator over comm's ranks, one GPU each (comm.size() > 1).
  void init_nccl(const Communicator& comm);
  // Finalizes the communicator within the timeout, or aborts it (failed, or not done in time).
  void close_nccl() noexcept;
  // Aborts the communicator (ending a capture and destroying the graphs that hold NCCL
  // launches first) and refuses every later collective with `why`.
  void abort_communicator(std::string why) noexcept;
  [[noreturn]] void abort_nccl(const std::string& why);  // abort_communicator, then throws
  void usable() const;  // throws once a collective has failed
  // Until NCCL's state is ncclSuccess (a call returned ncclInProgress).
  void settle(const char* what);
  // An NCCL call's result: an error aborts; ncclInProgress is waited out.
  void check_nccl(ncclResult_t r, const char* what);
  // In place on the collectives stream, after everything `stream` has been given so far;
  // false when there is nothing to do (no communicator, n = 0).
  bool allreduce(void* p, size_t n, ncclDataType_t type);
  // Until the stream is done, watching NCCL meanwhile (a collective on it may wait on a peer).
  void wait_stream(const char* what);
  // Until both streams are done, watched the same way: before a call that may wait for the
  // whole device unwatched (cuDNN's Find*Ex times its candidates with synchronizations).
  void quiesce(const char* what);
  // Until query() (a stream's or an event's) stops saying cudaErrorNotReady, the same way.
  void wait_until(const std::function<cudaError_t()>& query, const char* what);

  // ---- CUDA graphs (device_graphs.cpp) ----
  bool capturing = false;
  // Graphs holding captured NCCL launches: ncclCommAbort waits until none is left, so an abort
  // destroys their executables first (a later replay of one fails).
  std::vector<cudaGraphExec_t*> live_graphs;
  void no_capture(const char* what) const {
    if (capturing)
      throw Error(std::string("cuda: ") + what + " while a step is being captured (it would wait for the device)",
                  SF_ERR);
  }
  // Ends a capture that is given up, keeping nothing of it. A failure between an allreduce's
  // fork of the collectives stream and join_collectives would leave the capture unjoined
  // (cudaErrorStreamCaptureUnjoined, and the stream still capturing): join it first.
  void end_partial_capture() noexcept;

  // ---- SKYFORGE_CUDA_PROFILE (device_profile.cpp) ----
  std::vector<cudaEvent_t> marks;  // SKYFORGE_CUDA_PROFILE's timing marks, reused
  size_t marks_used = 0;
};

}  // namespace skyforge::cuda
