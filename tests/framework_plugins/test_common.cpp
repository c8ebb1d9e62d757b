// The shared pieces of plugins/common: the fan-out launcher (run for real through sh).
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>

#include "fanout.hpp"
#include "process.hpp"

using namespace skyforge::fw;
using skyforge::test::Child;
using skyforge::test::Output;

namespace {

// The worker starts every command as the leader of its own process group; `setsid -w` does the
// same here, so that the launcher's `kill 0` stays inside this test's command.
Output run_fanout(const std::vector<std::string>& cmd, const std::map<std::string, std::string>& env,
                  double timeout_s = 30, bool own_group = true) {
  auto argv = fanout_argv(cmd);
  argv[0] = "/bin/sh";  // Child uses posix_spawn (no PATH search)
  if (own_group) argv.insert(argv.begin(), {"/usr/bin/setsid", "-w"});
  std::map<std::string, std::string> e = env;
  for (const char* k : {kFanoutNproc, kFanoutAdd, kFanoutDevices, "RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"})
    if (!e.count(k)) e[k] = "";
  Child c(argv, e);
  return c.wait(timeout_s);
}

std::multiset<std::string> lines(const std::string& s) {
  std::multiset<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find('\n', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) out.insert(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

TEST(Fanout, StartsNCopiesEachWithItsIndexAddedToTheNamedVariables) {
  Output o = run_fanout({"sh", "-c", "echo proc=$SKYFORGE_LOCAL_PROC rank=$RANK local=$LOCAL_RANK dev=$CUDA_VISIBLE_DEVICES"},
                        {{kFanoutNproc, "3"}, {kFanoutAdd, "RANK LOCAL_RANK"}, {"RANK", "6"}, {"LOCAL_RANK", "3"}});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(lines(o.out), (std::multiset<std::string>{"proc=0 rank=6 local=3 dev=", "proc=1 rank=7 local=4 dev=",
                                                       "proc=2 rank=8 local=5 dev="}))
      << o.out;
}

TEST(Fanout, GivesEachCopyItsOwnDeviceCyclingWhenThereAreFewer) {
  Output o = run_fanout({"sh", "-c", "echo $SKYFORGE_LOCAL_PROC=$CUDA_VISIBLE_DEVICES"},
                        {{kFanoutNproc, "3"}, {kFanoutDevices, "MIG-a MIG-b"}, {"CUDA_VISIBLE_DEVICES", "MIG-a,MIG-b"}});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(lines(o.out), (std::multiset<std::string>{"0=MIG-a", "1=MIG-b", "2=MIG-a"})) << o.out;
}

TEST(Fanout, ArgumentsReachTheCommandUnchanged) {
  Output o = run_fanout({"printf", "[%s]\\n", "a b", "*", "$HOME", ""}, {{kFanoutNproc, "1"}});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "[a b]\n[*]\n[$HOME]\n[]\n");
}

TEST(Fanout, TheFirstFailureStopsTheOthersAndIsTheExitStatus) {
  // Copy 1 fails at once; copies 0 and 2 would sleep for a minute.
  Output o = run_fanout({"sh", "-c", "if [ $SKYFORGE_LOCAL_PROC = 1 ]; then exit 7; fi; exec sleep 60"},
                        {{kFanoutNproc, "3"}});
  EXPECT_EQ(o.exit_code, 7) << o.err;
  EXPECT_LT(o.seconds, 20);
  EXPECT_NE(o.err.find("process 1 of 3 exited with status 7"), std::string::npos) << o.err;
}

TEST(Fanout, OutsideItsOwnProcessGroupAFailureWaitsForTheOthersInsteadOfKillingTheGroup) {
  Output o = run_fanout({"sh", "-c", "if [ $SKYFORGE_LOCAL_PROC = 1 ]; then exit 5; fi; sleep 1"},
                        {{kFanoutNproc, "2"}}, 30, /*own_group=*/false);
  EXPECT_EQ(o.exit_code, 5) << o.err;
  EXPECT_NE(o.err.find("waiting for the others"), std::string::npos) << o.err;
}

TEST(Fanout, SucceedsOnlyWhenEveryCopySucceeds) {
  Output ok = run_fanout({"sh", "-c", "sleep 0.$SKYFORGE_LOCAL_PROC"}, {{kFanoutNproc, "4"}});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  Output last = run_fanout({"sh", "-c", "sleep 0.$SKYFORGE_LOCAL_PROC; [ $SKYFORGE_LOCAL_PROC != 3 ]"},
                           {{kFanoutNproc, "4"}});
  EXPECT_EQ(last.exit_code, 1) << last.err;
}

TEST(Fanout, RefusesBadSettings) {
  EXPECT_EQ(run_fanout({"true"}, {{kFanoutNproc, "0"}}).exit_code, 2);
  EXPECT_EQ(run_fanout({"true"}, {{kFanoutNproc, "x"}}).exit_code, 2);
  EXPECT_EQ(run_fanout({"true"}, {{kFanoutNproc, "2"}, {kFanoutAdd, "RANK;rm"}}).exit_code, 2);
  EXPECT_EQ(run_fanout({"true"}, {{kFanoutNproc, "2"}, {kFanoutAdd, "RANK"}, {"RANK", "abc"}}).exit_code, 2);
}

TEST(Fanout, WrappingIsIdempotentAndReversible) {
  std::vector<std::string> cmd = {"python", "train.py"};
  auto once = fanout_argv(cmd);
  EXPECT_TRUE(is_fanout(once));
  EXPECT_FALSE(is_fanout(cmd));
  EXPECT_EQ(fanout_argv(once), once);
  EXPECT_EQ(unwrap_fanout(once), cmd);
  EXPECT_EQ(once[3], "skyforge-fanout");
}

TEST(Fanout, RecognisesLaunchersThatStartTheirOwnProcesses) {
  EXPECT_TRUE(is_torchrun({"torchrun", "train.py"}));
  EXPECT_TRUE(is_torchrun({"/opt/venv/bin/torchrun", "--standalone", "train.py"}));
  EXPECT_TRUE(is_torchrun({"python3", "-m", "torch.distributed.run", "train.py"}));
  EXPECT_TRUE(is_torchrun({"python", "-m", "torch.distributed.launch", "train.py"}));
  EXPECT_FALSE(is_torchrun({"python", "train.py"}));
  EXPECT_FALSE(is_torchrun({"sh", "-c", "torchrun train.py"}));
  EXPECT_TRUE(is_accelerate_launch({"accelerate", "launch", "train.py"}));
  EXPECT_TRUE(is_accelerate_launch({"python", "-m", "accelerate.commands.launch", "train.py"}));
  EXPECT_FALSE(is_accelerate_launch({"accelerate", "config"}));
}

TEST(Fanout, WordListsMergeWithoutDuplicates) {
  EXPECT_EQ(add_words("", {"RANK", "LOCAL_RANK"}), "RANK LOCAL_RANK");
  EXPECT_EQ(add_words("RANK LOCAL_RANK", {"RANK", "JAX_PROCESS_ID"}), "RANK LOCAL_RANK JAX_PROCESS_ID");
  EXPECT_EQ(split_words("  a \tb  c "), (std::vector<std::string>{"a", "b", "c"}));
}

}  // namespace
