#include "secure_channel.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>

#include "protocol.hpp"  // ProtocolError, hmac_sha256

namespace skyforge::net {
namespace {

constexpr size_t kKeySize = 32;
constexpr size_t kIvSize = 12;
constexpr size_t kKeptCapacity = 256 * 1024;  // an idle opener keeps at most this much buffer

[[noreturn]] void crypto_failed(const char* what) {
  throw std::runtime_error(std::string("OpenSSL: ") + what + " failed");
}

const unsigned char* bytes(std::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); }
unsigned char* bytes(std::string& s) { return reinterpret_cast<unsigned char*>(s.data()); }

std::string sha256(std::string_view data) {
  std::string out(32, '\0');
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), bytes(out), &len, EVP_sha256(), nullptr) != 1 || len != 32)
    crypto_failed("SHA-256");
  return out;
}

// RFC 5869 through OpenSSL's HKDF, one mode at a time.
std::string hkdf(int mode, std::string_view key, std::string_view salt, std::string_view info, size_t out_len) {
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (!kdf) crypto_failed("EVP_KDF_fetch(HKDF)");
  EVP_KDF_CTX* ctx = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  if (!ctx) crypto_failed("EVP_KDF_CTX_new");
  char digest[] = "SHA256";
  OSSL_PARAM params[6];
  size_t n = 0;
  params[n++] = OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode);
  params[n++] = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0);
  params[n++] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<char*>(key.data()), key.size());
  if (!salt.empty())
    params[n++] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<char*>(salt.data()), salt.size());
  if (!info.empty())
    params[n++] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(info.data()), info.size());
  params[n] = OSSL_PARAM_construct_end();
  std::string out(out_len, '\0');
  const int ok = EVP_KDF_derive(ctx, bytes(out), out.size(), params);
  EVP_KDF_CTX_free(ctx);
  if (ok != 1) crypto_failed("HKDF");
  return out;
}

void put_u32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// TLS 1.3's per-record nonce: the iv with the sequence number XORed into its last 8 bytes.
std::array<unsigned char, kIvSize> record_nonce(const std::string& iv, uint64_t seq) {
  std::array<unsigned char, kIvSize> n{};
  std::memcpy(n.data(), iv.data(), kIvSize);
  for (int i = 0; i < 8; ++i) n[kIvSize - 1 - i] ^= static_cast<unsigned char>((seq >> (8 * i)) & 0xff);
  return n;
}

void check_key(std::string_view key, std::string_view iv) {
  if (key.size() != kKeySize || iv.size() != kIvSize)
    throw std::invalid_argument("a record key is 32 bytes and its iv 12");
}

EVP_CIPHER_CTX* new_aead(std::string_view key, bool encrypt) {
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  if (!c) crypto_failed("EVP_CIPHER_CTX_new");
  const int ok = encrypt ? EVP_EncryptInit_ex(c, EVP_chacha20_poly1305(), nullptr, bytes(key), nullptr)
                         : EVP_DecryptInit_ex(c, EVP_chacha20_poly1305(), nullptr, bytes(key), nullptr);
  if (ok != 1) {
    EVP_CIPHER_CTX_free(c);
    crypto_failed("ChaCha20-Poly1305 init");
  }
  return c;
}

}  // namespace

namespace detail {
std::string hkdf_extract(std::string_view salt, std::string_view ikm) {
  return hkdf(EVP_KDF_HKDF_MODE_EXTRACT_ONLY, ikm, salt, {}, 32);
}
std::string hkdf_expand(std::string_view prk, std::string_view info, size_t length) {
  return hkdf(EVP_KDF_HKDF_MODE_EXPAND_ONLY, prk, {}, info, length);
}
}  // namespace detail

// ---- key share ------------------------------------------------------------------------------

struct KeyShare::Pkey {
  EVP_PKEY* p = nullptr;
  ~Pkey() { EVP_PKEY_free(p); }
};

KeyShare::KeyShare() : key_(std::make_unique<Pkey>()) {
  key_->p = EVP_PKEY_Q_keygen(nullptr, nullptr, "X25519");
  if (!key_->p) crypto_failed("X25519 key generation");
  public_.assign(kKeyShareSize, '\0');
  size_t len = public_.size();
  if (EVP_PKEY_get_raw_public_key(key_->p, bytes(public_), &len) != 1 || len != kKeyShareSize)
    crypto_failed("X25519 public key");
}

KeyShare::~KeyShare() = default;

