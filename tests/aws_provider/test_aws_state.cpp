// The aws provider's local state (a pool's private key, known_hosts) lives in a directory named
// after the pool id, which is not secret. make_private_dir() makes it this user's own 0700
// directory or refuses it: a symlink planted there by another local user (to the victim's ~/.ssh,
// or to a directory of the attacker's), a directory another user made, or one others can read is
// never used, and nothing in it or where it leads is touched. state_roots() never falls back to
// /tmp.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "ec2_pool.hpp"
#include "../support/read_text.hpp"

namespace fs = std::filesystem;
using skyforge::aws::make_private_dir;
using skyforge::aws::make_state_root;
using skyforge::aws::state_roots;

namespace {

mode_t mode_of(const fs::path& p) {
  struct stat st{};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

std::string refusal(const fs::path& dir) {
  try {
    make_private_dir(dir);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

class AwsStateDir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "skyforge-aws-state-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  fs::path root_;
};

TEST_F(AwsStateDir, AFreshOneIsMade0700WhateverTheUmask) {
  const mode_t old = ::umask(0);
  const fs::path dir = root_ / "skyforge-aws-0123456789ab";
  make_private_dir(dir);
  ::umask(0277);  // a umask that takes the owner's write bit too
  const fs::path dir2 = root_ / "skyforge-aws-0123456789ac";
  make_private_dir(dir2);
  ::umask(old);
  EXPECT_TRUE(fs::is_directory(fs::symlink_status(dir)));
  EXPECT_EQ(mode_of(dir), 0700u);
  EXPECT_EQ(mode_of(dir2), 0700u);
  // Ours and 0700 already (the same pool's directory met again): used as it is.
  EXPECT_EQ(refusal(dir), "");
}

TEST_F(AwsStateDir, APlantedSymlinkIsRefusedAndItsTargetUntouched) {
  // The victim's ~/.ssh, 0755 with a key in it: the old code chmod-ed it to 0700, removed the key
  // and wrote a new one there.
  const fs::path victim = root_ / "victim-ssh";
  fs::create_directory(victim);
  fs::permissions(victim, fs::perms(0755), fs::perm_options::replace);
  std::ofstream(victim / "id_ed25519") << "the user's own key\n";
  const fs::path dir = root_ / "skyforge-aws-0123456789ab";
  fs::create_directory_symlink(victim, dir);

  const std::string why = refusal(dir);
  EXPECT_NE(why.find(dir.string() + " is a symlink (to " + victim.string()), std::string::npos) << why;
  EXPECT_NE(why.find("expected a real directory owned by this user"), std::string::npos) << why;
  EXPECT_NE(why.find("mode 0700"), std::string::npos) << why;
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir)));
  EXPECT_EQ(skyforge::test::read_text(victim / "id_ed25519"), "the user's own key\n");
  EXPECT_EQ(mode_of(victim), 0755u) << "the symlink's target was chmod-ed";
  EXPECT_EQ(std::distance(fs::directory_iterator(victim), fs::directory_iterator()), 1);

  // A dangling one (to where the attacker wants the key to land) is refused too, and not made.
  const fs::path dangling = root_ / "skyforge-aws-0123456789ac";
  fs::create_directory_symlink(root_ / "attacker-dir", dangling);
  EXPECT_NE(refusal(dangling).find("is a symlink"), std::string::npos);
  EXPECT_FALSE(fs::exists(root_ / "attacker-dir"));
}

TEST_F(AwsStateDir, AnotherUsersDirectoryIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (to chown a directory to uid 65534)";
  const fs::path dir = root_ / "skyforge-aws-0123456789ab";
  fs::create_directory(dir);
  fs::permissions(dir, fs::perms(0700), fs::perm_options::replace);
  ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
  const std::string why = refusal(dir);
  EXPECT_NE(why.find(dir.string() + " is owned by uid 65534"), std::string::npos) << why;
  EXPECT_NE(why.find("not by this user (mode 0700)"), std::string::npos) << why;
  struct stat st{};
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
}

TEST_F(AwsStateDir, OneOthersCanReadIsRefusedAndLeftAsItIs) {
  const fs::path dir = root_ / "skyforge-aws-0123456789ab";
  fs::create_directory(dir);
  fs::permissions(dir, fs::perms(0755), fs::perm_options::replace);
  const std::string why = refusal(dir);
  EXPECT_NE(why.find(dir.string() + " has mode 0755, not 0700"), std::string::npos) << why;
  EXPECT_EQ(mode_of(dir), 0755u);
  // A file there is not a directory.
  std::ofstream(root_ / "skyforge-aws-0123456789ac") << "x";
  EXPECT_NE(refusal(root_ / "skyforge-aws-0123456789ac").find("is not a directory"), std::string::npos);
}

TEST_F(AwsStateDir, AParentOthersCanWriteToIsRefusedUnlessSticky) {
  const fs::path open = root_ / "open";
  fs::create_directory(open);
  fs::permissions(open, fs::perms(0777), fs::perm_options::replace);
  const std::string why = refusal(open / "skyforge-aws-0123456789ab");
  EXPECT_NE(why.find(open.string() + " (owner "), std::string::npos) << why;
  EXPECT_NE(why.find("mode 0777) is writable by other users and not sticky"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(open / "skyforge-aws-0123456789ab"));
  fs::permissions(open, fs::perms(01777), fs::perm_options::replace);  // as /tmp
  EXPECT_EQ(refusal(open / "skyforge-aws-0123456789ab"), "");
}

TEST(AwsStateRoots, RuntimeDirThenStateHomeNeverTmp) {
  std::map<std::string, std::string> env;
  auto lookup = [&](const std::string& k) { return env.count(k) ? env[k] : std::string(); };
  env = {{"XDG_RUNTIME_DIR", "/run/user/1000"}, {"HOME", "/home/u"}};
  EXPECT_EQ(state_roots(lookup), (std::vector<fs::path>{"/run/user/1000", "/home/u/.local/state/skyforge"}));
  env = {{"XDG_STATE_HOME", "/s"}, {"HOME", "/home/u"}};
  EXPECT_EQ(state_roots(lookup), (std::vector<fs::path>{"/s/skyforge"}));
  env = {{"XDG_RUNTIME_DIR", "relative"}, {"XDG_STATE_HOME", ""}, {"HOME", "/home/u"}};
  EXPECT_EQ(state_roots(lookup), (std::vector<fs::path>{"/home/u/.local/state/skyforge"}));
  env = {{"TMPDIR", "/tmp"}};
  try {
    state_roots(lookup);
    FAIL() << "a state root without XDG_RUNTIME_DIR, XDG_STATE_HOME or HOME";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("none of XDG_RUNTIME_DIR, XDG_STATE_HOME, HOME"), std::string::npos)
        << e.what();
  }
}

TEST_F(AwsStateDir, TheStateHomeRootIsMade0700) {
  std::map<std::string, std::string> env = {{"HOME", (root_ / "home").string()}};
  auto lookup = [&](const std::string& k) { return env.count(k) ? env[k] : std::string(); };
  const fs::path root = make_state_root(lookup);
  EXPECT_EQ(root, root_ / "home" / ".local" / "state" / "skyforge");
  EXPECT_EQ(mode_of(root), 0700u);
  EXPECT_EQ(make_state_root(lookup), root) << "made once, then used";
}

}  // namespace
