// Hand-written SIMD kernels of the cpu backend, chosen at run time (the plugin must run on any
// x86-64 node, so nothing here depends on the build machine's -march).
//
// Each instruction set has its own translation unit compiled with that ISA's flags
// (simd_avx2.cpp: AVX2+FMA, simd_avx512.cpp: AVX-512F/VL/DQ/BW) from the same source
// (simd_kernels.inc); kernels() returns the best table the CPU (and its OS) supports, or
// nullptr (no AVX2/FMA, not x86-64, or SKYFORGE_CPU_ISA=none): then OpenBLAS does every GEMM.
//
// Numerics: every output element of a GEMM is one fused multiply-add chain over the reduction
// index, in increasing order, starting from 0 (accumulating GEMMs add the finished chain to C
// at the end). The chain does not depend on the vector width, the tiling or the thread split,
// so the AVX2 and AVX-512 tables give bit-identical results, whatever the thread count.
#pragma once

#include <cstddef>

namespace skyforge::cpu::simd {

enum class Isa : int { none = 0, avx2 = 1, avx512 = 2 };

// A 2-D convolution's window geometry (NHWC input H x W x C, kernel kh x kw, strides, leading
// pads, output Ho x Wo). A col row is one output pixel's window, (kh, kw, C) flattened.
struct ConvGeom {
  size_t H, W, C, kh, kw, sh, sw, pt, pl, Ho, Wo;
};

// Row kernels (row_kernels.hpp: one source for every table and the portable loops, the same
// bits from all of them): GELU and its derivative over n floats (gelu_grad: dy *= GELU'(z)),
// softmax over rows of `width` in place and its backward from the output (dy <- y * (dy -
// sum(dy * y))), layer normalization of rows of C (gamma/beta null for none; mean/invstd, one
// per row, written) and its input gradient.
struct RowKernels {
  void (*gelu)(const float* z, float* y, size_t n);
  void (*gelu_grad)(const float* z, float* dy, size_t n);
  void (*softmax)(float* s, size_t rows, size_t width);
  void (*softmax_grad)(const float* y, float* dy, size_t rows, size_t width);
  void (*layer_norm)(const float* x, float* y, size_t rows, size_t C, const float* gamma, const float* beta, float eps,
                     float* mean, float* invstd);
  void (*layer_norm_dx)(const float* x, const float* dy, float* dx, size_t rows, size_t C, const float* gamma,
                        const float* mean, const float* invstd);
};

struct Kernels {
  Isa isa;
  const char* name;
  int width;  // floats per vector register
  // Keras Adam over [0, n), the same operations in the same order as Optimizer::apply's
  // portable loop (no fma contraction: these translation units build with -ffp-contract=off),
  // so the result is bit-identical to it: g' = g * scale; m += (g' - m) * b1c;
  // v += (g'^2 - v) * b2c; p -= alpha * m / (sqrt(v) + eps).
  // Convolutions without a col matrix: the forward and the weight gradient read x in place, or
  // copy each sample zero-padded into buf (with, for small windows' forward, the kernel's columns
  // padded to whole vectors) and read it there; the input gradient, and any sample too big for
  // buf, builds panels of col rows in buf (as many as fit in buf_floats less 16 floats of slack;
  // room for 24 rows or more is best) and uses them at once. Same results as im2col, a GEMM with
  // one fma chain per element, and col2im.
  //   conv_fwd:   y rows of samples [n0, n1) = col · Wk (Wk [K, F], K = kh*kw*C)
  //   conv_dgrad: dx of samples [n0, n1) = col2im(dy · Wt) (Wt [F, K], the kernel transposed)
  //   conv_wgrad: rows [r0, r1) of dW [K, F] = col^T · dy over all `batch` samples (overwritten);
  //               scratch holds (r1 - r0) * F floats
  void (*conv_fwd)(const ConvGeom& g, const float* x, size_t n0, size_t n1, const float* Wk, size_t F, float* y,
                   float* buf, size_t buf_floats);
  void (*conv_dgrad)(const ConvGeom& g, const float* dy, size_t n0, size_t n1, const float* Wt, size_t F, float* dx,
                     float* buf, size_t buf_floats);
  void (*conv_wgrad)(const ConvGeom& g, const float* x, size_t batch, const float* dy, size_t F, size_t r0, size_t r1,
                     float* dW, float* buf, size_t buf_floats, float* scratch);
  // Batch normalization over rows of C channels (x, y, dy: rows * C floats; per-channel arrays
  // of C). bn_sums: sum[c] += x, sumsq[c] += x^2 in double, in row order. bn_bwd_sums, with
  // d = dy masked by y > 0 when y is given (a fused ReLU after the normalisation, y its output):
  // sdy[c] += d, sdx[c] += d * ((x - mu) * is) (float product, double sum). bn_apply:
  // y = x * sc + sf, then max(y, 0) when relu. bn_dx: dx = sc * ((d - k1) - ((x - mu) * is) * k2).
  // The double accumulators hold C values rounded up to 8 (so whole vectors can be stored).
  void (*bn_sums)(const float* x, size_t rows, size_t C, double* sum, double* sumsq);
  void (*bn_bwd_sums)(const float* x, const float* y, const float* dy, size_t rows, size_t C, const float* mu,
                      const float* is, double* sdy, double* sdx);
  void (*bn_apply)(const float* x, float* y, size_t rows, size_t C, const float* sc, const float* sf, bool relu);
  void (*bn_dx)(const float* x, const float* y, const float* dy, float* dx, size_t rows, size_t C, const float* sc,
                const float* mu, const float* is, const float* k1, const float* k2);
  void (*adam)(size_t n, float* p, const float* g, float* m, float* v, float scale, float b1c, float b2c,
               float alpha, float eps);
  // A plain GEMM in register tiles, no packing (for operands that stay in L2): O[i, j] (rows x
  // cols, row stride ldo) = sum over t < T of P[i * prs + t * pts] * Q[t * qts + j], one fma chain
  // per element in increasing t, stored, or added to O when accumulate.
  void (*gemm)(size_t rows, size_t cols, size_t T, const float* P, size_t prs, size_t pts, const float* Q,
               size_t qts, float* O, size_t ldo, bool accumulate);
  const RowKernels* rows;
};

// The best table for this CPU, honouring SKYFORGE_CPU_ISA (avx512 | avx2 | none) as a cap;
// nullptr: use OpenBLAS.
const Kernels* kernels();
// The row kernels of kernels(), or the portable loops when it is nullptr.
const RowKernels& row_kernels();
// What the CPU and OS support (cpuid + xgetbv, via the compiler's runtime).
Isa supported();
// Test and benchmark hook: use `isa` (capped at supported()) from now on; returns the ISA in use.
Isa set_isa(Isa isa);
const char* isa_name(Isa isa);

namespace portable {
extern const RowKernels row_table;
}
#if defined(SKYFORGE_CPU_SIMD)
namespace avx2 {
extern const Kernels table;
extern const RowKernels row_table;
}
namespace avx512 {
extern const Kernels table;
extern const RowKernels row_table;
}
#endif

}  // namespace skyforge::cpu::simd
