// Handshake, connections, heartbeats and leases over real loopback TCP.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>

#include "helpers.hpp"
#include "protocol.hpp"

using namespace skyforge;
using namespace skyforge::net;
using namespace sftest;

namespace {

const std::string kSecret = "pool-secret-0123456789abcdef";

struct Received {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Frame> frames;
  void add(msg::Type t, std::string&& p) {
    std::lock_guard<std::mutex> l(mu);
    frames.push_back({t, std::move(p)});
    cv.notify_all();
  }
  bool wait_for(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, timeout, [&] { return frames.size() >= n; });
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu);
    return frames.size();
  }
};

// A server on its own io thread that records authenticated connections and rejections.
struct TestServer {
  explicit TestServer(ConnectionOptions opts = {}, bool start_connections = true)
      : server(io.io(), "127.0.0.1", 0, kSecret, opts,
               [this, start_connections](std::shared_ptr<Connection> c) {
                 if (start_connections) {
                   c->start([this](msg::Type t, std::string&& p) { received.add(t, std::move(p)); },
                            [this](const std::string& r) { closed.set(r); });
                 }
                 authenticated.set(c);
               },
               [this](const std::string& peer, const std::string& why) { rejected.set(peer + ": " + why); }) {}

  // Stop the io thread before the members its callbacks write to are destroyed.
  ~TestServer() {
    server.close();
    io.stop();
  }

  IoThread io;
  Received received;
  Latch<std::shared_ptr<Connection>> authenticated;
  Latch<std::string> rejected;
  Latch<std::string> closed;
  Server server;
};

ConnectionOptions fast(int heartbeat_ms = 50, int lease_ms = 300, int handshake_ms = 300) {
  ConnectionOptions o;
  o.heartbeat_ms = heartbeat_ms;
  o.lease_ms = lease_ms;
  o.handshake_timeout_ms = handshake_ms;
  return o;
}

}  // namespace

TEST(Auth, SucceedsAndFramesFlowBothWays) {
  TestServer s;
  Received client_rx;
  Latch<std::string> client_closed;
  IoThread cio;
  auto c = connect(cio.io(), "127.0.0.1", s.server.port(), kSecret, 7, {}, 2000);
  c->start([&](msg::Type t, std::string&& p) { client_rx.add(t, std::move(p)); },
           [&](const std::string& r) { client_closed.set(r); });
  auto sc = s.authenticated.wait(2000ms);
  ASSERT_TRUE(sc);
  EXPECT_EQ((*sc)->node(), 7u);
  EXPECT_EQ(c->node(), 7u);
  EXPECT_NE((*sc)->remote_address().find("127.0.0.1:"), std::string::npos);
  EXPECT_EQ(c->remote_address(), "127.0.0.1:" + std::to_string(s.server.port()));

  c->send_msg(msg::Type::Hello, msg::Hello{7, 99, "h", "127.0.0.1", ""});
  ASSERT_TRUE(s.received.wait_for(1, 2000ms));
  EXPECT_EQ(s.received.frames[0].type, msg::Type::Hello);
  EXPECT_EQ(deserialize<msg::Hello>(s.received.frames[0].payload).pid, 99);

  (*sc)->send_msg(msg::Type::Shutdown, msg::Shutdown{"bye"});
  ASSERT_TRUE(client_rx.wait_for(1, 2000ms));
  EXPECT_EQ(deserialize<msg::Shutdown>(client_rx.frames[0].payload).reason, "bye");
  EXPECT_FALSE(s.rejected.is_set());
}

