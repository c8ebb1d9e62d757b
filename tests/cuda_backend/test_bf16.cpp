// precision = "bf16" (docs/compute-backends.md, "Mixed precision") in the cuda engine's host
// build: the rounding (kernels/bf16.hpp) against a reference that rounds another way, the GEMMs
// multiplying rounded operands, and training that follows FP32's (the gpu tests run the CUDA
// build's cublasGemmEx path against this one).
#include "bf16_training.hpp"

#include <skyforge/kernels/bf16.hpp>
#include <skyforge/thread_group.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

using namespace cuda_test;
using skyforge::Communicator;
namespace cu = skyforge::cuda;
namespace k = skyforge::kernels;

namespace {

uint32_t bits(float x) { return k::float_bits(x); }
float from_bits(uint32_t u) { return k::float_of_bits(u); }

// The nearest bf16 by exact arithmetic: the two bf16 values around x (x truncated, and the next
// one away from zero), the closer in long double, a tie going to the one whose last kept bit is 0.
uint16_t reference_bf16(float x) {
  if (std::isnan(x)) return 0;  // checked separately
  const uint32_t down = bits(x) & 0xffff0000u;
  if (down == bits(x)) return static_cast<uint16_t>(down >> 16);
  const uint32_t up = down + 0x10000u;  // past the largest finite: the infinity's bits
  const long double lo = std::fabs(static_cast<long double>(from_bits(down)));
  const long double hi = (up & 0x7fffffffu) == 0x7f800000u ? std::ldexp(1.0L, 128)  // rounding to inf: 2^128
                                                           : std::fabs(static_cast<long double>(from_bits(up)));
  const long double ax = std::fabs(static_cast<long double>(x));
  const long double d_lo = ax - lo, d_hi = hi - ax;
  const bool take_up = d_hi < d_lo || (d_hi == d_lo && ((down >> 16) & 1u));
  return static_cast<uint16_t>((take_up ? up : down) >> 16);
}

}  // namespace

