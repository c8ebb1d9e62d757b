// The cuda engine's device layer (docs/compute-backends.md, "The cuda engine"): everything the
// engine needs from a GPU besides the kernels of kernels/ (docs/kernels.md). Two builds:
//   device_host.cpp  plain host memory, OpenBLAS cblas_sgemm, the pool's sf_communicator;
//   device_cuda.cpp  CUDA runtime memory and streams, and beside it by concern (device_cuda_impl.hpp)
//                    device_blas.cpp (cuBLAS/cuBLASLt), device_cudnn.cpp, device_nccl.cpp (its
//                    unique id broadcast from rank 0 over the pool's communicator),
//                    device_graphs.cpp and device_profile.cpp.
// The engine (engine.cpp) is written once against this class and launch.hpp, so the host build
// that tests run here is the same engine code a GPU runs.
#pragma once

#include <skyforge/kernels/launch.hpp>
#include <skyforge/sdk.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace skyforge::cuda {

// How a Device runs (docs/compute-backends.md). Each field's initializer is its one default;
// EngineOptions extends it, and the plugin's options set both (plugin_options.hpp).
struct DeviceOptions {
  // How long the CUDA build waits for a collective before it declares a peer lost, aborts the
  // NCCL communicator and fails (the pool's collective timeout; the host build's communicator
  // has its own).
  double collective_timeout_s = 300;
  // Let cuBLAS, cuBLASLt and cuDNN round FP32 inputs to TF32 on tensor cores ("TF32").
  bool tf32 = false;
  // cuDNN's convolution algorithms ("Convolution algorithms"): deterministic ones only (an
  // algorithm that adds with atomics is not; false allows them, as PyTorch's default does), and
  // chosen by cuDNN's heuristics, or (autotune) by timing every candidate at a window's first
  // eager use, as torch.backends.cudnn.benchmark does. survey: time every candidate, in both
  // layouts (NHWC, which the engine uses, and NCHW), for describe_convolutions() even without
  // autotune, and keep the heuristics' choice (SKYFORGE_CUDA_PROFILE).
  bool deterministic = true;
  bool autotune = false;
  bool survey = false;
  // The layout cuDNN's convolutions run in ("Convolution algorithms"): the engine's tensors are
  // NHWC; in NCHW a direction's tensors are transformed there and back around its call.
  // automatic: NHWC, or with autotune whichever is faster, transforms included.
  enum class ConvLayout { automatic, nhwc, nchw };
  ConvLayout conv_layout = ConvLayout::automatic;
  // The GEMMs' precision ("Mixed precision"): fp32, or bf16 as Keras' mixed_bfloat16 computes:
  // every GEMM (dense, conv2d through im2col, attention) multiplies its operands rounded to
  // bfloat16 (kernels/bf16.hpp) and sums in FP32; weights, gradients, optimizer state and every
  // other layer stay FP32.
  enum class Precision { fp32, bf16 };
  Precision precision = Precision::fp32;
  // The deterministic reductions' accumulator (docs/kernels.md, "Reductions"; the Stream that
  // stream() hands out carries it): fp64 (doubles), fp32 (pairs of floats: FP32 instructions
  // only, for GPUs whose FP64 is slow), or automatic: fp32 where the GPU's FP32 rate is more
  // than twice its FP64 rate (cudaDevAttrSingleToDoublePrecisionPerfRatio > 2: L4, L40S, RTX;
  // not A100, H100, H200), else fp64; the host build's is fp64. The two give different bits.
  enum class Reductions { automatic, fp64, fp32 };
  Reductions reductions = Reductions::automatic;
  // Test-only (no plugin option sets it): one rank runs the data-parallel path anyway. The CUDA
  // build makes an NCCL communicator of one rank, so the bucketed allreduce on the collectives
  // stream, the captured collectives and ncclCommAbort run on a machine with one GPU (NCCL
  // refuses two ranks on one GPU); the host build calls the pool's communicator of one.
  bool collectives_alone = false;
};

class Device {
 public:
  // comm: the pool's communicator (rank, size; the host build's collectives; the CUDA build
  // broadcasts rank 0's NCCL unique id over it). host: its services (this node's local rank,
  // which picks the GPU). The host build has no TF32 nor cuDNN and ignores those options.
  // Throws Error(SF_ERR_UNSUPPORTED) when no device can be used.
  Device(const Communicator& comm, const Host& host, const DeviceOptions& options = {});
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  static const char* build_name();  // "host" or "cuda"
  // Whether a Device can be made in this process: returns, or throws Error(SF_ERR_UNSUPPORTED)
  // naming what is missing (no driver, no device, a device older than every architecture this
  // build carries code for). Cheap, no lasting state; the constructor runs it first.
  static void probe();

