// What `skyforge run` writes to a terminal: a transient status (SF_LOG_STATUS) is kept as the last
// line, every other line is printed above it, and nothing of it reaches a pipe or a file.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "run_output.hpp"

namespace {

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
  std::string out;
  char buf[4096];
  ssize_t n;
  ::fcntl(p[0], F_SETFL, O_NONBLOCK);
  while ((n = ::read(p[0], buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  ::close(p[0]);
  return out;
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
