// Boost.Serialization payloads: round trips of every message and rejection of malformed input,
// plus the crypto helpers.
#include <gtest/gtest.h>

#include <random>

#include "protocol.hpp"

using namespace skyforge;
using namespace skyforge::net;

namespace {

// Round trip: deserialising the bytes and serialising again gives the same bytes, and every
// strict prefix (and the bytes plus a trailing one) is rejected.
template <class T>
T round_trip(const T& value) {
  const std::string bytes = serialize(value);
  T back = deserialize<T>(bytes);
  EXPECT_EQ(serialize(back), bytes);
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(deserialize<T>(std::string_view(bytes.data(), n)), ProtocolError) << "prefix of " << n << " bytes";
  EXPECT_THROW(deserialize<T>(bytes + "!"), ProtocolError);
  return back;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string o;
  for (unsigned char c : s) {
    o += d[c >> 4];
    o += d[c & 15];
  }
  return o;
}

}  // namespace

TEST(Payload, Hello) {
  msg::Hello h{3, 4242, "node-a", "10.0.0.3", "10.0.0.1:555"};
  auto b = round_trip(h);
  EXPECT_EQ(b.node, 3u);
  EXPECT_EQ(b.pid, 4242);
  EXPECT_EQ(b.hostname, "node-a");
  EXPECT_EQ(b.store_addr, "10.0.0.1:555");
}

TEST(Payload, Job) {
  msg::Job j;
  j.id.node = 2;
  j.id.total_nodes = 4;
  j.id.head_addr = "10.0.0.1";
  j.id.accelerators = 8;
  j.id.accelerator = "H100";
  j.id.pool_id = "abc123";
  j.frameworks = {{"torch", "/p/torch.so", {{"backend", "nccl"}, {"x", ""}}}, {"jax", "/p/jax.so", {}}};
  j.app = {"hello", "/p/hello.so", {{"k", "v"}}};
  j.mode = JobMode::map;
  j.command = {"python3", "train.py", std::string("\0bin", 4)};
  j.env = {{"A", "1"}, {"B", "two"}};
  j.config = {{"lr", "0.1"}};
  auto b = round_trip(j);
  EXPECT_EQ(b.id.total_nodes, 4u);
  EXPECT_EQ(b.id.accelerator, "H100");
  EXPECT_EQ(b.mode, JobMode::map);
  ASSERT_EQ(b.frameworks.size(), 2u);
  EXPECT_EQ(b.frameworks[0].options[0].second, "nccl");
  EXPECT_EQ(b.command[2], std::string("\0bin", 4));
  EXPECT_EQ(b.env.at("B"), "two");
}

TEST(Payload, PluginSpecLogShutdownReady) {
  EXPECT_EQ(round_trip(msg::PluginSpec{"a", "/b.so", {{"c", "d"}}}).library, "/b.so");
  auto l = round_trip(msg::Log{1, 2, "line one\nline two\n"});
  EXPECT_EQ(l.stream, 2);
  EXPECT_EQ(l.text, "line one\nline two\n");
  EXPECT_EQ(round_trip(msg::Shutdown{"done"}).reason, "done");
}

// The collective watchdog's input (docs/architecture.md, "Collective watchdog").
TEST(Payload, Progress) {
  msg::Progress p;
  p.entered = 8812;
  p.done = 8811;
  p.op = "allreduce";
  p.bytes = 407080;
  p.since_ms = 61000;
  const msg::Progress back = round_trip(p);
  EXPECT_EQ(back.entered, 8812u);
  EXPECT_EQ(back.done, 8811u);
  EXPECT_EQ(back.op, "allreduce");
  EXPECT_EQ(back.bytes, 407080u);
  EXPECT_EQ(back.since_ms, 61000);
}

TEST(Payload, Tasks) {
  msg::TaskBatch tb;
  tb.first = 1000;
  tb.inputs = {"", "x", std::string(300, 'y')};
  auto b = round_trip(tb);
  EXPECT_EQ(b.first, 1000u);
  EXPECT_TRUE(b.tasks.empty());
  EXPECT_EQ(b.task(2), 1002u);
  EXPECT_EQ(b.inputs[2].size(), 300u);
  tb.tasks = {1000, 7, uint64_t{1} << 40};  // a task backend's own choice of tasks
  b = round_trip(tb);
  EXPECT_EQ(b.tasks, tb.tasks);
  EXPECT_EQ(b.task(2), uint64_t{1} << 40);

  msg::TaskResults tr;
  tr.first = 7;
  tr.elapsed_ns = 123456789;
  tr.results = {{true, 0, "ok"}, {false, 3, "boom"}};
  auto r = round_trip(tr);
  ASSERT_EQ(r.results.size(), 2u);
  EXPECT_FALSE(r.results[1].ok);
  EXPECT_EQ(r.results[1].slot, 3u);
  EXPECT_EQ(round_trip(msg::TaskResult{false, 9, "e"}).slot, 9u);
}

TEST(Payload, RunResultAndKv) {
  auto rr = round_trip(msg::RunResult{5, false, -9, "", "killed by SIGKILL"});
  EXPECT_EQ(rr.exit_code, -9);
  EXPECT_EQ(rr.error, "killed by SIGKILL");
  auto kq = round_trip(msg::KvRequest{42, "key", "value", -3, 1000});
  EXPECT_EQ(kq.delta, -3);
  EXPECT_EQ(kq.timeout_ms, 1000);
  auto kr = round_trip(msg::KvReply{42, 4, "", "timed out"});
  EXPECT_EQ(kr.status, 4);
}

