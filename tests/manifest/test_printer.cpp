// What `skyforge run` writes to a terminal: a transient status (SF_LOG_STATUS) is kept as the last
// line, every other line is printed above it, and nothing of it reaches a pipe or a file.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "run_output.hpp"

namespace {

// What is left to read from `fd`, up to its end (or, non-blocking, up to what is there); closes it.
std::string read_to_end(int fd) {
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  ::close(fd);
  return out;
}

// Everything `fn` writes to stderr.
template <class Fn>
std::string captured_stderr(Fn&& fn) {
  int p[2];
  EXPECT_EQ(::pipe(p), 0);
  std::fflush(stderr);
  int saved = ::dup(2);
  ::dup2(p[1], 2);
  ::close(p[1]);
  fn();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::fcntl(p[0], F_SETFL, O_NONBLOCK);
  return read_to_end(p[0]);
}

TEST(Printer, OnATerminalAStatusStaysBelowTheOutputAndIsReplaced) {
  const std::string erase = "\r\033[K";
  std::string got = captured_stderr([] {
    skyforge::Printer p(true);
    p.status("aws [1 s]: node 0 pending");
    p.err("aws: node 0 i-1: running (2 s)");
    p.status("aws [2 s]: node 0 running");
    p.status("");
    p.err("done");
  });
  EXPECT_EQ(got, "skyforge: aws [1 s]: node 0 pending" + erase + "skyforge: aws: node 0 i-1: running (2 s)\n" +
                     "skyforge: aws [1 s]: node 0 pending" + erase + "skyforge: aws [2 s]: node 0 running" + erase +
                     "skyforge: done\n");
}

TEST(Printer, ElsewhereAStatusIsNotShownAndTheLinesAreAsBefore) {
  std::string got = captured_stderr([] {
    skyforge::Printer p(false);
    p.status("aws [1 s]: node 0 pending");
    p.err("aws: node 0 i-1: running (2 s)");
  });
  EXPECT_EQ(got, "skyforge: aws: node 0 i-1: running (2 s)\n");
}

TEST(Printer, ALiveStatusIsErasedWhenThePrinterGoes) {
  std::string got = captured_stderr([] {
    skyforge::Printer p(true);
    p.status("aws [1 s]: waiting");
  });
  EXPECT_EQ(got, "skyforge: aws [1 s]: waiting\r\033[K");
}


// What a stalled reader of stdout costs (issue 33): nothing to the caller. The lines wait in the
// Printer's queue, their `done` runs only once they are written, and the order stays.
TEST(Printer, AStalledStdoutNeverBlocksTheCallerAndDoneFollowsTheWrite) {
  int out[2], err[2];
  ASSERT_EQ(::pipe(out), 0);
  ASSERT_EQ(::pipe(err), 0);
  std::atomic<size_t> done_bytes{0};
  const std::string text(1000, 'a');
  const std::string line = text + "\n";
  const size_t kItems = 1000;  // 1 MB: far beyond the pipe's 64 KiB
  {
    skyforge::Printer p(false, out[1], err[1]);
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < kItems; ++i) {
      p.node_lines(3, 1, line, [&] { done_bytes += line.size(); });
      if (i == kItems / 2) p.err("half way");
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << "the caller was held";
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_LT(done_bytes.load(), kItems * line.size() / 4) << "done ran before its lines were written";
    EXPECT_EQ(p.output_idle(), std::chrono::steady_clock::duration::zero());
    std::string got;
    char buf[65536];
    while (got.size() < kItems * (line.size() + 9)) {
      ssize_t n = ::read(out[0], buf, sizeof buf);
      ASSERT_GT(n, 0);
      got.append(buf, size_t(n));
    }
    p.flush();
    EXPECT_EQ(done_bytes.load(), kItems * line.size());
    EXPECT_GT(p.output_idle(), std::chrono::steady_clock::duration::zero());
    std::string want;
    for (size_t i = 0; i < kItems; ++i) want += "[node 3] " + line;
    EXPECT_EQ(got, want);
    EXPECT_EQ(p.counts().discarded_out, 0u);
  }
  ::close(out[0]);
  ::close(out[1]);
  ::close(err[1]);
  const std::string e = read_to_end(err[0]);
  EXPECT_EQ(e, "skyforge: half way\n");
}

// A reader that went away (EPIPE): said at once on stderr, the rest for stdout discarded and
// counted (and said) at flush(); `done` still runs, so no node waits for it; stderr goes on.
TEST(Printer, AClosedStdoutIsSaidOnceAndItsDiscardedLinesCounted) {
  int out[2], err[2];
  ASSERT_EQ(::pipe(out), 0);
  ASSERT_EQ(::pipe(err), 0);
  ::close(out[0]);
  int dones = 0;
  {
    skyforge::Printer p(false, out[1], err[1]);
    p.node_lines(0, 1, "a\nb\n", [&] { ++dones; });
    p.node_lines(1, 1, "c\n", [&] { ++dones; });
    p.node_lines(1, 2, "to stderr\n", [&] { ++dones; });
    p.out("the report");
    p.flush();
    EXPECT_EQ(dones, 3);
    EXPECT_EQ(p.counts().discarded_out, 4u);
  }
  ::close(out[1]);
  ::close(err[1]);
  const std::string e = read_to_end(err[0]);
  EXPECT_EQ(e,
            "skyforge: stdout: Broken pipe: what is meant for it is discarded from here on; the run goes on\n"
            "[node 1] to stderr\n"
            "skyforge: 4 lines not written to stdout (Broken pipe)\n");
}

// The workers' own log lines have no flow control: beyond kMaxUnpaced waiting they are dropped,
// and the count is said once the writer catches up. The host's own lines are never dropped.
TEST(Printer, UnpacedLinesBeyondTheBoundAreDroppedAndCounted) {
  int out[2], err[2];
  ASSERT_EQ(::pipe(out), 0);
  ASSERT_EQ(::pipe(err), 0);
  const std::string mib((1u << 20) - 1, 'x');
  const size_t n_items = skyforge::Printer::kMaxUnpaced / (1u << 20) + 8;
  std::string e;
  std::thread reader;
  {
    skyforge::Printer p(false, out[1], err[1]);
    for (size_t i = 0; i < n_items; ++i) p.node_lines(0, 3, mib + "\n");  // stderr, nobody reading yet
    p.err("mine");
    reader = std::thread([&] { e = read_to_end(err[0]); });
    p.flush();
    const auto c = p.counts();
    EXPECT_GE(c.dropped_lines, 7u);
    EXPECT_LE(c.dropped_lines, 9u);
  }
  ::close(err[1]);
  reader.join();
  ::close(out[0]);
  ::close(out[1]);
  EXPECT_NE(e.find("skyforge: mine\n"), std::string::npos);
  EXPECT_NE(e.find(" lines of the workers' logs dropped: more than 16 MiB of output waited for stdout/stderr to be read\n"),
            std::string::npos)
      << e.substr(e.size() > 300 ? e.size() - 300 : 0);
}

// The host acknowledges a node's output as a running total, each quarter window.
TEST(OutputAcks, ARunningTotalEachQuarterWindow) {
  std::vector<uint64_t> sent;
  skyforge::OutputAcks a([&](uint64_t total) { sent.push_back(total); }, 1000);
  a.done(100);
  a.done(149);
  EXPECT_TRUE(sent.empty());
  a.done(1);
  ASSERT_EQ(sent, std::vector<uint64_t>{250});
  a.done(5000);
  EXPECT_EQ(sent, (std::vector<uint64_t>{250, 5250}));
}
}  // namespace

// 500 junk connections used to print 500 lines: the first three verbatim, then a summary line
// per 10 s window (as the next one arrives) and one at the end, with the count and the last.
TEST(RejectionLog, AFloodIsSummarisedNotPrintedLineByLine) {
  std::vector<std::string> lines;
  auto now = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  skyforge::RejectionLog log([&](const std::string& l) { lines.push_back(l); }, [&] { return now; });
  for (int i = 0; i < 500; ++i) log.add("127.0.0.1:" + std::to_string(40000 + i), "handshake failed: End of file");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "rejected a connection from 127.0.0.1:40000: handshake failed: End of file");
  now += std::chrono::seconds(11);
  log.add("127.0.0.1:50000", "wrong secret");
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[3], "rejected 498 more connections (501 in all; the last from 127.0.0.1:50000: wrong secret)");
  log.add("127.0.0.1:50001", "wrong secret");
  EXPECT_EQ(lines.size(), 4u) << "within the next window";
  log.flush();
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[4], "rejected 1 more connection (502 in all; the last from 127.0.0.1:50001: wrong secret)");
  log.flush();
  EXPECT_EQ(lines.size(), 5u) << "nothing held back, nothing printed";
}
