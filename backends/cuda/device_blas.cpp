// The CUDA build's GEMMs (device.hpp): cuBLAS for gemm(), cuBLASLt for gemm_bias_act's fused
// bias and ReLU epilogues, each fused shape's plan kept (plan_cache.hpp).
#include "device_cuda_impl.hpp"

#include <skyforge/kernels/bf16.hpp>

#include <algorithm>
#include <cstdint>

namespace skyforge::cuda {

void Device::Impl::init_blas() {
  check(cublasCreate(&blas), "cublasCreate");
  check(cublasSetStream(blas, stream), "cublasSetStream");
  check(cublasSetMathMode(blas, options.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  // A workspace of its own for cuBLAS (32 MiB, what NVIDIA advises for Hopper), so that no GEMM
  // allocates while a step is captured as a graph.
  constexpr size_t kBlasWorkspace = size_t{32} << 20;
  check(cudaMalloc(&blas_workspace, kBlasWorkspace), "cudaMalloc (cuBLAS workspace)");
  check(cublasSetWorkspace(blas, blas_workspace, kBlasWorkspace), "cublasSetWorkspace");
  blas_workspace_bytes = kBlasWorkspace;
  check(cublasLtCreate(&lt), "cublasLtCreate");
}

const void* Device::Impl::bf16_operand(const float* p, size_t rows, size_t cols, size_t ld, size_t batch,
                                       size_t stride, Grown& scratch) {
  const size_t n = operand_span(rows, cols, ld, batch, stride);
  grow(scratch, n * sizeof(uint16_t), "a bf16 GEMM operand's scratch");
  kernels::to_bf16(p, static_cast<uint16_t*>(scratch.p), n, kernels::Stream{stream});
  return scratch.p;
}

// cuBLAS is column-major: a row-major [M, N] matrix is its column-major transpose, so
// C^T = op(B)^T op(A)^T is the same call with the operands swapped. With precision bf16 the
// operands go in rounded to bfloat16 and cuBLAS sums their products in FP32 (CUBLAS_COMPUTE_32F).
void Device::gemm(bool ta, bool tb, size_t M, size_t N, size_t K, float alpha, const float* A, size_t lda,
                  const float* B, size_t ldb, float beta, float* C, size_t ldc) {
  if (impl_->bf16() && M && N && K) {
    const void* a = impl_->bf16_operand(A, ta ? K : M, ta ? M : K, lda, 1, 0, impl_->bf16_a);
    const void* b = impl_->bf16_operand(B, tb ? N : K, tb ? K : N, ldb, 1, 0, impl_->bf16_b);
    check(cublasGemmEx(impl_->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
                       static_cast<int>(M), static_cast<int>(K), &alpha, b, CUDA_R_16BF, static_cast<int>(ldb), a,
                       CUDA_R_16BF, static_cast<int>(lda), &beta, C, CUDA_R_32F, static_cast<int>(ldc),
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (bf16)");
    return;
  }
  check(cublasSgemm(impl_->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
                    static_cast<int>(M), static_cast<int>(K), &alpha, B, static_cast<int>(ldb), A,
                    static_cast<int>(lda), &beta, C, static_cast<int>(ldc)),
        "cublasSgemm");
}

// Swapped operands as in gemm().
void Device::gemm_strided_batched(bool ta, bool tb, size_t M, size_t N, size_t K, float alpha, const float* A,
                                  size_t lda, size_t stride_a, const float* B, size_t ldb, size_t stride_b, float beta,
                                  float* C, size_t ldc, size_t stride_c, size_t batch) {
  if (impl_->bf16() && M && N && K && batch) {
    const void* a = impl_->bf16_operand(A, ta ? K : M, ta ? M : K, lda, batch, stride_a, impl_->bf16_a);
    const void* b = impl_->bf16_operand(B, tb ? N : K, tb ? K : N, ldb, batch, stride_b, impl_->bf16_b);
    check(cublasGemmStridedBatchedEx(impl_->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, b,
                                     CUDA_R_16BF, static_cast<int>(ldb), static_cast<long long>(stride_b), a,
                                     CUDA_R_16BF, static_cast<int>(lda), static_cast<long long>(stride_a), &beta, C,
                                     CUDA_R_32F, static_cast<int>(ldc), static_cast<long long>(stride_c),
                                     static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx (bf16)");
    return;
  }
  check(cublasSgemmStridedBatched(impl_->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B,
                                  static_cast<int>(ldb), static_cast<long long>(stride_b), A, static_cast<int>(lda),
                                  static_cast<long long>(stride_a), &beta, C, static_cast<int>(ldc),
                                  static_cast<long long>(stride_c), static_cast<int>(batch)),
        "cublasSgemmStridedBatched");
}

// Column-major, as gemm(): C^T[N, M] = B^T[N, K] A^T[K, M], the bias one value per row of C^T
// (a unit), which is what cuBLASLt's BIAS epilogues add (a vector of the output's rows).
void Device::gemm_bias_act(size_t M, size_t N, size_t K, const float* A, const float* B, const float* bias,
                           kernels::Activation act, float* C) {
  auto fallback = [&] {
    gemm(false, false, M, N, K, 1.f, A, K, B, N, 0.f, C, N);
    kernels::bias_activation_forward(C, bias, M, N, act, stream_);
  };
  // The epilogues used: relu and none; every other activation runs after the GEMM. bf16 GEMMs
  // take the two-step path (gemm() rounds the operands).
  const bool epilogue_act = act == kernels::Activation::relu || act == kernels::Activation::linear;
  if (!epilogue_act || (!bias && act == kernels::Activation::linear) || impl_->bf16()) return fallback();
  if (bias && reinterpret_cast<uintptr_t>(bias) % 16 != 0) return fallback();  // the BIAS epilogues need 16 bytes
  const cublasLtEpilogue_t epilogue = act == kernels::Activation::relu
                                          ? (bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU)
                                          : CUBLASLT_EPILOGUE_BIAS;
  // The heuristic assumes 256-byte aligned operands unless told: a layer's weights are a slice
  // of the flat parameter buffer, aligned to 4 bytes only. The alignments are part of the key.
  auto alignment = [](const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return static_cast<uint32_t>(std::min<uintptr_t>(a & (~a + 1), 256));
  };
  const uint32_t align_a = alignment(B), align_b = alignment(A), align_c = alignment(C);
  // The heuristic also reads the bias pointer's alignment off the descriptor (cublasLt.h, BIAS_POINTER).
  const uint32_t align_bias = bias ? alignment(bias) : 0;
  const size_t ws = impl_->blas_workspace_bytes;
  auto make = [&](LtPlan& d) {
    const cublasOperation_t no = CUBLAS_OP_N;
    check(cublasLtMatmulDescCreate(&d.op, impl_->options.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F),
          "cublasLtMatmulDescCreate");
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &no, sizeof no), "cublasLt TRANSA");
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof no), "cublasLt TRANSB");
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
          "cublasLt EPILOGUE");
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
          "cublasLt BIAS_POINTER");
    check(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_32F, N, K, N), "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_32F, K, M, K), "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, N, M, N), "cublasLtMatrixLayoutCreate");
    check(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate");
    check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
          "cublasLt MAX_WORKSPACE_BYTES");
    check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                               sizeof align_a),
          "cublasLt MIN_ALIGNMENT_A_BYTES");
    check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                               sizeof align_b),
          "cublasLt MIN_ALIGNMENT_B_BYTES");
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check(cublasLtMatmulPreferenceSetAttribute(d.pref, attr, &align_c, sizeof align_c),
            "cublasLt MIN_ALIGNMENT_C/D");
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t asked =
        cublasLtMatmulAlgoGetHeuristic(impl_->lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found);
    d.found = asked == CUBLAS_STATUS_SUCCESS && found > 0;
    if (d.found) d.algo = heuristic.algo;
  };
  LtPlan& d = impl_->lt_plans.get(
      {M, N, K, static_cast<uint64_t>(epilogue), align_a, align_b, align_c, align_bias, ws}, make);
  if (!d.found) return fallback();  // no fused algorithm for this shape
  // This call's bias (of the alignment the plan was chosen for); a bias-less epilogue ignores it.
  check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
        "cublasLt BIAS_POINTER");
  const float alpha = 1.f, beta = 0.f;
  const cublasStatus_t st = cublasLtMatmul(impl_->lt, d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c, C, d.c, &d.algo,
                                           impl_->blas_workspace, ws, impl_->stream);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    d.found = false;  // and every later call of this shape falls back at once
    return fallback();
  }
  check(st, "cublasLtMatmul");
}

}  // namespace skyforge::cuda
