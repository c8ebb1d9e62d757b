// The aws dead-man switch's user data, run for real: the script dead_man_user_data() makes, run
// as root by sh (as cloud-init would) with a lease path of the test's own, a one-second check and
// a fake `poweroff` (and `logger`) on PATH that say what happened. The lease must be the login
// user's alone (0700 directory, 0600 file): no other local user may keep a lost machine billing
// by touching it, or power it off mid-job by aging it; and a lease the check cannot trust -- a
// symlink, not a regular file, another user's, writable by others -- counts as stale.
//
// Root only (the lease is chowned to the login user, `nobody` here; the other user is uid 4242):
// skipped with the reason elsewhere.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "ec2_pool.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using skyforge::aws::dead_man_user_data;

namespace {

constexpr uid_t kOther = 4242;  // a local user that is not the login user

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class DeadManTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: the lease is chowned to the login user";
    const passwd* pw = ::getpwnam("nobody");
    if (!pw) GTEST_SKIP() << "no user 'nobody' to be the login user";
    uid_ = pw->pw_uid;
    gid_ = pw->pw_gid;
    // Under /tmp, 0711: every user can reach the lease directory, so only its own modes keep
    // other users out (a private parent would hide what is tested).
    char tmpl[] = "/tmp/skyforge-dead-man-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    ::chmod(root_.c_str(), 0711);
    fs::create_directories(root_ / "bin");
    fs::create_directories(root_ / "run");
    std::ofstream(root_ / "bin" / "poweroff") << "#!/bin/sh\ntouch '" << (root_ / "powered-off").string() << "'\n";
    std::ofstream(root_ / "bin" / "logger") << "#!/bin/sh\nshift 2\nprintf '%s\\n' \"$*\" >> '"
                                            << (root_ / "logged").string() << "'\n";
    ::chmod((root_ / "bin" / "poweroff").c_str(), 0755);
    ::chmod((root_ / "bin" / "logger").c_str(), 0755);
    dir_ = root_ / "run" / "skyforge";
    lease_ = dir_ / "lease";
  }
  void TearDown() override {
    if (pgid_ > 0) ::kill(-pgid_, SIGKILL);  // the switch's loop, when it never powered off
    if (!root_.empty()) fs::remove_all(root_);
  }

  // The user data, run by sh as root; its loop stays in the process group made here.
  void boot(const std::string& user, std::chrono::seconds ttl = 60s) {
    const fs::path ud = root_ / "user-data";
    std::ofstream(ud) << dead_man_user_data(ttl, user, lease_.string(), 1);
    const std::string path = "PATH=" + (root_ / "bin").string() + ":/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::setpgid(0, 0);
      int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
      char* const argv[] = {const_cast<char*>("sh"), const_cast<char*>(ud.c_str()), nullptr};
      char* const envp[] = {const_cast<char*>(path.c_str()), nullptr};
      ::execve("/bin/sh", argv, envp);
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    pgid_ = pid;
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the user data failed: " << status;
  }

  // Waits until the lease is the login user's (the switch is armed).
  void wait_armed() {
    struct stat st {};
    for (int i = 0; i < 100; ++i) {
      if (::lstat(lease_.c_str(), &st) == 0 && st.st_uid == uid_) {
        std::this_thread::sleep_for(100ms);  // its directory goes to the user right after
        return;
      }
      std::this_thread::sleep_for(50ms);
    }
    FAIL() << "the lease " << lease_ << " never became the login user's";
  }

  bool powered_off_within(std::chrono::milliseconds limit) {
    auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (fs::exists(root_ / "powered-off")) return true;
      std::this_thread::sleep_for(50ms);
    }
    return fs::exists(root_ / "powered-off");
  }

  // `fn` run as uid:gid in a child (no supplementary groups): its errno, 0 on success.
  template <class F>
  static int as_user(uid_t uid, gid_t gid, F fn) {
    pid_t pid = ::fork();
    if (pid == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(250);
      ::_exit(fn() == 0 ? 0 : (errno ? errno : 249));
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 255;
  }
  static int renew(const fs::path& p) { return ::utimensat(AT_FDCWD, p.c_str(), nullptr, 0); }
  static int age(const fs::path& p) {
    const timespec epoch[2] = {{0, 0}, {0, 0}};
    return ::utimensat(AT_FDCWD, p.c_str(), epoch, 0);
  }

  fs::path root_, dir_, lease_;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  pid_t pgid_ = -1;
};

TEST_F(DeadManTest, TheLeaseIsTheLoginUsersAloneAndItsWorkerKeepsTheMachine) {
  boot("nobody");
  wait_armed();
  struct stat d {}, f {};
  ASSERT_EQ(::lstat(dir_.c_str(), &d), 0);
  ASSERT_EQ(::lstat(lease_.c_str(), &f), 0);
  EXPECT_TRUE(S_ISDIR(d.st_mode));
  EXPECT_EQ(d.st_mode & 07777, 0700u) << std::oct << (d.st_mode & 07777);
  EXPECT_EQ(d.st_uid, uid_);
  EXPECT_EQ(d.st_gid, gid_);
  EXPECT_TRUE(S_ISREG(f.st_mode));
  EXPECT_EQ(f.st_mode & 07777, 0600u) << std::oct << (f.st_mode & 07777);
  EXPECT_EQ(f.st_uid, uid_);
  EXPECT_EQ(f.st_gid, gid_);

  // Another local user can neither keep it fresh nor age it, nor put anything beside it.
  EXPECT_NE(as_user(kOther, kOther, [&] { return renew(lease_); }), 0) << "another user touched the lease";
  EXPECT_NE(as_user(kOther, kOther, [&] { return age(lease_); }), 0) << "another user aged the lease";
  EXPECT_NE(as_user(kOther, kOther, [&] { return ::open((dir_ / "x").c_str(), O_CREAT | O_WRONLY, 0600) < 0 ? -1 : 0; }), 0);

  // The login user (its worker) keeps it fresh: the machine stays up past several checks.
  EXPECT_EQ(as_user(uid_, gid_, [&] { return renew(lease_); }), 0) << "the login user cannot renew its lease";
  EXPECT_FALSE(powered_off_within(3s)) << read_all(root_ / "logged");

  // ... and ages it when its lease on the host is lost: powered off at the next check.
  EXPECT_EQ(as_user(uid_, gid_, [&] { return age(lease_); }), 0) << "the login user cannot age its lease";
  EXPECT_TRUE(powered_off_within(5s));
  EXPECT_NE(read_all(root_ / "logged").find("untouched for more than 60 s"), std::string::npos)
      << read_all(root_ / "logged");
}

