// The CUDA build of launch.hpp's optimizer, gradient-clipping and batch-normalization calls
// (docs/kernels.md).
#include "for_n.cuh"

#include "../clip.inl"
#include "../train.inl"
