// The CUDA build of launch.hpp's transformer-layer calls (docs/kernels.md, "Transformer layers").
#include "for_n.cuh"

#include "../transformer.inl"