std::string KeyShare::agree(std::string_view peer_public) const {
  if (peer_public.size() != kKeyShareSize)
    throw ProtocolError("the peer's key share is " + std::to_string(peer_public.size()) + " bytes, not 32");
  EVP_PKEY* peer = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, bytes(peer_public), peer_public.size());
  if (!peer) throw ProtocolError("the peer's key share is not an X25519 public key");
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new(key_->p, nullptr);
  std::string shared(32, '\0');
  size_t len = shared.size();
  const bool ok = ctx && EVP_PKEY_derive_init(ctx) == 1 && EVP_PKEY_derive_set_peer(ctx, peer) == 1 &&
                  EVP_PKEY_derive(ctx, bytes(shared), &len) == 1 && len == 32;
  EVP_PKEY_CTX_free(ctx);
  EVP_PKEY_free(peer);
  static const std::string kZero(32, '\0');
  if (!ok || CRYPTO_memcmp(shared.data(), kZero.data(), 32) == 0)
    throw ProtocolError("the peer's key share is a small-order point (no shared secret)");
  return shared;
}

// ---- handshake ------------------------------------------------------------------------------

std::string handshake_transcript(std::string_view server_nonce, std::string_view server_key, uint32_t node,
                                 std::string_view client_nonce, std::string_view client_key) {
  std::string t;
  t.reserve(server_nonce.size() + server_key.size() + 4 + client_nonce.size() + client_key.size());
  t.append(server_nonce).append(server_key);
  char le[4];
  put_u32(le, node);
  t.append(le, 4).append(client_nonce).append(client_key);
  return t;
}

std::string client_proof(std::string_view secret, std::string_view transcript) {
  return hmac_sha256(secret, std::string("skyforge/5 client").append(transcript));
}

std::string server_proof(std::string_view secret, std::string_view transcript) {
  return hmac_sha256(secret, std::string("skyforge/5 server").append(transcript));
}

SessionKeys derive_session_keys(std::string_view secret, std::string_view shared, std::string_view transcript,
                                bool is_server) {
  const std::string prk = detail::hkdf_extract(sha256(transcript), std::string(shared).append(secret));
  SessionKeys k;
  const std::string c2s_key = detail::hkdf_expand(prk, "skyforge/5 c2s key", kKeySize);
  const std::string c2s_iv = detail::hkdf_expand(prk, "skyforge/5 c2s iv", kIvSize);
  const std::string s2c_key = detail::hkdf_expand(prk, "skyforge/5 s2c key", kKeySize);
  const std::string s2c_iv = detail::hkdf_expand(prk, "skyforge/5 s2c iv", kIvSize);
  if (is_server) {
    k = {s2c_key, s2c_iv, c2s_key, c2s_iv};
  } else {
    k = {c2s_key, c2s_iv, s2c_key, s2c_iv};
  }
  return k;
}

// ---- records --------------------------------------------------------------------------------

struct RecordSealer::Ctx {
  EVP_CIPHER_CTX* c = nullptr;
  ~Ctx() { EVP_CIPHER_CTX_free(c); }
};

RecordSealer::RecordSealer(std::string_view key, std::string_view iv) : ctx_(std::make_unique<Ctx>()), iv_(iv) {
  check_key(key, iv);
  ctx_->c = new_aead(key, true);
}
RecordSealer::~RecordSealer() = default;
RecordSealer::RecordSealer(RecordSealer&&) noexcept = default;
RecordSealer& RecordSealer::operator=(RecordSealer&&) noexcept = default;

void RecordSealer::seal(std::string& out, std::string_view head, std::string_view body) {
  const size_t n = head.size() + body.size();
  if (n > static_cast<size_t>(INT_MAX) || n > UINT32_MAX)
    throw ProtocolError("record too large: " + std::to_string(n) + " bytes");
  if (seq_ == UINT64_MAX) throw ProtocolError("record sequence exhausted: the connection must end");
  const auto nonce = record_nonce(iv_, seq_++);
  const size_t at = out.size();
  out.resize(at + kRecordHeaderSize + n + kRecordTagSize);
  char* hdr = out.data() + at;
  put_u32(hdr, static_cast<uint32_t>(n));
  auto* ct = reinterpret_cast<unsigned char*>(hdr + kRecordHeaderSize);
  int len = 0;
  EVP_CIPHER_CTX* c = ctx_->c;
  if (EVP_EncryptInit_ex(c, nullptr, nullptr, nullptr, nonce.data()) != 1 ||
      EVP_EncryptUpdate(c, nullptr, &len, reinterpret_cast<const unsigned char*>(hdr), kRecordHeaderSize) != 1 ||
      (!head.empty() && EVP_EncryptUpdate(c, ct, &len, bytes(head), static_cast<int>(head.size())) != 1) ||
      (!body.empty() &&
       EVP_EncryptUpdate(c, ct + head.size(), &len, bytes(body), static_cast<int>(body.size())) != 1) ||
      EVP_EncryptFinal_ex(c, ct + n, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, kRecordTagSize, ct + n) != 1) {
    out.resize(at);
    crypto_failed("ChaCha20-Poly1305 seal");
  }
}

