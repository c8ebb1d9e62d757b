// Philox-4x32-10 against the published known-answer vectors, and the dropout mask built on it
// (docs/kernels.md, "Dropout"): a pure function of (seed, step, layer, rank, index).
#include "reference.hpp"

#include <skyforge/kernels/launch.hpp>
#include <skyforge/kernels/philox.hpp>

#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <stdexcept>

namespace sk = skyforge::kernels;

namespace {

// Random123's kat_vectors, the three "philox4x32 10" lines (counter, key -> output); also in
// Salmon et al.'s distribution and used by libstdc++'s std::philox4x32 test.
TEST(Philox, KnownAnswerVectors) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const sk::Philox4x32 r = sk::philox4x32_10(sk::Philox4x32{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(r.v[w], k.out[w]) << "word " << w << " of counter " << std::hex << k.ctr[0];
  }
}

std::vector<float> run_dropout(size_t n, float rate, const sk::DropoutKey& key, float value = 1.f) {
  std::vector<float> x(n, value), y(n, -1.f);
  sk::dropout(x.data(), y.data(), n, rate, key);
  return y;
}

// The mapping docs/kernels.md documents, spelled out here once more: counter {i / 4,
// layer | rank << 16, step lo, step hi}, key {seed lo, seed hi}, word i mod 4, top 24 bits < cut.
TEST(Dropout, MaskIsTheDocumentedPhiloxFunction) {
  const sk::DropoutKey key{0x0123456789abcdefULL, 0x1111222233334444ULL, 7, 3};
  const float rate = 0.3f;
  const size_t n = 4099;  // not a multiple of 4: the last block is partial
  const auto y = run_dropout(n, rate, key);
  const uint32_t cut = static_cast<uint32_t>(std::ceil(0.3f * 16777216.0));
  const float scale = 1.f / (1.f - rate);
  for (size_t i = 0; i < n; ++i) {
    const sk::Philox4x32 ctr{{static_cast<uint32_t>(i / 4), 7u | (3u << 16), 0x33334444u, 0x11112222u}};
    const uint32_t word = sk::philox4x32_10(ctr, 0x89abcdefu, 0x01234567u).v[i % 4];
    const bool keep = (word >> 8) >= cut;
    ASSERT_EQ(y[i], keep ? scale : 0.f) << "element " << i;
    ASSERT_EQ(sk::dropout_keep(key, i, sk::dropout_cut(rate)), keep);
  }
}

TEST(Dropout, SameKeySameMaskAtAnyThreadCount) {
  const sk::DropoutKey key{42, 5, 2, 1};
  const size_t n = 100003;
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto a = run_dropout(n, 0.5f, key);
  omp_set_num_threads(std::max(2, before));
  const auto b = run_dropout(n, 0.5f, key);
  omp_set_num_threads(before);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * sizeof(float)));
}

// Two masks drawn independently at rate 0.5 disagree on half the elements: within 45%..55% at
// n = 1e5 (the standard deviation of the fraction is 0.0016).
TEST(Dropout, EachKeyFieldChangesTheMask) {
  const size_t n = 100000;
  const sk::DropoutKey base{42, 5, 2, 1};
  const auto ref = run_dropout(n, 0.5f, base);
  auto differ = [&](sk::DropoutKey k) {
    const auto m = run_dropout(n, 0.5f, k);
    size_t d = 0;
    for (size_t i = 0; i < n; ++i) d += (m[i] == 0.f) != (ref[i] == 0.f);
    return static_cast<double>(d) / n;
  };
  sk::DropoutKey k = base;
  k.seed = 43;
  EXPECT_NEAR(differ(k), 0.5, 0.05) << "seed";
  k = base;
  k.step = 6;
  EXPECT_NEAR(differ(k), 0.5, 0.05) << "step";
  k = base;
  k.step = 5 + (uint64_t{1} << 32);  // the step's high word counts too
  EXPECT_NEAR(differ(k), 0.5, 0.05) << "step high word";
  k = base;
  k.layer = 3;
  EXPECT_NEAR(differ(k), 0.5, 0.05) << "layer";
  k = base;
  k.rank = 0;
  EXPECT_NEAR(differ(k), 0.5, 0.05) << "rank";
  EXPECT_EQ(differ(base), 0.0);
}

// Keep fraction over 1e6 elements: the expected fraction is 1 - cut / 2^24 (within 2^-24 of
// 1 - rate); the bound is 6 standard deviations sqrt(p (1 - p) / n) <= 0.003.
TEST(Dropout, KeepFractionIsOneMinusRate) {
  const size_t n = 1000000;
  for (const float rate : {0.f, 0.1f, 0.5f, 0.9f}) {
    const auto y = run_dropout(n, rate, sk::DropoutKey{7, 0, 1, 0});
    size_t kept = 0;
    for (float v : y) kept += v != 0.f;
    const double p = 1.0 - static_cast<double>(rate);
    const double bound = 6 * std::sqrt(p * (1 - p) / n) + 1.0 / 16777216.0;
    EXPECT_NEAR(static_cast<double>(kept) / n, p, bound) << "rate " << rate;
  }
}

// Inverted dropout: kept values scaled by 1 / (1 - rate), the rest 0; the backward (the same
// call on dy with the same key) masks exactly the forward's elements; in place works.
TEST(Dropout, ForwardAndBackwardShareTheMask) {
  const size_t n = 10007;
  const float rate = 0.25f;
  const sk::DropoutKey key{99, 12, 4, 2};
  const auto x = kref::randn(n, 1), dy = kref::randn(n, 2);
  std::vector<float> y(n), dx(n), inplace = dy;
  sk::dropout(x.data(), y.data(), n, rate, key);
  sk::dropout(dy.data(), dx.data(), n, rate, key);
  sk::dropout(inplace.data(), inplace.data(), n, rate, key);
  const float scale = 1.f / (1.f - rate);
  for (size_t i = 0; i < n; ++i) {
    const bool keep = sk::dropout_keep(key, i, sk::dropout_cut(rate));
    ASSERT_EQ(y[i], keep ? x[i] * scale : 0.f);
    ASSERT_EQ(dx[i], keep ? dy[i] * scale : 0.f);
    ASSERT_EQ(inplace[i], dx[i]);
  }
}

TEST(Dropout, RejectsArgumentsOutsideItsLimits) {
  std::vector<float> x(8, 1.f);
  EXPECT_THROW(sk::dropout(x.data(), x.data(), 8, 1.f, {}), std::invalid_argument);
  EXPECT_THROW(sk::dropout(x.data(), x.data(), 8, -0.1f, {}), std::invalid_argument);
  EXPECT_THROW(sk::dropout(x.data(), x.data(), 8, 0.5f, sk::DropoutKey{0, 0, 1u << 16, 0}), std::invalid_argument);
  EXPECT_THROW(sk::dropout(x.data(), x.data(), 8, 0.5f, sk::DropoutKey{0, 0, 0, 1u << 16}), std::invalid_argument);
  EXPECT_THROW(sk::dropout(nullptr, nullptr, (size_t{1} << 34) + 1, 0.5f, {}), std::invalid_argument);
}

}  // namespace
