// Another local user racing the ssh provider for its ControlMaster sockets (test_ssh_e2e's
// AnotherUserCannotTakeTheControlSockets): started as root, it becomes `uid`:`gid` at once, then
// watches every process's command line for `ControlPath=<path>` under `watch_dir` and, the moment
// one shows up (the master's command line is public, and ssh binds the path only once it has
// authenticated), binds unix sockets of its own where a client would look:
//   - the path itself, and its siblings h0..h7 (the private directory of today's provider);
//   - "<prefix>-h0".."<prefix>-h7" for a path ending in "-h<digit>", and
//     "<watch_dir>/skyforge-ssh-<pool>-h0..7" once a pool id shows on a command line (the old
//     predictable names).
// Each client that connects is answered as an OpenSSH master would (the mux hello), and what it
// sends — its request and the descriptors it passes (its stdin among them) — is read: the
// session's input, the pool secret with it, were it ever connected.
//
// It writes one line per event to `report` (opened before it drops root):
//   ready uid=U | seen PATH | bound PATH | denied PATH REASON | connected PATH | stole N bytes |
//   secret
// SIGTERM: it removes the sockets it bound and leaves.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

volatile sig_atomic_t stop = 0;
int report_fd = -1;

void report(const std::string& line) {
  std::string l = line + "\n";
  (void)!::write(report_fd, l.data(), l.size());
}

struct Listener {
  std::string path;
  int fd;
};

int bind_at(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) return -ENAMETOOLONG;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return -errno;
  ::umask(0);
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s, 16) != 0) {
    int e = errno;
    ::close(s);
    return -e;
  }
  ::chmod(path.c_str(), 0777);
  return s;
}

// Everything a connected client sends within `ms`, and the descriptors it passes.
void serve(int c, std::string& data, std::vector<int>& fds, int ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0) return;
    pollfd p{c, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) continue;
    char buf[4096];
    char control[CMSG_SPACE(sizeof(int) * 8)];
    iovec iov{buf, sizeof buf};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(c, &m, MSG_CMSG_CLOEXEC);
    if (n <= 0) return;
    data.append(buf, size_t(n));
    for (cmsghdr* h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
      if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
        for (size_t i = 0; i < (h->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
          fds.push_back(fd);
        }
  }
}

// What the command lines show: ControlPath=<path> under `watch`, and the pool ids of the node
// sessions' remote directories (".../pools/'<12 hex digits>'/...") into `pools`.
std::vector<std::string> control_paths(const std::string& watch, std::set<std::string>& pools) {
  std::vector<std::string> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    int fd = ::open((std::string("/proc/") + e->d_name + "/cmdline").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // gone already
    std::string cmd;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) cmd.append(buf, size_t(n));
    ::close(fd);
    for (size_t at = 0; (at = cmd.find("ControlPath=", at)) != std::string::npos;) {
      at += 12;
      std::string p = cmd.substr(at, cmd.find('\0', at) - at);
      if (p.rfind(watch + "/", 0) == 0) out.push_back(p);
    }
    for (size_t at = 0; (at = cmd.find("/pools/", at)) != std::string::npos;) {
      at += 7;
      size_t b = at + (at < cmd.size() && cmd[at] == '\'' ? 1 : 0), e = b;
      while (e < cmd.size() && std::isxdigit(static_cast<unsigned char>(cmd[e]))) ++e;
      if (e - b == 12) pools.insert(cmd.substr(b, 12));
    }
  }
  ::closedir(d);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s WATCH_DIR REPORT UID GID\n", argv[0]);
    return 2;
  }
  const std::string watch = argv[1];
  report_fd = ::open(argv[2], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (report_fd < 0) return 2;
  const uid_t uid = uid_t(std::stoul(argv[3]));
  const gid_t gid = gid_t(std::stoul(argv[4]));
  if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0 || ::geteuid() != uid || ::setuid(0) == 0) {
    std::perror("dropping root");
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = [](int) { stop = 1; };
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  report("ready uid=" + std::to_string(::geteuid()));

  std::set<std::string> seen, tried;
  std::vector<Listener> mine;
  std::vector<int> stolen_fds;
  std::string stolen;
  bool secret = false;
  auto attempt = [&](const std::string& path) {
    if (!tried.insert(path).second) return;
    int s = bind_at(path);
    if (s >= 0) {
      mine.push_back({path, s});
      report("bound " + path);
    } else {
      report("denied " + path + " " + std::strerror(-s));
    }
  };
  std::set<std::string> pools;
  while (!stop) {
    for (const auto& p : control_paths(watch, pools)) {
      if (!seen.insert(p).second) continue;
      report("seen " + p);
      attempt(p);
      const std::string dir = p.substr(0, p.rfind('/'));
      for (int i = 0; i < 8; ++i) attempt(dir + "/h" + std::to_string(i));
      if (p.size() > 3 && p[p.size() - 3] == '-' && p[p.size() - 2] == 'h' && std::isdigit(static_cast<unsigned char>(p.back())))
        for (int i = 0; i < 8; ++i) attempt(p.substr(0, p.size() - 1) + std::to_string(i));
    }
    // The old predictable names, $TMPDIR/skyforge-ssh-<pool>-h<i>, once a pool id shows.
    for (const auto& id : pools)
      for (int i = 0; i < 8; ++i) attempt(watch + "/skyforge-ssh-" + id + "-h" + std::to_string(i));
    for (auto& l : mine) {
      int c = ::accept4(l.fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      report("connected " + l.path);
      // The master's hello: MUX_MSG_HELLO, protocol version 4.
      const unsigned char hello[] = {0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 4};
      (void)!::write(c, hello, sizeof hello);
      std::string request;
      std::vector<int> fds;
      serve(c, request, fds, 2000);
      stolen += request;
      stolen_fds.insert(stolen_fds.end(), fds.begin(), fds.end());
      for (int fd : fds) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      ::close(c);
    }
    for (int fd : stolen_fds) {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) {
        stolen.append(buf, size_t(n));
        report("stole " + std::to_string(n) + " bytes");
      }
    }
    if (!secret && stolen.find("SKYFORGE_POOL_SECRET") != std::string::npos) {
      secret = true;
      report("secret");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& l : mine) ::unlink(l.path.c_str());
  return 0;
}
