// The device layer's CUDA build (device.hpp), its setup: the probe, this rank's GPU and stream,
// memory and copies. The rest of the build by concern: device_cuda_impl.hpp.
#include "arch.hpp"
#include "device_cuda_impl.hpp"
#include "nccl_env.hpp"

#include <algorithm>
#include <cstring>

namespace skyforge::cuda {

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
// DeviceOptions::reductions on this GPU: automatic is fp32 where FP64 runs at less than half
// FP32's rate (the attribute: 2 on A100/H100/H200, 32 or 64 on L4, L40S, RTX), on any rank of
// the pool (collective: every replica reduces alike, or a pool of mixed GPUs would clip and
// synchronize BatchNorm with other bits on each).
kernels::Reduction reduction_for(DeviceOptions::Reductions r, int device, const Communicator& comm) {
  if (r != DeviceOptions::Reductions::automatic)
    return r == DeviceOptions::Reductions::fp32 ? kernels::Reduction::fp32 : kernels::Reduction::fp64;
  int ratio = 0;
  check(cudaDeviceGetAttribute(&ratio, cudaDevAttrSingleToDoublePrecisionPerfRatio, device), "cudaDeviceGetAttribute");
  double slow = ratio > 2 ? 1.0 : 0.0;  // (a sum of doubles: what every communicator has)
  if (comm.size() > 1) comm.allreduce(&slow, 1);
  return slow > 0 ? kernels::Reduction::fp32 : kernels::Reduction::fp64;
}
}  // namespace

Device::Device(const Communicator& comm, const Host& host, const DeviceOptions& options)
    : impl_(std::make_unique<Impl>()) {
  probe();
  impl_->options = {options};
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
  stream_.reduction = reduction_for(options.reductions, device, comm);
  impl_->init_blas();
  if (comm.size() > 1 || options.collectives_alone) {
    if (host.on_node()) export_nccl_socket_ifname(host.instance_info().private_ip);  // nccl_env.hpp
    impl_->init_nccl(comm);
  }
}
Device::~Device() = default;

Device::Impl::~Impl() {
  close_nccl();
  for (cudaEvent_t e : marks) cudaEventDestroy(e);
  for (Staging& b : staging) {
    if (b.done) cudaEventDestroy(b.done);
    if (b.host) cudaFreeHost(b.host);
  }
  lt_plans.clear();
  conv_plans.clear();
  if (dnn) cudnnDestroy(dnn);
  for (Grown* g : {&dnn_workspace, &kernel_krsc, &grad_krsc, &nchw_in, &nchw_out, &bf16_a, &bf16_b})
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

const char* Device::build_name() { return "cuda"; }

void* Device::alloc(size_t bytes) {
  impl_->no_capture("a device allocation");
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}
// cudaFree waits for the whole device, the collectives stream too, with no timeout: with NCCL,
// wait for both streams first, watched (a collective stuck on a lost peer aborts the
// communicator, after which the device drains).
void Device::free(void* p) noexcept {
  if (impl_->nccl && !impl_->capturing) {  // (nothing is freed inside a capture)
    try {
      impl_->quiesce("freeing device memory");
    } catch (const std::exception&) {  // aborted: nothing is left waiting on a peer
    }
  }
  cudaFree(p);
}
void Device::make_current() { check(cudaSetDevice(impl_->device), "cudaSetDevice"); }
void Device::upload(void* dst, const void* src, size_t bytes) {
  impl_->pageable_copy(dst, src, bytes, cudaMemcpyHostToDevice, "upload");
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
  impl_->pageable_copy(dst, src, bytes, cudaMemcpyDeviceToHost, "download");
}
void Device::copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_->stream), "copy");
}
void Device::zero(void* p, size_t bytes) {
  if (bytes) check(cudaMemsetAsync(p, 0, bytes, impl_->stream), "memset");
}

// A copy from or to pageable memory may wait for the stream inside the driver, with no timeout
// (a download returns only once done, i.e. after everything before it on the stream): with
// collectives on the stream, wait first, watched (a collective stuck on a lost peer aborts
// instead of hanging here). Without, nothing on the stream can wait forever, and a step's
// read-back stays one wait.
void Device::Impl::pageable_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
  no_capture(what);
  if (!bytes) return;
  if (nccl) synchronize();
  check(cudaMemcpyAsync(dst, src, bytes, kind, stream), what);
  synchronize();
}

void Device::synchronize() { impl_->synchronize(); }
void Device::Impl::synchronize() {
  no_capture("synchronize");
  if (!nccl) {  // nothing on the stream waits on a peer (none, or the communicator was aborted)
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return;
  }
  wait_stream("waiting for the stream");
}

}  // namespace skyforge::cuda
