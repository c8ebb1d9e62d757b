// The ABI header may not change without its version moving (docs/plugins.md, "The ABI"):
// abi_versions.txt holds "major.minor sha256" for every released version of
// sdk/include/skyforge/abi.h, hashed over its code alone — comments removed, every run of white
// space one blank — so that documenting the contract is not an ABI change.
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <fstream>
#include <cctype>
#include <map>
#include <regex>
#include <sstream>

#include "../support/read_text.hpp"

using skyforge::test::read_text;

namespace {

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

// The header's code: comments gone, white space outside literals kept only where it separates
// two words (identifiers, numbers), as one blank. String and character literals are kept as
// they are (a comment marker inside one is not a comment).
std::string code_of(const std::string& text) {
  std::string out;
  bool blank = false;
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  auto emit = [&](char c) {
    if (blank && !out.empty() && word(out.back()) && word(c)) out.push_back(' ');
    blank = false;
    out.push_back(c);
  };
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 2, "/*") == 0) {
      const size_t end = text.find("*/", i + 2);
      i = end == std::string::npos ? text.size() : end + 2;
      blank = true;
    } else if (text.compare(i, 2, "//") == 0) {
      i = text.find('\n', i);
      if (i == std::string::npos) i = text.size();
      blank = true;
    } else if (text[i] == '"' || text[i] == '\'') {
      const char quote = text[i];
      emit(text[i++]);
      while (i < text.size() && text[i] != quote) {
        if (text[i] == '\\' && i + 1 < text.size()) emit(text[i++]);
        emit(text[i++]);
      }
      if (i < text.size()) emit(text[i++]);
    } else if (std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      blank = true;
    } else {
      emit(text[i++]);
    }
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
  const std::string header = read_text(ABI_HEADER);
  ASSERT_FALSE(header.empty());
  const std::string version = header_version(header), hash = sha256_hex(code_of(header));
  ASSERT_FALSE(version.empty()) << "abi.h does not define SKYFORGE_ABI_MAJOR/MINOR";
  std::map<std::string, std::string> released;
  std::istringstream lines(read_text(ABI_VERSIONS));
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
  const std::string frozen = read_text(FROZEN_V1_0);
  EXPECT_EQ(header_version(frozen), "1.0");
  std::istringstream lines(read_text(ABI_VERSIONS));
  std::map<std::string, std::string> released;
  for (std::string v, h; lines >> v >> h;) released[v] = h;
  EXPECT_EQ(released["1.0"], sha256_hex(code_of(frozen))) << "the frozen v1.0 header's code must never change";
}

TEST(AbiGuard, CommentsAndLayoutAreNotTheAbiButCodeIs) {
  const std::string a = "/* doc */\nstruct s {\n  int x; // the x\n};\n";
  EXPECT_EQ(code_of(a), "struct s{int x;};");
  EXPECT_EQ(code_of(a), code_of("struct s {int x;   /* other words */ };"));
  EXPECT_NE(code_of(a), code_of("struct s { long x; };"));
  EXPECT_NE(code_of("int ab;"), code_of("int a/**/b;"));  // a comment separates tokens
  EXPECT_EQ(code_of("#define S \"a  /* b */ c\" // d"), "#define S\"a  /* b */ c\"");  // literals stay whole
  EXPECT_NE(code_of("#define S \"x\""), code_of("#define S \"y\""));
}

}  // namespace