  // Makes this rank's GPU the calling thread's current device (CUDA's is per thread; kernels,
  // cudaMalloc and cuBLAS use it). The engine calls it at each of its entry points, so an
  // engine made on one thread may be used from another.
  void make_current();

  // Memory in the device's address space. Copies and memsets are ordered on stream(). alloc
  // throws inside a capture (cudaMalloc may wait for the device; a graph would not own it).
  void* alloc(size_t bytes);
  void free(void* p) noexcept;
  void upload(void* dst, const void* src, size_t bytes);    // host -> device, returns when done
  // host -> device in stream order, returning before the copy is done; src may be reused at
  // once (the CUDA build copies it into pinned staging memory first: a ring of a few, so the
  // host runs at most that many uploads ahead of the device).
  void upload_async(void* dst, const void* src, size_t bytes);
  void download(void* dst, const void* src, size_t bytes);  // device -> host, returns when done
  void copy(void* dst, const void* src, size_t bytes);      // device -> device
  void zero(void* p, size_t bytes);

  // Row-major C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C (cblas_sgemm's contract);
  // with precision bf16, of A and B rounded to bfloat16 (this and the two calls below).
  void gemm(bool trans_a, bool trans_b, size_t M, size_t N, size_t K, float alpha, const float* A, size_t lda,
            const float* B, size_t ldb, float beta, float* C, size_t ldc);

  // `batch` such GEMMs, matrix i's operands at A + i * stride_a, B + i * stride_b and
  // C + i * stride_c (cublasSgemmStridedBatched in the CUDA build, a loop in the host build).
  void gemm_strided_batched(bool trans_a, bool trans_b, size_t M, size_t N, size_t K, float alpha, const float* A,
                            size_t lda, size_t stride_a, const float* B, size_t ldb, size_t stride_b, float beta,
                            float* C, size_t ldc, size_t stride_c, size_t batch);

  // Row-major C[M, N] = act(A[M, K] B[K, N] + bias) (bias: N floats, or null): a layer's
  // forward GEMM with its epilogue. The CUDA build fuses the bias and a ReLU into the GEMM
  // (cuBLASLt's epilogues), so the output is written once; the host build, softmax, and shapes
  // cuBLASLt has no algorithm for run gemm() then kernels::bias_activation_forward.
  void gemm_bias_act(size_t M, size_t N, size_t K, const float* A, const float* B, const float* bias,
                     kernels::Activation act, float* C);

  // conv2d on the device's own convolutions (cuDNN in the CUDA build), window g with g.batch
  // set, w in Keras' layout (kh, kw, C, filters), no bias. false: not done (the host build;
  // precision bf16, whose convolutions are im2col + the bf16 GEMM; a
  // padding cuDNN cannot express, since it pads both sides alike; no algorithm that fits the
  // workspace): the engine then runs im2col + GEMM. conv_backward: dw (Keras' layout, overwritten;
  // null when the engine takes it itself, kernels::conv_filter_grad for a thin window) and, if dx
  // is not null, the input's gradient (overwritten).
  bool conv_forward(const kernels::WindowShape& g, size_t filters, const float* x, const float* w, float* y);
  bool conv_backward(const kernels::WindowShape& g, size_t filters, const float* x, const float* w, const float* dy,
                     float* dw, float* dx);

  // In-place sum of n floats of device memory over every rank, ordered after everything the
  // stream has been given so far. The CUDA build runs it on a stream of its own, so kernels
  // enqueued after it (the rest of the backward pass) overlap it, as PyTorch DDP's buckets do;
  // join_collectives() orders the stream after every allreduce so far (before the update).
  void allreduce_sum(float* p, size_t n);
  void allreduce_sum(double* p, size_t n);  // the same for doubles (a step's loss and counts)
  void join_collectives();
  // Device bytes from root to every rank (in stream order).
  void broadcast(void* p, size_t bytes, uint32_t root);
  // Whether the collectives above reach other ranks (more than one rank, or collectives_alone);
  // when false they return at once.
  bool data_parallel() const;
  // How many collectives this device has been given (run, queued or captured) so far: a step
  // that fails after this number moved left its peers waiting for the rest.
  uint64_t collectives_issued() const { return issued_; }
  // This rank is out of step with its peers (a step failed after issuing collectives): the
  // CUDA build aborts the NCCL communicator (ncclCommAbort, after ending a capture and
  // destroying the graphs that hold NCCL launches), so the kernels waiting on it return and the
  // peers' own watch sees the communicator go instead of waiting out the collective timeout;
  // every later collective throws `why`. The host build's pool communicator has no abort: its
  // peers' collectives time out.
  void abort(const std::string& why) noexcept;

