// The CUDA build's plan cache (backends/cuda/plan_cache.hpp), plain C++: a plan is made once per
// key, past the bound the least recently used plan goes (a hit counts as a use), a make that
// throws leaves nothing, and a returned reference stays valid until its plan is evicted.
#include <gtest/gtest.h>

#include "plan_cache.hpp"

#include <stdexcept>
#include <vector>

namespace cu = skyforge::cuda;

namespace {

// A plan that records its key and how many plans are alive, so eviction is seen.
struct Plan {
  static inline int alive = 0;
  uint64_t made_for = 0;
  Plan() { ++alive; }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() { --alive; }
};

using Cache = cu::PlanCache<Plan, 1, 3>;

// The keys held, in key order; each plan is the one made for its key.
std::vector<uint64_t> held(const Cache& cache) {
  std::vector<uint64_t> keys;
  cache.for_each([&](const Cache::Key& k, const Plan& p) {
    EXPECT_EQ(p.made_for, k[0]);
    keys.push_back(k[0]);
  });
  return keys;
}

class PlanCacheTest : public ::testing::Test {
 protected:
  // The plan for key, counting the makes.
  Plan& get(uint64_t key) {
    return cache.get({key}, [&](Plan& p) {
      p.made_for = key;
      ++makes;
    });
  }
  void TearDown() override {
    cache.clear();
    EXPECT_EQ(Plan::alive, 0);
  }
  Cache cache;
  int makes = 0;
};

TEST_F(PlanCacheTest, MakesEachPlanOnceAndKeepsIt) {
  Plan& a = get(1);
  EXPECT_EQ(&get(1), &a);
  get(2);
  EXPECT_EQ(&get(1), &a);
  EXPECT_EQ(makes, 2);
  EXPECT_EQ(held(cache), (std::vector<uint64_t>{1, 2}));
}

TEST_F(PlanCacheTest, PastTheBoundTheLeastRecentlyUsedGoes) {
  for (uint64_t k : {1, 2, 3, 4}) get(k);
  EXPECT_EQ(held(cache), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(Plan::alive, 3);
  get(5);
  EXPECT_EQ(held(cache), (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(makes, 5);
  get(1);  // evicted: made again
  EXPECT_EQ(makes, 6);
  EXPECT_EQ(held(cache), (std::vector<uint64_t>{1, 4, 5}));
}

TEST_F(PlanCacheTest, AHitRefreshesRecency) {
  for (uint64_t k : {1, 2, 3}) get(k);
  get(1);  // now 2 is the least recently used
  get(4);
  EXPECT_EQ(held(cache), (std::vector<uint64_t>{1, 3, 4}));
  get(3);
  get(5);  // 1 is now the least recently used
  EXPECT_EQ(held(cache), (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(makes, 5);
}

// A run that keeps using a set of up to Bound shapes never makes a plan twice, however long.
TEST_F(PlanCacheTest, AWorkingSetWithinTheBoundIsNeverRemade) {
  for (int step = 0; step < 100; ++step)
    for (uint64_t k : {7, 8, 9}) get(k);
  EXPECT_EQ(makes, 3);
}

TEST_F(PlanCacheTest, AThrowingMakeLeavesNoPlan) {
  for (uint64_t k : {1, 2, 3}) get(k);
  EXPECT_THROW(cache.get({4}, [](Plan&) { throw std::runtime_error("no algorithm"); }), std::runtime_error);
  EXPECT_EQ(held(cache), (std::vector<uint64_t>{1, 2, 3}));  // and evicted nothing
  EXPECT_EQ(Plan::alive, 3);
  get(4);  // made anew, not found half-made
  EXPECT_EQ(makes, 4);
  EXPECT_EQ(held(cache), (std::vector<uint64_t>{2, 3, 4}));
}

// A reference outlives Bound - 1 gets of other keys (new ones, which evict) after its last
// use, and a kept plan stays the same object throughout.
TEST_F(PlanCacheTest, ReferencesStayValidUntilEvicted) {
  Plan& a = get(1);
  Plan& b = get(2);
  get(3);
  EXPECT_EQ(a.made_for, 1u);
  get(4);  // evicts 1
  EXPECT_EQ(b.made_for, 2u);
  EXPECT_EQ(&get(2), &b);  // the same object, refreshed
  get(5);                  // evicts 3
  get(6);                  // evicts 4
  EXPECT_EQ(b.made_for, 2u);
  EXPECT_EQ(&get(2), &b);
  EXPECT_EQ(held(cache), (std::vector<uint64_t>{2, 5, 6}));
  get(1);  // remade
  EXPECT_EQ(makes, 7);
}

TEST_F(PlanCacheTest, ClearDropsEveryPlan) {
  for (uint64_t k : {1, 2}) get(k);
  cache.clear();
  EXPECT_EQ(Plan::alive, 0);
  EXPECT_TRUE(held(cache).empty());
  get(1);
  EXPECT_EQ(makes, 3);
}

TEST(PlanCache, DefaultBoundIs1024) {
  cu::PlanCache<Plan, 1> cache;
  int makes = 0;
  for (uint64_t k = 0; k < 1025; ++k) cache.get({k}, [&](Plan&) { ++makes; });
  EXPECT_EQ(Plan::alive, 1024);
  cache.get({1}, [&](Plan&) { ++makes; });  // key 0 went, 1 stayed
  EXPECT_EQ(makes, 1025);
  cache.get({0}, [&](Plan&) { ++makes; });
  EXPECT_EQ(makes, 1026);
  cache.clear();
  EXPECT_EQ(Plan::alive, 0);
}

}  // namespace
