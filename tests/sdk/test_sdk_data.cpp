// Property tests for skyforge/data.hpp (docs/runtime-api.md): every guarantee docs/runtime-api.md
// promises, checked over many (n, world, seed) combinations rather than a handful of examples.
#include <skyforge/data.hpp>
#include <skyforge/sdk.hpp>  // skyforge::InstanceInfo, which data.hpp must not need

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using skyforge::DistributedSampler;
using skyforge::permutation;
using skyforge::shard;

const std::vector<size_t> kSizes = {0, 1, 2, 3, 5, 7, 10, 16, 31, 64, 97, 100, 1000, 1023};
const std::vector<uint32_t> kWorlds = {1, 2, 3, 4, 7, 8, 13, 64};
const std::vector<uint64_t> kSeeds = {0, 1, 42, 0xdeadbeefULL, UINT64_MAX};

std::vector<size_t> iota_vec(size_t n) {
  std::vector<size_t> v(n);
  std::iota(v.begin(), v.end(), size_t{0});
  return v;
}

std::string where(size_t n, uint32_t world, uint64_t seed, bool shuffle) {
  return "n=" + std::to_string(n) + " world=" + std::to_string(world) + " seed=" + std::to_string(seed) +
         " shuffle=" + std::to_string(shuffle);
}

// ---- permutation -------------------------------------------------------------------------

// GOLDEN VALUES. permutation() decides which rows every node of every user's job trains on.
// If this test fails, the generator, the bounded draw or the shuffle changed, and every
// existing job with shuffle = true now splits its data differently (results stop being
// reproducible across skyforge versions). That needs a deliberate, announced decision — never
// update these numbers just to make the test pass.
// The values below were computed once with this implementation, cross-checked against an
// independent transcription of the published algorithms (SplitMix64, xoshiro256**, Lemire's
// bounded draw, Fisher–Yates from the top), and written in by hand.
TEST(Permutation, GoldenValuesArePinned) {
  EXPECT_EQ(permutation(10, true, 42), (std::vector<size_t>{9, 1, 4, 2, 8, 7, 6, 5, 3, 0}));
  const auto big = permutation(1000, true, 7);
  EXPECT_EQ(std::vector<size_t>(big.begin(), big.begin() + 8), (std::vector<size_t>{11, 528, 114, 853, 63, 201, 711, 240}));
  // What node 1 of 4 trains on first, for the documented call form.
  const auto part = shard(100, 1, 4, true, 2024);
  EXPECT_EQ(std::vector<size_t>(part.begin(), part.begin() + 6), (std::vector<size_t>{61, 13, 21, 62, 47, 57}));
}

// Same reason: the raw generator stream (xoshiro256** seeded through SplitMix64) and the bounded
// draw, pinned separately so a failure says which layer changed.
TEST(Rng, GoldenStreamIsPinned) {
  skyforge::Rng rng(0);
  EXPECT_EQ(rng.next(), 0x99ec5f36cb75f2b4ULL);
  EXPECT_EQ(rng.next(), 0xbf6e1f784956452aULL);
  skyforge::Rng draw(123);
  std::vector<uint64_t> got;
  for (uint64_t bound : std::vector<uint64_t>{1, 2, 3, 10, 1000, (uint64_t{1} << 63) + 1, UINT64_MAX}) got.push_back(draw.below(bound));
  EXPECT_EQ(got, (std::vector<uint64_t>{0, 1, 1, 1, 337, 9222516600384820277ULL, 6972174322906985754ULL}));
}

TEST(Rng, BelowStaysInRangeForAwkwardBounds) {
  skyforge::Rng rng(99);
  for (uint64_t bound : std::vector<uint64_t>{1, 2, 3, 7, (uint64_t{1} << 32) + 1, (uint64_t{1} << 63) + 1, UINT64_MAX})
    for (int i = 0; i < 1000; ++i) ASSERT_LT(rng.below(bound), bound) << "bound " << bound;
  // bound 1 can only give 0; bound 2^63+1 rejects about half the draws, which must still terminate.
  EXPECT_EQ(rng.below(1), 0u);
}

TEST(Rng, BelowIsUniform) {
  // Chi-squared over 7 buckets (7 does not divide 2^64, so a naive modulo would be biased, if
  // only slightly); 70,000 draws, 6 degrees of freedom: 22.5 is the 0.1% critical value.
  skyforge::Rng rng(5);
  std::vector<double> count(7, 0);
  const int draws = 70000;
  for (int i = 0; i < draws; ++i) ++count[rng.below(7)];
  double chi2 = 0;
  for (double c : count) chi2 += (c - draws / 7.0) * (c - draws / 7.0) / (draws / 7.0);
  EXPECT_LT(chi2, 22.5);
}

