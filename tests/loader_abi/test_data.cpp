// The runtime data API (DESIGN.md §6): properties that must hold on every node, for many
// sizes, worlds and seeds.
#include <gtest/gtest.h>

#include <skyforge/data.hpp>

#include <algorithm>
#include <set>

using skyforge::DistributedSampler;
using skyforge::permutation;
using skyforge::shard;

namespace {

TEST(Shard, PartsAreDisjointCoverEverythingAndDifferByAtMostOne) {
  for (size_t n : {0u, 1u, 2u, 7u, 10u, 64u, 1000u, 1001u})
    for (uint32_t world : {1u, 2u, 3u, 4u, 7u, 16u})
      for (bool shuffle : {false, true})
        for (uint64_t seed : {0ull, 42ull}) {
          std::vector<int> seen(n, 0);
          size_t lo = SIZE_MAX, hi = 0;
          for (uint32_t node = 0; node < world; ++node) {
            auto part = shard(n, node, world, shuffle, seed);
            lo = std::min(lo, part.size());
            hi = std::max(hi, part.size());
            for (size_t i : part) {
              ASSERT_LT(i, n);
              ++seen[i];
            }
            // Every node computes the same split on its own.
            EXPECT_EQ(part, shard(n, node, world, shuffle, seed));
          }
          EXPECT_LE(hi - lo, 1u) << "n=" << n << " world=" << world;
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "index " << i << " n=" << n << " world=" << world;
        }
}

TEST(Shard, ShuffleIsASeededPermutation) {
  auto a = permutation(1000, true, 7), b = permutation(1000, true, 7), c = permutation(1000, true, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, permutation(1000, false, 0));
  EXPECT_NE(a, sorted);
}

TEST(Shard, GoldenPermutation) {
  // Pinned on purpose: changing the generator changes every user's data split, which must be a
  // deliberate, documented decision (and a note in the changelog), never an accident.
  std::vector<size_t> golden = permutation(10, true, 42);
  std::vector<size_t> expected = {9, 1, 4, 2, 8, 7, 6, 5, 3, 0};
  EXPECT_EQ(golden, expected);
}

TEST(Shard, SeveralArraysStayAligned) {
  std::vector<int> y(101);
  std::vector<double> x(101);
  for (int i = 0; i < 101; ++i) {
    y[i] = i;
    x[i] = 2.0 * i;
  }
  size_t total = 0;
  for (uint32_t node = 0; node < 3; ++node) {
    auto [xs, ys] = shard(node, 3, true, 5, x, y);
    ASSERT_EQ(xs.size(), ys.size());
    for (size_t k = 0; k < xs.size(); ++k) EXPECT_EQ(xs[k], 2.0 * ys[k]);
    total += xs.size();
  }
  EXPECT_EQ(total, 101u);
  std::vector<int> shorter(100);
  EXPECT_THROW(shard(0, 3, true, 5, x, shorter), std::invalid_argument);
  EXPECT_THROW(shard(10, 3, 3), std::invalid_argument);
}

TEST(DistributedSampler, EveryIndexOncePerEpochWhenTheSizeDivides) {
  for (uint32_t world : {1u, 2u, 4u, 5u}) {
    const size_t size = 20 * world;
    std::vector<int> seen(size, 0);
    for (uint32_t r = 0; r < world; ++r) {
      DistributedSampler s(size, r, world, true, 3);
      s.set_epoch(2);
      EXPECT_EQ(s.num_samples(), 20u);
      for (size_t i : s.indices()) ++seen[i];
    }
    for (int c : seen) EXPECT_EQ(c, 1);
  }
}

TEST(DistributedSampler, PadsByRepeatingTheStartOrDropsTheTail) {
  const size_t size = 10;
  const uint32_t world = 4;  // 10 = 4*2 + 2
  std::vector<size_t> order = permutation(size, true, 9 + 1);
  std::vector<size_t> all;
  for (uint32_t r = 0; r < world; ++r) {
    DistributedSampler s(size, r, world, true, 9, false);
    s.set_epoch(1);
    auto idx = s.indices();
    EXPECT_EQ(idx.size(), 3u);  // ceil(10/4)
    EXPECT_EQ(s.total_size(), 12u);
    for (size_t k = 0; k < idx.size(); ++k) EXPECT_EQ(idx[k], k * world + r < size ? order[k * world + r] : order[k * world + r - size]);
    all.insert(all.end(), idx.begin(), idx.end());
  }
  EXPECT_EQ(std::set<size_t>(all.begin(), all.end()).size(), size);  // all covered, two repeated
  for (uint32_t r = 0; r < world; ++r) {
    DistributedSampler s(size, r, world, true, 9, true);
    EXPECT_EQ(s.indices().size(), 2u);  // floor(10/4)
  }
}

TEST(DistributedSampler, EpochChangesTheOrderDeterministically) {
  DistributedSampler a(100, 1, 3, true, 11), b(100, 1, 3, true, 11);
  auto e0 = a.indices();
  a.set_epoch(1);
  auto e1 = a.indices();
  EXPECT_NE(e0, e1);
  b.set_epoch(1);
  EXPECT_EQ(e1, b.indices());
  DistributedSampler plain(9, 2, 3, false);
  EXPECT_EQ(plain.indices(), (std::vector<size_t>{2, 5, 8}));
  EXPECT_THROW(DistributedSampler(10, 3, 3), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, 0, 0), std::invalid_argument);
}

}  // namespace
