// A stalled reader of `skyforge run`'s stdout (`| less`, Ctrl-S, a pipe nobody reads) holds the
// nodes' output, never the host's control loop: the run outlives a stall longer than the lease,
// and every line arrives, in order. A reader that goes away (EPIPE) costs the output, said with a
// count, not the run (docs/architecture.md, "Output"). The real binaries, the local provider.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "process.hpp"
#include "run_fixture.hpp"

using namespace skyforge::test;

namespace {

using Clock = std::chrono::steady_clock;

// `skyforge` with its stdout a pipe this test reads only when it chooses to; its stderr is read
// all along.
class HeldReader {
 public:
  HeldReader(const std::vector<std::string>& argv, const std::map<std::string, std::string>& extra) {
    int err_fd = -1;
    pid_ = skyforge::test::spawn_with_pipes(argv, extra, out_fd_, err_fd);
    err_thread_ = std::thread([this, fd = err_fd] {
      char buf[65536];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) {
        std::lock_guard<std::mutex> lock(mu_);
        err_.append(buf, size_t(n));
      }
      close(fd);
    });
  }
  ~HeldReader() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      wait_exit(30);
    }
    close_stdout();
    if (err_thread_.joinable()) err_thread_.join();
  }
  pid_t pid() const { return pid_; }
  std::string err() {
    std::lock_guard<std::mutex> lock(mu_);
    return err_;
  }
  bool running() { return !reaped_ && waitpid(pid_, &status_, WNOHANG) == 0; }
  // Reads stdout until `bytes` are in (or EOF).
  std::string read_stdout(size_t bytes = SIZE_MAX) {
    std::string s;
    char buf[65536];
    while (s.size() < bytes) {
      ssize_t n = read(out_fd_, buf, std::min(sizeof buf, bytes - s.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      s.append(buf, size_t(n));
    }
    return s;
  }
  void close_stdout() {
    if (out_fd_ >= 0) close(out_fd_);
    out_fd_ = -1;
  }
  // The exit status (128+signal when killed), or -1 after `timeout_s` (then killed).
  int wait_exit(double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
    for (;;) {
      pid_t r = reaped_ ? pid_ : waitpid(pid_, &status_, WNOHANG);
      if (r == pid_) break;
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        waitpid(pid_, &status_, 0);
        reaped_ = true;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    reaped_ = true;
    if (err_thread_.joinable()) err_thread_.join();
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
  int out_fd_ = -1;
  std::thread err_thread_;
  std::mutex mu_;
  std::string err_;
};

class StdoutReader : public SkyforgeRunTest {
 protected:
  StdoutReader() : SkyforgeRunTest("skyforge-output") {}
  // A job whose every node prints `lines` numbered lines of 100 bytes on stdout (and every
  // 1000th line's number on stderr), then its last line, then touches <root>/finished-<node>.
  fs::path chatty_job(int nodes, int lines) {
    const fs::path script = write("chatty.sh",
                                  "awk -v node=\"$SKYFORGE_NODE\" 'BEGIN { pad = sprintf(\"%72s\", \"\"); gsub(/ /, \"x\", pad);\n"
                                  "  for (i = 0; i < " + std::to_string(lines) + "; i++) {\n"
                                  "    printf \"n%d %08d %s\\n\", node, i, pad\n"
                                  "    if (i % 1000 == 0) printf \"e%d %08d\\n\", node, i > \"/dev/stderr\"\n"
                                  "  } }'\n"
                                  "echo \"last-$SKYFORGE_NODE\"\n"
                                  "touch \"" + (root_ / "finished-").string() + "$SKYFORGE_NODE\"\n");
    return write("chatty.toml", "[pool]\nnodes = " + std::to_string(nodes) + "\n\n[job]\ncommand = [\"sh\", \"" +
                                    script.string() + "\"]\n");
  }
  bool finished(int node) { return fs::exists(root_ / ("finished-" + std::to_string(node))); }
  std::vector<pid_t> workers() {
    std::vector<pid_t> w;
    for (pid_t p : processes_under(root_))
      if (comm_of(p) == "skyforge-worker") w.push_back(p);
    return w;
  }
};

// Every node's lines, in the order they arrived; what is neither theirs nor expected, aside.
struct Parsed {
  std::map<int, std::vector<long>> numbers;  // node -> line numbers, arrival order
  std::map<int, bool> last;                  // node -> its last line came, after every numbered one
  std::vector<std::string> other;
};
Parsed parse(const std::string& out, int lines) {
  Parsed p;
  std::istringstream in(out);
  std::string l;
  while (std::getline(in, l)) {
    int node = -1, k = -1;
    long i = -1;
    char pad[128] = {0};
    if (std::sscanf(l.c_str(), "[node %d] n%d %ld %100s", &node, &k, &i, pad) == 4 && node == k &&
        std::string(pad) == std::string(72, 'x')) {
      p.numbers[node].push_back(i);
    } else if (std::sscanf(l.c_str(), "[node %d] last-%d", &node, &k) == 2 && node == k) {
      p.last[node] = p.numbers[node].size() == size_t(lines);
    } else {
      p.other.push_back(l);
    }
  }
  return p;
}

// The issue's `skyforge run job.toml | (sleep 15; cat)`: 2 nodes × 50,000 lines (5 MB each),
// stdout not read for 10 s (2.5 leases), then read to the end.
TEST_F(StdoutReader, AStalledStdoutReaderHoldsTheOutputNotTheLease) {
  constexpr int kNodes = 2, kLines = 50000;
  const fs::path m = chatty_job(kNodes, kLines);
  HeldReader run({SKYFORGE_BIN, "run", m.string()}, env());
  const auto t0 = Clock::now();
  // The short check, while nobody reads: after two leases (8 s) the host, both workers and their
  // heartbeats are still there, nothing is declared lost, and the commands are held in their
  // own write() (the host does not take 10 MB into its memory instead).
  std::this_thread::sleep_until(t0 + std::chrono::seconds(8));
  EXPECT_TRUE(run.running()) << run.err();
  EXPECT_EQ(workers().size(), size_t(kNodes)) << run.err();
  EXPECT_EQ(run.err().find("lost"), std::string::npos) << run.err();
  for (int n = 0; n < kNodes; ++n) EXPECT_FALSE(finished(n)) << "node " << n << "'s command was not held";
  std::this_thread::sleep_until(t0 + std::chrono::seconds(10));
  const auto t_read = Clock::now();
  const std::string out = run.read_stdout();
  const double read_s = std::chrono::duration<double>(Clock::now() - t_read).count();
  const int rc = run.wait_exit(60);
  const std::string err = run.err();
  ASSERT_EQ(rc, 0) << err;
  EXPECT_EQ(err.find("lost"), std::string::npos) << err;
  EXPECT_EQ(err.find("dropped"), std::string::npos) << err;
  EXPECT_EQ(err.find("not written"), std::string::npos) << err;
  const Parsed p = parse(out, kLines);
  EXPECT_TRUE(p.other.empty()) << p.other.size() << " unexpected lines, the first: " << p.other[0];
  for (int n = 0; n < kNodes; ++n) {
    const auto& got = p.numbers.count(n) ? p.numbers.at(n) : std::vector<long>{};
    ASSERT_EQ(got.size(), size_t(kLines)) << "node " << n;
    for (long i = 0; i < kLines; ++i) ASSERT_EQ(got[size_t(i)], i) << "node " << n << ": out of order or lost";
    EXPECT_TRUE(p.last.count(n) && p.last.at(n)) << "node " << n << "'s last line missing or early";
    for (int i = 0; i < kLines; i += 1000) {
      char e[64];
      std::snprintf(e, sizeof e, "[node %d] e%d %08d\n", n, n, i);
      ASSERT_NE(err.find(e), std::string::npos) << "stderr line lost: " << e;
    }
  }
  std::printf("stall 10 s; then %.1f MB of stdout read in %.2f s\n", double(out.size()) / 1e6, read_s);
}

// `skyforge run job.toml | head -n 3`: the reader goes away. The host says so on stderr at once,
// discards what was meant for stdout from then on (counted at the end), and the run goes on to
// its own verdict: every node's command ends normally, no lease is lost, nothing is left behind.
TEST_F(StdoutReader, AClosedStdoutCostsTheOutputSaidWithACountNotTheRun) {
  constexpr int kNodes = 2, kLines = 20000;
  const fs::path m = chatty_job(kNodes, kLines);
  HeldReader run({SKYFORGE_BIN, "run", m.string()}, env());
  const std::string head = run.read_stdout(4096);
  ASSERT_EQ(head.size(), 4096u) << run.err();
  EXPECT_EQ(head.rfind("[node ", 0), 0u) << head.substr(0, 200);
  run.close_stdout();
  const int rc = run.wait_exit(60);
  const std::string err = run.err();
  EXPECT_EQ(rc, 0) << err;
  EXPECT_NE(err.find("skyforge: stdout: Broken pipe: what is meant for it is discarded from here on; the run goes on"),
            std::string::npos)
      << err;
  unsigned long discarded = 0;
  const size_t at = err.find(" lines not written to stdout (Broken pipe)");
  ASSERT_NE(at, std::string::npos) << err;
  const size_t from = err.rfind("skyforge: ", at);
  ASSERT_EQ(std::sscanf(err.c_str() + from, "skyforge: %lu lines", &discarded), 1) << err;
  // At most the 4 KiB read and the pipe's buffer went out; the rest is counted.
  EXPECT_GT(discarded, (unsigned long)(kNodes * (kLines + 1)) - 2000) << err;
  EXPECT_LE(discarded, (unsigned long)(kNodes * (kLines + 1))) << err;
  EXPECT_EQ(err.find("lost"), std::string::npos) << err;
  for (int n = 0; n < kNodes; ++n) {
    EXPECT_TRUE(finished(n)) << "node " << n << "'s command did not run to its end";
    char e[64];
    std::snprintf(e, sizeof e, "[node %d] e%d %08d\n", n, n, kLines - kLines % 1000 - (kLines % 1000 ? 0 : 1000));
    EXPECT_NE(err.find(e), std::string::npos) << "stderr keeps every line: " << e;
  }
}

}  // namespace