TEST(Permutation, WithoutShuffleIsTheIdentity) {
  for (size_t n : kSizes)
    for (uint64_t seed : kSeeds) EXPECT_EQ(permutation(n, false, seed), iota_vec(n)) << where(n, 1, seed, false);
}

TEST(Permutation, ShuffleIsAPermutationDeterministicInTheSeed) {
  for (size_t n : kSizes)
    for (uint64_t seed : kSeeds) {
      const auto p = permutation(n, true, seed);
      auto sorted = p;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(sorted, iota_vec(n)) << where(n, 1, seed, true) << ": not a permutation of [0, n)";
      EXPECT_EQ(permutation(n, true, seed), p) << where(n, 1, seed, true) << ": same seed, different order";
      if (n >= 16) {
        EXPECT_NE(p, iota_vec(n)) << where(n, 1, seed, true) << ": shuffle left the order unchanged";
      }
    }
}

TEST(Permutation, DifferentSeedsGiveDifferentOrders) {
  for (size_t n : {16, 100, 1000}) {
    std::set<std::vector<size_t>> orders;
    for (uint64_t seed = 0; seed < 50; ++seed) orders.insert(permutation(n, true, seed));
    EXPECT_EQ(orders.size(), 50u) << "n=" << n << ": two of 50 seeds gave the same order";
  }
}

TEST(Permutation, EveryPositionIsReachable) {
  // A biased or broken bounded draw shows up as elements that never move to some positions.
  const size_t n = 8;
  std::vector<std::vector<int>> seen(n, std::vector<int>(n, 0));
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    const auto p = permutation(n, true, seed);
    for (size_t pos = 0; pos < n; ++pos) ++seen[p[pos]][pos];
  }
  // Expected 500 per cell; a fair shuffle stays well within ±30% at this sample size.
  for (size_t v = 0; v < n; ++v)
    for (size_t pos = 0; pos < n; ++pos)
      EXPECT_NEAR(seen[v][pos], 500, 150) << "value " << v << " at position " << pos;
}

// ---- shard(n, node, world, shuffle, seed) ----------------------------------------------------

TEST(Shard, PartsAreDisjointCoverEverythingAndDifferByAtMostOne) {
  for (size_t n : kSizes)
    for (uint32_t world : kWorlds)
      for (uint64_t seed : kSeeds)
        for (bool shuffle : {false, true}) {
          std::vector<int> count(n, 0);
          size_t smallest = SIZE_MAX, largest = 0;
          for (uint32_t node = 0; node < world; ++node) {
            const auto part = shard(n, node, world, shuffle, seed);
            smallest = std::min(smallest, part.size());
            largest = std::max(largest, part.size());
            // The first n % world nodes get the extra element.
            EXPECT_EQ(part.size(), n / world + (node < n % world ? 1 : 0)) << where(n, world, seed, shuffle);
            for (size_t i : part) {
              ASSERT_LT(i, n) << where(n, world, seed, shuffle);
              ++count[i];
            }
          }
          EXPECT_LE(largest - smallest, 1u) << where(n, world, seed, shuffle);
          for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(count[i], 1) << where(n, world, seed, shuffle) << ": index " << i << " assigned " << count[i]
                                   << " times";
        }
}

TEST(Shard, EachNodeComputesTheSameSplitIndependently) {
  // What node k computes alone equals node k's slice of what any other node would compute: the
  // split depends only on (n, world, shuffle, seed), never on state shared between calls.
  for (size_t n : {10, 97, 1000})
    for (uint32_t world : {2u, 3u, 8u})
      for (uint64_t seed : kSeeds) {
        std::vector<std::vector<size_t>> first;
        for (uint32_t node = 0; node < world; ++node) first.push_back(shard(n, node, world, true, seed));
        (void)permutation(n, true, seed + 1);  // unrelated work between the two rounds
        for (uint32_t node = world; node-- > 0;)
          EXPECT_EQ(shard(n, node, world, true, seed), first[node]) << where(n, world, seed, true) << " node " << node;
        // The concatenation in node order is exactly the seeded permutation.
        std::vector<size_t> joined;
        for (const auto& part : first) joined.insert(joined.end(), part.begin(), part.end());
        EXPECT_EQ(joined, permutation(n, true, seed)) << where(n, world, seed, true);
      }
}

TEST(Shard, UnshuffledPartsAreContiguousRanges) {
  const auto part = shard(10, 1, 3, false, 0);  // sizes 4, 3, 3
  EXPECT_EQ(part, (std::vector<size_t>{4, 5, 6}));
}

