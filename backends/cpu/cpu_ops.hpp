// The cpu backend's threaded building blocks: the GEMM (OpenBLAS or simd.hpp's tiles), OpenMP
// loop helpers, deterministic row reductions, bias + activation. Not installed; included by the
// engine's .cpp files only (the engine's tests and benchmarks too). Not the shared kernels of
// kernels/ (skyforge/kernels/*.hpp), which both engines read.
#pragma once

#include "cpu_engine.hpp"
#include "simd.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace skyforge::cpu::k {

// Loops shorter than this (elements, or rows * width) stay on the calling thread: an OpenMP
// fork/join costs more than the work.
inline constexpr size_t kParallelMin = size_t{1} << 15;

inline bool par(size_t work, const Exec& ex) { return ex.threads > 1 && work >= kParallelMin; }

// f(begin, end) over [0, n), split across the engine's threads when n is large. Loops inside f
// carry `#pragma omp simd` (a combined `parallel for simd` with an if clause loses its simd
// when the clause is false, i.e. on every small loop).
template <class F>
void for_range(size_t n, const Exec& ex, F&& f) {
  if (!par(n, ex)) {
    f(size_t{0}, n);
    return;
  }
  const size_t T = static_cast<size_t>(ex.threads);
#pragma omp parallel for schedule(static) num_threads(ex.threads)
  for (size_t c = 0; c < T; ++c) f(n * c / T, n * (c + 1) / T);
}

// f(begin, end) over [0, rows) rows of `width` floats, split across the threads when the rows
// hold enough work (each row is independent: the split changes no bit).
template <class F>
void for_rows(size_t rows, size_t width, const Exec& ex, F&& f) {
  if (!par(rows * width, ex) || rows < 2) {
    f(size_t{0}, rows);
    return;
  }
  const size_t T = std::min(static_cast<size_t>(ex.threads), rows);
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(T))
  for (size_t t = 0; t < T; ++t) f(rows * t / T, rows * (t + 1) / T);
}

// How many blocks a GEMM is split into: a function of its shape alone, never of the thread
// count. OpenBLAS' bits for an element depend on where its block starts (its micro-kernels
// treat edge tiles their own way: with Debian's 0.3.21 on a Zen 3 core, splitting a 200x128x784
// GEMM's rows at 112 changes 1,612 of its 25,600 elements, at 96 none), so a split that followed
// the threads would make the results follow them too. A block holds at least kGemmGrain
// multiply-adds (~4 MFLOP, tens of microseconds on one core: a fork pays for itself, and a
// single thread working through the blocks in turn loses little to the extra calls) and 16 rows
// or columns; the count is a power of two up to kGemmMaxBlocks, so 1, 2, 4, ... threads share
// the blocks evenly, and more threads than blocks leave the rest idle for that GEMM.
inline constexpr double kGemmGrain = 2.0e6;
inline constexpr size_t kGemmMaxBlocks = 16;
inline size_t gemm_blocks(size_t span, size_t M, size_t N, size_t K) {
  const double fit = std::min({static_cast<double>(kGemmMaxBlocks), static_cast<double>(span / 16),
                               static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) / kGemmGrain});
  size_t blocks = 1;
  while (static_cast<double>(blocks * 2) <= fit) blocks *= 2;
  return blocks;
}

// Row-major C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C.
//
// OpenBLAS, or simd.hpp's register tiles where those measured faster: with the AVX-512 table,
// for op(B) = B (so not the input gradients, dy · W^T), alpha 1, beta 0 or 1, and a B of at most
// kTileGemmMaxB floats (the tiles stream B from L2 and do not pack: a B that leaves L2 belongs
// to OpenBLAS). Callers are Dense layers and 1x1 convolutions. The MLP's Dense GEMMs at
// batch 64 on a Zen 5 core (bench_cpu_engine BM_gemm vs BM_tile_gemm, 1 thread, two rounds):
// forward 64x128x784 OpenBLAS 72-73 us with its own AVX-512 kernels, 117-120 us pinned to
// Haswell's (OPENBLAS_CORETYPE), tiles 53-55 us; weight gradient 784x128x64 64 / 114-115 us,
// tiles 55-56 us. On the AVX2-only cores of earlier machines OpenBLAS beat the AVX2 tiles by up
// to 2x on such GEMMs, so the AVX2 table leaves them to it. Other convolutions do not come here:
// they run simd.hpp's conv kernels on both tables (they never build the im2col matrix).
//
// One thread pool: OpenBLAS runs single-threaded (see use_single_threaded_blas) and a big GEMM
// is split into independent GEMMs over blocks of C's rows (or columns, when C is wide), which
// the engine's OpenMP threads share out. A mix of OpenBLAS' own pthreads and OpenMP's threads
// spins two pools against each other on the same cores. The blocks follow the shape only
// (gemm_blocks) and every element's K-sum stays in one block, in one order: the thread count
// changes no bit, on either kernel table or on OpenBLAS.
constexpr size_t kTileGemmMaxB = size_t{256} << 10;  // floats: 1 MiB, an AVX-512 core's L2

