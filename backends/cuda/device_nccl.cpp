// The CUDA build's collectives (device.hpp): the NCCL communicator over the pool's ranks (rank 0's
// unique id broadcast over the pool's communicator), the gradient allreduce on a stream of its
// own, the broadcast, and the watch that bounds every wait on them by the collective timeout:
// a lost peer ends in ncclCommAbort and an error, never in a hang.
#include "device_cuda_impl.hpp"

#include <cstring>
#include <thread>

#include <unistd.h>

namespace skyforge::cuda {

namespace {
// Where a rank's GPU is: its host and PCI bus id, fixed-size for an allgather.
struct GpuPlace {
  char host[64] = {};
  char bus[32] = {};
};
}  // namespace

void Device::Impl::init_nccl(const Communicator& comm) {
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
  const ncclResult_t r =
      ncclCommInitRankConfig(&nccl, static_cast<int>(comm.size()), root.id, static_cast<int>(comm.rank()), &config);
  check_nccl(r, "ncclCommInitRankConfig");
  check(cudaStreamCreateWithFlags(&collectives, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventCreateWithFlags(&summed, cudaEventDisableTiming), "cudaEventCreate");
}

void Device::Impl::close_nccl() noexcept {
  if (!nccl) return;
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

void Device::Impl::abort_communicator(std::string why) noexcept {
  // The partial graph holds NCCL launches too, and ncclCommAbort waits for every graph that
  // references the communicator: end it first.
  end_partial_capture();
  for (cudaGraphExec_t* exec : live_graphs)
    if (*exec) cudaGraphExecDestroy(*exec), *exec = nullptr;
  if (nccl) ncclCommAbort(nccl);
  nccl = nullptr;
  failed = true;
  failure = std::move(why);
}
void Device::Impl::abort_nccl(const std::string& why) {
  abort_communicator("cuda: " + why + "; the NCCL communicator was aborted (a lost or stuck peer?)");
  throw Error(failure, SF_ERR);
}
void Device::abort(const std::string& why) noexcept {
  if (!impl_->failed) impl_->abort_communicator(why);
}
bool Device::data_parallel() const { return impl_->nccl || impl_->failed; }
void Device::Impl::usable() const {
  if (failed) throw Error(failure + " (earlier)", SF_ERR);
}

namespace {
void pause(int& spins) {
  if (++spins < 1000) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(50));
}
}  // namespace

void Device::Impl::settle(const char* what) {
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
void Device::Impl::check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclInProgress) return settle(what);
  if (r != ncclSuccess)
    abort_nccl(std::string(what) + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(nccl) + ")");
}
bool Device::Impl::allreduce(void* p, size_t n, ncclDataType_t type) {
  usable();
  if (!nccl || n == 0) return false;
  check(cudaEventRecord(ready, stream), "cudaEventRecord");
  check(cudaStreamWaitEvent(collectives, ready, 0), "cudaStreamWaitEvent");
  check_nccl(ncclAllReduce(p, p, n, type, ncclSum, nccl, collectives), "ncclAllReduce");
  return true;
}
void Device::Impl::wait_stream(const char* what) {
  wait_until([this] { return cudaStreamQuery(stream); }, what);
}
void Device::Impl::quiesce(const char* what) {
  wait_stream(what);
  if (nccl) wait_until([this] { return cudaStreamQuery(collectives); }, what);
}
void Device::Impl::wait_until(const std::function<cudaError_t()>& query, const char* what) {
  if (!nccl) {  // one rank, or an aborted communicator: nothing can hang on a peer
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

void Device::allreduce_sum(float* p, size_t n) { issued_ += impl_->allreduce(p, n, ncclFloat32); }
void Device::allreduce_sum(double* p, size_t n) { issued_ += impl_->allreduce(p, n, ncclFloat64); }
void Device::join_collectives() {
  impl_->usable();
  if (!impl_->nccl) return;
  check(cudaEventRecord(impl_->summed, impl_->collectives), "cudaEventRecord");
  check(cudaStreamWaitEvent(impl_->stream, impl_->summed, 0), "cudaStreamWaitEvent");
}
void Device::broadcast(void* p, size_t bytes, uint32_t root) {
  impl_->usable();
  if (!impl_->nccl || bytes == 0) return;
  ++issued_;
  impl_->check_nccl(ncclBroadcast(p, p, bytes, ncclUint8, static_cast<int>(root), impl_->nccl, impl_->stream),
                    "ncclBroadcast");
}

}  // namespace skyforge::cuda
