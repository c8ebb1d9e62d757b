// Frame encoding and the incremental decoder, including every rejection.
#include <gtest/gtest.h>

#include <cstring>

#include "protocol.hpp"

using namespace skyforge;
using namespace skyforge::net;

namespace {

std::string header(uint32_t magic, uint16_t version, uint16_t type, uint32_t length) {
  std::string h(kHeaderSize, '\0');
  for (int i = 0; i < 4; ++i) h[i] = static_cast<char>((magic >> (8 * i)) & 0xff);
  h[4] = static_cast<char>(version & 0xff);
  h[5] = static_cast<char>(version >> 8);
  h[6] = static_cast<char>(type & 0xff);
  h[7] = static_cast<char>(type >> 8);
  for (int i = 0; i < 4; ++i) h[8 + i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return h;
}

std::string error_of(FrameDecoder& d) {
  try {
    d.next();
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Framing, HeaderLayoutIsLittleEndianSkyf) {
  const std::string f = encode_frame(msg::Type::Log, "abc");
  ASSERT_EQ(f.size(), kHeaderSize + 3);
  EXPECT_EQ(f.substr(0, 4), "SKYF");
  EXPECT_EQ(f.substr(4, 8), header(kMagic, kProtocolVersion, 13, 3).substr(4, 8));
  EXPECT_EQ(f.substr(12), "abc");
  const FrameHeader h = decode_header(f.data(), kDefaultMaxFrame);
  EXPECT_EQ(h.version, kProtocolVersion);
  EXPECT_EQ(h.type, msg::Type::Log);
  EXPECT_EQ(h.length, 3u);
}

TEST(Framing, RoundTripSeveralFrames) {
  std::string payload_big(100000, 'x');
  for (size_t i = 0; i < payload_big.size(); ++i) payload_big[i] = static_cast<char>(i * 31);
  const std::vector<Frame> frames = {{msg::Type::Hello, "hello"},
                                     {msg::Type::Heartbeat, ""},
                                     {msg::Type::TaskBatch, payload_big},
                                     {msg::Type::KvReply, std::string("\0\1\2", 3)}};
  std::string wire;
  for (const auto& f : frames) wire += encode_frame(f.type, f.payload);
  FrameDecoder d;
  d.feed(wire.data(), wire.size());
  for (const auto& want : frames) {
    auto got = d.next();
    ASSERT_TRUE(got);
    EXPECT_EQ(got->type, want.type);
    EXPECT_EQ(got->payload, want.payload);
  }
  EXPECT_FALSE(d.next());
  EXPECT_EQ(d.buffered(), 0u);
  EXPECT_NO_THROW(d.finish());
}

TEST(Framing, DecoderFedByteByByte) {
  std::string wire;
  for (int i = 0; i < 20; ++i) wire += encode_frame(msg::Type::Log, std::string(static_cast<size_t>(i), 'a' + i));
  FrameDecoder d;
  int seen = 0;
  for (char c : wire) {
    d.feed(&c, 1);
    while (auto f = d.next()) {
      EXPECT_EQ(f->type, msg::Type::Log);
      EXPECT_EQ(f->payload, std::string(static_cast<size_t>(seen), 'a' + seen));
      ++seen;
    }
  }
  EXPECT_EQ(seen, 20);
  EXPECT_NO_THROW(d.finish());
}

TEST(Framing, RejectsBadMagic) {
  FrameDecoder d;
  const std::string h = header(0x50545448, kProtocolVersion, 10, 0);  // "HTTP"
  d.feed(h.data(), h.size());
  const std::string e = error_of(d);
  EXPECT_NE(e.find("bad magic"), std::string::npos) << e;
  EXPECT_NE(e.find("0x50545448"), std::string::npos) << e;
}

TEST(Framing, RejectsUnsupportedVersionQuotingBoth) {
  FrameDecoder d;
  const std::string h = header(kMagic, 8, 10, 0);
  d.feed(h.data(), h.size());
  const std::string e = error_of(d);
  EXPECT_NE(e.find("unsupported protocol version 8"), std::string::npos) << e;
  EXPECT_NE(e.find("version " + std::to_string(kProtocolVersion)), std::string::npos) << e;
}

TEST(Framing, RejectsUnknownType) {
  for (uint16_t t : {0, 4, 9, 25, 29, 34, 999, 65535}) {
    FrameDecoder d;
    const std::string h = header(kMagic, kProtocolVersion, t, 0);
    d.feed(h.data(), h.size());
    EXPECT_EQ(error_of(d), "unknown frame type " + std::to_string(t));
  }
}

TEST(Framing, RejectsTooLargeFromTheHeaderAlone) {
  FrameDecoder d(1024);
  const std::string h = header(kMagic, kProtocolVersion, 14, 1025);
  d.feed(h.data(), h.size());
  const std::string e = error_of(d);
  EXPECT_NE(e.find("frame too large"), std::string::npos) << e;
  EXPECT_NE(e.find("1025"), std::string::npos) << e;
  EXPECT_NE(e.find("1024"), std::string::npos) << e;
  // Nothing of the payload is buffered, even when it follows in the same chunk.
  FrameDecoder d2(1024);
  const std::string wire = h + std::string(1025, 'z');
  d2.feed(wire.data(), wire.size());
  EXPECT_EQ(d2.buffered(), 0u);
  EXPECT_THROW(d2.next(), ProtocolError);
  // A huge claimed length is refused just the same (the default limit is 16 MiB).
  FrameDecoder d3;
  const std::string h3 = header(kMagic, kProtocolVersion, 14, 0xFFFFFFFFu);
  d3.feed(h3.data(), h3.size());
  EXPECT_NE(error_of(d3).find("4294967295"), std::string::npos);
}

TEST(Framing, LimitIsInclusiveAndConfigurable) {
  FrameDecoder d(16);
  const std::string f = encode_frame(msg::Type::Log, std::string(16, 'q'));
  d.feed(f.data(), f.size());
  auto got = d.next();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->payload.size(), 16u);
}

TEST(Framing, ErrorsAreSticky) {
  FrameDecoder d;
  const std::string bad = header(kMagic, kProtocolVersion + 1, 10, 0);
  d.feed(bad.data(), bad.size());
  EXPECT_THROW(d.next(), ProtocolError);
  const std::string good = encode_frame(msg::Type::Hello, "x");
  d.feed(good.data(), good.size());
  EXPECT_THROW(d.next(), ProtocolError);
  EXPECT_THROW(d.finish(), ProtocolError);
}

TEST(Framing, RejectionAfterValidFrames) {
  std::string wire = encode_frame(msg::Type::Hello, "one") + header(kMagic, kProtocolVersion, 77, 0);
  FrameDecoder d;
  d.feed(wire.data(), wire.size());
  auto f = d.next();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->payload, "one");
  EXPECT_EQ(error_of(d), "unknown frame type 77");
}

TEST(Framing, TruncatedFrameAtEof) {
  const std::string f = encode_frame(msg::Type::Log, "hello");  // 17 bytes
  FrameDecoder d;
  d.feed(f.data(), 7);
  EXPECT_FALSE(d.next());
  try {
    d.finish();
    FAIL() << "finish() accepted a truncated header";
  } catch (const ProtocolError& e) {
    EXPECT_STREQ(e.what(), "truncated frame: got 7 of 12 bytes");
  }
  FrameDecoder d2;
  d2.feed(f.data(), 15);
  EXPECT_FALSE(d2.next());
  try {
    d2.finish();
    FAIL() << "finish() accepted a truncated payload";
  } catch (const ProtocolError& e) {
    EXPECT_STREQ(e.what(), "truncated frame: got 15 of 17 bytes");
  }
}

TEST(Framing, KnownTypes) {
  for (uint16_t t : {1, 2, 3, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 30, 31, 32, 33}) EXPECT_TRUE(msg::known_type(t)) << t;
  int known = 0;
  for (uint32_t t = 0; t <= 0xFFFF; ++t) known += msg::known_type(static_cast<uint16_t>(t)) ? 1 : 0;
  EXPECT_EQ(known, 22);
}
