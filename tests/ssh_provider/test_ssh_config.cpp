// The ssh provider's configuration, checked without a host: the `hosts` entries, the options,
// the remote paths and the platform check (the real-host tests are in test_ssh_e2e.cpp).
#include <gtest/gtest.h>

#include "ssh_provider.hpp"

namespace skyforge::ssh {
namespace {

Options options(std::map<std::string, std::string> kv) {
  std::vector<sf_kv> v;
  for (auto& [k, val] : kv) v.push_back({k.c_str(), val.c_str()});
  return Options(v.data(), v.size());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

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

}  // namespace
}  // namespace skyforge::ssh
