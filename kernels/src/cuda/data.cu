// The CUDA build of launch.hpp's bound-data calls (docs/kernels.md, "Bound data").
#include "for_n.cuh"

#include "../data.inl"