TEST(Bf16, RoundsToNearestWithTiesToEven) {
  // Hand-checked: ties (1 + 2^-8 -> 1; 1 + 3 * 2^-8 -> 1 + 2^-6), signs, zeros, the largest
  // finite float (past bf16's largest finite, 0x7f7f, by more than half a step: inf), infinities.
  EXPECT_EQ(k::bf16_bits(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(k::bf16_bits(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(k::bf16_bits(-(1.0f + 3 * 0x1p-8f)), 0xbf82);
  EXPECT_EQ(k::bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(k::bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(k::bf16_bits(FLT_MAX), 0x7f80);
  EXPECT_EQ(k::bf16_bits(from_bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(k::bf16_bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(k::bf16_bits(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(k::bf16_bits(from_bits(0x00008000u)), 0x0000) << "the smallest subnormals: a tie to even (zero)";
  EXPECT_EQ(k::bf16_bits(from_bits(0x00018000u)), 0x0002);
  // NaNs stay NaNs of their sign, quiet, even those whose payload is only in the low bits.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t b = k::bf16_bits(from_bits(nan));
    EXPECT_EQ(b & 0x7f80, 0x7f80) << std::hex << nan;
    EXPECT_NE(b & 0x0040, 0) << std::hex << nan;
    EXPECT_EQ(b >> 15, nan >> 31) << std::hex << nan;
  }
  // Every 4099th bit pattern (a million, every exponent and sign), and the patterns right at a tie.
  uint64_t checked = 0;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) {
    for (uint32_t v : {static_cast<uint32_t>(u), (static_cast<uint32_t>(u) & 0xffff0000u) | 0x8000u}) {
      const float x = from_bits(v);
      if (std::isnan(x)) continue;
      ASSERT_EQ(k::bf16_bits(x), reference_bf16(x)) << std::hex << v;
      ASSERT_EQ(bits(k::bf16_round(x)), static_cast<uint32_t>(reference_bf16(x)) << 16) << std::hex << v;
      ++checked;
    }
  }
  EXPECT_GT(checked, 2000000u);
}

// The host build's GEMMs with precision bf16 multiply the operands rounded to bf16 (each product
// exact in FP32) and sum in FP32: against a long-double reference of the rounded operands within
// FP32 summation error, and far (relative to that error) from the FP32 product. Both operand
// layouts, leading dimensions wider than the rows, and a strided batch.
TEST(Bf16, GemmsMultiplyTheOperandsRoundedToBf16) {
  cu::DeviceOptions o;
  o.precision = cu::DeviceOptions::Precision::bf16;
  cu::Device bf(Communicator{}, skyforge::Host{}, o);
  cu::Device fp(Communicator{}, skyforge::Host{});
  constexpr size_t M = 7, N = 5, K = 33, ld = 40, batch = 3, stride = 1400;  // a matrix spans at most 33 x 40
  skyforge::Rng rng(9);
  std::vector<float> A(batch * stride), B(batch * stride);
  for (float& v : A) v = static_cast<float>(static_cast<double>(rng.next() >> 11) / 9007199254740992.0 * 2 - 1);
  for (float& v : B) v = static_cast<float>(static_cast<double>(rng.next() >> 11) / 9007199254740992.0 * 2 - 1);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<float> cb(batch * M * N), cf(batch * M * N);
      bf.gemm_strided_batched(ta, tb, M, N, K, 1.f, A.data(), ld, stride, B.data(), ld, stride, 0.f, cb.data(), N,
                              M * N, batch);
      fp.gemm_strided_batched(ta, tb, M, N, K, 1.f, A.data(), ld, stride, B.data(), ld, stride, 0.f, cf.data(), N,
                              M * N, batch);
      std::vector<float> single(M * N);
      bf.gemm(ta, tb, M, N, K, 1.f, A.data(), ld, B.data(), ld, 0.f, single.data(), N);
      EXPECT_EQ(std::memcmp(single.data(), cb.data(), single.size() * sizeof(float)), 0) << "gemm is batch 0";
      double far = 0;
      for (size_t p = 0; p < batch; ++p)
        for (size_t i = 0; i < M; ++i)
          for (size_t j = 0; j < N; ++j) {
            long double ref = 0, sum_abs = 0;
            for (size_t kk = 0; kk < K; ++kk) {
              const float a = A[p * stride + (ta ? kk * ld + i : i * ld + kk)];
              const float b = B[p * stride + (tb ? j * ld + kk : kk * ld + j)];
              const long double t = static_cast<long double>(k::bf16_round(a)) * k::bf16_round(b);
              ref += t;
              sum_abs += std::fabs(t);
            }
            const double bound = static_cast<double>(sum_abs) * K * FLT_EPSILON;
            const float got = cb[p * M * N + i * N + j];
            EXPECT_LE(std::fabs(got - static_cast<double>(ref)), bound) << ta << tb << " " << p << "," << i << "," << j;
            far = std::max(far, std::fabs(static_cast<double>(cf[p * M * N + i * N + j]) - static_cast<double>(ref)) /
                                    bound);
          }
      EXPECT_GT(far, 1.0) << "the FP32 product is as close: the operands were not rounded";
    }
}

// The bar: the main job's MLP on Fashion-MNIST, after 1,000 steps of batch 32 (the same
// seed, the same batches), has a loss within 1% of FP32's (bf16_training.hpp).
TEST(Bf16, TheMainJobsMlpAfter1000StepsIsWithinOnePercentOfFp32) { expect_main_jobs_mlp_within_one_percent("host"); }

// A step in bf16 from the same state is a step in FP32 to bf16's rounding: the loss within
// 1e-2 relative, the weights within 1e-3 (SGD, lr 0.05), on the MLP and the convnet; the gpu
// tests hold the CUDA build to the same bounds.
TEST(Bf16, AStepFromTheSameStateIsFp32sToBf16Rounding) {
  for (const ModelSpec& m : {mlp(75), convnet(76)}) {
    const auto [loss, weights] = bf16_steps_beside_cpu(m);
    std::printf("bf16 step vs the cpu backend's FP32 step: loss %.3g (relative), weights %.3g\n", loss, weights);
    EXPECT_LE(loss, 1e-2);
    EXPECT_LE(weights, 1e-3);
    EXPECT_GT(weights, 0.0) << "no difference at all: the rounding is not in the step";
  }
}

// Convolutions (im2col + the bf16 GEMM) and attention (strided-batched bf16 GEMMs) train with it
// too: the convnet and a transformer block (the image as 16 rows of 49) on Fashion-MNIST, the
// mean loss of steps 101-150 within 1% of FP32's.
TEST(Bf16, ConvolutionsAndAttentionTrainAsFp32Does) {
  std::string why;
  std::vector<Batch> batches = fashion_batches(150, &why);
  if (batches.empty()) GTEST_SKIP() << why;
  ModelSpec conv = convnet(72);
  ModelSpec att;
  att.input_shape = {16, 49};
  att.layers = {layer("dense", {{"units", "32"}}),
                layer("layer_normalization", {{"name", "ln"}}),
                layer("multi_head_attention", {{"num_heads", "4"}, {"key_dim", "8"}, {"name", "att"}}),
                layer("add", {{"inputs", "ln,att"}}),
                layer("global_average_pooling1d"),
                layer("dense", {{"units", "10"}})};
  att.seed = 73;
  for (const ModelSpec* m : {&conv, &att}) {
    const Losses r = train_each_way(*m, batches, 50);
    std::printf("%s on Fashion-MNIST, mean training loss of steps 101-150: fp32 %.5f, bf16 %.5f (%+.2f%%)\n",
                m == &conv ? "convnet" : "attention", r.fp32, r.bf16, 100 * (r.bf16 - r.fp32) / r.fp32);
    EXPECT_LE(std::fabs(r.bf16 - r.fp32), 0.01 * r.fp32);
    EXPECT_NE(r.weights_fp32, r.weights_bf16);
  }
}

// The weights, gradients and optimizer state stay FP32: a bf16 run's checkpoint loads in the cpu
// backend and back, as an FP32 one does.
TEST(Bf16, CheckpointsStayFp32AndMoveBetweenBackends) {
  const ModelSpec m = mlp(74);
  const cu::EngineOptions o = bf16_options();
  auto g = cu::make_engine(m, Communicator{}, skyforge::Host{}, o);
  const Batch b = make_batch(5, 16, features(m));
  for (int s = 0; s < 3; ++s) g->train_step(b.x.data(), b.y.data(), 16);
  auto c = skyforge::cpu::make_engine(m, Communicator{});
  c->load_state(g->state_dict());
  EXPECT_EQ(params_of(*c), params_of(*g));
  auto back = cu::make_engine(m, Communicator{}, skyforge::Host{}, o);
  back->load_state(c->state_dict());
  EXPECT_EQ(back->state_dict(), g->state_dict());
}
