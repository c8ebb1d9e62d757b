// The CUDA build of launch.hpp's dense-layer, loss, reduction and dropout calls (docs/kernels.md).
#include "for_n.cuh"

namespace skyforge::kernels {
const char* build_name() { return "cuda"; }
}  // namespace skyforge::kernels

#include "../dense.inl"
#include "../window.inl"
