// The `joblib` task backend's policy (backends/joblib/joblib_policy.hpp), driven as the host's
// task driver drives it: batches asked for per node, answered whole, nodes lost.
#include <gtest/gtest.h>

#include <numeric>

#include "joblib_policy.hpp"

using skyforge::TaskJob;
using skyforge::TasksState;
using skyforge::joblib::Options;
using skyforge::joblib::Policy;

namespace {

TaskJob job(uint32_t nodes, uint32_t slots, uint32_t pipeline, uint64_t tasks) {
  TaskJob j;
  j.nodes = nodes;
  j.slots_per_node = slots;
  j.pipeline = pipeline;
  j.n_tasks = tasks;
  j.app = "app";
  return j;
}

// Answers a batch: every task ok (or the ones in `failing` failed), `ns_each` per task.
void answer(Policy& p, uint32_t node, const std::vector<uint64_t>& batch, uint64_t ns_each,
            const std::vector<uint64_t>& failing = {}) {
  std::vector<sf_task_outcome> out;  // as the host hands them over
  for (uint64_t t : batch) {
    const bool fails = std::find(failing.begin(), failing.end(), t) != failing.end();
    out.push_back(sf_task_outcome{t, node, 0, fails ? 0 : 1, fails ? "boom" : "ok", fails ? 4u : 2u});
  }
  p.completed(node, skyforge::TaskOutcomes(out.data(), out.size()), ns_each * batch.size());
}

TasksState state_of(const Policy& p) {
  std::string why;
  return p.state(why);
}

// Why the job failed; it must have.
std::string failure_of(const Policy& p) {
  std::string why;
  EXPECT_EQ(p.state(why), TasksState::failed);
  return why;
}

std::vector<uint64_t> iota(uint64_t from, uint64_t n) {
  std::vector<uint64_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(JoblibPolicy, FixedBatchesGoOutInInputOrderUpToThePipeline) {
  Policy p(Options{4, 0, false});
  p.begin(job(2, 1, 2, 20));
  EXPECT_EQ(p.next_batch(0, 100), iota(0, 4));
  EXPECT_EQ(p.next_batch(1, 100), iota(4, 4));
  EXPECT_EQ(p.next_batch(0, 100), iota(8, 4));
  EXPECT_TRUE(p.next_batch(0, 100).empty()) << "2 batches per slot at most";
  EXPECT_EQ(p.next_batch(1, 3), iota(12, 3)) << "never more than the host's buffer";
  answer(p, 0, iota(0, 4), 1000);
  EXPECT_EQ(p.next_batch(0, 100), iota(15, 4));
  EXPECT_EQ(state_of(p), TasksState::running);
}

TEST(JoblibPolicy, AutomaticBatchesAimAtHalfASecond) {
  Policy p(Options{});
  p.begin(job(2, 2, 2, 1'000'000));
  auto first = p.next_batch(0, 1 << 20);
  EXPECT_EQ(first.size(), 1u) << "one task until its cost is known";
  answer(p, 0, first, 1'000'000);  // 1 ms per task: 500 tasks make 0.5 s
  auto b = p.next_batch(0, 1 << 20);
  EXPECT_EQ(b.size(), 500u);
  EXPECT_EQ(b.front(), 1u);
  // Expensive tasks (2 s each) bring the estimate up until batches hold one task.
  for (int i = 0; i < 20; ++i) answer(p, 0, p.next_batch(0, 1 << 20), 2'000'000'000);
  answer(p, 0, b, 2'000'000'000);
  EXPECT_EQ(p.next_batch(1, 1 << 20).size(), 1u);
}

TEST(JoblibPolicy, AutomaticBatchesKeepTheTailBalanced) {
  Policy p(Options{});
  p.begin(job(2, 2, 2, 1'000'000));
  answer(p, 0, p.next_batch(0, 1 << 20), 10);  // 10 ns a task: 0.5 s would be 50 M tasks
  // At most a quarter of a slot's share of what is left (4 slots).
  auto b = p.next_batch(0, 1 << 20);
  EXPECT_EQ(b.size(), (1'000'000u - 1u) / 16u);
  EXPECT_EQ(p.next_batch(1, 1000).size(), 1000u) << "and never more than the host's buffer";
}

TEST(JoblibPolicy, EveryTaskAnsweredIsDone) {
  Policy p(Options{3, 0, false});
  p.begin(job(1, 1, 4, 7));
  std::vector<std::vector<uint64_t>> out;
  while (true) {
    auto b = p.next_batch(0, 100);
    if (b.empty()) break;
    out.push_back(b);
  }
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2], iota(6, 1));
  for (auto it = out.rbegin(); it != out.rend(); ++it) answer(p, 0, *it, 10);  // any order
  EXPECT_EQ(state_of(p), TasksState::done);
}

TEST(JoblibPolicy, TheFirstFailureStopsTheDispatchAndNamesTaskNodeAndSlot) {
  Policy p(Options{2, 0, false});
  p.begin(job(2, 1, 2, 10));
  auto b0 = p.next_batch(0, 100), b1 = p.next_batch(1, 100);
  std::vector<sf_task_outcome> out = {{2, 1, 0, 1, "ok", 2}, {3, 1, 0, 0, "ValueError: no", 14}};
  p.completed(1, skyforge::TaskOutcomes(out.data(), out.size()), 100);
  EXPECT_EQ(failure_of(p), "task 3 failed on node 1 slot 0: ValueError: no");
  EXPECT_TRUE(p.next_batch(0, 100).empty()) << "nothing more goes out (joblib's abort_everything)";
  answer(p, 0, b0, 10, {0});  // a later failure does not replace the first
  EXPECT_EQ(failure_of(p), "task 3 failed on node 1 slot 0: ValueError: no");
}

TEST(JoblibPolicy, AFailedTaskRunsAgainOnlyWithRetryFailed) {
  Policy p(Options{1, 2, true});
  p.begin(job(1, 1, 1, 2));
  EXPECT_EQ(p.next_batch(0, 10), iota(0, 1));
  answer(p, 0, {0}, 10, {0});
  EXPECT_EQ(state_of(p), TasksState::running);
  EXPECT_EQ(p.next_batch(0, 10), iota(0, 1)) << "the failed task first";
  answer(p, 0, {0}, 10, {0});
  EXPECT_EQ(p.next_batch(0, 10), iota(0, 1));
  answer(p, 0, {0}, 10, {0});  // third failure: retries = 2 are spent
  EXPECT_EQ(failure_of(p), "task 0 failed on node 0 slot 0: boom (run 3 times; [tasks] retries = 2)");
}

TEST(JoblibPolicy, ALostNodesTasksGoToTheOthersLowestFirst) {
  Policy p(Options{2, 1, false});
  p.begin(job(2, 1, 2, 10));
  auto a = p.next_batch(0, 100), b = p.next_batch(1, 100), c = p.next_batch(0, 100);  // 0-1, 2-3, 4-5
  ASSERT_EQ(c, iota(4, 2));
  p.node_lost(0);
  EXPECT_EQ(state_of(p), TasksState::running);
  EXPECT_TRUE(p.next_batch(0, 100).empty()) << "a lost node gets nothing";
  EXPECT_EQ(p.next_batch(1, 100), iota(0, 2));
  answer(p, 1, b, 10);
  answer(p, 1, iota(0, 2), 10);
  EXPECT_EQ(p.next_batch(1, 100), iota(4, 2));
  // A task lost a second time has no retry left.
  p.node_lost(1);
  EXPECT_EQ(failure_of(p), "task 4 was out on a lost node 2 times ([tasks] retries = 1)");
}

// reorder() sets the order of what has not gone out; tasks to run again still go first, and a
// lost node's reordered batches are run again task by task.
TEST(JoblibPolicy, ReorderSetsTheOrderOfWhatIsLeft) {
  Policy p(Options{2, 1, false});
  p.begin(job(2, 1, 1, 8));
  EXPECT_EQ(p.next_batch(0, 100), iota(0, 2));
  p.reorder([](uint64_t a, uint64_t b) { return a > b; });  // the rest, last first
  const auto b = p.next_batch(1, 100);
  EXPECT_EQ(b, (std::vector<uint64_t>{7, 6}));
  p.node_lost(1);
  answer(p, 0, iota(0, 2), 10);
  EXPECT_EQ(p.next_batch(0, 100), (std::vector<uint64_t>{6, 7})) << "run again first, lowest first";
  answer(p, 0, {6, 7}, 10);
  EXPECT_EQ(p.next_batch(0, 100), (std::vector<uint64_t>{5, 4}));
  answer(p, 0, {5, 4}, 10);
  EXPECT_EQ(p.next_batch(0, 100), (std::vector<uint64_t>{3, 2}));
  answer(p, 0, {3, 2}, 10);
  EXPECT_EQ(state_of(p), TasksState::done);
}

TEST(JoblibPolicy, WithoutRetriesALostNodeFailsTheJob) {
  Policy p(Options{});
  p.begin(job(2, 1, 1, 4));
  p.next_batch(0, 10);
  p.node_lost(1);  // even a node that held nothing
  EXPECT_EQ(failure_of(p), "[tasks] retries = 0, so a lost node fails the job (no task was out on it)");
}

TEST(JoblibPolicy, NoNodeLeftFailsTheJob) {
  Policy p(Options{1, 3, false});
  p.begin(job(2, 1, 1, 4));
  p.node_lost(0);
  p.node_lost(1);
  EXPECT_EQ(failure_of(p), "every node of the pool is lost");
}

TEST(JoblibPolicy, OptionsAreChecked) {
  auto opts = [](std::vector<std::pair<std::string, std::string>> kv) {
    std::vector<sf_kv> c;
    for (auto& [k, v] : kv) c.push_back(sf_kv{k.c_str(), v.c_str()});
    return Options::from(skyforge::Options(c.data(), c.size()));
  };
  EXPECT_EQ(opts({{"batch_size", "8"}, {"retries", "3"}, {"retry_failed", "true"}}).batch_size, 8u);
  EXPECT_THROW(opts({{"batch_size", "-1"}}), skyforge::Error);
  EXPECT_THROW(opts({{"retries", "1001"}}), skyforge::Error);
  try {
    opts({{"retry_failed", "true"}});
    FAIL() << "retry_failed without retries was accepted";
  } catch (const skyforge::Error& e) {
    EXPECT_EQ(e.status(), SF_ERR_INVALID);
    EXPECT_NE(std::string(e.what()).find("set retries = N"), std::string::npos) << e.what();
  }
}

}  // namespace
