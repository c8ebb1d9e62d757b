#include "reaper.hpp"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

namespace skyforge::reaper {
namespace {

// One /proc/<pid>/stat: its parent, and whether it is a zombie. False when it is gone.
bool read_stat(pid_t pid, pid_t& ppid, bool& zombie) {
  char path[32] = "/proc/";
  size_t n = 6;
  char digits[16];
  int d = 0;
  for (unsigned v = static_cast<unsigned>(pid); v > 0 || d == 0; v /= 10) digits[d++] = char('0' + v % 10);
  while (d > 0) path[n++] = digits[--d];
  const char* tail = "/stat";
  while (*tail) path[n++] = *tail++;
  path[n] = '\0';
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];  // "pid (comm) state ppid ...": comm is at most 16 bytes (64 on new kernels)
  ssize_t got;
  do got = ::read(fd, buf, sizeof buf - 1);
  while (got < 0 && errno == EINTR);
  ::close(fd);
  if (got <= 0) return false;
  buf[got] = '\0';
  // comm may hold spaces and parentheses: the fields go on after the last ')'.
  const char* close = nullptr;
  for (const char* p = buf; *p; ++p)
    if (*p == ')') close = p;
  if (!close || close[1] != ' ' || !close[2]) return false;
  zombie = close[2] == 'Z' || close[2] == 'X';
  const char* p = close + 3;
  while (*p == ' ') ++p;
  long v = 0;
  if (*p < '0' || *p > '9') return false;
  for (; *p >= '0' && *p <= '9'; ++p) v = v * 10 + (*p - '0');
  ppid = static_cast<pid_t>(v);
  return true;
}

// The descendants found so far (this process first). A tree larger than this is still handled:
// what did not fit is reached in a later pass, once its ancestors' deaths gave it to us.
constexpr int kMaxKnown = 2048;
struct Known {
  pid_t pid[kMaxKnown];
  int n = 0;
  bool has(pid_t p) const {
    for (int i = 0; i < n; ++i)
      if (pid[i] == p) return true;
    return false;
  }
  void add(pid_t p) {
    if (n < kMaxKnown) pid[n++] = p;
  }
};

struct linux_dirent64 {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

// One walk of /proc: every process whose parent is in `known` joins it and gets `sig` (0: none),
// `except` and its descendants aside. Processes are listed in pid order, so a child with a lower
// pid than its parent's is caught by the next pass; passes go on until one finds nothing new.
int signal_tree(Known& known, int sig, pid_t except) {
  int signalled = 0;
  for (int pass = 0; pass < 8; ++pass) {
    const int dir = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return signalled;
    bool found = false;
    alignas(8) char buf[4096];
    for (;;) {
      const long got = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
      if (got <= 0) break;
      for (long off = 0; off < got;) {
        const auto* e = reinterpret_cast<const linux_dirent64*>(buf + off);
        off += e->d_reclen;
        long v = 0;
        const char* s = e->d_name;
        if (*s < '1' || *s > '9') continue;
        for (; *s >= '0' && *s <= '9'; ++s) v = v * 10 + (*s - '0');
        if (*s) continue;
        const pid_t pid = static_cast<pid_t>(v);
        if (pid == except || known.has(pid)) continue;
        pid_t ppid = 0;
        bool zombie = false;
        if (!read_stat(pid, ppid, zombie) || !known.has(ppid)) continue;
        known.add(pid);
        found = true;
        if (!zombie && sig > 0 && ::kill(pid, sig) == 0) ++signalled;
      }
    }
    ::close(dir);
    if (!found) break;
  }
  return signalled;
}

int64_t now_ms() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t(t.tv_sec) * 1000 + t.tv_nsec / 1000000;
}

// Reaps every child that has ended; true when this process has no child at all any more.
bool reap_all() {
  for (;;) {
    const pid_t r = ::waitpid(-1, nullptr, WNOHANG | __WALL);
    if (r > 0) continue;
    if (r < 0 && errno == EINTR) continue;
    return r < 0 && errno == ECHILD;
  }
}

}  // namespace

void become_subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }

int signal_descendants(int sig, pid_t except) {
  Known known;
  known.add(::getpid());
  return signal_tree(known, sig, except);
}

bool kill_descendants(int limit_ms) {
  const int64_t deadline = now_ms() + limit_ms;
  for (int round = 0;; ++round) {
    if (reap_all()) return true;  // no child: no descendant either
    Known known;
    known.add(::getpid());
    signal_tree(known, SIGKILL, -1);
    if (reap_all()) return true;
    if (now_ms() >= deadline) return false;
    // The killed are still exiting (their children move to us as they go): a moment, then again.
    timespec pause{0, (round < 10 ? 1 : 10) * 1000000L};
    ::nanosleep(&pause, nullptr);
  }
}

}  // namespace skyforge::reaper