// The kernel table whose tiles run this GEMM, or nullptr for OpenBLAS (see gemm).
inline const simd::Kernels* tile_gemm(bool tb, size_t N, size_t K, float alpha, float beta) {
  const simd::Kernels* sk = simd::kernels();
  if (!sk || sk->isa != simd::Isa::avx512 || tb || alpha != 1.f || (beta != 0.f && beta != 1.f)) return nullptr;
  return K * N <= kTileGemmMaxB ? sk : nullptr;
}

inline void gemm(bool ta, bool tb, size_t M, size_t N, size_t K, float alpha, const float* A, size_t lda,
                 const float* B, size_t ldb, float beta, float* C, size_t ldc, const Exec& ex) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (size_t i = 0; i < M; ++i)
      for (size_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
  const simd::Kernels* tiles = tile_gemm(tb, N, K, alpha, beta);
  auto call = [&](size_t m0, size_t m1, size_t n0, size_t n1) {
    const float* a = ta ? A + m0 : A + m0 * lda;
    const float* b = tb ? B + n0 * ldb : B + n0;
    if (tiles) {
      tiles->gemm(m1 - m0, n1 - n0, K, a, ta ? 1 : lda, ta ? lda : 1, b, ldb, C + m0 * ldc + n0, ldc, beta != 0.f);
      return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                static_cast<int>(m1 - m0), static_cast<int>(n1 - n0), static_cast<int>(K), alpha, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, C + m0 * ldc + n0, static_cast<int>(ldc));
  };
  const bool by_rows = M >= N;
  const size_t span = by_rows ? M : N;
  const size_t blocks = gemm_blocks(span, M, N, K);
  if (blocks <= 1) {
    call(0, M, 0, N);
    return;
  }
  const size_t step = (span + blocks - 1) / blocks;
  const size_t chunk = (step + 15) / 16 * 16;
  const int team = static_cast<int>(std::min<size_t>(blocks, static_cast<size_t>(std::max(ex.threads, 1))));
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = std::min(span, b * chunk), hi = std::min(span, (b + 1) * chunk);
    if (lo >= hi) continue;
    if (by_rows) call(lo, hi, 0, N);
    else call(0, M, lo, hi);
  }
}

// Column sums of a [rows, width] matrix in double, through a fixed split of the rows into
// chunks that depends on `rows` only — so the result is bit-identical whatever the thread count.
// f(row_begin, row_end, acc) adds its rows' contributions to acc[width] (zeroed).
template <class F>
void reduce_rows(size_t rows, size_t width, const Exec& ex, double* out, F&& f) {
  const size_t nchunks = std::clamp<size_t>(rows / 64, 1, 32);
  static thread_local std::vector<double> partial;
  if (partial.size() < nchunks * width) partial.resize(nchunks * width);
  std::fill(partial.begin(), partial.begin() + static_cast<std::ptrdiff_t>(nchunks * width), 0.0);
  double* part = partial.data();
#pragma omp parallel for schedule(static) num_threads(ex.threads) if (nchunks > 1 && par(rows * width, ex))
  for (size_t c = 0; c < nchunks; ++c) {
    const size_t b = rows * c / nchunks, e = rows * (c + 1) / nchunks;
    f(b, e, part + c * width);
  }
  for (size_t j = 0; j < width; ++j) out[j] = 0.0;
  for (size_t c = 0; c < nchunks; ++c)
    for (size_t j = 0; j < width; ++j) out[j] += part[c * width + j];
}

// Bias gradient: column sums of dy[rows, width] into float out.
inline void bias_grad(const float* dy, size_t rows, size_t width, const Exec& ex, float* out) {
  static thread_local std::vector<double> acc;
  acc.resize(width);
  reduce_rows(rows, width, ex, acc.data(), [&](size_t b, size_t e, double* a) {
    for (size_t r = b; r < e; ++r) {
      const float* row = dy + r * width;
#pragma omp simd
      for (size_t j = 0; j < width; ++j) a[j] += row[j];
    }
  });
  for (size_t j = 0; j < width; ++j) out[j] = static_cast<float>(acc[j]);
}

