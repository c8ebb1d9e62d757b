// fit() on a checkpoint directory under attack (CTest label `faults`), on the REAL parts
// (real_parts.hpp): another run holding the directory, a dead run's lock, a checkpoint of
// another seed or of another batch mid-epoch, and the leftovers of an interrupted run.
#include <skyforge/keras.hpp>

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model_util.hpp"
#include "real_parts.hpp"
#include "lock_holder.hpp"
#include "test_util.hpp"

namespace K = skyforge::keras;
namespace fs = std::filesystem;
using namespace model_util;
using namespace real;

namespace {

K::FitOptions fit_options(const fs::path& ckpt, uint32_t epochs, bool resume, std::FILE* out = nullptr) {
  K::FitOptions o;
  o.epochs = epochs;
  o.batch_size = 16;
  o.verbose = out ? 1 : 0;
  o.out = out;
  o.tty = false;
  o.callbacks.checkpoint_dir = ckpt.string();
  o.callbacks.resume = resume;
  return o;
}

std::string text_of(std::FILE* f) {
  std::rewind(f);
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  return s;
}

}  // namespace

// A directory another process holds: fit() fails at once, before training, naming it; once that
// process is dead (SIGKILL, no chance to let go), fit() takes the lock over and says whose it was.
TEST(CheckpointFit, ALockedDirectoryFailsAtOnceAndADeadHoldersIsTakenOver) {
  TempDir dir("fit_locked");
  const fs::path ckpt = dir.path / "ckpt";
  const pid_t child = fork_lock_holder(ckpt);  // a run that holds the lock (before any thread starts)
  ASSERT_GT(child, 0);

  const Synthetic d = make_data(64, 3);
  SpiedCpu b;
  K::Sequential m = sgd_model(b);
  const std::string err = error_of([&] { m.fit(d.x, d.y, fit_options(ckpt, 2, true)); });
  EXPECT_NE(err.find("checkpoint directory " + ckpt.string() + " is in use by another run (host "), std::string::npos) << err;
  EXPECT_NE(err.find(", pid " + std::to_string(child) + ", started "), std::string::npos) << err;
  EXPECT_EQ(b.spy.train_calls, 0u);
  EXPECT_FALSE(fs::exists(ckpt / "latest"));

  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  std::FILE* out = std::tmpfile();
  EXPECT_EQ(m.fit(d.x, d.y, fit_options(ckpt, 2, true, out)).size(), 2u);
  const std::string said = text_of(out);
  std::fclose(out);
  EXPECT_NE(said.find("Took over " + ckpt.string() + "/lock from a run that ended without letting go of it (host "),
            std::string::npos)
      << said;
  EXPECT_NE(said.find(", pid " + std::to_string(child) + ", started "), std::string::npos) << said;
  EXPECT_EQ(K::read_file(ckpt / "latest"), "ckpt-2.bin\n");
  EXPECT_EQ(K::read_file(ckpt / "lock"), "") << "fit() lets go of the lock when it ends";
}

// Two ranks: only rank 0 takes the lock, and its failure is every rank's error (no hang).
TEST(CheckpointFit, OnlyRankZeroLocksAndItsFailureReachesEveryRank) {
  TempDir dir("fit_locked_ranks");
  const fs::path ckpt = dir.path / "ckpt";
  const Synthetic d = make_data(64, 1);
  auto fit_two = [&] {
    return run_ranks(2, [&](uint32_t, const sf_communicator* comm) {
      SpiedCpu b;
      K::Sequential m = sgd_model(b, comm);
      K::FitOptions o = fit_options(ckpt, 1, false);
      o.data = K::Data::replicated;
      m.fit(d.x, d.y, o);
    });
  };
  {
    K::CheckpointLock other = K::CheckpointLock::acquire(ckpt);
    const auto errors = fit_two();
    ASSERT_FALSE(errors[0].empty());
    EXPECT_EQ(errors[0], errors[1]);
    EXPECT_NE(errors[0].find("is in use by another run"), std::string::npos) << errors[0];
  }
  const auto errors = fit_two();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(K::read_file(ckpt / "latest"), "ckpt-1.bin\n");
}

