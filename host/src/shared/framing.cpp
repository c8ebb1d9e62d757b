// The control plane's frames: header encoding and validation, the incremental decoder, and the
// list of frame types this build knows (framing.hpp).
#include "framing.hpp"

#include <algorithm>
#include <cstdio>

namespace skyforge::msg {
bool known_type(uint16_t t) {
  switch (static_cast<Type>(t)) {
    case Type::Challenge:
    case Type::AuthReply:
    case Type::AuthOk:
    case Type::Hello:
    case Type::Job:
    case Type::Heartbeat:
    case Type::Log:
    case Type::TaskBatch:
    case Type::TaskResults:
    case Type::RunResult:
    case Type::Shutdown:
    case Type::Ready:
    case Type::Progress:
    case Type::OutputAck:
    case Type::OutputsBegin:
    case Type::OutputChunk:
    case Type::OutputsEnd:
    case Type::OutputsAck:
    case Type::KvSet:
    case Type::KvGet:
    case Type::KvAdd:
    case Type::KvReply:
      return true;
  }
  return false;
}
}  // namespace skyforge::msg

namespace skyforge::net {
using detail::get_u16;
using detail::get_u32;

namespace {
std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08X", v);
  return b;
}
}  // namespace

FrameHeader decode_header(const char* p, uint32_t max_frame) {
  const uint32_t magic = get_u32(p);
  if (magic != kMagic)
    throw ProtocolError("bad magic: expected " + hex32(kMagic) + " (\"SKYF\"), got " + hex32(magic) +
                        " (not a skyforge peer)");
  FrameHeader h;
  h.version = get_u16(p + 4);
  if (h.version != kProtocolVersion)
    throw ProtocolError("unsupported protocol version " + std::to_string(h.version) + " (this build speaks version " +
                        std::to_string(kProtocolVersion) + ")");
  const uint16_t type = get_u16(p + 6);
  if (!msg::known_type(type)) throw ProtocolError("unknown frame type " + std::to_string(type));
  h.type = static_cast<msg::Type>(type);
  h.length = get_u32(p + 8);
  if (h.length > max_frame)
    throw ProtocolError("frame too large: " + std::to_string(h.length) + " bytes of payload exceed the limit of " +
                        std::to_string(max_frame) + " bytes");
  return h;
}

void detail::throw_frame_too_large(size_t payload_size) {
  throw ProtocolError("frame too large: " + std::to_string(payload_size) + " bytes do not fit a frame");
}

void append_frame(std::string& out, msg::Type type, std::string_view payload) {
  const auto h = encode_header(type, payload.size());
  out.append(h.data(), h.size());
  out.append(payload.data(), payload.size());
}

std::string encode_frame(msg::Type type, std::string_view payload) {
  std::string out;
  out.reserve(kHeaderSize + payload.size());
  append_frame(out, type, payload);
  return out;
}

FrameDecoder::FrameDecoder(uint32_t max_frame) : max_frame_(max_frame) {}

void FrameDecoder::check_header() {
  if (!error_.empty() || header_ || buffered() < kHeaderSize) return;
  try {
    header_ = decode_header(buf_.data() + pos_, max_frame_);
  } catch (const ProtocolError& e) {
    error_ = e.what();
    buf_.clear();
    buf_.shrink_to_fit();
    pos_ = 0;
  }
}

void FrameDecoder::feed(const char* data, size_t size) {
  if (!error_.empty() || size == 0) return;  // a rejected stream is not buffered any further
  if (pos_ > 0 && (pos_ == buf_.size() || pos_ >= buf_.size() / 2)) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  // Validate a pending header before buffering more than it, so an oversized frame never gets
  // its payload stored.
  if (!header_ && buffered() < kHeaderSize) {
    const size_t take = std::min(size, kHeaderSize - buffered());
    buf_.append(data, take);
    data += take;
    size -= take;
    check_header();
    if (!error_.empty()) return;
  }
  buf_.append(data, size);
}

std::optional<Frame> FrameDecoder::next() {
  check_header();
  if (!error_.empty()) throw ProtocolError(error_);
  if (!header_) return std::nullopt;
  const size_t total = kHeaderSize + header_->length;
  if (buffered() < total) return std::nullopt;
  Frame f{header_->type, buf_.substr(pos_ + kHeaderSize, header_->length)};
  pos_ += total;
  header_.reset();
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  return f;
}

void FrameDecoder::finish() {
  check_header();
  if (!error_.empty()) throw ProtocolError(error_);
  const size_t have = buffered();
  if (have == 0) return;
  const size_t want = header_ ? kHeaderSize + header_->length : kHeaderSize;
  throw ProtocolError("truncated frame: got " + std::to_string(have) + " of " + std::to_string(want) + " bytes");
}

}  // namespace skyforge::net
