// The SIMD kernels for AVX2 + FMA (compiled with -mavx2 -mfma; see simd.hpp).
#define SF_SIMD_NS avx2
#include "simd_kernels.inc"
#include "simd_rows.inc"
