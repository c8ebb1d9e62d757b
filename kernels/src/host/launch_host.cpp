// The host build of the engine's kernels (docs/kernels.md, "Two builds"): the launch API of
// launch.hpp over host memory, each functor run by Thrust's OpenMP device system, so the code
// the CUDA build runs on a GPU is exercised by tests on any machine.
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <skyforge/kernels/launch.hpp>

static_assert(THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP,
              "skyforge_kernels_host is built with -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP");

namespace skyforge::kernels {
namespace {

// Synchronous: thrust::device is the OpenMP system here. A stream whose handle is a
// HostRecording (a capture in progress) gets the call recorded instead, f copied by value.
template <class F>
void for_n(Stream s, size_t n, const F& f, const char*) {
  if (n == 0) return;
  if (!s.handle) {  // the common case: no copy of f
    thrust::for_each_n(thrust::device, thrust::counting_iterator<size_t>(0), n, f);
    return;
  }
  run_or_record(s, [n, f] { thrust::for_each_n(thrust::device, thrust::counting_iterator<size_t>(0), n, f); });
}

}  // namespace

const char* build_name() { return "host"; }

}  // namespace skyforge::kernels

#include "../bf16.inl"
#include "../clip.inl"
#include "../data.inl"
#include "../dense.inl"
#include "../train.inl"
#include "../transformer.inl"
#include "../window.inl"
