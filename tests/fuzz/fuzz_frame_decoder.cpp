// libFuzzer target for the control-plane frame decoder (docs/architecture.md, "The control plane"), for the payload
// decoder behind it, and (second byte's bit 1) for the record layer in front of it: arbitrary bytes, fed in arbitrary chunks, must only ever yield frames or
// ProtocolError, never a crash, an unbounded allocation or any other exception.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "protocol.hpp"

using namespace skyforge;

namespace {

void decode_payload(const net::Frame& f) {
  switch (f.type) {
    case msg::Type::Hello: (void)net::deserialize<msg::Hello>(f.payload); break;
    case msg::Type::Job: (void)net::deserialize<msg::Job>(f.payload); break;
    case msg::Type::Log: (void)net::deserialize<msg::Log>(f.payload); break;
    case msg::Type::TaskBatch: (void)net::deserialize<msg::TaskBatch>(f.payload); break;
    case msg::Type::TaskResults: (void)net::deserialize<msg::TaskResults>(f.payload); break;
    case msg::Type::RunResult: (void)net::deserialize<msg::RunResult>(f.payload); break;
    case msg::Type::Shutdown: (void)net::deserialize<msg::Shutdown>(f.payload); break;
    case msg::Type::Progress: (void)net::deserialize<msg::Progress>(f.payload); break;
    case msg::Type::KvSet:
    case msg::Type::KvGet:
    case msg::Type::KvAdd: (void)net::deserialize<msg::KvRequest>(f.payload); break;
    case msg::Type::KvReply: (void)net::deserialize<msg::KvReply>(f.payload); break;
    default: break;  // handshake frames and heartbeats carry raw bytes
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // First byte: chunk size for feeding (1..256); second: the decoder's frame limit class (bit 0)
  // and which layer is fed (bit 1: the record layer).
  const size_t chunk = static_cast<size_t>(data[0]) + 1;
  const uint32_t max_frame = (data[1] & 1) ? 64 : net::kDefaultMaxFrame;
  const bool records = (data[1] & 2) != 0;
  data += 2;
  size -= 2;
  if (records) {
    // The record layer in front of the decoder: arbitrary bytes under a fixed key (a forged tag
    // must fail cleanly; a length must never make the opener buffer past its limit).
    static const std::string key(32, 'k'), iv(12, 'i');
    net::RecordOpener opener(key, iv, net::kHeaderSize + max_frame);
    try {
      for (size_t off = 0; off < size; off += chunk) {
        opener.feed(reinterpret_cast<const char*>(data + off), std::min(chunk, size - off));
        while (auto r = opener.next())
          if (r->size() > net::kHeaderSize + max_frame) std::abort();
      }
      opener.finish();
    } catch (const net::ProtocolError&) {
    }
    return 0;
  }
  net::FrameDecoder decoder(max_frame);
  try {
    for (size_t off = 0; off < size; off += chunk) {
      const size_t n = std::min(chunk, size - off);
      decoder.feed(reinterpret_cast<const char*>(data + off), n);
      while (auto f = decoder.next()) {
        if (f->payload.size() > max_frame) std::abort();  // the limit must hold
        try {
          decode_payload(*f);
        } catch (const net::ProtocolError&) {
        }
      }
    }
    decoder.finish();
  } catch (const net::ProtocolError&) {
  }
  return 0;
}
