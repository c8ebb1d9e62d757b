// bfloat16 for the cuda engine's precision = "bf16" (docs/compute-backends.md, "Mixed
// precision"): a float rounded to its upper 16 bits, to nearest with ties to even, as
// __float2bfloat16_rn, PyTorch and XLA round; a NaN stays a (quiet) NaN of the same sign. The
// GEMMs' operands are rounded this one way in both builds, so the host build's products are the
// GPU's (a product of two bf16 values is exact in FP32) and only the FP32 sums' order differs.
#pragma once

#include "hd.hpp"
#include "launch.hpp"

#include <cstdint>
#include <cstring>

namespace skyforge::kernels {

SF_HD inline uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

SF_HD inline float float_of_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// The bf16 nearest to x (ties to even), as its 16 bits.
SF_HD inline uint16_t bf16_bits(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: quiet
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // a carry rounds up, to inf past the largest
}

// That bf16 as a float (exact).
SF_HD inline float bf16_round(float x) { return float_of_bits(static_cast<uint32_t>(bf16_bits(x)) << 16); }

// y[i] = bf16_bits(x[i]) (the CUDA build's GEMM operands), or bf16_round(x[i]) as floats (the
// host build's, which OpenBLAS multiplies in FP32), for i in [0, n).
void to_bf16(const float* x, uint16_t* y, size_t n, Stream s);
void round_bf16(const float* x, float* y, size_t n, Stream s);

}  // namespace skyforge::kernels
