// The CUDA build of launch.hpp's optimizer and batch-normalization calls (docs/kernels.md).
#include "for_n.cuh"

#include "../train.inl"
