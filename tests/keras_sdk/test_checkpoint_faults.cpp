// Checkpoint directories under attack (CTest label `faults`): a second run on a locked directory,
// the lock of a dead run, `latest` naming a FIFO, a path with '..', a dangling symbolic link,
// the checkpoint directory itself a dangling link, and the leftovers of an interrupted run
// (temporaries, stale mid-epoch checkpoints), a directory user `nobody` can write (refused before
// anything is written) and links planted at temporaries' names (never followed). The pieces of keras_callbacks.hpp on real files
// and real processes; the fit()-level behaviour is in test_checkpoint_faults_fit.cpp.
#include <skyforge/keras_callbacks.hpp>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "lock_holder.hpp"
#include "test_util.hpp"

namespace K = skyforge::keras;
namespace fs = std::filesystem;

namespace {

// f's exception message, "" when it returned. A call that would block on a FIFO is unjammed
// after 3 s (a writer opens the FIFO and goes, so the reader sees EOF): the test then fails on
// its time instead of hanging.
struct Timed {
  std::string error;
  double seconds = 0;
};
Timed timed(const std::function<void()>& f, const fs::path& fifo = {}) {
  std::atomic<bool> done{false};
  std::thread unjam;
  if (!fifo.empty())
    unjam = std::thread([&] {
      for (int i = 0; i < 300 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (done) return;
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    });
  Timed t;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    f();
  } catch (const std::exception& e) {
    t.error = e.what();
  }
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done = true;
  if (unjam.joinable()) unjam.join();
  return t;
}

K::Checkpoint some_checkpoint(uint32_t epoch, uint64_t epoch_step = 0) {
  K::Checkpoint c;
  c.epoch = epoch;
  c.epoch_step = epoch_step;
  c.step = 100 * epoch + epoch_step;
  c.spec = "s";
  c.fingerprint = K::fnv1a64("s");
  c.state = "state";
  return c;
}

}  // namespace

// ---- `latest` ---------------------------------------------------------------------------------
TEST(CheckpointLatest, AFifoIsAClearErrorNotAHang) {
  TempDir dir("latest_fifo");
  K::write_checkpoint(dir.path, some_checkpoint(1));
  fs::remove(dir.path / "latest");
  ASSERT_EQ(::mkfifo((dir.path / "latest").c_str(), 0600), 0);
  const Timed t = timed([&] { K::latest_checkpoint(dir.path); }, dir.path / "latest");
  EXPECT_LT(t.seconds, 2.0) << "reading `latest` blocked on the FIFO";
  EXPECT_NE(t.error.find((dir.path / "latest").string() + " is a FIFO; expected a regular file holding the file name "
                         "of a checkpoint in " + dir.path.string()),
            std::string::npos)
      << t.error;
  // Writing the next checkpoint does not read it either: it replaces it.
  const Timed w = timed([&] { K::write_checkpoint(dir.path, some_checkpoint(2)); }, dir.path / "latest");
  EXPECT_LT(w.seconds, 2.0);
  EXPECT_EQ(w.error, "");
  EXPECT_EQ(K::read_file(dir.path / "latest"), "ckpt-2.bin\n");
}

TEST(CheckpointLatest, AFifoNamedByLatestIsAClearErrorNotAHang) {
  TempDir dir("latest_names_fifo");
  ASSERT_EQ(::mkfifo((dir.path / "ckpt-3.bin").c_str(), 0600), 0);
  K::write_file_atomic(dir.path / "latest", "ckpt-3.bin\n");
  const Timed t = timed([&] { K::latest_checkpoint(dir.path); }, dir.path / "ckpt-3.bin");
  EXPECT_LT(t.seconds, 2.0);
  EXPECT_NE(t.error.find("names " + (dir.path / "ckpt-3.bin").string() + ", which is a FIFO; expected a regular checkpoint file"),
            std::string::npos)
      << t.error;
  // The reader used for checkpoint files refuses one too, without blocking.
  const Timed r = timed([&] { K::read_regular_file(dir.path / "ckpt-3.bin", "checkpoint x"); }, dir.path / "ckpt-3.bin");
  EXPECT_LT(r.seconds, 2.0);
  EXPECT_NE(r.error.find("checkpoint x is a FIFO; expected a regular file"), std::string::npos) << r.error;
}

