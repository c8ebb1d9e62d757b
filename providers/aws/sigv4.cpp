#include "sigv4.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <ctime>
#include <map>
#include <stdexcept>

namespace skyforge::aws {
namespace {

constexpr char kAlgorithm[] = "AWS4-HMAC-SHA256";

std::string hex(const unsigned char* p, size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

std::string hmac(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), int(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
            data.size(), out, &len))
    throw std::runtime_error("HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Trimmed, every run of whitespace (folded lines included) made one space.
std::string canonical_value(std::string_view v) {
  std::string out;
  bool gap = false;
  for (char c : v) {
    if (is_space(c)) {
      gap = !out.empty();
      continue;
    }
    if (gap) out += ' ';
    gap = false;
    out += c;
  }
  return out;
}

std::string canonical_uri(std::string_view path, bool normalize) {
  if (path.empty()) return "/";
  if (!normalize) return uri_encode(path, true);
  std::vector<std::string_view> segments;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    std::string_view seg = path.substr(i, j - i);
    if (seg == "..") {
      if (!segments.empty()) segments.pop_back();
    } else if (!seg.empty() && seg != ".") {
      segments.push_back(seg);
    }
    i = j + 1;
  }
  std::string out;
  for (auto seg : segments) out += "/" + uri_encode(seg, false);
  if (out.empty()) return "/";
  if (path.back() == '/') out += '/';
  return out;
}

using Params = std::vector<std::pair<std::string, std::string>>;  // encoded key, encoded value

Params parse_query(std::string_view query) {
  Params out;
  size_t i = 0;
  while (i < query.size()) {
    size_t j = query.find('&', i);
    if (j == std::string_view::npos) j = query.size();
    std::string_view part = query.substr(i, j - i);
    if (!part.empty()) {
      size_t eq = part.find('=');
      std::string_view k = part.substr(0, eq);
      std::string_view v = eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1);
      out.emplace_back(uri_encode(uri_decode(k), false), uri_encode(uri_decode(v), false));
    }
    i = j + 1;
  }
  return out;
}

std::string canonical_query(Params params) {
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [k, v] : params) {
    if (!out.empty()) out += '&';
    out += k + "=" + v;
  }
  return out;
}

struct CanonicalHeaders {
  std::string block;   // "name:value\n" for each
  std::string signed_; // "a;b;c"
};

CanonicalHeaders canonical_headers(const std::vector<std::pair<std::string, std::string>>& headers) {
  std::map<std::string, std::string> merged;  // sorted by lower-case name
  for (const auto& [name, value] : headers) {
    auto [it, fresh] = merged.try_emplace(lower(name), canonical_value(value));
    if (!fresh) it->second += "," + canonical_value(value);
  }
  CanonicalHeaders out;
  for (const auto& [name, value] : merged) {
    out.block += name + ":" + value + "\n";
    if (!out.signed_.empty()) out.signed_ += ';';
    out.signed_ += name;
  }
  return out;
}

std::string scope_of(const std::string& date, const SigningParams& p) {
  return date + "/" + p.region + "/" + p.service + "/aws4_request";
}

void finish(Signature& s, const std::string& amzdate, const std::string& scope, const Credentials& c,
            const SigningParams& p) {
  s.string_to_sign = std::string(kAlgorithm) + "\n" + amzdate + "\n" + scope + "\n" + sha256_hex(s.canonical_request);
  std::string key = hmac("AWS4" + c.secret_access_key, amzdate.substr(0, 8));
  key = hmac(key, p.region);
  key = hmac(key, p.service);
  key = hmac(key, "aws4_request");
  std::string sig = hmac(key, s.string_to_sign);
  s.signature = hex(reinterpret_cast<const unsigned char*>(sig.data()), sig.size());
}

void require(const Credentials& c, const SigningParams& p) {
  if (c.access_key_id.empty() || c.secret_access_key.empty())
    throw std::invalid_argument("SigV4: no credentials to sign with");
  if (p.region.empty() || p.service.empty()) throw std::invalid_argument("SigV4: region and service are required");
}

}  // namespace

