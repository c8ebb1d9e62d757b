// The handshake's three frames as both ends write and read them (server.cpp runs the server's
// side, connect.cpp the client's; secure_channel.hpp holds the cryptography they use).
//
// The server speaks first; nothing is Boost-deserialised before the handshake succeeds, and its
// frames' payloads are raw bytes:
//   server -> Challenge  : server nonce (32 random bytes) | server X25519 key share (32)
//   client -> AuthReply  : node u32 LE | client nonce (32) | client key share (32) | client proof (32)
//   server -> AuthOk     : server proof (32)
// The proofs are HMAC-SHA256 of the pool secret over everything both sides sent; the record keys
// of the connection that follows come from the X25519 secret and the pool secret.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "framing.hpp"
#include "secure_channel.hpp"

namespace skyforge::net::handshake {

constexpr size_t kChallengeSize = kNonceSize + kKeyShareSize;
constexpr size_t kAuthReplySize = 4 + kNonceSize + kKeyShareSize + kMacSize;
constexpr size_t kAuthOkSize = kMacSize;
constexpr uint32_t kMaxFrame = 256;  // the frame limit while the handshake runs

// Views into a payload of exactly its frame's size (the callers check that size first).
struct Challenge {
  std::string_view nonce, share;
};
inline Challenge read_challenge(std::string_view payload) {
  return {payload.substr(0, kNonceSize), payload.substr(kNonceSize, kKeyShareSize)};
}

struct AuthReply {
  uint32_t node;
  std::string_view nonce, share, proof;
};
inline AuthReply read_auth_reply(std::string_view payload) {
  return {detail::get_u32(payload.data()), payload.substr(4, kNonceSize), payload.substr(4 + kNonceSize, kKeyShareSize),
          payload.substr(4 + kNonceSize + kKeyShareSize, kMacSize)};
}
inline std::string auth_reply(uint32_t node, std::string_view nonce, std::string_view share, std::string_view proof) {
  std::string out(4, '\0');
  detail::put_u32(out.data(), node);
  out.append(nonce).append(share).append(proof);
  return out;
}

}  // namespace skyforge::net::handshake
