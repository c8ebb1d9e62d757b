// Map jobs through their task backend (docs/plugins.md, "Task backends"), with the real
// `skyforge` binary on the local provider: the default `joblib` backend's batching and retries
// (a node really killed, a task really failing once), and a third party's backend that decides
// everything differently — the host keeps no policy of its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <string>

#include "process.hpp"
#include "run_fixture.hpp"

using namespace skyforge::test;

namespace {

class TasksE2E : public SkyforgeRunTest {
 protected:
  TasksE2E() : SkyforgeRunTest("skyforge-tasks") {}
  // A map of the crashy fixture app over `inputs`, on `nodes` nodes, with `tasks` as [tasks].
  fs::path crashy_map(const std::string& name, int nodes, const std::vector<std::string>& inputs,
                      const std::string& tasks) {
    std::string list;
    for (const auto& i : inputs) list += (list.empty() ? "\"" : ", \"") + i + "\"";
    return write(name, "[pool]\nnodes = " + std::to_string(nodes) + "\n[job]\nplugin_path = [\"" + E2E_FIXTURES +
                           "\"]\napp = \"crashy\"\nmode = \"map\"\ninputs = [" + list + "]\n[tasks]\n" + tasks);
  }
  Output run(const std::vector<std::string>& args) { return skyforge(args, 60); }
  std::string marker(const std::string& what) const { return (root_ / ("marker-" + what)).string(); }
};

// "[task I] => value" lines, in the order printed.
std::vector<std::pair<int, std::string>> task_lines(const std::string& out) {
  std::vector<std::pair<int, std::string>> v;
  std::regex line(R"(\[task (\d+)\] => (.*))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it)
    v.emplace_back(std::stoi((*it)[1]), (*it)[2]);
  return v;
}

TEST_F(TasksE2E, FixedBatchSizeIsTheBackendsOption) {
  auto m = write("b.toml", "[pool]\nnodes = 2\n[job]\napp = \"hello\"\nmode = \"map\"\ntasks = 20\n[tasks]\nbatch_size = 5\n");
  Output o = run({"run", "--timings", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.err.find(" batches=4 "), std::string::npos) << o.err;
  EXPECT_EQ(task_lines(o.out).size(), 20u);
}

TEST_F(TasksE2E, ALostNodesTasksRunAgainElsewhereAndEachResultIsReportedOnce) {
  // Task 3 kills the worker that first runs it; with retries it runs again on the other node.
  std::vector<std::string> in = {"a", "b", "c", "kill-once:" + marker("kill"), "e", "f", "g", "h"};
  auto m = crashy_map("retry.toml", 2, in, "batch_size = 1\nretries = 1\n");
  Output o = run({"run", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(node \d lost: its worker was killed by SIGKILL.*the task backend hands its tasks to the other nodes)")))
      << o.err;
  auto lines = task_lines(o.out);
  ASSERT_EQ(lines.size(), in.size()) << o.out;
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(lines[i].first, int(i));
    EXPECT_EQ(lines[i].second, in[i]);
  }
}

TEST_F(TasksE2E, WithoutRetriesALostNodeFailsTheJobSayingWhy) {
  std::vector<std::string> in = {"a", "kill-once:" + marker("kill"), "c"};
  auto m = crashy_map("noretry.toml", 2, in, "batch_size = 1\n");
  Output o = run({"run", m.string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(node \d lost: its worker was killed by SIGKILL.* — \[tasks\] retries = 0, so a lost node fails the job \((task 1 was|\d tasks \(\d to \d\) were) out on it\))")))
      << o.err;
}

TEST_F(TasksE2E, AFailedTaskRunsAgainOnlyWhenAsked) {
  std::vector<std::string> in = {"a", "fail-once:" + marker("f1"), "c"};
  // Retries alone cover lost nodes, not failures: the job fails, naming the task.
  Output o = run({"run", crashy_map("f.toml", 1, in, "retries = 2\n").string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(task 1 failed on node 0 slot 0: failed once, on purpose)"))) << o.err;
  // retry_failed: the same task runs again, and the job ends with every result.
  in[1] = "fail-once:" + marker("f2");
  o = run({"run", crashy_map("f2.toml", 1, in, "retries = 2\nretry_failed = true\n").string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  auto lines = task_lines(o.out);
  ASSERT_EQ(lines.size(), 3u) << o.out;
  EXPECT_EQ(lines[1].second, in[1]);
}

TEST_F(TasksE2E, ABadOptionIsRefusedAtItsLineBeforeAnythingStarts) {
  Output o = run({"run", crashy_map("bad.toml", 1, {"a"}, "retries = -1\n").string()});
  EXPECT_EQ(o.exit_code, 2) << o.err;
  EXPECT_NE(o.err.find("bad.toml:9:11: [tasks]"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("option 'retries': expected 0 to 1000, got -1"), std::string::npos) << o.err;
  o = run({"run", crashy_map("bad2.toml", 1, {"a"}, "retry_failed = true\n").string()});
  EXPECT_EQ(o.exit_code, 2) << o.err;
  EXPECT_NE(o.err.find("set retries = N"), std::string::npos) << o.err;
}

TEST_F(TasksE2E, AThirdPartysBackendDecidesOrderFailuresAndTheReport) {
  std::vector<std::string> in = {"a", "fail-once:" + marker("r"), "c", "d"};
  auto m = crashy_map("rev.toml", 2, in, "backend = \"reverse\"\n");
  Output o = run({"run", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;  // the reverse backend skips failures instead of failing
  EXPECT_NE(o.out.find("reverse: answered in order 3,2,1,0"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("reverse: skipped failures 1"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("reverse: 3 -> d"), std::string::npos) << o.out;
  EXPECT_TRUE(task_lines(o.out).empty()) << "its report replaces the line per task: " << o.out;
}

TEST_F(TasksE2E, AGreedyBackendGetsNoMoreThanSlotsTimesPipelineBatchesPerNode) {
  // The template backend with chunk = 1 hands a task to every next_batch while any is left: only
  // the host keeps a node to 2 slots x --pipeline 3 = 6 batches, so the node ready first cannot
  // take them all. Its report counts what it handed out and what came back, per node.
  constexpr int kTasks = 30, kHeld = 6;
  std::string list;
  for (int i = 0; i < kTasks; ++i) list += std::string(i ? ", " : "") + "\"sleep:150\"";
  auto m = write("greedy.toml", "[pool]\nnodes = 2\nconcurrency = 2\n[job]\nplugin_path = [\"" + std::string(E2E_FIXTURES) +
                                    "\"]\napp = \"crashy\"\nmode = \"map\"\ninputs = [" + list +
                                    "]\n[tasks]\nbackend = \"my_tasks\"\nchunk = 1\nreport_results = false\n");
  Output o = run({"run", "--pipeline", "3", m.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::regex line(R"(my_tasks: node (\d) ran (\d+) tasks in (\d+) batches, at most (\d+) out at once)");
  int nodes = 0, tasks = 0, most = 0;
  for (std::sregex_iterator it(o.out.begin(), o.out.end(), line), end; it != end; ++it, ++nodes) {
    const int ran = std::stoi((*it)[2]), held = std::stoi((*it)[4]);
    EXPECT_GT(ran, 0) << "node " << (*it)[1] << " ran nothing:\n" << o.out;
    EXPECT_LE(held, kHeld) << "node " << (*it)[1] << " held more than slots x pipeline:\n" << o.out;
    tasks += ran;
    most = std::max(most, held);
  }
  EXPECT_EQ(nodes, 2) << o.out;
  EXPECT_EQ(tasks, kTasks) << o.out;
  EXPECT_EQ(most, kHeld) << "the host asks again until a node is full:\n" << o.out;
}

}  // namespace
