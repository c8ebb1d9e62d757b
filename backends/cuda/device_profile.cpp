// The CUDA build's part of SKYFORGE_CUDA_PROFILE (device.hpp, docs/compute-backends.md
// "Profiling"): timing marks as CUDA events on the stream, and describe_convolutions(), the text
// of every conv2d window's plan (device_cudnn.hpp): its algorithms, by the names cuDNN's go by
// here, and what each candidate took.
#include "device_cuda_impl.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace skyforge::cuda {

size_t Device::mark() {
  Impl& d = *impl_;
  d.no_capture("a timing mark");
  if (d.marks_used == d.marks.size()) {
    cudaEvent_t e = nullptr;
    check(cudaEventCreate(&e), "cudaEventCreate");
    d.marks.push_back(e);
  }
  check(cudaEventRecord(d.marks[d.marks_used], d.stream), "cudaEventRecord");
  return d.marks_used++;
}
double Device::seconds(size_t from, size_t to) const {
  const Impl& d = *impl_;
  if (from >= d.marks_used || to >= d.marks_used) throw Error("cuda: seconds: no such timing mark", SF_ERR);
  float ms = 0;
  check(cudaEventElapsedTime(&ms, d.marks[from], d.marks[to]), "cudaEventElapsedTime");
  return ms / 1e3;
}
void Device::clear_marks() { impl_->marks_used = 0; }

const char* fwd_algo_name(cudnnConvolutionFwdAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: return "implicit_gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: return "implicit_precomp_gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM: return "gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT: return "direct";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT: return "fft";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: return "fft_tiling";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: return "winograd";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: return "winograd_nonfused";
    default: return "?";
  }
}
const char* filter_algo_name(cudnnConvolutionBwdFilterAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0: return "algo_0";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1: return "algo_1";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT: return "fft";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3: return "algo_3";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED: return "winograd_nonfused";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING: return "fft_tiling";
    default: return "?";
  }
}
const char* data_algo_name(cudnnConvolutionBwdDataAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0: return "algo_0";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1: return "algo_1";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT: return "fft";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING: return "fft_tiling";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD: return "winograd";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED: return "winograd_nonfused";
    default: return "?";
  }
}

namespace {
constexpr const char* kEngineReduction = "the engine's column reduction (deterministic)";

template <class Algo>
std::string choice_text(const ConvPlan::Choice<Algo>& c, const char* (*name)(Algo)) {
  if (!c.asked) return "not asked";
  if (!c.found) return "none fits: im2col + GEMM";
  return std::string(name(c.algo)) + (c.math == CUDNN_FMA_MATH ? "" : " (tensor ops)") + (c.nchw ? " in NCHW" : "") +
         (c.timed ? ", timed" : "");
}
// A direction's timed candidates, fastest first: "name 0.123 ms", marked when cuDNN ranks it
// under tensor-op math (TF32 on tensor cores for FP32 data) or it adds with atomics
// (nondeterministic), and when the policy refuses it.
void timed_text(std::string& out, const char* direction, const char* layout, const std::vector<ConvPlan::Timed>& ts,
                float transforms_ms = -1) {
  if (ts.empty()) return;
  out += std::string("      ") + direction + " " + layout;
  if (transforms_ms >= 0) {
    char t[64];
    std::snprintf(t, sizeof t, " (+ %.3f ms of transforms)", static_cast<double>(transforms_ms));
    out += t;
  }
  out += ":";
  char item[128];
  for (const ConvPlan::Timed& t : ts) {
    std::snprintf(item, sizeof item, " %s%s%s %.3f ms%s,", t.name, t.math == CUDNN_FMA_MATH ? "" : " (tensor ops)",
                  t.deterministic ? "" : " (nondeterministic)", static_cast<double>(t.ms), t.admitted ? "" : " [refused]");
    out += item;
  }
  out.back() = '\n';
}
}  // namespace

