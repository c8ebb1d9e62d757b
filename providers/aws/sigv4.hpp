// AWS Signature Version 4 (docs/providers.md, "aws": how requests are signed).
//
// One request in, its canonical request, string to sign and signature out, either as headers
// (`Authorization`, `X-Amz-Date`, ...) or as a presigned query string. The request is the one
// that goes on the wire: its path and query exactly as they appear in the request line, its
// headers in order (duplicates allowed), its body. SHA-256 and HMAC come from OpenSSL.
//
// Checked against AWS's own signing test suite (tests/aws_provider/sigv4, every case, both
// header and query signing).
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace skyforge::aws {

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty: long-term keys
  std::string source;         // where they came from ("environment", "profile dev in ~/.aws/credentials"); never the secret
};

struct HttpRequest {
  std::string method = "GET";
  std::string path = "/";  // as in the request line, before any query
  std::string query;       // as in the request line, after '?', without it; may be empty
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

struct SigningParams {
  std::string region;
  std::string service;
  std::chrono::system_clock::time_point when;
  bool normalize_path = true;       // remove dot segments and empty segments (every service but S3)
  bool sign_body = false;           // add x-amz-content-sha256 with the payload hash (header signing)
  bool omit_session_token = false;  // the token is added after signing, not signed (some services)
  std::chrono::seconds expires{3600};  // query signing only
};

struct Signature {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;  // lowercase hex
  // What signing adds to the request: headers (header signing) or query parameters already
  // encoded (query signing), in the order they are sent.
  std::vector<std::pair<std::string, std::string>> added_headers;
  std::string query;  // query signing: the request's full query string, signature included
};

// Header signing: adds X-Amz-Date (and X-Amz-Security-Token, x-amz-content-sha256) and an
// Authorization header.
Signature sign_headers(const HttpRequest& request, const Credentials& credentials, const SigningParams& params);
// Query signing (a presigned URL): the signing parameters and X-Amz-Signature go in the query.
Signature sign_query(const HttpRequest& request, const Credentials& credentials, const SigningParams& params);

// Building blocks, exposed for the client and the tests.
std::string sha256_hex(std::string_view data);
// RFC 3986 percent-encoding as SigV4 wants it: every byte but A-Z a-z 0-9 - _ . ~ as %XX
// (upper-case hex); '/' kept when `keep_slash`.
std::string uri_encode(std::string_view s, bool keep_slash);
// Percent-decoding (%XX only; '+' stays '+').
std::string uri_decode(std::string_view s);
// `t` in UTC through strftime's `format`.
std::string utc_text(std::chrono::system_clock::time_point t, const char* format);
// "20150830T123600Z"
inline std::string amz_date(std::chrono::system_clock::time_point t) { return utc_text(t, "%Y%m%dT%H%M%SZ"); }

}  // namespace skyforge::aws