TEST(Payload, HugeStringLengthIsRejectedWithoutAllocating) {
  // Shutdown = the 5-byte class preamble Boost writes for each class, then one string (an 8-byte
  // length and the bytes), then the `outputs` bool (one byte). Claim 2^62 bytes.
  const std::string preamble(5, '\0');
  const std::string no_outputs(1, '\0');
  ASSERT_EQ(serialize(msg::Shutdown{"short"}), preamble + le64(5) + "short" + no_outputs);
  const std::string forged = preamble + le64(uint64_t{1} << 62) + "short" + no_outputs;
  try {
    deserialize<msg::Shutdown>(forged);
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("malformed Shutdown payload"), std::string::npos) << e.what();
  }
  // A length just above what is left is refused too.
  EXPECT_THROW(deserialize<msg::Shutdown>(preamble + le64(7) + "short" + no_outputs), ProtocolError);
  EXPECT_EQ(deserialize<msg::Shutdown>(preamble + le64(5) + "short" + no_outputs).reason, "short");
}

TEST(Payload, HugeCollectionCountIsRejected) {
  msg::TaskBatch tb;
  tb.first = 1;
  tb.inputs = {"a"};
  std::string bytes = serialize(tb);
  // Layout: preamble(5) | first(8) | tasks: count(8), one block of u64 | inputs: vector
  // preamble(5) | count(8) | item_version(4) | strings.
  ASSERT_EQ(bytes.size(), 47u);
  ASSERT_EQ(bytes.substr(13, 8), le64(0));
  ASSERT_EQ(bytes.substr(26, 8), le64(1));
  for (size_t at : {size_t{13}, size_t{26}}) {  // the block of numbers and the strings
    std::string forged = bytes;
    forged.replace(at, 8, le64(uint64_t{1} << 60));
    EXPECT_THROW(deserialize<msg::TaskBatch>(forged), ProtocolError);
    forged.replace(at, 8, le64(1000000));
    EXPECT_THROW(deserialize<msg::TaskBatch>(forged), ProtocolError);
  }
}

TEST(Payload, InvalidBoolIsRejected) {
  std::string bytes = serialize(msg::TaskResult{true, 1, "v"});
  // The bool follows the 5-byte class preamble.
  ASSERT_EQ(bytes[5], 1);
  bytes[5] = 7;
  EXPECT_THROW(deserialize<msg::TaskResult>(bytes), ProtocolError);
}

// A decoder may only accept what an encoder could have written: whatever it accepts must
// serialise back to the very same bytes (no trailing bytes, no out-of-range bool or enum read as
// something else); everything else is refused with a ProtocolError — deserialize() maps every
// other exception to one, so a crash or a canonical-form break is what this can catch. Most
// corrupted inputs must be refused (a flip inside a string's bytes is a valid message).
TEST(Payload, RandomGarbageIsRefusedOrIsACanonicalMessage) {
  std::mt19937_64 rng(12345);
  msg::Job job;
  job.command = {"python3", "train.py"};
  job.env = {{"A", "1"}};
  job.config = {{"job.timeout", "30"}};
  job.app.name = "hello";
  const std::string good = serialize(job);
  int job_refused = 0, junk_refused = 0;
  const int rounds = 3000;
  for (int i = 0; i < rounds; ++i) {
    std::string s = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) s[rng() % s.size()] = static_cast<char>(rng());
    if (rng() % 3 == 0) s.resize(rng() % (s.size() + 1));
    try {
      const msg::Job back = deserialize<msg::Job>(s);
      ASSERT_EQ(serialize(back), s) << "round " << i << ": accepted a non-canonical Job payload";
    } catch (const ProtocolError&) {
      ++job_refused;
    }
    std::string junk(rng() % 64, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    try {
      const msg::TaskResults back = deserialize<msg::TaskResults>(junk);
      ASSERT_EQ(serialize(back), junk) << "round " << i << ": accepted random bytes as TaskResults";
    } catch (const ProtocolError&) {
      ++junk_refused;
    }
  }
  EXPECT_GT(job_refused, rounds / 2) << "corrupted Job payloads refused";
  EXPECT_GT(junk_refused, rounds * 9 / 10) << "random payloads refused";
}

TEST(Payload, JobModeOutOfRangeIsRefused) {
  msg::Job a, b;
  a.mode = JobMode::broadcast;
  b.mode = JobMode::map;
  const std::string sa = serialize(a), sb = serialize(b);
  ASSERT_EQ(sa.size(), sb.size());
  size_t at = sa.size(), diffs = 0;
  for (size_t i = 0; i < sa.size(); ++i)
    if (sa[i] != sb[i]) at = i, ++diffs;
  ASSERT_EQ(diffs, 1u) << "the mode is one byte";
  for (int v = 0; v < 256; ++v) {
    std::string s = sa;
    s[at] = static_cast<char>(v);
    if (v <= 2) EXPECT_EQ(static_cast<int>(deserialize<msg::Job>(s).mode), v);
    else EXPECT_THROW(deserialize<msg::Job>(s), ProtocolError) << v;
  }
}

TEST(Crypto, HmacSha256MatchesRfc4231) {
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hmac_sha256("", "").size(), 32u);
}

TEST(Crypto, RandomBytesAndHex) {
  EXPECT_EQ(random_bytes(32).size(), 32u);
  EXPECT_NE(random_bytes(32), random_bytes(32));
  const std::string h = random_hex(16);
  EXPECT_EQ(h.size(), 32u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(random_hex(0), "");
}
