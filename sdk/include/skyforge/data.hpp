// skyforge data API (docs/runtime-api.md): deterministic data partitioning for native apps.
//
// Every function here gives the same answer on every node, compiler and standard library:
// the permutation comes from a documented generator (SplitMix64 seeding a xoshiro256**) and
// a Fisher–Yates shuffle with an unbiased bounded draw (Lemire's multiply-shift with
// rejection), never from std::shuffle or std::uniform_int_distribution, whose output is
// implementation-defined.
//
//   shard(n, node, total, shuffle, seed)          this node's indices of [0, n)
//   shard(info, n, shuffle, seed)                 the same, info = instance_info() (or shard_for)
//   shard(node, total, shuffle, seed, a, b, ...)  the same rows of several equal-length arrays
//   shard(info, shuffle, seed, a, b, ...)         the same, info = instance_info()
//   DistributedSampler                            PyTorch's sampler semantics, epoch by epoch
//   permutation(n, shuffle, seed), Rng            the building blocks, public and pinned
//
// The generator, the bounded draw and the shuffle are pinned by a golden test
// (tests/sdk/test_sdk_data.cpp): a given (n, seed) splits the same way in every release.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace skyforge {

// xoshiro256** seeded through SplitMix64 (Blackman & Vigna). Small, fast, and specified
// exactly, so a permutation can be reproduced anywhere from (seed, epoch).
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& word : s_) word = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, bound), unbiased: Lemire's multiply-shift ("Fast Random Integer Generation
  // in an Interval", 2019) — the high 64 bits of next() * bound, redrawing when the low 64 bits
  // fall below 2^64 mod bound. bound must be > 0.
  uint64_t below(uint64_t bound) {
    uint64_t hi = 0, lo = 0;
    mul_64x64(next(), bound, hi, lo);
    if (lo < bound) {
      const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
      while (lo < threshold) mul_64x64(next(), bound, hi, lo);
    }
    return hi;
  }

 private:
  // Full 128-bit product as (hi, lo), in portable C++ (no __int128, so -pedantic builds stay clean).
  static void mul_64x64(uint64_t a, uint64_t b, uint64_t& hi, uint64_t& lo) {
    const uint64_t a_lo = a & 0xffffffffULL, a_hi = a >> 32, b_lo = b & 0xffffffffULL, b_hi = b >> 32;
    const uint64_t p0 = a_lo * b_lo, p1 = a_lo * b_hi, p2 = a_hi * b_lo, p3 = a_hi * b_hi;
    const uint64_t mid = (p0 >> 32) + (p1 & 0xffffffffULL) + (p2 & 0xffffffffULL);
    hi = p3 + (p1 >> 32) + (p2 >> 32) + (mid >> 32);
    lo = (mid << 32) | (p0 & 0xffffffffULL);
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t s_[4];
};

// [0, n), permuted by Fisher–Yates from `seed` when shuffle is set.
inline std::vector<size_t> permutation(size_t n, bool shuffle, uint64_t seed) {
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t{0});
  if (shuffle && n > 1) {
    Rng rng(seed);
    for (size_t i = n - 1; i > 0; --i) std::swap(idx[i], idx[rng.below(i + 1)]);
  }
  return idx;
}

// This node's part of [0, n): a contiguous slice of the (optionally permuted) indices. The
// first n % total_nodes nodes get one more element, so sizes differ by at most one; the parts
// are disjoint and together cover [0, n), identically on every node.
inline std::vector<size_t> shard(size_t n, uint32_t node, uint32_t total_nodes, bool shuffle = false,
                                 uint64_t seed = 0) {
  if (total_nodes == 0) throw std::invalid_argument("shard: total_nodes must be >= 1");
  if (node >= total_nodes)
    throw std::invalid_argument("shard: node " + std::to_string(node) + " is not below total_nodes " +
                                std::to_string(total_nodes));
  const size_t base = n / total_nodes, extra = n % total_nodes;
  const size_t begin = node * base + std::min<size_t>(node, extra);
  const size_t count = base + (node < extra ? 1 : 0);
  std::vector<size_t> all = permutation(n, shuffle, seed);
  return std::vector<size_t>(all.begin() + static_cast<std::ptrdiff_t>(begin),
                             all.begin() + static_cast<std::ptrdiff_t>(begin + count));
}

namespace detail {
// Anything that says which node this is: skyforge::InstanceInfo (sdk.hpp), or any struct with
// integral .node and .total_nodes.
template <class I>
concept NodeInfo = requires(const I& i) {
  { i.node } -> std::convertible_to<uint32_t>;
  { i.total_nodes } -> std::convertible_to<uint32_t>;
};
}  // namespace detail

