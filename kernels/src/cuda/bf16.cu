// The CUDA build of bf16.hpp's rounding calls (docs/kernels.md).
#include "for_n.cuh"

#include "../bf16.inl"