TEST(Auth, WrongSecretIsDroppedAndReported) {
  TestServer s;
  IoThread cio;
  try {
    connect(cio.io(), "127.0.0.1", s.server.port(), "not-the-secret", 3, {}, 2000);
    FAIL() << "connect succeeded with a wrong secret";
  } catch (const AuthError& e) {
    EXPECT_NE(std::string(e.what()).find("authentication failed: the host rejected this worker's pool secret"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(contains(reason(s.rejected), "authentication failed: wrong pool secret (peer claimed node 3)"));
  EXPECT_FALSE(s.authenticated.is_set());
}

TEST(Auth, PeerFailingAuthNeverGetsAFrameThrough) {
  TestServer s;
  RawPeer p(s.server.port());
  auto challenge = p.read_frame();
  ASSERT_TRUE(challenge);
  ASSERT_EQ(challenge->type, msg::Type::Challenge);
  ASSERT_EQ(challenge->payload.size(), 64u);  // nonce | X25519 key share
  // A bad MAC immediately followed by frames the server must never deliver.
  std::string reply = std::string(4, '\0') + std::string(32, 'n') + KeyShare().public_key() + std::string(32, 'm');
  p.write(encode_frame(msg::Type::AuthReply, reply) + encode_frame(msg::Type::Hello, serialize(msg::Hello{})) +
          encode_frame(msg::Type::RunResult, serialize(msg::RunResult{})));
  EXPECT_TRUE(p.closed_within(2000ms));
  ASSERT_TRUE(s.rejected.wait(2000ms));
  EXPECT_FALSE(s.authenticated.is_set());
  EXPECT_EQ(s.received.size(), 0u);
}

TEST(Auth, SilentPeerIsDroppedAfterTheHandshakeTimeout) {
  TestServer s(fast(50, 300, 200));
  RawPeer p(s.server.port());
  const auto t0 = Clock::now();
  ASSERT_TRUE(p.read_frame());  // the challenge; then say nothing
  EXPECT_TRUE(p.closed_within(1500ms));
  const auto elapsed = Clock::now() - t0;
  EXPECT_GE(elapsed, 150ms);
  EXPECT_TRUE(contains(reason(s.rejected, 1000ms), "handshake timed out after 200 ms"));
}

TEST(Auth, NonAuthFrameFirstIsDropped) {
  TestServer s;
  RawPeer p(s.server.port());
  p.write(encode_frame(msg::Type::Hello, serialize(msg::Hello{1, 2, "x", "y", ""})));
  EXPECT_TRUE(p.closed_within(2000ms));
  EXPECT_TRUE(contains(reason(s.rejected), "expected an AuthReply frame first, got a frame of type 10"));
  EXPECT_FALSE(s.authenticated.is_set());
  EXPECT_EQ(s.received.size(), 0u);
}

TEST(Auth, GarbageFirstIsDropped) {
  TestServer s;
  RawPeer p(s.server.port());
  p.write("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(p.closed_within(2000ms));
  EXPECT_TRUE(contains(reason(s.rejected), "bad magic"));
}

TEST(Auth, OversizedAuthReplyIsRefusedFromItsHeader) {
  TestServer s;
  RawPeer p(s.server.port());
  std::string h = encode_frame(msg::Type::AuthReply, std::string(100, 'a')).substr(0, kHeaderSize);
  h[8] = '\x00';
  h[9] = '\x00';
  h[10] = '\x00';
  h[11] = '\x10';  // 256 MiB
  p.write(h);
  EXPECT_TRUE(p.closed_within(2000ms));
  EXPECT_TRUE(contains(reason(s.rejected), "frame too large"));
}

TEST(Auth, ClientRejectsAServerThatCannotProveTheSecret) {
  RawListener l;
  std::thread fake([&] {
    int fd = l.accept();
    std::string challenge = encode_frame(msg::Type::Challenge, random_bytes(32) + KeyShare().public_key());
    ::send(fd, challenge.data(), challenge.size(), MSG_NOSIGNAL);
    char buf[12 + 100];
    size_t got = 0;
    while (got < sizeof buf) {
      ssize_t r = ::recv(fd, buf + got, sizeof buf - got, 0);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    std::string ok = encode_frame(msg::Type::AuthOk, std::string(32, 'x'));  // not the HMAC
    ::send(fd, ok.data(), ok.size(), MSG_NOSIGNAL);
    char c;
    ::recv(fd, &c, 1, 0);  // until the client hangs up
    ::close(fd);
  });
  IoThread cio;
  try {
    connect(cio.io(), "127.0.0.1", l.port(), kSecret, 1, {}, 2000);
    ADD_FAILURE() << "connect accepted an unproven host";
  } catch (const AuthError& e) {
    EXPECT_NE(std::string(e.what()).find("did not prove the pool secret"), std::string::npos) << e.what();
  }
  fake.join();
}

TEST(Auth, ConnectionRefused) {
  IoThread cio;
  const uint16_t port = unused_port();
  try {
    connect(cio.io(), "127.0.0.1", port, kSecret, 1, {}, 1000);
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_EQ(std::string(e.what()), "connection refused to 127.0.0.1:" + std::to_string(port));
  }
}

TEST(Auth, ConnectTimesOutWhenTheHostNeverSpeaks) {
  RawListener l;  // accepts (kernel backlog) but never sends a challenge
  IoThread cio;
  const auto t0 = Clock::now();
  try {
    connect(cio.io(), "127.0.0.1", l.port(), kSecret, 1, {}, 200);
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out after 200 ms waiting for the host's challenge"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(Clock::now() - t0, 1500ms);
}

TEST(Connection, HeartbeatsKeepAnIdleConnectionAlive) {
  TestServer s(fast(50, 300));
  Latch<std::string> client_closed;
  Received client_rx;
  IoThread cio;
  auto c = connect(cio.io(), "127.0.0.1", s.server.port(), kSecret, 1, fast(50, 300), 2000);
  c->start([&](msg::Type t, std::string&& p) { client_rx.add(t, std::move(p)); },
           [&](const std::string& r) { client_closed.set(r); });
  auto sc = s.authenticated.wait(2000ms);
  ASSERT_TRUE(sc);
  std::this_thread::sleep_for(1000ms);  // more than three leases of silence from the application
  EXPECT_FALSE(client_closed.is_set()) << *client_closed.wait(0ms);
  EXPECT_FALSE(s.closed.is_set()) << *s.closed.wait(0ms);
  EXPECT_EQ(client_rx.size(), 0u);  // heartbeats are not delivered
  EXPECT_EQ(s.received.size(), 0u);
  (*sc)->send(msg::Type::Ready, "");
  EXPECT_TRUE(client_rx.wait_for(1, 1000ms));
}

TEST(Connection, LeaseExpiresWhenThePeerGoesSilent) {
  TestServer s(fast(50, 300));
  RawPeer p(s.server.port());
  ASSERT_TRUE(p.authenticate(kSecret, 4));  // then never send anything again
  ASSERT_TRUE(s.authenticated.wait(2000ms));
  const auto t0 = Clock::now();
  EXPECT_EQ(reason(s.closed), "lease expired: no frame from the peer for 300 ms");
  EXPECT_GE(Clock::now() - t0, 200ms);
  EXPECT_TRUE(p.closed_within(1000ms));
}

TEST(Connection, ClientLeaseExpiresWhenTheHostGoesSilent) {
  TestServer s(fast(50, 300), /*start_connections=*/false);  // the host never starts: no heartbeats
  Latch<std::string> closed;
  IoThread cio;
  auto c = connect(cio.io(), "127.0.0.1", s.server.port(), kSecret, 2, fast(50, 300), 2000);
  c->start([](msg::Type, std::string&&) {}, [&](const std::string& r) { closed.set(r); });
  EXPECT_EQ(reason(closed), "lease expired: no frame from the peer for 300 ms");
}

TEST(Connection, ProtocolErrorClosesWithAReason) {
  TestServer s;
  RawPeer p(s.server.port());
  ASSERT_TRUE(p.authenticate(kSecret, 1));
  ASSERT_TRUE(s.authenticated.wait(2000ms));
  std::string h = encode_frame(msg::Type::Log, "").substr(0, kHeaderSize);
  h[11] = '\x7f';  // ~2 GiB
  p.write_sealed(h);
  EXPECT_TRUE(contains(reason(s.closed), "protocol error: frame too large"));
  EXPECT_TRUE(p.closed_within(1000ms));
}

TEST(Connection, TruncatedFrameAtEofIsReported) {
  TestServer s;
  {
    RawPeer p(s.server.port());
    ASSERT_TRUE(p.authenticate(kSecret, 1));
    ASSERT_TRUE(s.authenticated.wait(2000ms));
    p.write_sealed(encode_frame(msg::Type::Log, "0123456789").substr(0, 15));
  }  // EOF mid-frame: the record is whole, the frame in it is not
  EXPECT_EQ(reason(s.closed), "protocol error: truncated frame: got 15 of 22 bytes");
}

TEST(Connection, HandshakeFrameAfterAuthIsAProtocolError) {
  TestServer s;
  RawPeer p(s.server.port());
  ASSERT_TRUE(p.authenticate(kSecret, 1));
  p.write_sealed(encode_frame(msg::Type::AuthOk, std::string(32, 'z')));
  EXPECT_TRUE(contains(reason(s.closed), "unexpected handshake frame"));
}

TEST(Connection, SendIsThreadSafeAndOrderedPerThread) {
  TestServer s;
  IoThread cio;
  auto c = connect(cio.io(), "127.0.0.1", s.server.port(), kSecret, 1, {}, 2000);
  c->start([](msg::Type, std::string&&) {}, [](const std::string&) {});
  constexpr int kThreads = 8, kPerThread = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        msg::Log l;
        l.node = static_cast<uint32_t>(t);
        l.text = std::to_string(i) + ":" + std::string(static_cast<size_t>(i % 97), static_cast<char>('a' + t));
        c->send_msg(msg::Type::Log, l);
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(s.received.wait_for(kThreads * kPerThread, 5000ms)) << s.received.size();
  std::map<uint32_t, int> next;
  std::lock_guard<std::mutex> lock(s.received.mu);
  ASSERT_EQ(s.received.frames.size(), static_cast<size_t>(kThreads * kPerThread));
  for (const auto& f : s.received.frames) {
    ASSERT_EQ(f.type, msg::Type::Log);
    auto l = deserialize<msg::Log>(f.payload);
    const int i = next[l.node]++;
    ASSERT_EQ(l.text, std::to_string(i) + ":" + std::string(static_cast<size_t>(i % 97), static_cast<char>('a' + l.node)));
  }
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(next[static_cast<uint32_t>(t)], kPerThread);
}

// A client connection to `s` as node 1, started: what it receives dropped, its close reason set
// in `closed`.
static std::shared_ptr<Connection> started_client(IoThread& cio, TestServer& s, Latch<std::string>& closed) {
  auto c = connect(cio.io(), "127.0.0.1", s.server.port(), kSecret, 1, {}, 2000);
  c->start([](msg::Type, std::string&&) {}, [&closed](const std::string& r) { closed.set(r); });
  return c;
}

TEST(Connection, GracefulCloseFlushesQueuedFrames) {
  TestServer s;
  Latch<std::string> closed;
  IoThread cio;
  auto c = started_client(cio, s, closed);
  constexpr int kFrames = 2000;
  for (int i = 0; i < kFrames; ++i) c->send(msg::Type::Log, std::string(1000, 'p'));
  c->close();
  c->send(msg::Type::Log, "after close: dropped");
  EXPECT_EQ(reason(closed, 3000ms), "closed locally");
  EXPECT_EQ(reason(s.closed, 3000ms), "peer closed the connection");
  EXPECT_EQ(s.received.size(), static_cast<size_t>(kFrames));
  EXPECT_TRUE(c->wait_closed(0));
  EXPECT_EQ(c->close_reason(), "closed locally");
}

TEST(Connection, AbortClosesAtOnceAndOnCloseRunsOnce) {
  TestServer s;
  Latch<std::string> closed;
  IoThread cio;
  auto c = started_client(cio, s, closed);
  c->abort();
  c->abort();
  c->close();
  ASSERT_TRUE(c->wait_closed(2000));
  EXPECT_EQ(*closed.wait(0ms), "aborted locally");
  const std::string server_why = reason(s.closed);
  EXPECT_TRUE(server_why == "peer closed the connection" || server_why == "connection reset by peer") << server_why;
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(closed.count(), 1);
}

TEST(Connection, StartAfterCloseReportsTheReason) {
  TestServer s(ConnectionOptions{}, /*start_connections=*/false);
  Latch<std::string> closed;
  IoThread cio;
  auto c = connect(cio.io(), "127.0.0.1", s.server.port(), kSecret, 1, {}, 2000);
  c->abort();
  c->start([](msg::Type, std::string&&) {}, [&](const std::string& r) { closed.set(r); });
  EXPECT_EQ(reason(closed), "aborted locally");
}

TEST(Connection, OversizedSendThrows) {
  ConnectionOptions o;
  o.max_frame = 1024;
  TestServer s(o);
  IoThread cio;
  auto c = connect(cio.io(), "127.0.0.1", s.server.port(), kSecret, 1, o, 2000);
  c->start([](msg::Type, std::string&&) {}, [](const std::string&) {});
  EXPECT_THROW(c->send(msg::Type::Log, std::string(1025, 'x')), ProtocolError);
  EXPECT_NO_THROW(c->send(msg::Type::Log, std::string(1024, 'x')));
  EXPECT_TRUE(s.received.wait_for(1, 2000ms));
}

TEST(Server, CloseStopsListening) {
  auto s = std::make_unique<TestServer>();
  const uint16_t port = s->server.port();
  s->server.close();
  s->server.close();  // idempotent
  IoThread cio;
  try {
    connect(cio.io(), "127.0.0.1", port, kSecret, 1, {}, 1000);
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("connection refused"), std::string::npos) << e.what();
  }
}

TEST(Server, CloseCancelsPendingHandshakesSilently) {
  TestServer s;
  RawPeer p(s.server.port());
  ASSERT_TRUE(p.read_frame());
  s.server.close();
  EXPECT_TRUE(p.closed_within(2000ms));
  EXPECT_FALSE(s.rejected.is_set());
}

TEST(Server, BindFailureIsClear) {
  IoThread io;
  Server a(io.io(), "127.0.0.1", 0, kSecret, {}, [](std::shared_ptr<Connection>) {});
  try {
    Server b(io.io(), "127.0.0.1", a.port(), kSecret, {}, [](std::shared_ptr<Connection>) {});
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on 127.0.0.1:" + std::to_string(a.port())), std::string::npos)
        << e.what();
  }
}

// The host's wait for stopping workers and a worker's grace for its app come from one place:
// the worker is gone 6 s before the host gives up on it, whatever the lease.
TEST(Shutdown, AWorkersStopGraceEndsBeforeTheHostsWait) {
  using std::chrono::milliseconds;
  EXPECT_EQ(net::shutdown_wait(4000), milliseconds(14000));  // the default lease
  EXPECT_EQ(net::stop_grace(4000), milliseconds(8000));
  EXPECT_EQ(net::shutdown_wait(200), milliseconds(11000));  // at least a second of lease
  for (int lease : {1, 999, 1000, 5000, 60000})
    EXPECT_EQ(net::shutdown_wait(lease) - net::stop_grace(lease), milliseconds(6000)) << lease;
}

// ---- the channel: what an eavesdropper and a man in the middle get ----------------------------

TEST(Channel, NothingCrossesTheWireInCleartext) {
  TestServer s;
  Relay relay(s.server.port());
  IoThread cio;
  Received client_rx;
  auto c = connect(cio.io(), "127.0.0.1", relay.port(), kSecret, 3, {}, 2000);
  c->start([&](msg::Type t, std::string&& p) { client_rx.add(t, std::move(p)); }, [](const std::string&) {});
  auto sc = s.authenticated.wait(2000ms);
  ASSERT_TRUE(sc);
  const std::string up = "SKYFORGE_POOL_SECRET=up-6f1c0e2a-the-value-of-an---env-secret";
  const std::string down = "AWS_SECRET_ACCESS_KEY=down-9b8d77-an-[image]-env-value";
  c->send_msg(msg::Type::Log, msg::Log{3, 0, up});
  (*sc)->send_msg(msg::Type::Log, msg::Log{0, 0, down});
  ASSERT_TRUE(s.received.wait_for(1, 2000ms));
  ASSERT_TRUE(client_rx.wait_for(1, 2000ms));
  EXPECT_EQ(deserialize<msg::Log>(s.received.frames[0].payload).text, up);
  EXPECT_EQ(deserialize<msg::Log>(client_rx.frames[0].payload).text, down);
  const std::string c2s = relay.seen(true), s2c = relay.seen(false);
  EXPECT_EQ(c2s.find("up-6f1c0e2a"), std::string::npos);
  EXPECT_EQ(s2c.find("down-9b8d77"), std::string::npos);
  EXPECT_EQ(c2s.find(kSecret), std::string::npos);
  EXPECT_EQ(s2c.find(kSecret), std::string::npos);
  // Past the handshake not even the frame magic shows: headers are sealed too.
  EXPECT_EQ(c2s.find("SKYF", 12 + 100), std::string::npos);
  EXPECT_EQ(s2c.find("SKYF", 12 + 64 + 12 + 32), std::string::npos);
}

TEST(Channel, AManInTheMiddleCannotSwapAKeyShare) {
  TestServer s;
  const KeyShare mallory;
  // The relay puts its own X25519 key in place of the server's in the Challenge.
  Relay relay(s.server.port(), [&](bool c2s, size_t off, std::string& chunk) {
    for (size_t i = 0; i < chunk.size(); ++i) {
      const size_t at = off + i;
      if (!c2s && at >= 12 + 32 && at < 12 + 64) chunk[i] = mallory.public_key()[at - 12 - 32];
    }
  });
  IoThread cio;
  EXPECT_THROW(connect(cio.io(), "127.0.0.1", relay.port(), kSecret, 1, {}, 2000), AuthError);
  EXPECT_TRUE(contains(reason(s.rejected), "authentication failed: wrong pool secret"));
  EXPECT_FALSE(s.authenticated.is_set());
}

// Records a peer writes after the handshake that the server refuses: it closes the connection
// with `reason`, having taken `received` frames before.
struct RefusedRecords {
  const char* name;
  std::function<std::string(RawPeer&)> bytes;  // what the authenticated peer writes
  const char* reason;
  size_t received;
};
void PrintTo(const RefusedRecords& r, std::ostream* os) { *os << r.name; }

class Refused : public ::testing::TestWithParam<RefusedRecords> {};

TEST_P(Refused, RecordsCloseTheConnection) {
  TestServer s;
  RawPeer p(s.server.port());
  ASSERT_TRUE(p.authenticate(kSecret, 1));
  p.write(GetParam().bytes(p));
  EXPECT_TRUE(contains(reason(s.closed), GetParam().reason));
  EXPECT_EQ(s.received.size(), GetParam().received);
  EXPECT_TRUE(p.closed_within(1000ms));
}

static std::string log_record(RawPeer& p, const std::string& text) {
  return p.seal(encode_frame(msg::Type::Log, serialize(msg::Log{1, 0, text})));
}

INSTANTIATE_TEST_SUITE_P(
    Channel, Refused,
    ::testing::Values(
        RefusedRecords{"Altered",
                       [](RawPeer& p) {
                         std::string r = log_record(p, "hello");
                         r[kRecordHeaderSize + 14] ^= 0x01;  // one bit of the payload
                         return r;
                       },
                       "protocol error: record 0 failed authentication", 0},
        // The original is taken, not its copy.
        RefusedRecords{"Replayed",
                       [](RawPeer& p) {
                         const std::string r = log_record(p, "once");
                         return r + r;
                       },
                       "record 1 failed authentication", 1},
        RefusedRecords{"Reordered",
                       [](RawPeer& p) {
                         const std::string first = log_record(p, "first");
                         return log_record(p, "second") + first;
                       },
                       "record 0 failed authentication", 0},
        RefusedRecords{"UnsealedAfterTheHandshake",
                       [](RawPeer&) { return encode_frame(msg::Type::Log, serialize(msg::Log{1, 0, "in the clear"})); },
                       "protocol error: record", 0},
        // ~2 GiB claimed, nothing after it: refused from its length.
        RefusedRecords{"Oversized", [](RawPeer&) { return std::string("\xff\xff\xff\x7f", 4); },
                       "protocol error: record too large: 2147483647 bytes", 0}),
    [](const ::testing::TestParamInfo<RefusedRecords>& info) { return std::string(info.param.name); });

TEST(Channel, ATruncatedRecordAtEofIsReported) {
  TestServer s;
  {
    RawPeer p(s.server.port());
    ASSERT_TRUE(p.authenticate(kSecret, 1));
    ASSERT_TRUE(s.authenticated.wait(2000ms));
    const std::string r = p.seal(encode_frame(msg::Type::Log, "0123456789"));
    p.write(r.substr(0, r.size() - 5));
  }
  EXPECT_EQ(reason(s.closed), "protocol error: truncated record: got 37 of 42 bytes");
}

TEST(Channel, TheServerSealsWhatItSends) {
  TestServer s;
  RawPeer p(s.server.port());
  ASSERT_TRUE(p.authenticate(kSecret, 5));
  auto sc = s.authenticated.wait(2000ms);
  ASSERT_TRUE(sc);
  (*sc)->send_msg(msg::Type::Shutdown, msg::Shutdown{"sealed bye"});
  auto f = p.read_sealed_frame();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->type, msg::Type::Shutdown);
  EXPECT_EQ(deserialize<msg::Shutdown>(f->payload).reason, "sealed bye");
}
