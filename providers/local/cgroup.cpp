#include "cgroup.hpp"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace skyforge::local::cgroup {

namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// mountinfo escapes spaces etc. as \ooo.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      out.push_back(static_cast<char>(std::strtol(s.substr(i + 1, 3).c_str(), nullptr, 8)));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

bool write_file(const fs::path& p, const std::string& text) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n;
  do n = ::write(fd, text.data(), text.size());
  while (n < 0 && errno == EINTR);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  return n == ssize_t(text.size());
}

// `dir` and the cgroups under it, parents before children.
std::vector<fs::path> tree(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  out.push_back(dir);
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_directory(ec)) out.push_back(it->path());
  return out;
}

}  // namespace

fs::path usable_base(std::string& why) {
  if (const char* sw = std::getenv("SKYFORGE_CGROUP"); sw && std::string(sw) == "off") {
    why = "SKYFORGE_CGROUP=off";
    return {};
  }
  // This process's cgroup on the unified hierarchy: the "0::" line.
  std::string self;
  {
    std::istringstream in(slurp("/proc/self/cgroup"));
    for (std::string line; std::getline(in, line);)
      if (line.rfind("0::", 0) == 0) self = line.substr(3);
  }
  if (self.empty() || self[0] != '/') {
    why = "this process is in no cgroup v2 (/proc/self/cgroup has no \"0::\" line)";
    return {};
  }
  // The cgroup2 mount: /sys/fs/cgroup when it is one, else the first (hybrid systems: .../unified).
  fs::path mount;
  std::string mount_root;
  {
    std::istringstream in(slurp("/proc/self/mountinfo"));
    for (std::string line; std::getline(in, line);) {
      // id parent major:minor root mount-point options [optional...] - fstype source super-options
      std::istringstream f(line);
      std::string id, parent, dev, root, point;
      f >> id >> parent >> dev >> root >> point;
      const auto dash = line.find(" - ");
      if (dash == std::string::npos) continue;
      std::istringstream t(line.substr(dash + 3));
      std::string fstype;
      t >> fstype;
      if (fstype != "cgroup2") continue;
      if (mount.empty() || unescape(point) == "/sys/fs/cgroup") {
        mount = unescape(point);
        mount_root = unescape(root);
      }
    }
  }
  if (mount.empty()) {
    why = "no cgroup2 file system is mounted";
    return {};
  }
  // A cgroup namespace or a bind mount may show only part of the hierarchy.
  if (mount_root != "/" && self.rfind(mount_root + "/", 0) != 0 && self != mount_root) {
    why = "this process's cgroup " + self + " is not under the mount " + mount.string();
    return {};
  }
  std::string rel = mount_root == "/" ? self : self.substr(mount_root.size());
  fs::path base = mount / fs::path(rel).relative_path();
  if (::access(base.c_str(), W_OK | X_OK) != 0 || ::access((base / "cgroup.procs").c_str(), W_OK) != 0) {
    why = "cgroup " + base.string() + " is not writable (" + std::strerror(errno) + ")";
    return {};
  }
  return base;
}

void make(const fs::path& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0)
    throw std::runtime_error("cannot create cgroup " + dir.string() + ": " + std::strerror(errno));
}

std::vector<pid_t> procs(const fs::path& dir) {
  std::vector<pid_t> out;
  for (const auto& d : tree(dir)) {
    std::istringstream in(slurp(d / "cgroup.procs"));
    for (long pid; in >> pid;) out.push_back(static_cast<pid_t>(pid));
  }
  return out;
}

bool populated(const fs::path& dir) {
  std::istringstream in(slurp(dir / "cgroup.events"));
  for (std::string key, value; in >> key >> value;)
    if (key == "populated") return value == "1";
  return false;
}

void kill(const fs::path& dir) {
  if (write_file(dir / "cgroup.kill", "1")) return;
  for (pid_t pid : procs(dir)) ::kill(pid, SIGKILL);  // before 5.14: one by one
}

void signal(const fs::path& dir, int sig) {
  for (pid_t pid : procs(dir)) ::kill(pid, sig);
}

std::string remove(const fs::path& dir) {
  auto all = tree(dir);
  std::string problems;
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (::rmdir(it->c_str()) != 0 && errno != ENOENT)
      problems += (problems.empty() ? "" : "; ") + std::string("cgroup ") + it->string() + ": " + std::strerror(errno);
  return problems;
}

}  // namespace skyforge::local::cgroup