std::string Device::describe_convolutions() const {
  std::string out;
  const ConvPolicy& p = impl_->options;
  impl_->conv_plans.for_each([&](const auto& k, const ConvPlan& c) {
    // k: batch, H, W, C, kh, kw, sh, sw, pt, pl, Ho, Wo, filters (conv_setup's key)
    char line[200];
    std::snprintf(line, sizeof line, "batch %llu, %llux%llux%llu -> %llux%llux%llu, kernel %llux%llu, stride %llux%llu: ",
                  static_cast<unsigned long long>(k[0]), static_cast<unsigned long long>(k[1]),
                  static_cast<unsigned long long>(k[2]), static_cast<unsigned long long>(k[3]),
                  static_cast<unsigned long long>(k[10]), static_cast<unsigned long long>(k[11]),
                  static_cast<unsigned long long>(k[12]), static_cast<unsigned long long>(k[4]),
                  static_cast<unsigned long long>(k[5]), static_cast<unsigned long long>(k[6]),
                  static_cast<unsigned long long>(k[7]));
    out += line;
    if (!c.ok) {
      const bool thin = k[3] * k[4] * k[5] <= kernels::kThinWindow;  // C * kh * kw
      out += std::string("im2col + GEMM (cuDNN cannot pad this window)") +
             (thin ? ", the weight gradient " + std::string(kEngineReduction) : std::string()) + "\n";
      return;
    }
    out += "forward " + choice_text(c.forward, fwd_algo_name) + ", " +
           (c.by_gemm ? std::string("backward the engine's im2col + GEMM, timed") +
                            (c.filter_by_engine ? std::string(" (filter ") + kEngineReduction + ")" : std::string())
                      : "filter " +
                            (c.filter_by_engine ? std::string(kEngineReduction)
                                                : choice_text(c.filter, filter_algo_name)) +
                            ", data " + choice_text(c.data, data_algo_name)) +
           "\n";
    timed_text(out, "forward", "NHWC", c.forward.nhwc);
    timed_text(out, "forward", "NCHW", c.forward.nchw_timed, c.forward.transforms_ms);
    timed_text(out, "filter", "NHWC", c.filter.nhwc);
    timed_text(out, "filter", "NCHW", c.filter.nchw_timed, c.filter.transforms_ms);
    if (c.reduction_ms >= 0) {
      char t[96];
      std::snprintf(t, sizeof t, "      filter, %s: %.3f ms\n", kEngineReduction, static_cast<double>(c.reduction_ms));
      out += t;
    }
    timed_text(out, "data", "NHWC", c.data.nhwc);
    timed_text(out, "data", "NCHW", c.data.nchw_timed, c.data.transforms_ms);
    if (c.gemm_ms >= 0) {
      char t[160];
      if (c.cudnn_ms >= 0)
        std::snprintf(t, sizeof t, "      backward, the engine's im2col + GEMM: %.3f ms (cuDNN's chosen: %.3f ms)\n",
                      static_cast<double>(c.gemm_ms), static_cast<double>(c.cudnn_ms));
      else
        std::snprintf(t, sizeof t, "      backward, the engine's im2col + GEMM: %.3f ms\n", static_cast<double>(c.gemm_ms));
      out += t;
    }
  });
  if (!out.empty() && (p.autotune || p.survey || p.nchw_only()))
    out = std::string("    (chosen ") + (p.autotune ? "by time" : "by cuDNN's heuristics") + ", among " +
          (p.deterministic ? "deterministic" : "all") + " algorithms in " + (p.tf32 ? "FP32 or TF32" : "FP32") +
          ", in " + (p.nchw_only() ? "NCHW" : p.may_nchw() ? "NHWC or NCHW" : "NHWC") +
          (p.autotune || p.survey ? "; times: cudnnFind*Ex, each candidate once, at the window's first use)\n" : ")\n") +
          out;
  return out;
}

}  // namespace skyforge::cuda
