// The device layer's host build (device.hpp): host memory, OpenBLAS, the pool's communicator.
// Used by the tests of the engine on machines without a GPU (docs/compute-backends.md).
#include "device.hpp"

#include <skyforge/kernels/bf16.hpp>

#include <cblas.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace skyforge::cuda {

struct Device::Impl {
  Communicator comm;
  bool bf16 = false;  // precision bf16: the GEMMs' operands rounded (bf16.hpp)
  bool data_parallel = false;  // more than one rank, or collectives_alone
  std::string failure;         // abort()'s reason: every later collective throws it
  void usable() const {
    if (!failure.empty()) throw Error(failure + " (earlier)", SF_ERR);
  }
  template <class T>
  void allreduce(kernels::Stream s, uint64_t& issued, T* p, size_t n) {
    usable();
    if (!data_parallel || n == 0) return;
    ++issued;
    kernels::run_or_record(s, [c = comm, p, n] { c.allreduce(p, n, SF_REDUCE_SUM); });
  }
  std::vector<std::chrono::steady_clock::time_point> marks;  // SKYFORGE_CUDA_PROFILE
  std::unique_ptr<kernels::HostRecording> recording;  // a capture in progress (stream_ points at it)
  void no_capture(const char* what) const {
    if (recording)
      throw Error(std::string("cuda(host): ") + what + " while a step is being captured (it would wait for the device)",
                  SF_ERR);
  }
};

namespace {
struct HostGraph : Device::Graph {
  kernels::HostRecording recording;
};
}  // namespace

Device::Device(const Communicator& comm, const Host&, const DeviceOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->comm = comm;
  impl_->data_parallel = comm.size() > 1 || options.collectives_alone;
  impl_->bf16 = options.precision == DeviceOptions::Precision::bf16;
  stream_.reduction = options.reductions == DeviceOptions::Reductions::fp32 ? kernels::Reduction::fp32
                                                                           : kernels::Reduction::fp64;  // auto: fp64 here
}
Device::~Device() = default;

const char* Device::build_name() { return "host"; }
void Device::probe() {}  // host memory is always there

void* Device::alloc(size_t bytes) {
  impl_->no_capture("a device allocation");
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw Error("cuda(host): out of memory allocating " + std::to_string(bytes) + " bytes", SF_ERR);
  return p;
}
void Device::free(void* p) noexcept { std::free(p); }
void Device::make_current() {}  // one host
void Device::upload(void* dst, const void* src, size_t bytes) {
  impl_->no_capture("upload");
  if (bytes) std::memcpy(dst, src, bytes);
}
void Device::upload_async(void* dst, const void* src, size_t bytes) {
  impl_->no_capture("upload_async");
  upload(dst, src, bytes);
}
void Device::download(void* dst, const void* src, size_t bytes) {
  impl_->no_capture("download");
  if (bytes) std::memcpy(dst, src, bytes);
}
void Device::copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) kernels::run_or_record(stream_, [=] { std::memmove(dst, src, bytes); });
}
void Device::zero(void* p, size_t bytes) {
  if (bytes) kernels::run_or_record(stream_, [=] { std::memset(p, 0, bytes); });
}

namespace {
// With precision bf16, the operand (operand_span) rounded to bf16 into `scratch`, which then
// stands for it. Runs when the GEMM runs (a replay rounds that replay's values).
const float* operand(bool bf16, const float* p, size_t rows, size_t cols, size_t ld, size_t batch, size_t stride,
                     std::vector<float>& scratch) {
  if (!bf16 || rows == 0 || cols == 0 || batch == 0) return p;
  const size_t n = operand_span(rows, cols, ld, batch, stride);
  scratch.resize(n);
  kernels::round_bf16(p, scratch.data(), n, kernels::Stream{});
  return scratch.data();
}
thread_local std::vector<float> scratch_a, scratch_b;
}  // namespace

