// Faults survived (CTest label `faults`): the built-in [train] job on 2 local nodes, the real
// `skyforge` binary and workers, real SIGKILLs. A lost worker restarts every worker ([job]
// max_restarts) and the job resumes from its last checkpoint; a host that was itself killed
// goes on with `skyforge run --resume`. Either way the run ends with the weights and history of
// a run that was never interrupted, to the bit (docs/training.md, "Surviving a lost node").
// A checkpoint directory is one run's at a time: a second run fails at once naming the holder,
// a dead run's lock is taken over, another seed's checkpoint is refused, a broken `latest` is a
// clear error and never a hang, and what a crash left is cleaned (docs/training.md, "Resume").
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <regex>
#include <thread>
#include <vector>

#include "fashion_run_test.hpp"
#include "run_fixture.hpp"
#include "train_faults.hpp"

using namespace skyforge::test;

namespace {

constexpr int kEpochs = 6;

// The main job's MLP on 2 local nodes, a checkpoint every epoch; outputs under `out`.
std::string manifest(int max_restarts, const fs::path& out, const std::string& checkpoint_every = "\"epoch\"") {
  return faulty_training("[pool]\nprovider = \"local\"\nnodes = 2\n", max_restarts, out, kEpochs, checkpoint_every);
}

std::string weights_of(const std::string& out, int node) { return json_field(out, node, "weights_fnv1a64"); }

// `text` with its first `from` replaced by `to` (which must be there).
std::string with(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}
std::string with_resume(const std::string& text) { return with(text, "evaluate = false\n", "evaluate = false\nresume = true\n"); }

// E in `latest`'s "ckpt-E.bin" / "ckpt-E-S.bin" (-1: none).
int latest_epoch(const fs::path& out) {
  int e = -1;
  return std::sscanf(read_text(out / "ckpt" / "latest").c_str(), "ckpt-%d", &e) == 1 ? e : -1;
}

class TrainFaults : public FashionRunTest {
 protected:
  TrainFaults() : FashionRunTest("skyforge-faults") {}

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

// Run A trains into a checkpoint directory; run B (another seed, resume = true) is pointed at the
// same one while A lives: B fails at once, before it trains, naming A's writer (host, pid, start),
// and A goes on undisturbed. A's writer is then SIGKILLed (no chance to let go): the next run on
// the directory takes the lock over and says whose it was, removes what the crash left, and goes
// on from A's last checkpoint. A run of another seed is refused, and changes nothing.
TEST_F(TrainFaults, ACheckpointDirectoryIsOneRunsAtATime) {
  const fs::path out = root_ / "shared";
  const std::string a_text = faulty_training("[pool]\nprovider = \"local\"\nnodes = 2\n", 0, out, 1000);
  auto a = start_skyforge({"run", write("a.toml", a_text).string()});
  ASSERT_TRUE(wait_checkpoint(out, 1));
  const pid_t writer = worker_of(root_, 0);
  ASSERT_GT(writer, 0);

  const fs::path b_job = write("b.toml", with_resume(with(a_text, "seed = 42", "seed = 99")));
  Output b = skyforge({"run", b_job.string()}, 120);
  EXPECT_EQ(b.exit_code, 1) << b.out << b.err;
  const std::string ckpt = (out / "ckpt").string();
  EXPECT_TRUE(std::regex_search(b.err, std::regex("checkpoint directory " + ckpt + " is in use by another run \\(host [^,]+, pid " +
                                                  std::to_string(writer) + ", started \\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\dZ; lock file " +
                                                  ckpt + "/lock\\)")))
      << b.err;
  EXPECT_EQ(b.out.find("Epoch 1/"), std::string::npos) << "run B trained:\n" << b.out;
  EXPECT_EQ(b.out.find("Resuming"), std::string::npos) << b.out;
  std::cerr << "[ figure ] run B failed after " << b.seconds << " s (pool start included)\n";
  EXPECT_LT(b.seconds, 60);

  // A was not disturbed: it goes on writing its checkpoints.
  const int at = latest_epoch(out);
  ASSERT_TRUE(wait_checkpoint(out, at + 1));
  kill_worker(0);  // A's writer dies holding the lock; with no restart, run A fails
  Output ao = a->wait(60);
  EXPECT_EQ(ao.exit_code, 1) << ao.err;
  EXPECT_TRUE(wait_no_processes_under(root_, 30).empty());
  const int done = latest_epoch(out);
  ASSERT_GE(done, 2);

  // What a crash leaves: temporaries of atomic writes, a mid-epoch checkpoint `latest` no longer names.
  for (const char* name : {"ckpt-999.bin.tmp.4242", "latest.tmp.4242", "ckpt-1-100.bin"})
    std::ofstream(out / "ckpt" / name) << "x";

  // A's own manifest, one more epoch, --resume: the dead writer's lock is taken over and said,
  // the leftovers are removed, and the run goes on from A's last checkpoint.
  const fs::path c_job = write("c.toml", with(a_text, "epochs = 1000", "epochs = " + std::to_string(done + 1)));
  Output c = skyforge({"run", "--resume", c_job.string()}, 120);
  ASSERT_EQ(c.exit_code, 0) << c.out << c.err;
  EXPECT_NE(c.out.find("Took over " + ckpt + "/lock from a run that ended without letting go of it (host "), std::string::npos)
      << c.out;
  EXPECT_NE(c.out.find(", pid " + std::to_string(writer) + ", started "), std::string::npos) << c.out;
  EXPECT_TRUE(std::regex_search(c.out, std::regex("Removed \\d+ files? an interrupted run left in " + ckpt + ": .*ckpt-1-100\\.bin")))
      << c.out;
  EXPECT_NE(c.out.find("Resuming from " + ckpt + "/ckpt-" + std::to_string(done) + ".bin"), std::string::npos) << c.out;
  EXPECT_EQ(latest_epoch(out), done + 1);
  for (const auto& e : fs::directory_iterator(out / "ckpt")) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << name << " was left";
    EXPECT_NE(name, "ckpt-1-100.bin");
  }
  EXPECT_EQ(read_text(out / "ckpt" / "lock"), "") << "the run let go of its lock when it ended";

