// Philox-4x32-10, the counter-based generator of Salmon et al. (SC'11, "Parallel random numbers:
// as easy as 1, 2, 3"), and the dropout mask built on it (docs/kernels.md, "Dropout").
//
// A draw is a pure function of (counter, key): no state, so any backend, thread or element
// order produces the same mask. Checked against the published known-answer vectors in
// tests/kernels.
#pragma once

#include "hd.hpp"

namespace skyforge::kernels {

struct Philox4x32 {
  uint32_t v[4];
};

namespace philox_detail {
constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // round multipliers
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule increments
}  // namespace philox_detail

// Ten rounds over the 128-bit counter c with the 64-bit key k.
SF_HD inline Philox4x32 philox4x32_10(Philox4x32 c, uint32_t k0, uint32_t k1) {
  using namespace philox_detail;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c.v[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = Philox4x32{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
  }
  return c;
}

// Which dropout mask: the model's seed, the optimizer step, the layer's index in the model and
// the replica's rank. Limits (checked by the launch functions): layer and rank below 2^16, at
// most 2^34 elements per (layer, step).
struct DropoutKey {
  uint64_t seed = 0;
  uint64_t step = 0;
  uint32_t layer = 0;
  uint32_t rank = 0;
};

inline constexpr uint32_t kDropoutMaxLayer = 1u << 16, kDropoutMaxRank = 1u << 16;
inline constexpr uint64_t kDropoutMaxElements = uint64_t{1} << 34;

// Element i is dropped iff the top 24 bits of word (i mod 4) of
//   philox4x32_10(counter = {i / 4, layer | rank << 16, step mod 2^32, step / 2^32},
//                 key = {seed mod 2^32, seed / 2^32})
// are below cut = ceil(rate * 2^24), i.e. iff u < rate for u = (word >> 8) / 2^24 in [0, 1),
// the 24-bit uniform the cpu backend compares with its rate.
SF_HD inline uint32_t dropout_cut(float rate) {
  const double c = static_cast<double>(rate) * 16777216.0;
  const uint32_t t = static_cast<uint32_t>(c);
  return static_cast<double>(t) < c ? t + 1 : t;  // ceil, without <cmath> in device code
}

// The four words of block j (elements 4j .. 4j+3).
SF_HD inline Philox4x32 dropout_block(const DropoutKey& key, uint64_t j) {
  const Philox4x32 ctr{{static_cast<uint32_t>(j), key.layer | (key.rank << 16), static_cast<uint32_t>(key.step),
                        static_cast<uint32_t>(key.step >> 32)}};
  return philox4x32_10(ctr, static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.seed >> 32));
}

SF_HD inline uint32_t dropout_bits(const DropoutKey& key, uint64_t i) { return dropout_block(key, i >> 2).v[i & 3]; }

SF_HD inline bool dropout_keep(const DropoutKey& key, uint64_t i, uint32_t cut) {
  return (dropout_bits(key, i) >> 8) >= cut;
}

// Inverted dropout over n elements: out[i] = in[i] * (keep ? 1 / (1 - rate) : 0), the forward
// (in = x) and the backward (in = dy) alike, so the backward needs no stored mask. One call
// handles the four elements 4j .. 4j+3 that share a Philox block.
struct DropoutApply {
  const float* in;
  float* out;
  size_t n;
  DropoutKey key;
  uint32_t cut;
  float scale;
  const uint64_t* step = nullptr;  // not null: the key's step, read when the kernel runs (step.hpp)
  SF_HD void operator()(size_t j) const {
    DropoutKey k = key;
    if (step) k.step = *step;
    const Philox4x32 r = dropout_block(k, j);
    for (size_t q = 0; q < 4 && 4 * j + q < n; ++q) {
      const size_t i = 4 * j + q;
      out[i] = in[i] * ((r.v[q] >> 8) >= cut ? scale : 0.f);
    }
  }
};

}  // namespace skyforge::kernels
