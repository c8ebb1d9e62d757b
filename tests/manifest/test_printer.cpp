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
