// The SIMD kernels for AVX-512 (F, VL, DQ, BW; compiled with those flags; see simd.hpp).
#define SF_SIMD_NS avx512
#define SF_SIMD_AVX512 1
#include "simd_kernels.inc"