  // CUDA Graphs (docs/compute-backends.md, "Graphs"). Between begin_capture() and
  // end_capture() what the stream is given (kernels, GEMMs, copies, collectives) is recorded,
  // not run; a call that would wait for the device or read host memory later (alloc,
  // upload, upload_async, download, synchronize) throws instead. replay() runs the recording
  // on the stream, with every argument as it was when recorded: what changes from one replay
  // to the next must live in device memory. The CUDA build makes a cudaGraphExec_t; the host build
  // records each call as a closure (kernels::HostRecording), so tests here replay exactly what
  // was captured.
  class Graph {
   public:
    virtual ~Graph() = default;
  };
  void begin_capture();
  std::unique_ptr<Graph> end_capture();
  void abort_capture() noexcept;  // after a failure inside a capture: nothing is kept
  void replay(const Graph& g);
  bool capturing() const;

  // Timing marks for SKYFORGE_CUDA_PROFILE (docs/compute-backends.md, "Profiling"), outside a
  // capture only: mark() records a point in the stream's order and returns its index; once the
  // stream has been synchronized, seconds(from, to) is the device time between two marks;
  // clear_marks() forgets them all. The host build's marks read the wall clock: its calls
  // have finished when they return.
  size_t mark();
  double seconds(size_t from, size_t to) const;
  void clear_marks();
  // How each conv2d window met so far runs, one line per window: its shape and the algorithm
  // cuDNN gave each direction (and how it was chosen), or that it takes im2col + GEMM; with
  // autotune or survey, every candidate's time in each layout below it. Empty in the host build.
  std::string describe_convolutions() const;

  kernels::Stream stream() const { return stream_; }
  // Waits for the stream. With NCCL, a collective that is still not done after the collective
  // timeout, or that NCCL reports failed, aborts the communicator (ncclCommAbort: the kernels
  // waiting on a lost peer return) and throws Error naming what happened, instead of hanging.
  void synchronize();

  // Bytes held by Buffers on this device now (tests: what the engine keeps).
  size_t buffer_bytes() const { return buffer_bytes_; }

 private:
  template <class T>
  friend class Buffer;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  kernels::Stream stream_{};
  uint64_t issued_ = 0;  // collectives_issued()
  size_t buffer_bytes_ = 0;
};

// The floats a row-major GEMM operand spans: `batch` matrices `stride` apart, each `rows` rows
// of `cols` values `ld` apart (what both builds round to bf16 with precision bf16; the values
// between rows are rounded too, unread).
inline size_t operand_span(size_t rows, size_t cols, size_t ld, size_t batch, size_t stride) {
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

// conv2d's backward as im2col + GEMM + col2im on d's GEMMs and the kernels: the engine's way
// where the device's own convolutions are not used, and a candidate the CUDA build times against
// cuDNN's with autotune ("Convolution algorithms"). dw (Keras' layout, overwritten) = col^T dy
// unless dw is null, col = im2col(x) made here unless col_has_x; then, if dx is not null,
// col = dy w^T and dx = col2im(col) (overwritten). col: g.positions() x g.col_width() floats.
inline void conv_backward_gemm(Device& d, const kernels::WindowShape& g, size_t filters, const float* x,
                               const float* w, const float* dy, float* col, bool col_has_x, float* dw, float* dx) {
  const size_t M = g.positions(), kkc = g.col_width();
  if (dw) {
    if (!col_has_x) kernels::im2col(x, col, g, d.stream());
    d.gemm(true, false, kkc, filters, M, 1.f, col, kkc, dy, filters, 0.f, dw, filters);
  }
  if (dx) {
    d.gemm(false, true, M, kkc, filters, 1.f, dy, filters, w, filters, 0.f, col, kkc);
    kernels::col2im(col, dx, g, d.stream());
  }
}

// A typed buffer of device memory.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device& d, size_t n) : d_(&d), n_(n), p_(n ? static_cast<T*>(d.alloc(n * sizeof(T))) : nullptr) {
    d.buffer_bytes_ += n * sizeof(T);
  }
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept : d_(o.d_), n_(o.n_), p_(o.p_) { o.p_ = nullptr, o.n_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      d_ = o.d_, n_ = o.n_, p_ = o.p_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  void reset() {
    if (p_) d_->free(p_), d_->buffer_bytes_ -= n_ * sizeof(T);
    p_ = nullptr, n_ = 0;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  Device* d_ = nullptr;
  size_t n_ = 0;
  T* p_ = nullptr;
};

// Buffers a captured graph still points at after they were replaced (the engine's buffers grow):
// they live as long as the last graph that holds this list.
using Kept = std::vector<std::shared_ptr<void>>;

// b = a new buffer of n elements, made first (if that throws, b is as it was); the old one goes
// to `kept` when given, else it is freed.
template <class T>
void renew(Buffer<T>& b, Device& d, size_t n, Kept* kept) {
  Buffer<T> fresh(d, n);
  if (kept && b.get()) kept->push_back(std::make_shared<Buffer<T>>(std::move(b)));
  b = std::move(fresh);
}

}  // namespace skyforge::cuda
