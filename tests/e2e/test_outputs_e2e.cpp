// The job's files come back (docs/manifest.md, "Getting files back"): real runs of the real
// binaries on 2 local nodes — SKYFORGE_OUTPUT_DIR and [job] outputs' globs, a failed and a
// timed-out job's files, the per-node cap said, a fresh directory per run, a map job, and the
// example. The pieces (names, globs, hostile senders) are in test_outputs.cpp.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include "../support/read_text.hpp"
#include "process.hpp"
#include "run_fixture.hpp"

using namespace skyforge::test;

namespace {

class OutputsE2E : public SkyforgeRunTest {
 protected:
  OutputsE2E() : SkyforgeRunTest("skyforge-outputs-e2e") {}
  // A command on 2 nodes whose files go to <root>/out.
  Output run_command(const std::string& sh, const std::string& job_extra = "") {
    return skyforge({"run", write("job.toml", "[pool]\nnodes = 2\n[job]\ncommand = [\"sh\", \"-c\", \"" + sh +
                                                  "\"]\noutputs_dir = \"out\"\n" + job_extra)
                                .string()},
                    60);
  }
  std::string file(const std::string& rel) const { return read_text(root_ / "out" / rel); }
  bool exists(const std::string& rel) const { return fs::exists(root_ / "out" / rel); }
};

TEST_F(OutputsE2E, EveryNodesOutputDirectoryAndTheGlobsMatchesComeBack) {
  Output o = run_command(
      "echo r-$SKYFORGE_NODE > $SKYFORGE_OUTPUT_DIR/result.txt; mkdir -p logs; echo l-$SKYFORGE_NODE > "
      "logs/$SKYFORGE_NODE.log; echo no > other.txt; ln -s /etc/hostname $SKYFORGE_OUTPUT_DIR/link",
      "outputs = [\"logs/*.log\"]\n");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  for (const std::string n : {"0", "1"}) {
    EXPECT_EQ(file("node-" + n + "/result.txt"), "r-" + n + "\n");
    EXPECT_EQ(file("node-" + n + "/logs/" + n + ".log"), "l-" + n + "\n");
    EXPECT_FALSE(exists("node-" + n + "/other.txt")) << "no glob matches it";
    EXPECT_FALSE(exists("node-" + n + "/link")) << "a symlink is not followed";
    EXPECT_TRUE(contains(o.err, "node " + n + ": left on the node: \"link\": not a regular file")) << o.err;
  }
  EXPECT_TRUE(contains(o.err, "the job's files: 4 files (16 B) from 2 nodes in " + (root_ / "out").string())) << o.err;
}

TEST_F(OutputsE2E, AFailedJobsFilesComeBackToo) {
  Output o = run_command("echo done-$SKYFORGE_NODE > $SKYFORGE_OUTPUT_DIR/partial.txt; [ $SKYFORGE_NODE = 0 ] || exit 3");
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(contains(o.err, "node 1 (exit 3)")) << o.err;
  EXPECT_EQ(file("node-0/partial.txt"), "done-0\n");
  EXPECT_EQ(file("node-1/partial.txt"), "done-1\n");
}

TEST_F(OutputsE2E, ATimedOutJobsFilesComeBack) {
  Output o = run_command("echo so-far > $SKYFORGE_OUTPUT_DIR/checkpoint.txt; exec sleep 60", "timeout = 1.5\n");
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(contains(o.err, "timeout")) << o.err;
  EXPECT_EQ(file("node-0/checkpoint.txt"), "so-far\n");
  EXPECT_EQ(file("node-1/checkpoint.txt"), "so-far\n");
}

TEST_F(OutputsE2E, WhatGoesPastTheCapStaysOnTheNodeAndIsSaid) {
  Output o = run_command("head -c 5000 /dev/zero > $SKYFORGE_OUTPUT_DIR/big.bin; echo small > $SKYFORGE_OUTPUT_DIR/small.txt",
                         "outputs_max_bytes = 1000\n");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  for (const std::string n : {"0", "1"}) {
    EXPECT_EQ(file("node-" + n + "/small.txt"), "small\n");
    EXPECT_FALSE(exists("node-" + n + "/big.bin"));
    EXPECT_TRUE(contains(o.err, "node " + n + ": left on the node: \"big.bin\" (4.9 KiB): over [job] outputs_max_bytes = 1000 B"))
        << o.err;
  }
}

// The host killed mid-copy: the node's worker ends and removes its directory, as on any lost host
// (the fixture finds no process and no file left); no file got its name half-written.
TEST_F(OutputsE2E, AHostKilledMidCopyLeavesNoWorkerAndNoHalfFile) {
  auto c = start_skyforge({"run", write("job.toml", "[pool]\nnodes = 1\n[job]\ncommand = [\"sh\", \"-c\", \"head -c "
                                                    "400000000 /dev/zero > $SKYFORGE_OUTPUT_DIR/big.bin\"]\n"
                                                    "outputs_dir = \"out\"\n")
                                          .string()});
  auto copying = [&] {
    std::error_code ec;
    for (auto& e : fs::directory_iterator(root_ / "out/node-0", ec))
      if (e.path().filename().string().rfind(".skyforge-part-", 0) == 0) return true;
    return false;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!copying() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(copying()) << c->err_so_far();
  c->signal(SIGKILL);
  c->wait(10);
  EXPECT_FALSE(exists("node-0/big.bin")) << "a half-copied file never has its name";
  // The worker leaves its directory (and the fixture's sight) before it has removed 400 MB.
  for (int i = 0; i < 500 && !entries_of(tmp_).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

TEST_F(OutputsE2E, EachRunGetsAFreshDirectoryByDefault) {
  const fs::path m = write("job.toml", "[pool]\nnodes = 1\n[job]\ncommand = [\"sh\", \"-c\", \"echo $SKYFORGE_POOL_ID > "
                                       "$SKYFORGE_OUTPUT_DIR/pool.txt\"]\n");
  const std::string in_root = "cd '" + root_.string() + "' && exec '" + SKYFORGE_BIN + "' run '" + m.string() + "'";
  for (int i = 0; i < 2; ++i) ASSERT_EQ(Child({"/bin/sh", "-c", in_root}, env()).wait(60).exit_code, 0);
  std::set<std::string> pools;
  for (auto& run : fs::directory_iterator(root_ / "skyforge-outputs")) pools.insert(read_text(run.path() / "node-0/pool.txt"));
  EXPECT_EQ(pools.size(), 2u) << "two runs, two directories, neither overwritten";
}

TEST_F(OutputsE2E, AMapJobsNodesSendTheirFilesAtItsEnd) {
  write("in.txt", "staged\n");
  Output o = skyforge({"run", write("map.toml", "[pool]\nnodes = 2\n[image]\nfiles = [{ source = \"in.txt\", target = "
                                               "\"data/in.txt\" }]\n[job]\napp = \"hello\"\nmode = \"map\"\ntasks = 8\n"
                                               "outputs = [\"data/*.txt\"]\noutputs_dir = \"out\"\n")
                                    .string()},
                      60);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(contains(o.out, "[task 7] => 7^2=49")) << o.out;
  EXPECT_EQ(file("node-0/data/in.txt"), "staged\n");
  EXPECT_EQ(file("node-1/data/in.txt"), "staged\n");
}

TEST_F(OutputsE2E, TheExampleBringsBackEachNodesResultAndLog) {
  Output o = skyforge({"run", "--outputs", (root_ / "out").string(),
                       (fs::path(SKYFORGE_SOURCE_DIR) / "examples/outputs.toml").string()},
                      60);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(file("node-0/result.txt"), "node 0 of 2\n");
  EXPECT_EQ(file("node-1/result.txt"), "node 1 of 2\n");
  EXPECT_TRUE(exists("node-1/logs/node-1.log"));
  EXPECT_TRUE(contains(o.err, "the job's files: 4 files")) << o.err;
}

}  // namespace
