// The control plane's channel security (docs/architecture.md, "The control plane"): the key
// schedule of the handshake and the record layer every frame after it travels in.
//
// Handshake (server.cpp and connect.cpp run it, handshake.hpp lays out its frames; this file holds
// its cryptography):
//   server -> Challenge : server nonce (32) | server X25519 public key (32)
//   client -> AuthReply : node u32 LE | client nonce (32) | client X25519 public key (32)
//                         | HMAC-SHA256(secret, "skyforge/5 client" | transcript)
//   server -> AuthOk    : HMAC-SHA256(secret, "skyforge/5 server" | transcript)
// where transcript = server nonce | server key | node u32 LE | client nonce | client key: each
// side's MAC covers both ephemeral keys, so a peer without the pool secret can neither pass nor
// substitute a key of its own (a man in the middle fails the MAC). Then both sides derive
//   PRK = HKDF-Extract(salt = SHA-256(transcript), IKM = X25519 shared secret | pool secret)
//   per direction: key = HKDF-Expand(PRK, "skyforge/5 c2s key" or "s2c key", 32),
//                  iv  = HKDF-Expand(PRK, "skyforge/5 c2s iv"  or "s2c iv", 12)
// This is TLS 1.3's psk_dhe_ke mode in miniature: mutual authentication by the pre-shared key,
// forward secrecy from the ephemeral Diffie-Hellman (a secret leaked later does not decrypt a
// recorded session), keys bound to this connection's transcript.
//
// Records (every frame after the handshake, one frame per record):
//   length u32 LE (n, the frame's bytes) | ChaCha20-Poly1305 ciphertext (n) | tag (16)
// sealed with the direction's key, the 4 length bytes as associated data and the nonce TLS 1.3
// builds (RFC 8446 5.3): the direction's iv XOR the record's sequence number (a 64-bit count
// from 0, never sent). A record that is altered, replayed, reordered, dropped or injected
// fails its tag; a length above the frame limit is refused from its 4 bytes, before anything
// is buffered. All primitives are OpenSSL's (EVP): X25519, HKDF, ChaCha20-Poly1305.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace skyforge::net {

constexpr size_t kKeyShareSize = 32;    // an X25519 public key
constexpr size_t kRecordHeaderSize = 4;  // length u32 LE
constexpr size_t kRecordTagSize = 16;   // Poly1305

// One side's ephemeral X25519 key pair, made fresh for each connection.
class KeyShare {
 public:
  KeyShare();
  ~KeyShare();
  KeyShare(const KeyShare&) = delete;
  KeyShare& operator=(const KeyShare&) = delete;

  const std::string& public_key() const { return public_; }  // 32 bytes
  // The X25519 shared secret with the peer's public key. Throws ProtocolError for a key that
  // is not 32 bytes or gives the all-zero secret (a small-order point: RFC 7748 6.1).
  std::string agree(std::string_view peer_public) const;

 private:
  struct Pkey;
  std::unique_ptr<Pkey> key_;
  std::string public_;
};

// The transcript both MACs and the key schedule cover (see above).
std::string handshake_transcript(std::string_view server_nonce, std::string_view server_key, uint32_t node,
                                 std::string_view client_nonce, std::string_view client_key);
std::string client_proof(std::string_view secret, std::string_view transcript);  // 32 bytes
std::string server_proof(std::string_view secret, std::string_view transcript);  // 32 bytes

// The two directions' keys of one connection.
struct SessionKeys {
  std::string send_key, send_iv;  // what this side seals with
  std::string recv_key, recv_iv;  // what this side opens with
};
// Runs the key schedule. `is_server` picks which direction is this side's sending one.
SessionKeys derive_session_keys(std::string_view secret, std::string_view shared, std::string_view transcript,
                                bool is_server);

// The sending half: seals frames into records, numbering them from 0.
class RecordSealer {
 public:
  RecordSealer(std::string_view key, std::string_view iv);
  ~RecordSealer();
  RecordSealer(RecordSealer&&) noexcept;
  RecordSealer& operator=(RecordSealer&&) noexcept;

  // Appends one record holding `head` then `body` (a frame's header and its payload, sealed
  // where they lie: the payload is not copied first) to `out`.
  void seal(std::string& out, std::string_view head, std::string_view body = {});
  uint64_t records() const { return seq_; }

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
  std::string iv_;
  uint64_t seq_ = 0;
};

// The receiving half: an incremental decoder of a record stream, like FrameDecoder one layer
// down. Errors are sticky; once a record fails, every later next() throws the same error.
class RecordOpener {
 public:
  // `max_plaintext`: the largest record accepted (the frame limit plus a frame header).
  RecordOpener(std::string_view key, std::string_view iv, size_t max_plaintext);
  ~RecordOpener();
  RecordOpener(RecordOpener&&) noexcept;
  RecordOpener& operator=(RecordOpener&&) noexcept;

  void feed(const char* data, size_t size);
  // The next record's plaintext, or nullopt if more bytes are needed: a view into the opener's
  // buffer (opened in place), valid until the next feed(). Throws ProtocolError ("record too
  // large", "record N failed authentication ...").
  std::optional<std::string_view> next();
  // At end of stream: throws ProtocolError ("truncated record: got X of Y bytes") if a partial
  // record is pending (or the sticky error).
  void finish();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
  std::string iv_;
  size_t max_plaintext_;
  uint64_t seq_ = 0;
  std::string buf_;
  size_t pos_ = 0;
  std::string error_;
};

namespace detail {
// RFC 5869 (SHA-256), exposed for its test vectors.
std::string hkdf_extract(std::string_view salt, std::string_view ikm);
std::string hkdf_expand(std::string_view prk, std::string_view info, size_t length);
}  // namespace detail

}  // namespace skyforge::net