TEST(CheckpointLatest, DotDotAndSlashAreRefusedByName) {
  TempDir dir("latest_dotdot");
  fs::create_directories(dir.path / "ckpt");
  K::write_checkpoint(dir.path / "other", some_checkpoint(1));  // a real checkpoint next door
  for (const std::string name : {"../other/ckpt-1.bin", "..", ".", "sub/ckpt-1.bin", "ckpt-1.bin/.."}) {
    K::write_file_atomic(dir.path / "ckpt" / "latest", name + "\n");
    const Timed t = timed([&] { K::latest_checkpoint(dir.path / "ckpt"); });
    EXPECT_NE(t.error.find((dir.path / "ckpt" / "latest").string() + " names '" + name +
                           "'; expected the file name of a checkpoint in " + (dir.path / "ckpt").string() +
                           " (like ckpt-3.bin), without '/' or '..'"),
              std::string::npos)
        << name << ": " << t.error;
  }
  K::write_file_atomic(dir.path / "ckpt" / "latest", "\n");
  EXPECT_NE(timed([&] { K::latest_checkpoint(dir.path / "ckpt"); }).error.find("does not name a checkpoint file; expected"),
            std::string::npos);
  K::write_file_atomic(dir.path / "ckpt" / "latest", std::string(5000, 'x'));
  EXPECT_NE(timed([&] { K::latest_checkpoint(dir.path / "ckpt"); }).error.find("is 5000 bytes; expected at most 4096"),
            std::string::npos);
}

TEST(CheckpointLatest, SymbolicLinksAreRefused) {
  TempDir dir("latest_links");
  // `latest` names a dangling symbolic link.
  fs::create_symlink(dir.path / "gone" / "ckpt-4.bin", dir.path / "ckpt-4.bin");
  K::write_file_atomic(dir.path / "latest", "ckpt-4.bin\n");
  std::string e = timed([&] { K::latest_checkpoint(dir.path); }).error;
  EXPECT_NE(e.find("names " + (dir.path / "ckpt-4.bin").string() + ", which is a symbolic link to '" +
                   (dir.path / "gone" / "ckpt-4.bin").string() + "' that leads nowhere; expected a regular checkpoint file in " +
                   dir.path.string()),
            std::string::npos)
      << e;
  // `latest` names a directory.
  fs::create_directories(dir.path / "ckpt-5.bin");
  K::write_file_atomic(dir.path / "latest", "ckpt-5.bin\n");
  e = timed([&] { K::latest_checkpoint(dir.path); }).error;
  EXPECT_NE(e.find(", which is a directory; expected a regular checkpoint file"), std::string::npos) << e;
  // `latest` itself a symbolic link (to a good `latest` elsewhere): not followed.
  TempDir elsewhere("latest_elsewhere");
  K::write_checkpoint(elsewhere.path, some_checkpoint(1));
  fs::remove(dir.path / "latest");
  fs::create_symlink(elsewhere.path / "latest", dir.path / "latest");
  e = timed([&] { K::latest_checkpoint(dir.path); }).error;
  EXPECT_NE(e.find((dir.path / "latest").string() + " is a symbolic link; expected a regular file holding"), std::string::npos)
      << e;
}

