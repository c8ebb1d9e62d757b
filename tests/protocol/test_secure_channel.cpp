// The channel's cryptography on its own: the key schedule, the key shares and the record layer
// (host/src/shared/secure_channel.hpp). The wire-level attacks are in test_connection.cpp.
#include <gtest/gtest.h>

#include "protocol.hpp"
#include "secure_channel.hpp"

using namespace skyforge::net;

namespace {

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}
std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

// Both ends of one handshake, done in memory.
struct Pair {
  SessionKeys client, server;
  Pair(const std::string& client_secret = "s3cret", const std::string& server_secret = "s3cret") {
    const KeyShare c, s;
    const std::string t = handshake_transcript(std::string(32, 'S'), s.public_key(), 4, std::string(32, 'C'), c.public_key());
    client = derive_session_keys(client_secret, c.agree(s.public_key()), t, false);
    server = derive_session_keys(server_secret, s.agree(c.public_key()), t, true);
  }
};

}  // namespace

TEST(SecureChannel, HkdfMatchesRfc5869TestCase1) {
  const std::string ikm(22, '\x0b');
  const std::string salt = unhex("000102030405060708090a0b0c");
  const std::string info = unhex("f0f1f2f3f4f5f6f7f8f9");
  const std::string prk = detail::hkdf_extract(salt, ikm);
  EXPECT_EQ(hex(prk), "077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5");
  EXPECT_EQ(hex(detail::hkdf_expand(prk, info, 42)),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
}

TEST(SecureChannel, BothSidesDeriveEachOthersKeysAndTheDirectionsDiffer) {
  Pair p;
  EXPECT_EQ(p.client.send_key, p.server.recv_key);
  EXPECT_EQ(p.client.send_iv, p.server.recv_iv);
  EXPECT_EQ(p.server.send_key, p.client.recv_key);
  EXPECT_NE(p.client.send_key, p.client.recv_key);
  EXPECT_EQ(p.client.send_key.size(), 32u);
  EXPECT_EQ(p.client.send_iv.size(), 12u);
  // Fresh key shares each time: no two connections share keys, even with the same secret.
  Pair q;
  EXPECT_NE(p.client.send_key, q.client.send_key);
}

TEST(SecureChannel, ASmallOrderKeyShareIsRefused) {
  const KeyShare k;
  EXPECT_THROW(k.agree(std::string(32, '\0')), ProtocolError);
  EXPECT_THROW(k.agree(std::string(31, 'a')), ProtocolError);
}

TEST(SecureChannel, RecordsRoundTripFedByteByByte) {
  Pair p;
  RecordSealer seal(p.client.send_key, p.client.send_iv);
  RecordOpener open(p.server.recv_key, p.server.recv_iv, 1 << 20);
  std::string wire;
  std::vector<std::string> msgs = {"", "a", std::string(70000, 'x'), "last"};
  for (const auto& m : msgs) seal.seal(wire, m);
  seal.seal(wire, "he", "ad+body");  // sealed in two parts, opened as one
  msgs.push_back("head+body");
  EXPECT_EQ(wire.size(), 5 * (kRecordHeaderSize + kRecordTagSize) + 1 + 70000 + 4 + 9);
  std::vector<std::string> got;
  for (char c : wire) {
    open.feed(&c, 1);
    while (auto r = open.next()) got.emplace_back(*r);
  }
  EXPECT_EQ(got, msgs);
  EXPECT_NO_THROW(open.finish());
}

TEST(SecureChannel, AnotherSecretOpensNothing) {
  Pair p("s3cret", "another");
  RecordSealer seal(p.client.send_key, p.client.send_iv);
  RecordOpener open(p.server.recv_key, p.server.recv_iv, 1 << 20);
  std::string wire;
  seal.seal(wire, "hello");
  open.feed(wire.data(), wire.size());
  EXPECT_THROW(open.next(), ProtocolError);
  EXPECT_THROW(open.next(), ProtocolError);  // sticky
}

TEST(SecureChannel, TheLengthIsAuthenticated) {
  Pair p;
  RecordSealer seal(p.client.send_key, p.client.send_iv);
  RecordOpener open(p.server.recv_key, p.server.recv_iv, 1 << 20);
  std::string wire;
  seal.seal(wire, "01234", "56789");  // a header and a payload, as a connection seals a frame
  wire[0] = 9;  // claim one byte less: the tag is then read from the wrong place and fails
  open.feed(wire.data(), wire.size());
  EXPECT_THROW(open.next(), ProtocolError);
}