// Run A (seed 7) wrote the directory; run B (seed 99) resuming from it is refused, before it
// trains, and A's checkpoint stays as it was. Mid-epoch, another global batch is refused too;
// at an epoch's end it is allowed, and said.
TEST(CheckpointFit, AnotherRunsCheckpointIsRefused) {
  TempDir dir("fit_seed");
  const fs::path ckpt = dir.path / "ckpt";
  const Synthetic d = make_data(96, 3);
  SpiedCpu ba;
  K::Sequential a = sgd_model(ba, nullptr, 7);
  a.fit(d.x, d.y, fit_options(ckpt, 1, true));
  const std::string before = K::read_file(ckpt / "ckpt-1.bin");
  EXPECT_EQ(K::decode_checkpoint(before, "ckpt-1.bin").seed, 7u);

  SpiedCpu bb;
  K::Sequential b = sgd_model(bb, nullptr, 99);
  std::string err = error_of([&] { b.fit(d.x, d.y, fit_options(ckpt, 3, true)); });
  EXPECT_NE(err.find("checkpoint " + (ckpt / "ckpt-1.bin").string() +
                     " was written by a run with seed 7, and this run's seed is 99: resuming it would mix two runs"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("or seed 7 to go on with that run"), std::string::npos) << err;
  EXPECT_EQ(bb.spy.train_calls, 0u);
  EXPECT_EQ(K::read_file(ckpt / "ckpt-1.bin"), before);
  EXPECT_EQ(K::read_file(ckpt / "latest"), "ckpt-1.bin\n");
  // fit(seed = 7) is that run again: it goes on.
  K::FitOptions same = fit_options(ckpt, 2, true);
  same.seed = 7;
  EXPECT_EQ(b.fit(d.x, d.y, same).size(), 2u);

  // A mid-epoch checkpoint (6 steps of 16) resumed with a batch of 32.
  const fs::path mid = dir.path / "mid";
  K::FitOptions o = fit_options(mid, 1, false);
  o.callbacks.checkpoint_every_steps = 4;
  o.steps_per_epoch = 5;
  SpiedCpu bc;
  K::Sequential cm = sgd_model(bc);
  cm.fit(d.x, d.y, o);
  K::write_file_atomic(mid / "latest", "ckpt-0-4.bin\n");  // as if cut off after step 4
  ASSERT_FALSE(fs::exists(mid / "ckpt-0-4.bin"));          // replaced by the epoch's: write it again
  {
    K::Checkpoint ck = K::decode_checkpoint(K::read_file(mid / "ckpt-1.bin"), "x");
    ck.epoch = 0;
    ck.epoch_step = 4;
    K::write_file_atomic(mid / "ckpt-0-4.bin", K::encode_checkpoint(ck));
  }
  K::FitOptions wider = fit_options(mid, 1, true);
  wider.batch_size = 32;
  err = error_of([&] { cm.fit(d.x, d.y, wider); });
  EXPECT_NE(err.find("stopped 4 steps into epoch 1 of a run with a global batch of 16 and 5 steps per epoch, and this run "
                     "has 32 and 3: the position within the epoch would name other samples"),
            std::string::npos)
      << err;
}

// What a crash left (temporaries, a stale mid-epoch checkpoint) is gone after the next fit()
// starts; the checkpoint `latest` names is what it resumed from.
TEST(CheckpointFit, LeftoversOfAnInterruptedRunAreCleaned) {
  TempDir dir("fit_clean");
  const fs::path ckpt = dir.path / "ckpt";
  const Synthetic d = make_data(64, 3);
  SpiedCpu b1;
  K::Sequential m = sgd_model(b1);
  m.fit(d.x, d.y, fit_options(ckpt, 1, false));
  for (const char* name : {"ckpt-2.bin.tmp.31337", "latest.tmp.31337", "ckpt-1-2.bin"}) std::ofstream(ckpt / name) << "x";
  std::FILE* out = std::tmpfile();
  SpiedCpu b2;
  K::Sequential again = sgd_model(b2);
  EXPECT_EQ(again.fit(d.x, d.y, fit_options(ckpt, 2, true, out)).size(), 2u);
  const std::string said = text_of(out);
  std::fclose(out);
  EXPECT_NE(said.find("Removed 3 files an interrupted run left in " + ckpt.string() +
                      ": ckpt-1-2.bin, ckpt-2.bin.tmp.31337, latest.tmp.31337"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("Resuming from " + (ckpt / "ckpt-1.bin").string()), std::string::npos) << said;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(ckpt)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"ckpt-1.bin", "ckpt-2.bin", "latest", "lock"}));
}