// ---- the lock ---------------------------------------------------------------------------------
TEST(CheckpointLock, ASecondHolderFailsAtOnceNamingTheFirst) {
  TempDir dir("lock_held");
  const fs::path ckpt = dir.path / "ckpt";
  K::CheckpointLock first = K::CheckpointLock::acquire(ckpt);  // makes the directory
  ASSERT_TRUE(first.held());
  EXPECT_EQ(first.taken_over(), "");
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const Timed t = timed([&] { K::CheckpointLock::acquire(ckpt); });
  EXPECT_LT(t.seconds, 1.0);
  EXPECT_NE(t.error.find("checkpoint directory " + ckpt.string() + " is in use by another run (host " + host + ", pid " +
                         std::to_string(::getpid()) + ", started 20"),
            std::string::npos)
      << t.error;
  EXPECT_NE(t.error.find("lock file " + (ckpt / "lock").string()), std::string::npos) << t.error;
  // The holder's record survives the failed attempt.
  EXPECT_NE(K::read_file(ckpt / "lock").find("pid=" + std::to_string(::getpid())), std::string::npos);

  // With a wait, the second one gets it once the first lets go, and says it waited.
  std::thread let_go([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    first = K::CheckpointLock();
  });
  std::FILE* note = std::tmpfile();
  const Timed w = timed([&] { K::CheckpointLock second = K::CheckpointLock::acquire(ckpt, 10, note); });
  let_go.join();
  EXPECT_EQ(w.error, "");
  EXPECT_GT(w.seconds, 0.2);
  EXPECT_LT(w.seconds, 5.0);
  std::rewind(note);
  char line[512] = {};
  ASSERT_NE(std::fgets(line, sizeof line, note), nullptr);
  std::fclose(note);
  EXPECT_NE(std::string(line).find("Waiting up to 10 s for the run holding " + ckpt.string()), std::string::npos) << line;
  // A lock let go of cleanly leaves no holder behind.
  EXPECT_EQ(K::read_file(ckpt / "lock"), "");
}

TEST(CheckpointLock, ADeadHoldersLockIsTakenOver) {
  TempDir dir("lock_dead");
  const pid_t child = fork_lock_holder(dir.path);  // a run that holds the lock (before any thread starts)
  ASSERT_GT(child, 0);
  const std::string err = timed([&] { K::CheckpointLock::acquire(dir.path); }).error;
  EXPECT_NE(err.find("is in use by another run (host "), std::string::npos) << err;
  EXPECT_NE(err.find(", pid " + std::to_string(child) + ", started "), std::string::npos) << err;
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  K::CheckpointLock taken = K::CheckpointLock::acquire(dir.path);
  EXPECT_TRUE(taken.held());
  EXPECT_NE(taken.taken_over().find(", pid " + std::to_string(child) + ", started "), std::string::npos) << taken.taken_over();
  EXPECT_NE(K::read_file(dir.path / "lock").find("pid=" + std::to_string(::getpid()) + "\n"), std::string::npos);
}

TEST(CheckpointLock, ADanglingOrWrongDirectoryIsAClearError) {
  TempDir dir("lock_dir");
  fs::create_symlink(dir.path / "scratch" / "run1", dir.path / "ckpt");
  std::string e = timed([&] { K::CheckpointLock::acquire(dir.path / "ckpt"); }).error;
  EXPECT_EQ(e, "checkpoint directory " + (dir.path / "ckpt").string() + " is a symbolic link to '" +
                   (dir.path / "scratch" / "run1").string() +
                   "', which does not exist: create that directory or name another checkpoint directory");
  // A link to a directory that exists is refused too: it could be turned elsewhere between the
  // check and the writes. The error names the directory to use instead.
  fs::create_directories(dir.path / "scratch" / "run1");
  e = timed([&] { K::CheckpointLock::acquire(dir.path / "ckpt"); }).error;
  EXPECT_EQ(e, "checkpoint directory " + (dir.path / "ckpt").string() + " is a symbolic link to '" +
                   (dir.path / "scratch" / "run1").string() +
                   "'; expected the directory itself (a link can be turned elsewhere between the check and the "
                   "writes): name " + (dir.path / "scratch" / "run1").string() + " instead");
  EXPECT_FALSE(fs::exists(dir.path / "scratch" / "run1" / "lock"));
  EXPECT_TRUE(K::CheckpointLock::acquire(dir.path / "scratch" / "run1").held());
  std::ofstream(dir.path / "file") << "x";
  e = timed([&] { K::CheckpointLock::acquire(dir.path / "file"); }).error;
  EXPECT_EQ(e, "checkpoint directory " + (dir.path / "file").string() + " is a regular file; expected a directory");
  // The lock file a symbolic link (planted to make the run truncate another file): refused.
  fs::create_directories(dir.path / "planted");
  std::ofstream(dir.path / "victim") << "keep";
  fs::create_symlink(dir.path / "victim", dir.path / "planted" / "lock");
  e = timed([&] { K::CheckpointLock::acquire(dir.path / "planted"); }).error;
  EXPECT_NE(e.find("lock file " + (dir.path / "planted" / "lock").string() + ": it is a symbolic link"), std::string::npos)
      << e;
  EXPECT_EQ(K::read_file(dir.path / "victim"), "keep");
}

