// The ssh provider's configuration, checked without a host: the `hosts` entries, the options,
// the remote paths and the platform check (the real-host tests are in test_ssh_e2e.cpp).
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "provider_options.hpp"
#include "ssh_provider.hpp"

namespace skyforge::ssh {
namespace {

using test::error_of;
using test::options;

TEST(SshHosts, EntriesNameUserHostAndPort) {
  auto h = parse_host("alice@10.0.0.5");
  EXPECT_EQ(h.user, "alice");
  EXPECT_EQ(h.host, "10.0.0.5");
  EXPECT_EQ(h.port, 0);
  h = parse_host("gpu2:2222");
  EXPECT_EQ(h.user, "");
  EXPECT_EQ(h.host, "gpu2");
  EXPECT_EQ(h.port, 2222);
  h = parse_host("bob@[fd00::5]:22");
  EXPECT_EQ(h.user, "bob");
  EXPECT_EQ(h.host, "fd00::5");
  EXPECT_EQ(h.port, 22);
  h = parse_host("fd00::5");  // a bare IPv6 address: no port
  EXPECT_EQ(h.host, "fd00::5");
  EXPECT_EQ(h.port, 0);
}

TEST(SshHosts, BadEntriesAreRefusedNamingTheEntry) {
  for (const char* bad : {"", "gpu2:", "gpu2:0", "gpu2:70000", "gpu2:ssh", "@gpu2", "-oProxyCommand=x", "a b",
                          "[fd00::5", "[fd00::5]x"}) {
    const std::string e = error_of([&] { parse_host(bad); });
    EXPECT_NE(e.find("option 'hosts': entry \"" + std::string(bad) + "\""), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("expected \"[user@]host[:port]\""), std::string::npos) << e;
  }
}

TEST(SshOptions, DefaultsAndChecks) {
  auto c = SshConfig::from(options({{"hosts", "a\nb:2200"}}));
  ASSERT_EQ(c.hosts.size(), 2u);
  EXPECT_EQ(c.hosts[1].port, 2200);
  EXPECT_EQ(c.remote_dir, "~/.skyforge");
  EXPECT_EQ(c.slots_per_host, 1u);
  EXPECT_EQ(c.strict_host_keys, "yes");
  EXPECT_EQ(c.connect_timeout_s, 15);
  EXPECT_NE(error_of([] { SshConfig::from(options({})); }).find("option 'hosts' is required"), std::string::npos);
  EXPECT_NE(error_of([] { SshConfig::from(options({{"hosts", "a"}, {"slots_per_host", "0"}})); }).find("slots_per_host"),
            std::string::npos);
  EXPECT_NE(error_of([] { SshConfig::from(options({{"hosts", "a"}, {"strict_host_keys", "no"}})); }).find("\"accept-new\""),
            std::string::npos);
  EXPECT_NE(error_of([] { SshConfig::from(options({{"hosts", "a"}, {"remote_dir", "~"}})); }).find("remote_dir"),
            std::string::npos);
  EXPECT_NE(error_of([] { SshConfig::from(options({{"hosts", "a"}, {"connect_timeout", "0"}})); }).find("connect_timeout"),
            std::string::npos);
}

TEST(SshRemotePaths, HomeRelativeAndAbsolute) {
  EXPECT_EQ(remote_path_words("~/.skyforge"), "\"$HOME\"/'.skyforge'");
  EXPECT_EQ(remote_path_words("work dir"), "\"$HOME\"/'work dir'");
  EXPECT_EQ(remote_path_words("/srv/it's"), "'/srv/it'\\''s'");
}

TEST(SshPlatform, AMismatchNamesBothSides) {
  const Platform here{"x86_64", "2.36"};
  EXPECT_EQ(platform_mismatch(here, {"x86_64", "2.36"}), "");
  EXPECT_EQ(platform_mismatch(here, {"x86_64", "2.39"}), "") << "a newer glibc runs what an older one built";
  std::string e = platform_mismatch(here, {"aarch64", "2.36"});
  EXPECT_NE(e.find("the host is aarch64 with glibc 2.36"), std::string::npos) << e;
  EXPECT_NE(e.find("this machine (whose skyforge-worker and plugins are copied there) is x86_64"), std::string::npos) << e;
  e = platform_mismatch(here, {"x86_64", "2.31"});
  EXPECT_NE(e.find("glibc is older"), std::string::npos) << e;
  EXPECT_NE(e.find("2.31"), std::string::npos);
  EXPECT_NE(e.find("2.36"), std::string::npos);
  EXPECT_EQ(local_platform().machine.empty(), false);
}

// ---- the ControlMaster sockets (issue 33: another local user binding them first) ----------

int bind_socket(const std::string& path, mode_t mode) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << path;
  EXPECT_EQ(::chmod(path.c_str(), mode), 0);
  return s;
}

struct ControlSocketDir : ::testing::Test {
  void SetUp() override {
    std::string t = std::filesystem::temp_directory_path().string() + "/sf-ctl-XXXXXX";
    ASSERT_NE(::mkdtemp(t.data()), nullptr);
    parent = t;
  }
  void TearDown() override {
    for (int s : sockets) ::close(s);
    std::error_code ec;
    std::filesystem::permissions(parent, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(parent, ec);
  }
  std::string parent;
  std::vector<int> sockets;
};

TEST_F(ControlSocketDir, IsMadePrivateAndTrustsOnlyOurOwnSocket) {
  const std::string dir = make_control_dir(parent);
  EXPECT_EQ(dir.rfind(parent + "/skyforge-ssh-", 0), 0u) << dir;
  struct stat sb {};
  ASSERT_EQ(::lstat(dir.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISDIR(sb.st_mode));
  EXPECT_EQ(sb.st_mode & 07777, 0700u);
  EXPECT_EQ(sb.st_uid, ::geteuid());
  EXPECT_NE(make_control_dir(parent), dir) << "a new one each time";

  auto c = check_control_socket(dir + "/h0", ::geteuid());
  EXPECT_FALSE(c.exists);
  EXPECT_EQ(c.problem, "") << "nothing there yet: wait for the master";
  sockets.push_back(bind_socket(dir + "/h0", 0600));  // as ssh binds it (umask 0177)
  c = check_control_socket(dir + "/h0", ::geteuid());
  EXPECT_TRUE(c.exists);
  EXPECT_EQ(c.problem, "");
}

TEST_F(ControlSocketDir, RefusesATmpdirOthersMayWriteWithoutTheStickyBit) {
  ASSERT_EQ(::chmod(parent.c_str(), 0777), 0);
  try {
    make_control_dir(parent);
    ADD_FAILURE() << "a 0777 TMPDIR was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("is writable by other users and not sticky (mode 0777)"), std::string::npos)
        << e.what();
  }
  ASSERT_EQ(::chmod(parent.c_str(), 01777), 0);  // /tmp's mode: sticky, so only the owner renames
  EXPECT_NO_THROW(make_control_dir(parent));
}

TEST_F(ControlSocketDir, RefusesASocketOfAnotherUserOrOpenToOthers) {
  const std::string dir = make_control_dir(parent);
  sockets.push_back(bind_socket(dir + "/h0", 0600));
  // Another uid: as if another user's socket were there (this test need not be root to show it).
  auto c = check_control_socket(dir + "/h0", ::geteuid() + 1);
  EXPECT_NE(c.problem.find("belongs to uid " + std::to_string(::geteuid())), std::string::npos) << c.problem;
  ASSERT_EQ(::chmod((dir + "/h0").c_str(), 0666), 0);
  c = check_control_socket(dir + "/h0", ::geteuid());
  EXPECT_NE(c.problem.find("the control socket " + dir + "/h0 has mode 0666: others may use it"), std::string::npos) << c.problem;
  EXPECT_NE(c.problem.find("refused: another user may be trying to take over the connection"), std::string::npos);
}

TEST_F(ControlSocketDir, RefusesWhatIsNotASocketAndLinks) {
  const std::string dir = make_control_dir(parent);
  sockets.push_back(bind_socket(dir + "/h0", 0600));
  std::ofstream(dir + "/h1") << "x";
  ASSERT_EQ(::symlink((dir + "/h0").c_str(), (dir + "/h2").c_str()), 0);
  auto c = check_control_socket(dir + "/h1", ::geteuid());
  EXPECT_TRUE(c.exists);
  EXPECT_NE(c.problem.find(dir + "/h1 is a regular file, not a socket"), std::string::npos) << c.problem;
  c = check_control_socket(dir + "/h2", ::geteuid());
  EXPECT_NE(c.problem.find(dir + "/h2 is a symbolic link, not a socket"), std::string::npos) << c.problem;
}

TEST_F(ControlSocketDir, RefusesADirectoryNotOursOr0700) {
  const std::string dir = make_control_dir(parent);
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  auto c = check_control_socket(dir + "/h0", ::geteuid());
  EXPECT_NE(c.problem.find("the control sockets' directory " + dir + " has mode 0755, not 0700"), std::string::npos) << c.problem;
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  c = check_control_socket(dir + "/h0", ::geteuid() + 1);
  EXPECT_NE(c.problem.find("directory " + dir + " belongs to uid"), std::string::npos) << c.problem;
  // A link to a good directory is not the directory.
  ASSERT_EQ(::symlink(dir.c_str(), (parent + "/link").c_str()), 0);
  c = check_control_socket(parent + "/link/h0", ::geteuid());
  EXPECT_NE(c.problem.find(parent + "/link is a symbolic link, not a directory"), std::string::npos) << c.problem;
  c = check_control_socket(parent + "/gone/h0", ::geteuid());
  EXPECT_NE(c.problem.find("cannot be examined: No such file or directory"), std::string::npos) << c.problem;
}

TEST_F(ControlSocketDir, ATmpdirTooLongForASocketPathIsSaidSo) {
  EXPECT_NE(error_of([&] { make_control_dir(parent + "/" + std::string(100, 'x')); }).find("is too long for the control sockets"),
            std::string::npos);
}

}  // namespace
}  // namespace skyforge::ssh