// The elementwise activations and their derivatives (Keras' and jax's formulas). gelu's
// derivative needs the pre-activation z; tanh's and sigmoid's come from the output y. The exact
// gelu runs in the row kernels (simd::row_kernels(): its erfc is vectorised), the rest here.
inline constexpr float kSqrt2OverPi = 0.79788456080286536f, kGeluCubic = 0.044715f;
inline bool needs_pre_activation(Activation a) { return a == Activation::gelu || a == Activation::gelu_tanh; }
inline float apply(Activation a, float z) {
  switch (a) {
    case Activation::relu: return z > 0.f ? z : 0.f;
    case Activation::gelu_tanh: return 0.5f * z * (1.f + std::tanh(kSqrt2OverPi * (z + kGeluCubic * z * z * z)));
    case Activation::tanh: return std::tanh(z);
    case Activation::sigmoid: return 1.f / (1.f + std::exp(-z));
    default: return z;
  }
}
// dy/dz of the elementwise activations (not softmax), from the output y and the input z.
inline float derivative(Activation a, float y, float z) {
  switch (a) {
    case Activation::relu: return y > 0.f ? 1.f : 0.f;
    case Activation::gelu_tanh: {
      const float t = std::tanh(kSqrt2OverPi * (z + kGeluCubic * z * z * z));
      return 0.5f * (1.f + t) + 0.5f * z * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kGeluCubic * z * z);
    }
    case Activation::tanh: return 1.f - y * y;
    case Activation::sigmoid: return y * (1.f - y);
    default: return 1.f;
  }
}

// y[r, :] += bias, then the activation, in place over [rows, width]. pre (rows * width, may be
// null) receives the values before the activation: the backward of gelu needs them.
inline void bias_activation(float* y, const float* bias, size_t rows, size_t width, Activation act, const Exec& ex,
                            float* pre = nullptr) {
#pragma omp parallel for schedule(static) num_threads(ex.threads) if (par(rows * width, ex))
  for (size_t r = 0; r < rows; ++r) {
    float* row = y + r * width;
    if (bias) {
#pragma omp simd
      for (size_t j = 0; j < width; ++j) row[j] += bias[j];
    }
    if (pre) std::memcpy(pre + r * width, row, width * sizeof(float));
    if (act == Activation::relu) {
#pragma omp simd
      for (size_t j = 0; j < width; ++j) {
        const float v = row[j];
        row[j] = v > 0.f ? v : 0.f;
      }
    } else if (act == Activation::softmax) {
      float m = row[0];
      for (size_t j = 1; j < width; ++j) m = std::max(m, row[j]);
      float s = 0.f;
      for (size_t j = 0; j < width; ++j) {
        row[j] = std::exp(row[j] - m);
        s += row[j];
      }
      const float inv = 1.f / s;
#pragma omp simd
      for (size_t j = 0; j < width; ++j) row[j] *= inv;
    } else if (act == Activation::gelu) {
      simd::row_kernels().gelu(row, row, width);
    } else if (act != Activation::linear) {
      for (size_t j = 0; j < width; ++j) row[j] = apply(act, row[j]);
    }
  }
}

// dy <- dL/d(pre-activation), from the activation's output y (and, for gelu, its input pre),
// in place over [rows, width].
inline void activation_backward(const float* y, float* dy, size_t rows, size_t width, Activation act,
                                const Exec& ex, const float* pre = nullptr) {
  if (act == Activation::linear) return;
  if (needs_pre_activation(act) && !pre)
    throw std::logic_error("activation_backward: gelu's derivative needs the values before the activation");
#pragma omp parallel for schedule(static) num_threads(ex.threads) if (par(rows * width, ex))
  for (size_t r = 0; r < rows; ++r) {
    const float* yr = y + r * width;
    float* d = dy + r * width;
    if (act == Activation::relu) {
#pragma omp simd
      for (size_t j = 0; j < width; ++j) {
        const float v = d[j];
        d[j] = yr[j] > 0.f ? v : 0.f;
      }
    } else if (act == Activation::softmax) {
      float dot = 0.f;
      for (size_t j = 0; j < width; ++j) dot += d[j] * yr[j];
#pragma omp simd
      for (size_t j = 0; j < width; ++j) d[j] = yr[j] * (d[j] - dot);
    } else if (act == Activation::gelu) {
      simd::row_kernels().gelu_grad(pre + r * width, d, width);
    } else {
      const float* z = pre ? pre + r * width : nullptr;
      for (size_t j = 0; j < width; ++j) d[j] *= derivative(act, yr[j], z ? z[j] : 0.f);
    }
  }
}

inline void copy(const float* src, float* dst, size_t n, const Exec& ex) {
  if (!par(n, ex)) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const size_t nchunks = static_cast<size_t>(ex.threads);
#pragma omp parallel for schedule(static) num_threads(ex.threads)
  for (size_t c = 0; c < nchunks; ++c) {
    const size_t b = n * c / nchunks, e = n * (c + 1) / nchunks;
    std::memcpy(dst + b, src + b, (e - b) * sizeof(float));
  }
}

// dst[i] += src[i] over [0, n): elementwise, so the split changes no bit.
inline void add_into(float* dst, const float* src, size_t n, const Exec& ex) {
  for_range(n, ex, [&](size_t b, size_t e) {
#pragma omp simd
    for (size_t i = b; i < e; ++i) dst[i] += src[i];
  });
}

}  // namespace skyforge::cpu::k
