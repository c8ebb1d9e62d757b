// The CUDA build's graphs (device.hpp, docs/compute-backends.md "Graphs"): a step captured from
// the stream (NCCL's launches on the collectives stream with it) into a cudaGraphExec_t and
// replayed; a capture given up keeps nothing.
#include "device_cuda_impl.hpp"

#include <memory>
#include <vector>

namespace skyforge::cuda {

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

void Device::Impl::end_partial_capture() noexcept {
  if (!capturing) return;
  capturing = false;
  if (collectives && cudaEventRecord(summed, collectives) == cudaSuccess) cudaStreamWaitEvent(stream, summed, 0);
  cudaGraph_t partial = nullptr;
  if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
  cudaGetLastError();  // a failed capture leaves its error behind
}

}  // namespace skyforge::cuda
