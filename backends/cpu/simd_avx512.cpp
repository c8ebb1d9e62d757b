// The SIMD kernels for AVX-512 (F, VL, DQ, BW; compiled with those flags; see simd.hpp).
//
// GCC 12's AVX-512 headers give the undefined pass-through operand of many intrinsics
// (_mm512_max_ps, _mm512_cvtps_pd, _mm512_castps512_ps256, ...) the value of an uninitialised
// variable, and every inlined use then warns -W(maybe-)uninitialized (GCC bug 105593, fixed in
// GCC 13). Those warnings are off for this translation unit only; the AVX2 one, built from the
// same source, keeps them.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define SF_SIMD_NS avx512
#define SF_SIMD_AVX512 1
#include "simd_kernels.inc"
#include "simd_rows.inc"