TEST(Shard, ShuffleDependsOnTheSeed) {
  EXPECT_NE(shard(1000, 0, 4, true, 1), shard(1000, 0, 4, true, 2));
  EXPECT_EQ(shard(1000, 0, 4, true, 1), shard(1000, 0, 4, true, 1));
}

TEST(Shard, AcceptsIntegerLiteralsForTheSeed) {
  // The documented call form; it must pick the index overload, not the several-arrays one.
  const size_t n = 100;
  const uint32_t node = 1, world = 4;
  EXPECT_EQ(shard(n, node, world, true, 42), shard(n, node, world, true, uint64_t{42}));
}

TEST(Shard, BadNodeOrWorldThrows) {
  EXPECT_THROW(shard(10, 0, 0), std::invalid_argument);
  EXPECT_THROW(shard(10, 3, 3), std::invalid_argument);
  EXPECT_THROW(shard(10, 7, 3, true, 1), std::invalid_argument);
}

TEST(Shard, TakesTheSdksInstanceInfo) {
  skyforge::InstanceInfo info;
  info.node = 1;
  info.total_nodes = 3;
  EXPECT_EQ(shard(info, 10, true, 42), shard(10, 1, 3, true, 42));
  EXPECT_EQ(skyforge::shard_for(info, 10), (std::vector<size_t>{4, 5, 6}));
  const std::vector<double> x(10, 1.0);
  EXPECT_EQ(std::get<0>(shard(info, false, 0, x)).size(), 3u);
}

TEST(Shard, InfoOverloadsUseNodeAndTotalNodes) {
  // Any struct with .node and .total_nodes, as skyforge::InstanceInfo (sdk.hpp) has.
  struct Info {
    uint32_t node, total_nodes;
  } info{2, 5};
  EXPECT_EQ(skyforge::shard_for(info, 123, true, 9), shard(123, 2, 5, true, 9));
  EXPECT_EQ(shard(info, 123, true, 9), shard(123, 2, 5, true, 9));
  EXPECT_EQ(shard(info, 123), shard(123, 2, 5));
  std::vector<int> a(50), b(50);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 100);
  auto [ai, bi] = shard(info, true, 3, a, b);
  EXPECT_EQ(std::get<0>(shard(2, 5, true, 3, a, b)), ai);
  ASSERT_EQ(ai.size(), 10u);
  for (size_t k = 0; k < ai.size(); ++k) EXPECT_EQ(bi[k], ai[k] + 100);
  const Info bad{5, 5};
  EXPECT_THROW(shard(bad, 10), std::invalid_argument);
}

// ---- shard(node, world, shuffle, seed, arrays...) ------------------------------------------

TEST(ShardArrays, RowsStayAlignedAcrossArraysAndMatchTheIndexShard) {
  for (size_t n : {0, 1, 9, 100, 1001})
    for (uint32_t world : {1u, 3u, 8u})
      for (uint64_t seed : kSeeds) {
        std::vector<double> y(n);
        std::vector<long> x(n);
        std::vector<std::string> label(n);
        for (size_t i = 0; i < n; ++i) {
          y[i] = static_cast<double>(i) + 0.5;
          x[i] = 2 * static_cast<long>(i) + 1;  // x = 2*y exactly
          label[i] = "row" + std::to_string(i);
        }
        size_t total = 0;
        for (uint32_t node = 0; node < world; ++node) {
          auto [xs, ys, labels] = shard(node, world, true, seed, x, y, label);
          const auto idx = shard(n, node, world, true, seed);
          ASSERT_EQ(xs.size(), idx.size());
          ASSERT_EQ(ys.size(), idx.size());
          ASSERT_EQ(labels.size(), idx.size());
          for (size_t k = 0; k < idx.size(); ++k) {
            EXPECT_EQ(static_cast<double>(xs[k]), 2 * ys[k]) << where(n, world, seed, true);
            EXPECT_EQ(ys[k], y[idx[k]]);
            EXPECT_EQ(labels[k], "row" + std::to_string(idx[k]));
          }
          total += xs.size();
        }
        EXPECT_EQ(total, n) << where(n, world, seed, true);
      }
}

TEST(ShardArrays, ElementTypesArePreserved) {
  std::vector<float> f = {1.f, 2.f, 3.f};
  std::vector<std::string> s = {"a", "b", "c"};
  auto [fs, ss] = shard(0, 1, false, 0, f, s);
  static_assert(std::is_same_v<decltype(fs), std::vector<float>>);
  static_assert(std::is_same_v<decltype(ss), std::vector<std::string>>);
  EXPECT_EQ(fs, f);
  EXPECT_EQ(ss, s);
}