std::string sha256_hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr))
    throw std::runtime_error("SHA-256 failed (OpenSSL)");
  return hex(md, len);
}

std::string uri_encode(std::string_view s, bool keep_slash) {
  static constexpr char digits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += char(c);
    } else {
      out += '%';
      out += digits[c >> 4];
      out += digits[c & 15];
    }
  }
  return out;
}

std::string uri_decode(std::string_view s) {
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && value(s[i + 1]) >= 0 && value(s[i + 2]) >= 0) {
      out += char(value(s[i + 1]) * 16 + value(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string utc_text(std::chrono::system_clock::time_point t, const char* format) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

Signature sign_headers(const HttpRequest& r, const Credentials& c, const SigningParams& p) {
  require(c, p);
  const std::string amzdate = amz_date(p.when);
  const std::string scope = scope_of(amzdate.substr(0, 8), p);
  const std::string payload = sha256_hex(r.body);
  Signature s;
  auto headers = r.headers;
  auto add = [&](std::string name, std::string value) {
    headers.emplace_back(name, value);
    s.added_headers.emplace_back(std::move(name), std::move(value));
  };
  if (!c.session_token.empty() && !p.omit_session_token) add("X-Amz-Security-Token", c.session_token);
  add("X-Amz-Date", amzdate);
  if (p.sign_body) add("x-amz-content-sha256", payload);
  CanonicalHeaders ch = canonical_headers(headers);
  s.canonical_request = r.method + "\n" + canonical_uri(r.path, p.normalize_path) + "\n" +
                        canonical_query(parse_query(r.query)) + "\n" + ch.block + "\n" + ch.signed_ + "\n" + payload;
  finish(s, amzdate, scope, c, p);
  if (!c.session_token.empty() && p.omit_session_token)
    s.added_headers.emplace(s.added_headers.begin(), "X-Amz-Security-Token", c.session_token);
  s.added_headers.emplace_back("Authorization", std::string(kAlgorithm) + " Credential=" + c.access_key_id + "/" +
                                                    scope + ", SignedHeaders=" + ch.signed_ +
                                                    ", Signature=" + s.signature);
  s.query = r.query;
  return s;
}

Signature sign_query(const HttpRequest& r, const Credentials& c, const SigningParams& p) {
  require(c, p);
  const std::string amzdate = amz_date(p.when);
  const std::string scope = scope_of(amzdate.substr(0, 8), p);
  CanonicalHeaders ch = canonical_headers(r.headers);
  Params added = {{"X-Amz-Algorithm", kAlgorithm},
                  {"X-Amz-Credential", uri_encode(c.access_key_id + "/" + scope, false)},
                  {"X-Amz-Date", amzdate},
                  {"X-Amz-SignedHeaders", uri_encode(ch.signed_, false)},
                  {"X-Amz-Expires", std::to_string(p.expires.count())}};
  if (!c.session_token.empty() && !p.omit_session_token)
    added.emplace_back("X-Amz-Security-Token", uri_encode(c.session_token, false));
  Params all = parse_query(r.query);
  all.insert(all.end(), added.begin(), added.end());
  Signature s;
  s.canonical_request = r.method + "\n" + canonical_uri(r.path, p.normalize_path) + "\n" + canonical_query(all) +
                        "\n" + ch.block + "\n" + ch.signed_ + "\n" + sha256_hex(r.body);
  finish(s, amzdate, scope, c, p);
  if (!c.session_token.empty() && p.omit_session_token)
    added.emplace_back("X-Amz-Security-Token", uri_encode(c.session_token, false));
  added.emplace_back("X-Amz-Signature", s.signature);
  s.query = r.query;
  for (const auto& [k, v] : added) s.query += (s.query.empty() ? "" : "&") + k + "=" + v;
  return s;
}

}  // namespace skyforge::aws