// ---- what an interrupted run left ---------------------------------------------------------------
TEST(CheckpointClean, TemporariesAndStaleMidEpochCheckpointsGoNothingElse) {
  TempDir dir("clean");
  TempDir outside("clean_outside");
  const fs::path d = dir.path;
  K::write_checkpoint(d, some_checkpoint(1));
  K::write_checkpoint(d, some_checkpoint(1, 300));  // latest: ckpt-1-300.bin
  auto plant = [&](const std::string& name) { std::ofstream(d / name) << "x"; };
  plant("ckpt-2.bin.tmp.4242");       // a checkpoint cut off mid-write
  plant("ckpt-1-400.bin.tmp.17");
  plant("latest.tmp.4242");           // `latest` cut off mid-write
  plant("ckpt-1-200.bin");            // a mid-epoch checkpoint a crash left behind
  plant("ckpt-1-500.bin");            // one written but never committed to `latest`
  plant("history.csv.tmp.1");         // not ours: kept
  plant("notes.txt");
  std::ofstream(outside.path / "target") << "keep";
  fs::create_symlink(outside.path / "target", d / "ckpt-3.bin.tmp.9");  // a link: kept, target untouched
  fs::create_symlink(outside.path / "target", d / "ckpt-0-7.bin");
  fs::create_directories(d / "latest.tmp.5");                            // a directory: kept

  const std::vector<std::string> removed = K::clean_checkpoint_dir(d);
  EXPECT_EQ(removed, (std::vector<std::string>{"ckpt-1-200.bin", "ckpt-1-400.bin.tmp.17", "ckpt-1-500.bin",
                                                "ckpt-2.bin.tmp.4242", "latest.tmp.4242"}));
  for (const char* kept : {"ckpt-1.bin", "ckpt-1-300.bin", "latest", "history.csv.tmp.1", "notes.txt", "ckpt-3.bin.tmp.9",
                           "ckpt-0-7.bin", "latest.tmp.5"})
    EXPECT_TRUE(fs::exists(fs::symlink_status(d / kept))) << kept;
  EXPECT_EQ(K::read_file(outside.path / "target"), "keep");
  EXPECT_EQ(K::latest_checkpoint(d), d / "ckpt-1-300.bin");

  // `latest` broken: temporaries go, no checkpoint is pruned.
  plant("ckpt-1-100.bin");
  plant("latest.tmp.6");
  K::write_file_atomic(d / "latest", "ckpt-9-9.bin\n");
  EXPECT_EQ(K::clean_checkpoint_dir(d), (std::vector<std::string>{"latest.tmp.6"}));
  EXPECT_TRUE(fs::exists(d / "ckpt-1-100.bin"));
  EXPECT_TRUE(fs::exists(d / "ckpt-1-300.bin"));

  // `latest` names an epoch's checkpoint: every mid-epoch one is stale.
  K::write_file_atomic(d / "latest", "ckpt-1.bin\n");
  EXPECT_EQ(K::clean_checkpoint_dir(d), (std::vector<std::string>{"ckpt-1-100.bin", "ckpt-1-300.bin"}));
  EXPECT_TRUE(fs::exists(d / "ckpt-1.bin"));
}

