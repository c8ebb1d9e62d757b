// The device layer's host build (device.hpp): host memory, OpenBLAS, the pool's communicator.
// Used by the tests of the engine on machines without a GPU (docs/compute-backends.md).
#include "device.hpp"

#include <cblas.h>

#include <cstdlib>
#include <cstring>

namespace skyforge::cuda {

struct Device::Impl {
  Communicator comm;
};

Device::Device(const Communicator& comm, const Host&, double) : impl_(std::make_unique<Impl>(Impl{comm})) {}
Device::~Device() = default;

const char* Device::build_name() { return "host"; }
void Device::probe() {}  // host memory is always there

void* Device::alloc(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw Error("cuda(host): out of memory allocating " + std::to_string(bytes) + " bytes", SF_ERR);
  return p;
}
void Device::free(void* p) noexcept { std::free(p); }
void Device::upload(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void Device::upload_async(void* dst, const void* src, size_t bytes) { upload(dst, src, bytes); }
void Device::download(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void Device::copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) std::memmove(dst, src, bytes);
}
void Device::zero(void* p, size_t bytes) {
  if (bytes) std::memset(p, 0, bytes);
}

void Device::gemm(bool ta, bool tb, size_t M, size_t N, size_t K, float alpha, const float* A, size_t lda,
                  const float* B, size_t ldb, float beta, float* C, size_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
              static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}

void Device::allreduce_sum(float* p, size_t n) { impl_->comm.allreduce(p, n, SF_REDUCE_SUM); }
void Device::allreduce_sum(double* p, size_t n) { impl_->comm.allreduce(p, n, SF_REDUCE_SUM); }
void Device::join_collectives() {}  // the pool's allreduce returns when done
void Device::broadcast(void* p, size_t bytes, uint32_t root) { impl_->comm.broadcast(p, bytes, root); }
void Device::synchronize() {}

}  // namespace skyforge::cuda
