// The device layer's CUDA build (device.hpp): CUDA runtime memory and one stream, cuBLAS for the
// GEMMs, NCCL for the gradient allreduce and the initial broadcast. Plain C++ against the CUDA
// headers (no device code here: the kernels are kernels/'s). docs/compute-backends.md.
#include "device.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

namespace skyforge::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e), SF_ERR);
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuda: ") + what + ": " + cublasGetStatusString(s), SF_ERR);
}
void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("cuda: ") + what + ": " + ncclGetErrorString(r), SF_ERR);
}

// Engines are created in the same order on every rank, so the n-th one's NCCL id lives under the
// same key everywhere.
std::atomic<uint64_t> g_generation{0};

}  // namespace

struct Device::Impl {
  cudaStream_t stream = nullptr;       // every kernel, copy and GEMM
  cudaStream_t collectives = nullptr;  // NCCL's allreduces, overlapping the stream's backward
  cudaEvent_t ready = nullptr;         // recorded on `stream` before an allreduce
  cudaEvent_t summed = nullptr;        // recorded on `collectives` at join_collectives
  cublasHandle_t blas = nullptr;
  ncclComm_t nccl = nullptr;
  std::chrono::milliseconds timeout{300000};
  ~Impl() {
    if (nccl) ncclCommDestroy(nccl);
    if (blas) cublasDestroy(blas);
    if (summed) cudaEventDestroy(summed);
    if (ready) cudaEventDestroy(ready);
    if (collectives) cudaStreamDestroy(collectives);
    if (stream) cudaStreamDestroy(stream);
  }

  // The communicator is non-blocking (ncclConfig_t::blocking = 0): its calls return
  // ncclInProgress while they work, and a wait polls NCCL's asynchronous error, so a lost peer
  // ends in ncclCommAbort and an error, never in a hang.
  [[noreturn]] void abort_nccl(const std::string& why) {
    ncclCommAbort(nccl);
    nccl = nullptr;
    throw Error("cuda: " + why + "; the NCCL communicator was aborted (a lost or stuck peer?)", SF_ERR);
  }
  void check_nccl(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress)
      abort_nccl(std::string(what) + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(nccl) + ")");
  }
  // Until NCCL has no call in progress (communicator set-up), or the stream is done.
  void wait(const char* what, bool for_stream) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (for_stream) {
        const cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) check(e, what);
      }
      if (nccl) {
        ncclResult_t state = ncclSuccess;
        check_nccl(ncclCommGetAsyncError(nccl, &state), what);
        if (state != ncclSuccess && state != ncclInProgress)
          abort_nccl(std::string(what) + ": NCCL reported " + ncclGetErrorString(state));
        if (!for_stream && state == ncclSuccess) return;
      } else if (!for_stream) {
        return;
      }
      if (std::chrono::steady_clock::now() > deadline)
        abort_nccl(std::string(what) + ": not done after the collective timeout of " +
                   std::to_string(timeout.count() / 1000.0) + " s");
      std::this_thread::yield();
    }
  }
};

// Without a driver the runtime's first call fails (cudaErrorInsufficientDriver, or
// cudaErrorNoDevice where a driver sees no GPU) and leaves the count 0. A device is usable when
// one of the built architectures (CMake's CMAKE_CUDA_ARCHITECTURES, lowest SKYFORGE_CUDA_MIN_CC)
// runs on it: real code for its major at or below its capability, or PTX it can compile.
void Device::probe() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    throw Error(std::string("cuda: no usable CUDA driver (") + cudaGetErrorString(e) + ")", SF_ERR_UNSUPPORTED);
  if (count == 0) throw Error("cuda: no CUDA device visible (CUDA_VISIBLE_DEVICES?)", SF_ERR_UNSUPPORTED);
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  if (prop.major * 10 + prop.minor < SKYFORGE_CUDA_MIN_CC)
    throw Error(std::string("cuda: device 0 (") + prop.name + ") has compute capability " +
                    std::to_string(prop.major) + "." + std::to_string(prop.minor) + "; this build carries code for " +
                    SKYFORGE_CUDA_ARCHS + " (rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(prop.major) +
                    std::to_string(prop.minor) + ")",
                SF_ERR_UNSUPPORTED);
}

Device::Device(const Communicator& comm, const Host& host, double collective_timeout_s)
    : impl_(std::make_unique<Impl>()) {
  probe();
  impl_->timeout = std::chrono::milliseconds(static_cast<int64_t>(std::max(collective_timeout_s, 0.001) * 1000.0));
  // One node per GPU: the provider narrows CUDA_VISIBLE_DEVICES, so device 0 is this node's.
  check(cudaSetDevice(0), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_.handle = impl_->stream;
  check(cublasCreate(&impl_->blas), "cublasCreate");
  check(cublasSetStream(impl_->blas, impl_->stream), "cublasSetStream");
  const uint64_t gen = g_generation.fetch_add(1);
  if (comm.size() > 1) {
    ncclUniqueId id;
    const std::string key = "skyforge.cuda.nccl_id." + std::to_string(gen);
    if (comm.rank() == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      host.kv_set(key, std::string_view(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      const std::string v = host.kv_get(key);
      if (v.size() != sizeof(id)) throw Error("cuda: malformed NCCL unique id under " + key, SF_ERR);
      std::memcpy(&id, v.data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r =
        ncclCommInitRankConfig(&impl_->nccl, static_cast<int>(comm.size()), id, static_cast<int>(comm.rank()), &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (impl_->nccl) ncclCommAbort(impl_->nccl);
      impl_->nccl = nullptr;
      throw Error(std::string("cuda: ncclCommInitRankConfig: ") + ncclGetErrorString(r), SF_ERR);
    }
    impl_->wait("ncclCommInitRank", false);
    check(cudaStreamCreateWithFlags(&impl_->collectives, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&impl_->ready, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&impl_->summed, cudaEventDisableTiming), "cudaEventCreate");
  }
}
Device::~Device() = default;

const char* Device::build_name() { return "cuda"; }

void* Device::alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}
void Device::free(void* p) noexcept { cudaFree(p); }
void Device::upload(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, impl_->stream), "upload");
  synchronize();
}
void Device::download(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
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

void Device::allreduce_sum(float* p, size_t n) {
  if (!impl_->nccl || n == 0) return;
  check(cudaEventRecord(impl_->ready, impl_->stream), "cudaEventRecord");
  check(cudaStreamWaitEvent(impl_->collectives, impl_->ready, 0), "cudaStreamWaitEvent");
  impl_->check_nccl(ncclAllReduce(p, p, n, ncclFloat32, ncclSum, impl_->nccl, impl_->collectives), "ncclAllReduce");
}
void Device::join_collectives() {
  if (!impl_->nccl) return;
  check(cudaEventRecord(impl_->summed, impl_->collectives), "cudaEventRecord");
  check(cudaStreamWaitEvent(impl_->stream, impl_->summed, 0), "cudaStreamWaitEvent");
}
void Device::broadcast(void* p, size_t bytes, uint32_t root) {
  if (!impl_->nccl || bytes == 0) return;
  impl_->check_nccl(ncclBroadcast(p, p, bytes, ncclUint8, static_cast<int>(root), impl_->nccl, impl_->stream),
                    "ncclBroadcast");
}
void Device::synchronize() {
  if (!impl_->nccl) {
    check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
    return;
  }
  impl_->wait("waiting for the stream", true);
}

}  // namespace skyforge::cuda