TEST(CheckpointClean, TheRunsSeedBatchAndStepsRoundTrip) {
  K::Checkpoint c = some_checkpoint(2, 50);
  c.seed = 99;
  c.batch_size = 64;
  c.steps_per_epoch = 900;
  const K::Checkpoint back = K::decode_checkpoint(K::encode_checkpoint(c), "x");
  EXPECT_EQ(back.seed, 99u);
  EXPECT_EQ(back.batch_size, 64u);
  EXPECT_EQ(back.steps_per_epoch, 900u);
  EXPECT_EQ(back.epoch_step, 50u);
  EXPECT_EQ(back.state, "state");
  // Format 2 (the build before) has no run fields: it still loads, and they read 0 (unchecked).
  std::string v2 = K::encode_checkpoint(c);
  v2[8] = 2;
  v2.erase(56, 24);  // magic 8, format 4, epoch 4, step 8, epoch_step 8, loss_sum 8, correct 8, seen 8
  v2.resize(v2.size() - 4);
  const uint32_t crc = skyforge::tfevents::crc32c(v2.data(), v2.size());
  for (int i = 0; i < 4; ++i) v2.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
  const K::Checkpoint old = K::decode_checkpoint(v2, "v2");
  EXPECT_EQ(old.batch_size, 0u);
  EXPECT_EQ(old.seed, 0u);
  EXPECT_EQ(old.epoch_step, 50u);
  EXPECT_EQ(old.state, "state");
}

// ---- a directory another user can write; links planted at temporaries' names ---------------------
namespace {

std::set<std::string> listing(const fs::path& d) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.insert(e.path().filename().string());
  return names;
}

// Runs `f` in a forked child as user `nobody` (setgid, setgroups, setuid: it cannot get root
// back); true when it exited 0.
bool as_nobody(const std::function<bool()>& f) {
  const struct passwd* pw = ::getpwnam("nobody");
  if (!pw) return false;
  const uid_t uid = pw->pw_uid;
  const gid_t gid = pw->pw_gid;
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0 || ::setuid(0) == 0) ::_exit(90);
    ::umask(0);
    ::_exit(f() ? 0 : 1);
  }
  int st = 0;
  if (child < 0 || ::waitpid(child, &st, 0) != child) return false;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

}  // namespace

// The reviewer's attack: user nobody makes a 0777 checkpoint directory in a shared sticky
// directory and plants links named like the run's temporaries (<name>.tmp.<pid>, for the next
// 300 pids) to a file of root's. The run (root) refuses the directory before it writes anything
// there, its lock included; and the writer itself, pointed at that directory, never follows them.
TEST(CheckpointDirSafety, ANobodyOwnedWorldWritableDirectoryIsRefusedBeforeAnythingIsWritten) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to be another user (nobody) in a child";
  const struct passwd* pw = ::getpwnam("nobody");
  if (!pw) GTEST_SKIP() << "no user nobody";
  const uid_t nobody = pw->pw_uid;
  TempDir dir("nobody_dir");
  ASSERT_EQ(::chmod(dir.path.c_str(), 0755), 0);
  const fs::path shared = dir.path / "shared";  // like /var/tmp: 1777
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);
  const fs::path victim = dir.path / "victim";
  std::ofstream(victim) << "keep";
  const fs::path ck = shared / "ckpt";
  const pid_t me = ::getpid();
  ASSERT_TRUE(as_nobody([&] {
    if (::mkdir(ck.c_str(), 0777) != 0) return false;
    for (int i = 0; i < 300; ++i)
      for (const std::string name : {"ckpt-1.bin", "latest", "ckpt-0-5.bin"})
        if (::symlink(victim.c_str(), (ck / (name + ".tmp." + std::to_string(me + i))).c_str()) != 0) return false;
    return true;
  })) << "the attacker's setup failed";
  struct stat st {};
  ASSERT_EQ(::stat(ck.c_str(), &st), 0);
  ASSERT_EQ(st.st_uid, nobody);
  const std::set<std::string> before = listing(ck);

  const std::string e = timed([&] { K::CheckpointLock::acquire(ck); }).error;
  EXPECT_EQ(e, "checkpoint directory " + ck.string() + " is owned by uid " + std::to_string(nobody) + " (" + pw->pw_name +
                   ") with mode 0777; expected a directory owned by this run's user (uid 0 (root)) that no other user "
                   "can write (like 0700 or 0755): another user who can write there could plant a checkpoint this run "
                   "would resume or remove its lock; name a directory of your own (a missing one is made with mode 0700)");
  EXPECT_EQ(listing(ck), before) << "something was written in the refused directory";
  EXPECT_EQ(K::read_file(victim), "keep");

  // The writer on its own (as the reviewer's root process did after lock and clean): the
  // planted links are not followed, the victim keeps its bytes.
  K::write_checkpoint(ck, some_checkpoint(1));
  K::write_checkpoint(ck, some_checkpoint(1, 5));
  EXPECT_EQ(K::read_file(victim), "keep");
  EXPECT_EQ(K::latest_checkpoint(ck), ck / "ckpt-1-5.bin");
  EXPECT_TRUE(fs::is_symlink(ck / ("latest.tmp." + std::to_string(me))));
}

