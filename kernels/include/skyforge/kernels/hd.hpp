// Shared by both builds of the engine's kernels (docs/kernels.md): the math is written once as
// __host__ __device__ code; nvcc compiles it for the GPU, g++ for the host build.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define SF_HD __host__ __device__
#else
#define SF_HD
#endif

namespace skyforge::kernels {

// The activations of docs/compute-backends.md (the cpu backend's order); gelu is Keras' exact
// form (erf), gelu_tanh its approximate=true one.
enum class Activation : int { linear = 0, relu = 1, softmax = 2, gelu = 3, gelu_tanh = 4, tanh = 5, sigmoid = 6 };

}  // namespace skyforge::kernels
