// Nothing leaks from a long-lived host (label faults): run_job(), what `skyforge run` does, called
// over and over in one process — pools of 2 local nodes that succeed and pools whose command
// fails — leaves this process with the descriptors and threads it had, and no child.
#include <gtest/gtest.h>

#include <dirent.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "catalog.hpp"
#include "manifest.hpp"
#include "run.hpp"
#include "../support/read_text.hpp"

namespace fs = std::filesystem;
using skyforge::test::read_text;

namespace {

size_t entries(const char* dir) {
  size_t n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n - (std::string(dir) == "/proc/self/fd" ? 1 : 0);  // the DIR's own descriptor
}

TEST(LongLivedHost, ManyRunsInOneProcessLeaveNoDescriptorThreadOrChild) {
  char tmpl[] = "/tmp/skyforge-longlived-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  ::setenv("TMPDIR", tmpl, 1);
  using namespace skyforge;
  Manifest ok = parse_manifest("[pool]\nnodes = 2\n[job]\napp = \"hello\"\n", "ok.toml");
  Manifest bad = parse_manifest("[pool]\nnodes = 2\n[job]\ncommand = [\"sh\", \"-c\", \"exit 3\"]\n", "bad.toml");
  const Catalog catalog(Catalog::default_search_dirs({}));
  validate_against(ok, catalog);
  validate_against(bad, catalog);
  RunOptions o;
  o.worker_path = SKYFORGE_WORKER;
  o.quiet_results = true;
  ASSERT_EQ(run_job(ok, catalog, o), kExitOk);  // warm up: what is made once per process
  const size_t fds = entries("/proc/self/fd"), threads = entries("/proc/self/task");
  constexpr int kRuns = 100;
  for (int i = 0; i < kRuns; ++i) {
    ASSERT_EQ(run_job(ok, catalog, o), kExitOk) << "run " << i;
    ASSERT_EQ(run_job(bad, catalog, o), kExitJobFailed) << "run " << i;
  }
  EXPECT_EQ(entries("/proc/self/fd"), fds) << "descriptors after " << 2 * kRuns << " runs";
  // A joined thread's task may stay listed for a moment: pthread_join returns once the kernel
  // clears the thread's id at exit, before it releases the task. Wait for that, not for more.
  size_t now = entries("/proc/self/task");
  for (int i = 0; i < 500 && now > threads; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    now = entries("/proc/self/task");
  }
  EXPECT_EQ(now, threads) << "threads after " << 2 * kRuns << " runs";
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1) << "a child is left";
  EXPECT_EQ(entries(tmpl), 0u) << "files left in TMPDIR";
  std::error_code ec;
  fs::remove_all(tmpl, ec);
}

// A process's argv (NUL-separated), or what could be read of it: the process may end while it
// is read (read() then fails with ESRCH, which an ifstream turns into an exception).
std::string cmdline_of(const fs::path& proc_entry) {
  std::string text;
  const int fd = ::open((proc_entry / "cmdline").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return text;
}

// The pool secret (32 random bytes a run makes, hex) reaches each worker through the environment
// of the process its provider starts, and nowhere else: not in any process's argv while the run
// is on, not in anything the run prints — output or error, of a run that succeeds and one that
// fails — and not in the nodes' logs. A wrapper in place of the worker learns it, as the worker
// would, so the test can look for it.
TEST(LongLivedHost, ThePoolSecretIsInNoArgvNoOutputNoErrorAndNoLog) {
  char tmpl[] = "/tmp/skyforge-secret-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path root = tmpl, tmp = root / "tmp", seen = root / "secrets";
  fs::create_directories(tmp);
  ::setenv("TMPDIR", tmp.c_str(), 1);
  const fs::path wrapper = root / "worker.sh";
  std::ofstream(wrapper) << "#!/bin/sh\nprintf '%s\\n' \"$SKYFORGE_POOL_SECRET\" >> " << seen.string()
                         << "\nexec " << SKYFORGE_WORKER << " \"$@\"\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  using namespace skyforge;
  const fs::path work = root / "nodes";
  auto manifest = [&](const std::string& sh) {
    return parse_manifest("[pool]\nnodes = 2\n[provider]\nkeep_workdirs = true\nwork_root = \"" + work.string() +
                              "\"\n[job]\ncommand = [\"sh\", \"-c\", \"" + sh + "\"]\n",
                          "secret.toml");
  };
  Manifest ok = manifest("echo up; sleep 1"), bad = manifest("echo failing >&2; exit 4");
  const Catalog catalog(Catalog::default_search_dirs({}));
  validate_against(ok, catalog);
  validate_against(bad, catalog);
  RunOptions o;
  o.worker_path = wrapper.string();
  o.verbose = true;  // bootstrap output and debug logs too

  // Everything the runs print goes to a file (fds 1 and 2 of this process, for the run's length).
  const fs::path printed = root / "printed.txt";
  const int file = ::open(printed.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(file, 0);
  std::fflush(nullptr);
  const int out = ::dup(1), err = ::dup(2);
  ::dup2(file, 1);
  ::dup2(file, 2);
  std::string argv_seen;
  // Every process's argv while the first run is on. Processes come and go under it: nothing
  // here throws (an exception on this thread would end the test process, its message going to
  // the file above), and a jthread is joined however the test leaves.
  std::jthread scan([&] {
    for (auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
         std::chrono::steady_clock::now() < until;) {
      std::error_code ec;
      for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        argv_seen += cmdline_of(it->path()) + "\n";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const int rc_ok = run_job(ok, catalog, o);
  scan.join();
  const int rc_bad = run_job(bad, catalog, o);
  std::fflush(nullptr);
  ::dup2(out, 1);
  ::dup2(err, 2);
  ::close(out);
  ::close(err);
  ::close(file);
  EXPECT_EQ(rc_ok, kExitOk);
  EXPECT_EQ(rc_bad, kExitJobFailed);

  std::vector<std::string> secrets;
  {
    std::ifstream in(seen);
    for (std::string l; std::getline(in, l);)
      if (!l.empty()) secrets.push_back(l);
  }
  ASSERT_EQ(secrets.size(), 4u) << "2 runs x 2 workers";
  EXPECT_EQ(secrets[0].size(), 64u) << "32 random bytes, hex";
  const std::string text = read_text(printed);
  EXPECT_NE(text.find("up"), std::string::npos) << text;
  EXPECT_NE(text.find("failing"), std::string::npos) << text;
  std::string logs;  // every file the nodes kept: worker.log, bootstrap.log, bootstrap.sh
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(work))
    if (e.is_regular_file()) logs += read_text(e.path()), ++files;
  EXPECT_EQ(files, 12u) << "2 runs x 2 nodes x (worker.log, bootstrap.log, bootstrap.sh)";
  for (const auto& s : secrets) {
    EXPECT_EQ(argv_seen.find(s), std::string::npos) << "the secret in a process's argv";
    EXPECT_EQ(text.find(s), std::string::npos) << "the secret in the output or an error";
    EXPECT_EQ(logs.find(s), std::string::npos) << "the secret in a node's log";
  }
  std::error_code ec;
  fs::remove_all(root, ec);
}

}  // namespace