TEST(CheckpointDirSafety, OnlyADirectoryOfOurOwnThatNoOneElseCanWriteIsUsed) {
  TempDir dir("own_dir");
  ASSERT_EQ(::chmod(dir.path.c_str(), 0755), 0);
  // Missing: made 0700 (whatever the umask), parents and all.
  const fs::path made = dir.path / "runs" / "a" / "ckpt";
  const mode_t old_umask = ::umask(0);
  EXPECT_TRUE(K::CheckpointLock::acquire(made).held());
  ::umask(old_umask);
  struct stat st {};
  ASSERT_EQ(::stat(made.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_TRUE(K::CheckpointLock::acquire(dir.path / "runs" / "b" / "ckpt" / "").held());  // a trailing '/'
  ASSERT_EQ(::stat((dir.path / "runs" / "b" / "ckpt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);

  // Ours, 0755: used as it is.
  const fs::path open_dir = dir.path / "readable";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0755), 0);
  EXPECT_TRUE(K::CheckpointLock::acquire(open_dir).held());

  // Ours but group-writable (a umask of 002) or world-writable and sticky: refused, with the fix.
  for (const mode_t mode : {mode_t{0770}, mode_t{0775}, mode_t{01777}}) {
    const fs::path d = dir.path / ("w" + std::to_string(mode));
    ASSERT_EQ(::mkdir(d.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(d.c_str(), mode), 0);
    const std::string e = timed([&] { K::CheckpointLock::acquire(d); }).error;
    EXPECT_NE(e.find("checkpoint directory " + d.string() + " is owned by uid " + std::to_string(::geteuid())), std::string::npos) << e;
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode));
    EXPECT_NE(e.find(std::string(" with mode ") + octal + "; expected"), std::string::npos) << e;
    EXPECT_NE(e.find("that no other user can write"), std::string::npos) << e;
    EXPECT_NE(e.find("`chmod go-w " + d.string() + "`"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(d / "lock")) << mode;
  }

  // Ours, 0700, but inside a directory anyone can write without the sticky bit: refused.
  const fs::path open_parent = dir.path / "open";
  ASSERT_EQ(::mkdir(open_parent.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open_parent.c_str(), 0777), 0);
  ASSERT_EQ(::mkdir((open_parent / "ckpt").c_str(), 0700), 0);
  std::string e = timed([&] { K::CheckpointLock::acquire(open_parent / "ckpt"); }).error;
  EXPECT_NE(e.find("checkpoint directory " + (open_parent / "ckpt").string() + " is inside " + open_parent.string() +
                   " (owned by uid " + std::to_string(::geteuid())),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("mode 0777), which any user can write and which has no sticky bit"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(open_parent / "ckpt" / "lock"));
  ASSERT_EQ(::chmod(open_parent.c_str(), 01777), 0);  // sticky (like /tmp): fine
  EXPECT_TRUE(K::CheckpointLock::acquire(open_parent / "ckpt").held());
}

// In our own directory: links planted at the names of temporaries (the old <name>.tmp.<pid>, and
// a name the writer is made to draw) are never followed — not to a file, not to a file that does
// not exist yet — and a temporary left by a crash is still one the next start cleans.
TEST(CheckpointDirSafety, ALinkAtATemporarysNameIsNeverFollowed) {
  TempDir dir("tmp_links");
  TempDir outside("tmp_links_outside");
  const fs::path d = dir.path;
  const fs::path victim = outside.path / "victim";
  std::ofstream(victim) << "keep";
  const fs::path absent = outside.path / "made-through-a-link";
  const std::string pid = std::to_string(::getpid());
  for (const std::string name : {"ckpt-1.bin", "ckpt-2.bin", "history.csv"})
    fs::create_symlink(victim, d / (name + ".tmp." + pid));
  fs::create_symlink(absent, d / ("latest.tmp." + pid));
  K::write_checkpoint(d, some_checkpoint(1));
  K::write_checkpoint(d, some_checkpoint(2));
  K::write_file_atomic(d / "history.csv", "epoch,loss\n0,1\n");
  EXPECT_EQ(K::read_file(victim), "keep");
  EXPECT_FALSE(fs::exists(fs::symlink_status(absent)));
  EXPECT_EQ(K::latest_checkpoint(d), d / "ckpt-2.bin");
  EXPECT_EQ(K::read_file(d / "history.csv"), "epoch,loss\n0,1\n");

  // The name drawn is one that is taken (a link to the victim, then one to nowhere): another is
  // drawn, nothing is followed.
  static int calls = 0;
  calls = 0;
  auto guessed = []() -> std::string {
    ++calls;
    return calls == 1 ? "guess" : calls == 2 ? "dangling" : "free";
  };
  fs::create_symlink(victim, d / "ckpt-3.bin.tmp.guess");
  fs::create_symlink(absent, d / "ckpt-3.bin.tmp.dangling");
  fs::path tmp;
  const int fd = K::detail::create_temporary(d / "ckpt-3.bin", 0644, tmp, +guessed);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(tmp, d / "ckpt-3.bin.tmp.free");
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(::write(fd, "new", 3), 3);
  ::close(fd);
  EXPECT_EQ(K::read_file(victim), "keep");
  EXPECT_FALSE(fs::exists(fs::symlink_status(absent)));
  EXPECT_EQ(K::read_file(tmp), "new");

  // The real names: <name>.tmp.<16 random hex digits>, a new one each time, and what a crash
  // leaves of them (these, never renamed) is cleaned at the next start; the links are kept.
  fs::path a, b;
  ::close(K::detail::create_temporary(d / "ckpt-4.bin", 0644, a));
  ::close(K::detail::create_temporary(d / "latest", 0644, b));
  EXPECT_TRUE(std::regex_match(a.filename().string(), std::regex(R"(ckpt-4\.bin\.tmp\.[0-9a-f]{16})"))) << a;
  EXPECT_TRUE(std::regex_match(b.filename().string(), std::regex(R"(latest\.tmp\.[0-9a-f]{16})"))) << b;
  const std::vector<std::string> removed = K::clean_checkpoint_dir(d);
  EXPECT_EQ(removed, (std::vector<std::string>{"ckpt-3.bin.tmp.free", a.filename().string(), b.filename().string()}));
  EXPECT_TRUE(fs::is_symlink(d / ("latest.tmp." + pid)));
  EXPECT_EQ(K::read_file(victim), "keep");
}
