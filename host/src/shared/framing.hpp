// The control plane's frames (docs/architecture.md, "The control plane"): the header every
// frame starts with, its encoding, and the incremental decoder that reads frames off a byte
// stream. Also the errors every layer of the protocol throws.
//
// Frame on the wire (all integers little-endian):
//   magic u32 ("SKYF") | version u16 | type u16 | payload length u32 | payload
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "messages.hpp"

namespace skyforge::net {

constexpr uint32_t kMagic = 0x46594B53;  // bytes 'S' 'K' 'Y' 'F' read as a little-endian u32
constexpr uint16_t kProtocolVersion = 7;  // 2: Job holds a NodeIdentity; its mode is a byte (JobMode); 3: TaskBatch.tasks; 4: Progress.status; 5: OutputAck (a worker stops forwarding output without it; an older host never sends it); 6: key shares in the handshake, sealed records after it; 7: Shutdown.outputs and the Outputs* frames (the job's files)
constexpr size_t kHeaderSize = 12;
constexpr uint32_t kDefaultMaxFrame = 16u << 20;  // bound on one frame's payload, in bytes
constexpr size_t kNonceSize = 32;
constexpr size_t kMacSize = 32;

// Anything a peer sent that this end cannot accept. The connection it came from is unusable.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// The handshake failed: the peer does not hold the pool secret (or we do not hold its).
class AuthError : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};

struct Frame {
  msg::Type type;
  std::string payload;
};

struct FrameHeader {
  uint16_t version = 0;
  msg::Type type{};
  uint32_t length = 0;  // payload bytes
};

// Parses and validates a kHeaderSize-byte header: magic, version, known type, length <= max_frame.
// Throws ProtocolError naming what is wrong.
FrameHeader decode_header(const char* header, uint32_t max_frame);
// Header + payload. Throws ProtocolError if the payload does not fit a u32 length.
std::string encode_frame(msg::Type type, std::string_view payload);
// Appends the encoded frame to `out` (saves a copy on hot paths).
void append_frame(std::string& out, msg::Type type, std::string_view payload);

// Incremental decoder for a byte stream. Errors are sticky: once a header is rejected every
// later next() throws the same error. A header is validated as soon as its 12 bytes are in, so an
// oversized frame is refused before any of its payload is buffered.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_frame = kDefaultMaxFrame);
  void feed(const char* data, size_t size);
  // The next complete frame, or nullopt if more bytes are needed. Throws ProtocolError.
  std::optional<Frame> next();
  // At end of stream: throws ProtocolError ("truncated frame: got X of Y bytes") if a partial
  // frame is pending (or the sticky error, if any).
  void finish();
  size_t buffered() const { return buf_.size() - pos_; }
  uint32_t max_frame() const { return max_frame_; }

 private:
  void check_header();
  uint32_t max_frame_;
  std::string buf_;
  size_t pos_ = 0;
  std::optional<FrameHeader> header_;  // validated header of the frame at pos_
  std::string error_;
};

namespace detail {
// Little-endian integers, as every field of the protocol is written.
inline void put_u16(char* p, uint16_t v) {
  p[0] = static_cast<char>(v & 0xff);
  p[1] = static_cast<char>(v >> 8);
}
inline void put_u32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline uint16_t get_u16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}
inline uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

[[noreturn]] void throw_frame_too_large(size_t payload_size);
}  // namespace detail

// The header of a frame of `type` with `payload_size` bytes of payload. Throws ProtocolError if
// that does not fit a u32 length. Inline: the send path encodes one per frame.
inline std::array<char, kHeaderSize> encode_header(msg::Type type, size_t payload_size) {
  if (payload_size > UINT32_MAX) detail::throw_frame_too_large(payload_size);
  std::array<char, kHeaderSize> h{};
  detail::put_u32(h.data(), kMagic);
  detail::put_u16(h.data() + 4, kProtocolVersion);
  detail::put_u16(h.data() + 6, static_cast<uint16_t>(type));
  detail::put_u32(h.data() + 8, static_cast<uint32_t>(payload_size));
  return h;
}

}  // namespace skyforge::net