void Device::gemm(bool ta, bool tb, size_t M, size_t N, size_t K, float alpha, const float* A, size_t lda,
                  const float* B, size_t ldb, float beta, float* C, size_t ldc) {
  gemm_strided_batched(ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

void Device::gemm_strided_batched(bool ta, bool tb, size_t M, size_t N, size_t K, float alpha, const float* A,
                                  size_t lda, size_t stride_a, const float* B, size_t ldb, size_t stride_b, float beta,
                                  float* C, size_t ldc, size_t stride_c, size_t batch) {
  kernels::run_or_record(stream_, [=, bf16 = impl_->bf16] {
    const float* a = operand(bf16, A, ta ? K : M, ta ? M : K, lda, batch, stride_a, scratch_a);
    const float* b = operand(bf16, B, tb ? N : K, tb ? K : N, ldb, batch, stride_b, scratch_b);
    for (size_t i = 0; i < batch; ++i)
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
                  static_cast<int>(N), static_cast<int>(K), alpha, a + i * stride_a, static_cast<int>(lda),
                  b + i * stride_b, static_cast<int>(ldb), beta, C + i * stride_c, static_cast<int>(ldc));
  });
}

void Device::gemm_bias_act(size_t M, size_t N, size_t K, const float* A, const float* B, const float* bias,
                           kernels::Activation act, float* C) {
  gemm(false, false, M, N, K, 1.f, A, K, B, N, 0.f, C, N);
  kernels::bias_activation_forward(C, bias, M, N, act, stream_);
}

// No device convolutions here: the engine's im2col + GEMM is the host build's conv2d.
bool Device::conv_forward(const kernels::WindowShape&, size_t, const float*, const float*, float*) { return false; }
bool Device::conv_backward(const kernels::WindowShape&, size_t, const float*, const float*, const float*, float*,
                           float*) {
  return false;
}

void Device::allreduce_sum(float* p, size_t n) { impl_->allreduce(stream_, issued_, p, n); }
void Device::allreduce_sum(double* p, size_t n) { impl_->allreduce(stream_, issued_, p, n); }
void Device::join_collectives() {}  // the pool's allreduce returns when done
void Device::broadcast(void* p, size_t bytes, uint32_t root) {
  impl_->usable();
  if (!impl_->data_parallel || bytes == 0) return;
  ++issued_;
  kernels::run_or_record(stream_, [c = impl_->comm, p, bytes, root] { c.broadcast(p, bytes, root); });
}
bool Device::data_parallel() const { return impl_->data_parallel; }
void Device::abort(const std::string& why) noexcept {
  if (impl_->failure.empty()) impl_->failure = why;
}
void Device::synchronize() { impl_->no_capture("synchronize"); }

size_t Device::mark() {
  impl_->no_capture("a timing mark");
  impl_->marks.push_back(std::chrono::steady_clock::now());
  return impl_->marks.size() - 1;
}
double Device::seconds(size_t from, size_t to) const {
  if (from >= impl_->marks.size() || to >= impl_->marks.size())
    throw Error("cuda(host): seconds: no such timing mark", SF_ERR);
  return std::chrono::duration<double>(impl_->marks[to] - impl_->marks[from]).count();
}
void Device::clear_marks() { impl_->marks.clear(); }
std::string Device::describe_convolutions() const { return {}; }  // every conv2d is im2col + GEMM here

void Device::begin_capture() {
  if (impl_->recording) throw Error("cuda(host): begin_capture inside a capture", SF_ERR);
  impl_->recording = std::make_unique<kernels::HostRecording>();
  stream_.handle = impl_->recording.get();  // the kernels record instead of running
}
std::unique_ptr<Device::Graph> Device::end_capture() {
  if (!impl_->recording) throw Error("cuda(host): end_capture without begin_capture", SF_ERR);
  auto g = std::make_unique<HostGraph>();
  g->recording = std::move(*impl_->recording);
  abort_capture();
  return g;
}
void Device::abort_capture() noexcept {
  impl_->recording.reset();
  stream_.handle = nullptr;
}
void Device::replay(const Graph& g) {
  impl_->no_capture("replay");
  static_cast<const HostGraph&>(g).recording.replay();
}
bool Device::capturing() const { return impl_->recording != nullptr; }

}  // namespace skyforge::cuda
