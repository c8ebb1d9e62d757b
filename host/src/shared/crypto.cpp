// HMAC-SHA256 and the CSPRNG, through OpenSSL (crypto.hpp).
#include "crypto.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <stdexcept>

#include "framing.hpp"  // kMacSize

namespace skyforge::net {

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  static const unsigned char kEmpty = 0;
  const void* k = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  const auto* d = data.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(data.data());
  if (!HMAC(EVP_sha256(), k, static_cast<int>(key.size()), d, data.size(), out, &len) || len != kMacSize)
    throw std::runtime_error("HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string random_bytes(size_t n) {
  std::string s(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(n)) != 1)
    throw std::runtime_error("RAND_bytes failed: the system's random source is unavailable");
  return s;
}

std::string random_hex(size_t bytes) {
  static const char* kDigits = "0123456789abcdef";
  const std::string raw = random_bytes(bytes);
  std::string out;
  out.reserve(2 * bytes);
  for (unsigned char c : raw) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

}  // namespace skyforge::net
