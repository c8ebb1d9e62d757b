// Faults survived (CTest label `faults`): the built-in [train] job on 2 local nodes, the real
// `skyforge` binary and workers, real SIGKILLs. A lost worker restarts every worker ([job]
// max_restarts) and the job resumes from its last checkpoint; a host that was itself killed
// goes on with `skyforge run --resume`. Either way the run ends with the weights and history of
// a run that was never interrupted, to the bit (docs/training.md, "Surviving a lost node").
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include "run_fixture.hpp"
#include "train_faults.hpp"

using namespace skyforge::test;

namespace {

const char* kData = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
constexpr int kEpochs = 6;

// The main job's MLP on 2 local nodes, a checkpoint every epoch; outputs under `out`.
std::string manifest(int max_restarts, const fs::path& out, const std::string& checkpoint_every = "\"epoch\"") {
  return faulty_training("[pool]\nprovider = \"local\"\nnodes = 2\n", max_restarts, out, kEpochs, checkpoint_every);
}

std::string weights_of(const std::string& out, int node) { return json_field(out, node, "weights_fnv1a64"); }

class TrainFaults : public SkyforgeRunTest {
 protected:
  TrainFaults() : SkyforgeRunTest("skyforge-faults") {}
  void SetUp() override {
    if (::access(kData, R_OK) != 0) GTEST_SKIP() << kData << " is missing: apt-get install dataset-fashion-mnist";
    SkyforgeRunTest::SetUp();
  }

  // The uninterrupted run's weights hash and history, once per test binary.
  struct Reference {
    std::string weights, history;
  };
  const Reference& reference() {
    static Reference r;
    if (r.weights.empty()) {
      const fs::path out = root_ / "reference";
      Output o = skyforge({"run", write("reference.toml", manifest(0, out)).string()}, 240);
      EXPECT_EQ(o.exit_code, 0) << o.err;
      r.weights = weights_of(o.out, 0);
      EXPECT_FALSE(r.weights.empty()) << o.out;
      EXPECT_EQ(weights_of(o.out, 1), r.weights) << "replicas diverged";
      r.history = read_text(out / "history.csv");
    }
    return r;
  }

  void kill_worker(int node) { kill_worker_of(root_, node); }
};

// Node 1's worker is SIGKILLed in epoch 3, then the head's in epoch 5: each time every worker
// starts again and the job resumes from the checkpoint before; the run ends as if nothing had
// happened — the same weights, to the bit, on both replicas, and the same history.
TEST_F(TrainFaults, LostWorkersRestartAndTheRunEndsBitIdentical) {
  const Reference& ref = reference();
  const fs::path out = root_ / "faulty";
  auto run = start_skyforge({"run", write("faulty.toml", manifest(2, out)).string()});
  ASSERT_TRUE(wait_checkpoint(out, 2));
  kill_worker(1);
  ASSERT_TRUE(wait_checkpoint(out, 4));
  kill_worker(0);  // the head: it held the rendezvous store
  Output o = run->wait(240);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(node 1 lost: its worker was killed by SIGKILL.*; restart 1/2)")))
      << o.err;
  // Where it was, as its last status said (sent at most 100 ms apart; the kill came right after
  // the checkpoint of epoch 2, and an epoch here takes about half a second).
  EXPECT_TRUE(std::regex_search(
      o.err, std::regex(R"(node 1 lost: .*; last seen at epoch [23]/6, step \d+/900; last checkpoint: end of epoch [12]; restart 1/2)")))
      << o.err;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(node 0 lost: its worker was killed by SIGKILL.*; restart 2/2)")))
      << o.err;
  EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(Resuming from .*ckpt-[2-4]\.bin)"))) << o.out;
  EXPECT_EQ(weights_of(o.out, 0), ref.weights) << o.out;
  EXPECT_EQ(weights_of(o.out, 1), ref.weights) << o.out;
  EXPECT_EQ(read_text(out / "history.csv"), ref.history);
}

// checkpoint_every = N steps: a loss mid-epoch resumes mid-epoch (the rest of that epoch's
// batches, its running loss and accuracy restored from the checkpoint), and still ends as the
// uninterrupted run did.
TEST_F(TrainFaults, AMidEpochCheckpointResumesMidEpochBitIdentical) {
  const Reference& ref = reference();
  const fs::path out = root_ / "steps";
  auto run = start_skyforge({"run", write("steps.toml", manifest(1, out, "150")).string()});
  ASSERT_TRUE(wait_checkpoint(out, 2));
  // Then a checkpoint within epoch 3: `latest` names ckpt-2-<steps>.bin.
  bool mid = false;
  for (int i = 0; i < 20000 && !mid; ++i) {
    mid = read_text(out / "ckpt" / "latest").rfind("ckpt-2-", 0) == 0;
    if (!mid) std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  ASSERT_TRUE(mid) << read_text(out / "ckpt" / "latest");
  kill_worker(1);
  Output o = run->wait(240);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(Resuming from .*ckpt-[2-5]-\d+\.bin: epoch [2-5] done and \d+ steps of epoch [3-6])")))
      << o.out;
  EXPECT_EQ(weights_of(o.out, 0), ref.weights) << o.out;
  EXPECT_EQ(weights_of(o.out, 1), ref.weights) << o.out;
  EXPECT_EQ(read_text(out / "history.csv"), ref.history);
}

// With its restarts used up, the next loss fails the run as before, and says why.
TEST_F(TrainFaults, ALossWithNoRestartLeftFailsTheRun) {
  const fs::path out = root_ / "once";
  auto run = start_skyforge({"run", write("once.toml", manifest(1, out)).string()});
  ASSERT_TRUE(wait_checkpoint(out, 1));
  kill_worker(1);
  ASSERT_TRUE(wait_checkpoint(out, 3));
  kill_worker(1);
  Output o = run->wait(120);
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("restart 1/1"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("no restart left: [job] max_restarts = 1"), std::string::npos) << o.err;
}

// The host itself is SIGKILLed: its workers see the lease lapse and go; `skyforge run --resume`
// goes on from the last checkpoint and ends where the uninterrupted run did.
TEST_F(TrainFaults, ResumeGoesOnAfterTheHostWasKilled) {
  const Reference& ref = reference();
  const fs::path out = root_ / "host";
  const fs::path job = write("host.toml", manifest(0, out));
  auto run = start_skyforge({"run", job.string()});
  ASSERT_TRUE(wait_checkpoint(out, 3));
  ASSERT_EQ(::kill(run->pid(), SIGKILL), 0);
  run->wait(30);
  EXPECT_TRUE(wait_no_processes_under(root_, 30).empty()) << "the workers outlived their lease";
  Output o = skyforge({"run", "--resume", job.string()}, 240);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(Resuming from .*ckpt-[3-5]\.bin)"))) << o.out;
  EXPECT_EQ(weights_of(o.out, 0), ref.weights) << o.out;
  EXPECT_EQ(read_text(out / "history.csv"), ref.history);
}

}  // namespace
