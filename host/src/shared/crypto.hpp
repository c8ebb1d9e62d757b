// The control plane's small cryptographic helpers (OpenSSL): HMAC-SHA256 and the system's
// random source. The channel's own cryptography (key shares, key schedule, sealed records) is
// secure_channel.hpp's.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace skyforge::net {

std::string hmac_sha256(std::string_view key, std::string_view data);  // 32 raw bytes
std::string random_bytes(size_t n);                                     // CSPRNG (RAND_bytes)
std::string random_hex(size_t bytes);                                   // 2*bytes hex digits

}  // namespace skyforge::net
