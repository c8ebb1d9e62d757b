// The CUDA build's one backend primitive (../common.hpp): for_n as a grid-stride kernel queued
// on the caller's stream. No host synchronisation; a launch error throws.
#pragma once

#include <skyforge/kernels/launch.hpp>

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace skyforge::kernels {
namespace {

template <class F>
__global__ void for_n_kernel(size_t n, F f) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

template <class F>
void for_n(Stream s, size_t n, const F& f, const char* what) {
  if (n == 0) return;
  constexpr unsigned kThreads = 256;
  constexpr size_t kMaxBlocks = size_t{1} << 16;  // beyond that each thread strides over several elements
  const size_t blocks = (n + kThreads - 1) / kThreads;
  for_n_kernel<<<static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks), kThreads, 0,
                 static_cast<cudaStream_t>(s.handle)>>>(n, f);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("skyforge kernels: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace
}  // namespace skyforge::kernels
