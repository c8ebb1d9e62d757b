// SigV4 against AWS's own signing test suite (tests/aws_provider/sigv4/README.md): for every
// case, header and query signing give the suite's canonical request, string to sign, signature
// and signed request, byte for byte.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>

#include "sigv4.hpp"
#include "../support/read_text.hpp"

namespace fs = std::filesystem;
using namespace skyforge::aws;
using skyforge::test::read_text;

namespace {

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(SIGV4_CASES)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// request.txt: "METHOD target HTTP/1.1", header lines (a line that starts with whitespace
// continues the one before), an empty line, the body.
HttpRequest parse_request(const std::string& text) {
  HttpRequest r;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
  r.method = line.substr(0, sp1);
  std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  size_t q = target.find('?');
  r.path = target.substr(0, q);
  if (q != std::string::npos) r.query = target.substr(q + 1);
  while (std::getline(in, line) && !line.empty()) {
    if ((line[0] == ' ' || line[0] == '\t') && !r.headers.empty()) {
      r.headers.back().second += "\n" + line;
    } else {
      size_t colon = line.find(':');
      r.headers.emplace_back(line.substr(0, colon), line.substr(colon + 1));
    }
  }
  std::string rest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  r.body = rest;
  return r;
}

std::chrono::system_clock::time_point parse_time(const std::string& iso) {
  std::tm tm{};
  std::istringstream(iso) >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%SZ");
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

struct Case {
  HttpRequest request;
  Credentials credentials;
  SigningParams params;
  fs::path dir;
  std::string original_text;
};

Case load(const std::string& name) {
  Case c;
  c.dir = fs::path(SIGV4_CASES) / name;
  c.original_text = read_text(c.dir / "request.txt");
  c.request = parse_request(c.original_text);
  auto ctx = nlohmann::json::parse(read_text(c.dir / "context.json"));
  c.credentials.access_key_id = ctx["credentials"]["access_key_id"];
  c.credentials.secret_access_key = ctx["credentials"]["secret_access_key"];
  c.credentials.session_token = ctx["credentials"].value("token", "");
  c.params.region = ctx["region"];
  c.params.service = ctx["service"];
  c.params.when = parse_time(ctx["timestamp"]);
  c.params.normalize_path = ctx.value("normalize", true);
  c.params.sign_body = ctx.value("sign_body", false);
  c.params.omit_session_token = ctx.value("omit_session_token", false);
  c.params.expires = std::chrono::seconds(ctx.value("expiration_in_seconds", 3600));
  return c;
}

// The request line and header lines of a request as the suite writes them (the body aside).
std::multiset<std::string> lines_of(const std::string& text) {
  std::multiset<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line) && !line.empty()) out.insert(line);
  return out;
}

std::string original_header_block(const std::string& text) {
  // Everything after the request line up to the empty line, as written (folded lines too).
  size_t start = text.find('\n') + 1;
  size_t end = text.find("\n\n", start);
  std::string block = end == std::string::npos ? text.substr(start) : text.substr(start, end - start);
  while (!block.empty() && block.back() == '\n') block.pop_back();
  return block;
}

// The three files of a signing (`kind`: "header" or "query") against what was signed.
void expect_signature(const Case& c, const Signature& s, const std::string& kind) {
  EXPECT_EQ(s.canonical_request, read_text(c.dir / (kind + "-canonical-request.txt")));
  EXPECT_EQ(s.string_to_sign, read_text(c.dir / (kind + "-string-to-sign.txt")));
  EXPECT_EQ(s.signature, read_text(c.dir / (kind + "-signature.txt")));
}

class SigV4Suite : public ::testing::TestWithParam<std::string> {};

TEST_P(SigV4Suite, HeaderSigning) {
  Case c = load(GetParam());
  Signature s = sign_headers(c.request, c.credentials, c.params);
  expect_signature(c, s, "header");
  // The signed request: the original lines plus what signing added, whatever their order.
  std::string signed_text = c.original_text.substr(0, c.original_text.find('\n')) + "\n" +
                            original_header_block(c.original_text) + "\n";
  for (const auto& [k, v] : s.added_headers) signed_text += k + ":" + v + "\n";
  EXPECT_EQ(lines_of(signed_text), lines_of(read_text(c.dir / "header-signed-request.txt")));
}

TEST_P(SigV4Suite, QuerySigning) {
  Case c = load(GetParam());
  Signature s = sign_query(c.request, c.credentials, c.params);
  expect_signature(c, s, "query");
  std::string expected = read_text(c.dir / "query-signed-request.txt");
  std::string line = expected.substr(0, expected.find('\n'));
  EXPECT_EQ(c.request.method + " " + c.request.path + "?" + s.query + " HTTP/1.1", line);
}

INSTANTIATE_TEST_SUITE_P(Aws, SigV4Suite, ::testing::ValuesIn(case_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(SigV4, TheSuiteHasEveryCase) { EXPECT_EQ(case_names().size(), 38u); }

TEST(SigV4, EncodingRules) {
  EXPECT_EQ(uri_encode("a b/c~d*", false), "a%20b%2Fc~d%2A");
  EXPECT_EQ(uri_encode("a b/c", true), "a%20b/c");
  EXPECT_EQ(uri_decode("%E1%88%B4+%zz%4"), "\xE1\x88\xB4+%zz%4");
  EXPECT_EQ(amz_date(std::chrono::system_clock::from_time_t(1440938160)), "20150830T123600Z");
}

TEST(SigV4, MissingCredentialsAreRefused) {
  Case c = load("get-vanilla");
  c.credentials.secret_access_key.clear();
  EXPECT_THROW(sign_headers(c.request, c.credentials, c.params), std::invalid_argument);
}

}  // namespace