  // Another seed: refused before it trains; nothing changed.
  const std::string history = read_text(out / "history.csv");
  Output d = skyforge({"run", b_job.string()}, 120);
  EXPECT_EQ(d.exit_code, 1) << d.err;
  EXPECT_NE(d.err.find("checkpoint " + ckpt + "/ckpt-" + std::to_string(done + 1) +
                       ".bin was written by a run with seed 42, and this run's seed is 99: resuming it would mix two runs"),
            std::string::npos)
      << d.out << d.err;
  EXPECT_EQ(d.out.find("Epoch "), std::string::npos) << d.out;
  EXPECT_EQ(latest_epoch(out), done + 1);
  EXPECT_EQ(read_text(out / "history.csv"), history);
  EXPECT_EQ(read_text(out / "ckpt" / "lock"), "") << "the run let go of its lock when it ended";
}

// `latest` naming a FIFO, a path with '..', a dangling link, or the checkpoint directory itself a
// dangling link: each run fails within seconds, saying what it found and what it expected.
TEST_F(TrainFaults, ABrokenLatestIsAClearErrorNotAHang) {
  struct Case {
    std::string name;
    std::function<void(const fs::path& ckpt)> plant;
    std::string said;
  };
  const std::vector<Case> cases = {
      {"fifo", [](const fs::path& d) { ASSERT_EQ(::mkfifo((d / "latest").c_str(), 0600), 0); },
       "/ckpt/latest is a FIFO; expected a regular file holding the file name of a checkpoint in "},
      {"dotdot", [](const fs::path& d) { std::ofstream(d / "latest") << "../../victim/ckpt-3.bin\n"; },
       "/ckpt/latest names '../../victim/ckpt-3.bin'; expected the file name of a checkpoint in "},
      {"dangling", [](const fs::path& d) {
         fs::create_symlink(d / "gone" / "ckpt-3.bin", d / "ckpt-3.bin");
         std::ofstream(d / "latest") << "ckpt-3.bin\n";
       },
       "/ckpt/ckpt-3.bin, which is a symbolic link to '"},
      {"dangling-dir", [](const fs::path& d) {
         fs::remove(d);
         fs::create_symlink(d.parent_path() / "scratch", d);
       },
       "/ckpt is a symbolic link to '"},
  };
  for (const Case& k : cases) {
    const fs::path out = root_ / k.name;
    fs::create_directories(out / "ckpt");
    k.plant(out / "ckpt");
    const std::string text = with_resume(faulty_training("[pool]\nprovider = \"local\"\nnodes = 1\n", 0, out, 2));
    Output o = skyforge({"run", write(k.name + ".toml", text).string()}, 60);
    EXPECT_EQ(o.exit_code, 1) << k.name << " (-1: it hung)\n" << o.out << o.err;
    EXPECT_NE(o.err.find(out.string() + k.said), std::string::npos) << k.name << ":\n" << o.err;
    EXPECT_EQ(o.out.find("Epoch 1/"), std::string::npos) << k.name << ":\n" << o.out;
    std::cerr << "[ figure ] " << k.name << ": failed after " << o.seconds << " s\n";
  }
}

}  // namespace