// shard(n, info.node, info.total_nodes, shuffle, seed), for an InstanceInfo-like `info`:
//   auto mine = skyforge::shard(instance_info(), n, /*shuffle=*/true, /*seed=*/42);
template <detail::NodeInfo Info>
std::vector<size_t> shard(const Info& info, size_t n, bool shuffle = false, uint64_t seed = 0) {
  return shard(n, static_cast<uint32_t>(info.node), static_cast<uint32_t>(info.total_nodes), shuffle, seed);
}
// The same, under a name that cannot be confused with the other overloads.
template <detail::NodeInfo Info>
std::vector<size_t> shard_for(const Info& info, size_t n, bool shuffle = false, uint64_t seed = 0) {
  return shard(n, static_cast<uint32_t>(info.node), static_cast<uint32_t>(info.total_nodes), shuffle, seed);
}

namespace detail {
// What shard(node, total, shuffle, seed, arrays...) accepts as an array: size() and operator[].
template <class A>
concept IndexableRows = requires(const A& a, size_t i) {
  { a.size() } -> std::convertible_to<size_t>;
  a[i];
};
}  // namespace detail

// Several arrays split consistently: row i of every array lands on the same node. Each array
// is a std::vector (or anything with size() and operator[]); all must have one length.
// The constraint keeps shard(n, node, total, shuffle, seed) unambiguous when seed is a plain
// integer literal (without it, `shard(n, node, total, true, 42)` matched both overloads).
template <class... Arrays>
  requires(detail::IndexableRows<Arrays> && ...)
auto shard(uint32_t node, uint32_t total_nodes, bool shuffle, uint64_t seed, const Arrays&... arrays) {
  static_assert(sizeof...(Arrays) > 0, "shard: pass at least one array");
  const size_t sizes[] = {static_cast<size_t>(arrays.size())...};
  for (size_t s : sizes)
    if (s != sizes[0])
      throw std::invalid_argument("shard: arrays differ in length (" + std::to_string(sizes[0]) + " vs " +
                                  std::to_string(s) + ")");
  const std::vector<size_t> idx = shard(sizes[0], node, total_nodes, shuffle, seed);
  auto take = [&idx](const auto& a) {
    std::vector<std::decay_t<decltype(a[0])>> out;
    out.reserve(idx.size());
    for (size_t i : idx) out.push_back(a[i]);
    return out;
  };
  return std::make_tuple(take(arrays)...);
}

// shard(info.node, info.total_nodes, shuffle, seed, arrays...), for an InstanceInfo-like `info`:
//   auto [x_mine, y_mine] = skyforge::shard(instance_info(), /*shuffle=*/true, /*seed=*/42, x, y);
template <detail::NodeInfo Info, class... Arrays>
  requires(detail::IndexableRows<Arrays> && ...)
auto shard(const Info& info, bool shuffle, uint64_t seed, const Arrays&... arrays) {
  return shard(static_cast<uint32_t>(info.node), static_cast<uint32_t>(info.total_nodes), shuffle, seed, arrays...);
}

// PyTorch's DistributedSampler, deterministically:
//  - each epoch's order is permutation(size, shuffle, seed + epoch);
//  - drop_last = false: the list is padded by repeating its own first elements (again from the
//    start if needed) to total_size = world * ceil(size / world), so every rank gets the same
//    number of samples and a few samples appear twice in an epoch;
//  - drop_last = true: the tail is dropped to total_size = world * floor(size / world);
//  - rank r takes positions r, r + world, r + 2*world, ... (strided).
// When size % world == 0 every index appears exactly once per epoch across the ranks.
class DistributedSampler {
 public:
  DistributedSampler(size_t size, uint32_t rank, uint32_t world, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false)
      : size_(size), rank_(rank), world_(world), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
    if (world == 0) throw std::invalid_argument("DistributedSampler: world must be >= 1");
    if (rank >= world)
      throw std::invalid_argument("DistributedSampler: rank " + std::to_string(rank) + " is not below world " +
                                  std::to_string(world));
    num_samples_ = drop_last ? size / world : (size + world - 1) / world;
  }

  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t epoch() const { return epoch_; }
  size_t num_samples() const { return num_samples_; }
  size_t total_size() const { return num_samples_ * world_; }
  size_t size() const { return size_; }
  uint32_t rank() const { return rank_; }
  uint32_t world() const { return world_; }
  bool shuffle() const { return shuffle_; }
  uint64_t seed() const { return seed_; }
  bool drop_last() const { return drop_last_; }

  std::vector<size_t> indices() const {
    std::vector<size_t> all = permutation(size_, shuffle_, seed_ + epoch_);
    const size_t total = total_size();
    if (all.size() > total) {
      all.resize(total);
    } else if (!all.empty()) {
      // Cyclic repetition from the start (PyTorch: indices += indices[:padding], repeated as
      // often as needed when world > size).
      all.reserve(total);
      for (size_t i = 0; all.size() < total; ++i) all.push_back(all[i]);
    }
    std::vector<size_t> mine;
    mine.reserve(num_samples_);
    for (size_t i = rank_; i < all.size(); i += world_) mine.push_back(all[i]);
    return mine;
  }

 private:
  size_t size_;
  uint32_t rank_, world_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  uint64_t epoch_ = 0;
  size_t num_samples_ = 0;
};

}  // namespace skyforge