// A lease the check cannot trust counts as stale, however fresh: a planted lease must never keep
// a machine billing.
// Each test starts with the switch armed for the login user `nobody`.
class UntrustedLeaseTest : public DeadManTest {
 protected:
  void SetUp() override {
    DeadManTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    boot("nobody");
    if (!HasFatalFailure()) wait_armed();
  }
  void expect_powered_off(const std::string& why) {
    EXPECT_TRUE(powered_off_within(5s)) << "an untrusted lease (" << why << ") kept the machine up";
    EXPECT_NE(read_all(root_ / "logged").find("powering off"), std::string::npos) << read_all(root_ / "logged");
  }
};

TEST_F(UntrustedLeaseTest, ASymlinkIsNotTrusted) {
  const fs::path fresh = root_ / "fresh";
  std::ofstream(fresh) << "";
  ::chown(fresh.c_str(), uid_, gid_);
  ::chmod(fresh.c_str(), 0600);
  fs::remove(lease_);
  fs::create_symlink(fresh, lease_);
  ::lchown(lease_.c_str(), uid_, gid_);
  expect_powered_off("a symlink to a fresh file of the user's");
  EXPECT_NE(read_all(root_ / "logged").find("is not a regular file of nobody"), std::string::npos)
      << read_all(root_ / "logged");
}

TEST_F(UntrustedLeaseTest, AnotherUsersLeaseIsNotTrusted) {
  ASSERT_EQ(::chown(lease_.c_str(), kOther, kOther), 0);
  ASSERT_EQ(renew(lease_), 0);
  expect_powered_off("fresh, uid 4242's");
}

TEST_F(UntrustedLeaseTest, ARootOwnedLeaseIsNotTrusted) {
  ASSERT_EQ(::chown(lease_.c_str(), 0, 0), 0);
  ASSERT_EQ(renew(lease_), 0);
  expect_powered_off("fresh, root's");
}

TEST_F(UntrustedLeaseTest, AFifoIsNotTrusted) {
  fs::remove(lease_);
  ASSERT_EQ(::mkfifo(lease_.c_str(), 0600), 0);
  ASSERT_EQ(::chown(lease_.c_str(), uid_, gid_), 0);
  expect_powered_off("a FIFO of the user's");
}

TEST_F(UntrustedLeaseTest, AWorldWritableLeaseIsNotTrusted) {
  ASSERT_EQ(::chmod(lease_.c_str(), 0666), 0);
  ASSERT_EQ(renew(lease_), 0);
  expect_powered_off("mode 0666");
}

TEST_F(UntrustedLeaseTest, AWorldWritableDirectoryIsNotTrusted) {
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  ASSERT_EQ(renew(lease_), 0);
  expect_powered_off("its directory mode 1777");
  EXPECT_NE(read_all(root_ / "logged").find("lease directory"), std::string::npos) << read_all(root_ / "logged");
}

// What was at the lease's path before boot is replaced, never followed: root chowns nothing a
// planted symlink points at.
TEST_F(DeadManTest, APlantedSymlinkIsReplacedNotFollowed) {
  const fs::path victim = root_ / "victim";
  std::ofstream(victim) << "root's\n";
  ::chmod(victim.c_str(), 0644);
  fs::create_directories(dir_);
  fs::create_symlink(victim, lease_);
  boot("nobody");
  wait_armed();
  struct stat v {}, f {};
  ASSERT_EQ(::lstat(victim.c_str(), &v), 0);
  EXPECT_EQ(v.st_uid, 0u) << "root chowned what the planted symlink named";
  EXPECT_EQ(v.st_mode & 07777, 0644u);
  ASSERT_EQ(::lstat(lease_.c_str(), &f), 0);
  EXPECT_TRUE(S_ISREG(f.st_mode));
  EXPECT_EQ(f.st_uid, uid_);
}

// A login user that never appears: nothing is made for anyone else, and the machine powers off
// after the ttl (a broken image must not bill forever either).
TEST_F(DeadManTest, ALoginUserThatNeverAppearsPowersOffAfterTheTtl) {
  boot("skyforge-no-such-user", 2s);
  EXPECT_FALSE(fs::exists(lease_));
  EXPECT_TRUE(powered_off_within(8s));
  EXPECT_FALSE(fs::exists(lease_));
  EXPECT_NE(read_all(root_ / "logged").find("no user skyforge-no-such-user after 2 s"), std::string::npos)
      << read_all(root_ / "logged");
}

}  // namespace