TEST(ShardArrays, UnequalLengthsThrow) {
  std::vector<int> a(10), b(9);
  EXPECT_THROW(shard(0, 2, true, 1, a, b), std::invalid_argument);
  EXPECT_THROW(shard(1, 2, false, 0, b, a, a), std::invalid_argument);
  try {
    shard(0, 2, true, 1, a, b);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("10 vs 9"), std::string::npos) << e.what();
  }
}

TEST(ShardArrays, BadNodeThrows) {
  std::vector<int> a(10);
  EXPECT_THROW(shard(2, 2, true, 1, a), std::invalid_argument);
}

// ---- DistributedSampler ----------------------------------------------------------------------

std::vector<std::vector<size_t>> all_ranks(size_t size, uint32_t world, bool shuffle, uint64_t seed, bool drop_last,
                                           uint64_t epoch) {
  std::vector<std::vector<size_t>> out;
  for (uint32_t r = 0; r < world; ++r) {
    DistributedSampler s(size, r, world, shuffle, seed, drop_last);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

TEST(DistributedSampler, EveryIndexExactlyOncePerEpochWhenTheWorldDivides) {
  for (uint32_t world : kWorlds)
    for (size_t per_rank : {0, 1, 3, 17})
      for (uint64_t seed : kSeeds)
        for (bool drop_last : {false, true})
          for (uint64_t epoch : {0, 1, 5}) {
            const size_t size = per_rank * world;
            std::vector<int> count(size, 0);
            for (const auto& mine : all_ranks(size, world, true, seed, drop_last, epoch)) {
              EXPECT_EQ(mine.size(), per_rank);
              for (size_t i : mine) {
                ASSERT_LT(i, size);
                ++count[i];
              }
            }
            for (size_t i = 0; i < size; ++i)
              ASSERT_EQ(count[i], 1) << where(size, world, seed, true) << " epoch " << epoch << " index " << i;
          }
}

TEST(DistributedSampler, PaddingRepeatsTheStartOfThePermutedList) {
  for (size_t size : {1, 2, 5, 7, 10, 97, 1001})
    for (uint32_t world : kWorlds)
      for (uint64_t seed : kSeeds)
        for (uint64_t epoch : {0, 3}) {
          if (size % world == 0) continue;
          const size_t per_rank = (size + world - 1) / world;
          const auto ranks = all_ranks(size, world, true, seed, false, epoch);
          // Rebuild the padded list from the strided parts: position p belongs to rank p % world.
          std::vector<size_t> padded(per_rank * world);
          for (uint32_t r = 0; r < world; ++r) {
            ASSERT_EQ(ranks[r].size(), per_rank) << where(size, world, seed, true) << ": every rank gets the same count";
            for (size_t k = 0; k < per_rank; ++k) padded[r + k * world] = ranks[r][k];
          }
          const auto order = permutation(size, true, seed + epoch);
          for (size_t p = 0; p < padded.size(); ++p)
            ASSERT_EQ(padded[p], order[p % size])
                << where(size, world, seed, true) << " epoch " << epoch << ": position " << p
                << " should repeat the permuted list from its start";
          // Every index is covered; exactly total - size of them twice (or more when world > size).
          std::vector<int> count(size, 0);
          for (size_t i : padded) ++count[i];
          EXPECT_EQ(*std::min_element(count.begin(), count.end()), static_cast<int>(padded.size() / size));
          EXPECT_LE(*std::max_element(count.begin(), count.end()), static_cast<int>(padded.size() / size) + 1);
        }
}

TEST(DistributedSampler, PaddingSmallExample) {
  // size 5, world 2, no shuffle: list 0 1 2 3 4 padded to 0 1 2 3 4 0; ranks take even/odd positions.
  DistributedSampler r0(5, 0, 2, false), r1(5, 1, 2, false);
  EXPECT_EQ(r0.indices(), (std::vector<size_t>{0, 2, 4}));
  EXPECT_EQ(r1.indices(), (std::vector<size_t>{1, 3, 0}));
  EXPECT_EQ(r0.num_samples(), 3u);
  EXPECT_EQ(r0.total_size(), 6u);
}

TEST(DistributedSampler, DropLastDropsTheTailAndNothingRepeats) {
  for (size_t size : {1, 5, 7, 10, 97, 1001})
    for (uint32_t world : kWorlds)
      for (uint64_t seed : kSeeds) {
        const size_t per_rank = size / world;
        const auto ranks = all_ranks(size, world, true, seed, true, 2);
        std::set<size_t> seen;
        std::vector<size_t> padded(per_rank * world);
        for (uint32_t r = 0; r < world; ++r) {
          ASSERT_EQ(ranks[r].size(), per_rank) << where(size, world, seed, true);
          for (size_t k = 0; k < per_rank; ++k) padded[r + k * world] = ranks[r][k];
          for (size_t i : ranks[r]) EXPECT_TRUE(seen.insert(i).second) << where(size, world, seed, true) << " " << i;
        }
        // What is used is the head of the epoch's permutation; the last size % world are dropped.
        const auto order = permutation(size, true, seed + 2);
        EXPECT_TRUE(std::equal(padded.begin(), padded.end(), order.begin())) << where(size, world, seed, true);
      }
  DistributedSampler s(5, 0, 2, false, 0, true);
  EXPECT_EQ(s.indices(), (std::vector<size_t>{0, 2}));
  EXPECT_EQ(s.total_size(), 4u);
}

TEST(DistributedSampler, SetEpochChangesTheOrderAndTheSameEpochRepeatsIt) {
  DistributedSampler s(1000, 1, 4, true, 7);
  EXPECT_EQ(s.epoch(), 0u);
  const auto e0 = s.indices();
  s.set_epoch(1);
  EXPECT_EQ(s.epoch(), 1u);
  const auto e1 = s.indices();
  EXPECT_NE(e0, e1);
  EXPECT_EQ(std::set<size_t>(e0.begin(), e0.end()).size(), e0.size());
  s.set_epoch(0);
  EXPECT_EQ(s.indices(), e0) << "returning to an epoch must reproduce its order";
  s.set_epoch(1);
  EXPECT_EQ(s.indices(), e1);
  // A fresh sampler on another "node" agrees with this one epoch by epoch.
  DistributedSampler t(1000, 1, 4, true, 7);
  t.set_epoch(1);
  EXPECT_EQ(t.indices(), e1);
  // Different seeds differ.
  DistributedSampler u(1000, 1, 4, true, 8);
  u.set_epoch(1);
  EXPECT_NE(u.indices(), e1);
}

TEST(DistributedSampler, WithoutShuffleTheEpochDoesNotMatter) {
  DistributedSampler s(10, 1, 3, false);
  const auto e0 = s.indices();
  EXPECT_EQ(e0, (std::vector<size_t>{1, 4, 7, 0}));
  s.set_epoch(9);
  EXPECT_EQ(s.indices(), e0);
}

TEST(DistributedSampler, EmptyDatasetGivesNothing) {
  for (bool drop_last : {false, true}) {
    DistributedSampler s(0, 0, 3, true, 1, drop_last);
    EXPECT_EQ(s.num_samples(), 0u);
    EXPECT_TRUE(s.indices().empty());
  }
}

TEST(DistributedSampler, ReportsItsConfiguration) {
  DistributedSampler s(10, 1, 4, false, 77, true);
  EXPECT_EQ(s.size(), 10u);
  EXPECT_EQ(s.rank(), 1u);
  EXPECT_EQ(s.world(), 4u);
  EXPECT_FALSE(s.shuffle());
  EXPECT_EQ(s.seed(), 77u);
  EXPECT_TRUE(s.drop_last());
  EXPECT_EQ(s.num_samples(), 2u);
  EXPECT_EQ(s.total_size(), 8u);
  EXPECT_EQ(s.indices(), (std::vector<size_t>{1, 5}));
}

TEST(DistributedSampler, WorldLargerThanSizeWrapsRoundMoreThanOnce) {
  // size 2, world 5, no shuffle: 0 1 padded to 0 1 0 1 0; rank r gets position r.
  std::vector<size_t> got;
  for (uint32_t r = 0; r < 5; ++r) {
    DistributedSampler s(2, r, 5, false);
    ASSERT_EQ(s.num_samples(), 1u);
    got.push_back(s.indices().at(0));
  }
  EXPECT_EQ(got, (std::vector<size_t>{0, 1, 0, 1, 0}));
  // drop_last: floor(2 / 5) = 0 samples each.
  EXPECT_TRUE(DistributedSampler(2, 4, 5, true, 0, true).indices().empty());
}

TEST(DistributedSampler, BadRankOrWorldThrows) {
  EXPECT_THROW(DistributedSampler(10, 0, 0), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, 2, 2), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, 5, 2, true, 0, true), std::invalid_argument);
  EXPECT_NO_THROW(DistributedSampler(10, 1, 2));
}

}  // namespace