struct RecordOpener::Ctx {
  EVP_CIPHER_CTX* c = nullptr;
  ~Ctx() { EVP_CIPHER_CTX_free(c); }
};

RecordOpener::RecordOpener(std::string_view key, std::string_view iv, size_t max_plaintext)
    : ctx_(std::make_unique<Ctx>()), iv_(iv), max_plaintext_(std::min<size_t>(max_plaintext, INT_MAX)) {
  check_key(key, iv);
  ctx_->c = new_aead(key, false);
}
RecordOpener::~RecordOpener() = default;
RecordOpener::RecordOpener(RecordOpener&&) noexcept = default;
RecordOpener& RecordOpener::operator=(RecordOpener&&) noexcept = default;

void RecordOpener::feed(const char* data, size_t size) {
  if (!error_.empty() || size == 0) return;
  if (pos_ > 0 && (pos_ == buf_.size() || pos_ >= buf_.size() / 2)) {
    buf_.erase(0, pos_);
    pos_ = 0;
    if (buf_.empty() && buf_.capacity() > kKeptCapacity) std::string().swap(buf_);  // not kept for a big record
  }
  // Judge a pending length before buffering more than it: an oversized record is refused from
  // its 4 bytes.
  const size_t have = buf_.size() - pos_;
  if (have < kRecordHeaderSize) {
    const size_t take = std::min(size, kRecordHeaderSize - have);
    buf_.append(data, take);
    data += take;
    size -= take;
    if (buf_.size() - pos_ == kRecordHeaderSize && get_u32(buf_.data() + pos_) > max_plaintext_) {
      error_ = "record too large: " + std::to_string(get_u32(buf_.data() + pos_)) + " bytes exceed the limit of " +
               std::to_string(max_plaintext_) + " bytes";
      buf_.clear();
      buf_.shrink_to_fit();
      pos_ = 0;
      return;
    }
  }
  buf_.append(data, size);
}

std::optional<std::string_view> RecordOpener::next() {
  if (!error_.empty()) throw ProtocolError(error_);
  const size_t have = buf_.size() - pos_;
  if (have < kRecordHeaderSize) return std::nullopt;
  char* hdr = buf_.data() + pos_;
  const size_t n = get_u32(hdr);
  if (n > max_plaintext_) {  // a later record's length, checked here once the earlier ones are out
    error_ = "record too large: " + std::to_string(n) + " bytes exceed the limit of " + std::to_string(max_plaintext_) +
             " bytes";
    buf_.clear();
    pos_ = 0;
    throw ProtocolError(error_);
  }
  const size_t total = kRecordHeaderSize + n + kRecordTagSize;
  if (have < total) return std::nullopt;
  const auto nonce = record_nonce(iv_, seq_);
  // Opened in place: the plaintext takes the ciphertext's bytes (a stream cipher's output is
  // the length of its input), so a record costs no allocation and no copy here.
  auto* text = reinterpret_cast<unsigned char*>(hdr + kRecordHeaderSize);
  int len = 0;
  EVP_CIPHER_CTX* c = ctx_->c;
  const bool ok =
      EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, nonce.data()) == 1 &&
      EVP_DecryptUpdate(c, nullptr, &len, reinterpret_cast<const unsigned char*>(hdr), kRecordHeaderSize) == 1 &&
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, kRecordTagSize, text + n) == 1 &&
      (n == 0 || EVP_DecryptUpdate(c, text, &len, text, static_cast<int>(n)) == 1) &&
      EVP_DecryptFinal_ex(c, text + n, &len) == 1;
  if (!ok) {
    OPENSSL_cleanse(text, n);
    error_ = "record " + std::to_string(seq_) +
             " failed authentication: altered, replayed, reordered or not sealed with this connection's key";
    buf_.clear();
    buf_.shrink_to_fit();
    pos_ = 0;
    throw ProtocolError(error_);
  }
  ++seq_;
  pos_ += total;  // the buffer is compacted by the next feed(), so the view stays valid until then
  return std::string_view(reinterpret_cast<const char*>(text), n);
}

void RecordOpener::finish() {
  if (!error_.empty()) throw ProtocolError(error_);
  const size_t have = buf_.size() - pos_;
  if (have == 0) return;
  const size_t want = have < kRecordHeaderSize ? kRecordHeaderSize
                                               : kRecordHeaderSize + get_u32(buf_.data() + pos_) + kRecordTagSize;
  throw ProtocolError("truncated record: got " + std::to_string(have) + " of " + std::to_string(want) + " bytes");
}

}  // namespace skyforge::net
