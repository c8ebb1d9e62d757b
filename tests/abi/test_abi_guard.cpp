// The ABI header may not change without its version moving (DESIGN.md §3): abi_versions.txt
// holds "major.minor sha256" for every released version of sdk/include/skyforge/abi.h.
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>

namespace {

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string sha256_hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out.push_back(hex[md[i] >> 4]);
    out.push_back(hex[md[i] & 15]);
  }
  return out;
}

std::string header_version(const std::string& text) {
  std::smatch maj, min;
  if (!std::regex_search(text, maj, std::regex(R"(#define SKYFORGE_ABI_MAJOR (\d+))")) ||
      !std::regex_search(text, min, std::regex(R"(#define SKYFORGE_ABI_MINOR (\d+))")))
    return "";
  return maj[1].str() + "." + min[1].str();
}

TEST(AbiGuard, HeaderHashMatchesItsVersion) {
  const std::string header = read(ABI_HEADER);
  ASSERT_FALSE(header.empty());
  const std::string version = header_version(header), hash = sha256_hex(header);
  ASSERT_FALSE(version.empty()) << "abi.h does not define SKYFORGE_ABI_MAJOR/MINOR";
  std::map<std::string, std::string> released;
  std::istringstream lines(read(ABI_VERSIONS));
  for (std::string v, h; lines >> v >> h;) released[v] = h;
  auto it = released.find(version);
  ASSERT_NE(it, released.end()) << "abi.h says " << version << " (sha256 " << hash
                                << ") but tests/abi/abi_versions.txt has no line for it: add \"" << version
                                << " " << hash << "\"";
  EXPECT_EQ(it->second, hash) << "abi.h changed (sha256 " << hash << ") but SKYFORGE_ABI_MAJOR/MINOR still say "
                              << version
                              << ": bump the minor version (fields appended) or the major version (anything else), "
                                 "and add a line to tests/abi/abi_versions.txt";
}

TEST(AbiGuard, FrozenV1_0CopyIsTheReleasedOne) {
  const std::string frozen = read(FROZEN_V1_0);
  EXPECT_EQ(header_version(frozen), "1.0");
  std::istringstream lines(read(ABI_VERSIONS));
  std::map<std::string, std::string> released;
  for (std::string v, h; lines >> v >> h;) released[v] = h;
  EXPECT_EQ(released["1.0"], sha256_hex(frozen)) << "the frozen v1.0 header must never change";
}

}  // namespace
