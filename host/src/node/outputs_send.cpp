// A node's job outputs: which files go back to the client and their streaming (outputs_send.hpp).
#include "outputs_send.hpp"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "bounded_archive.hpp"

namespace skyforge {
namespace {

namespace fs = std::filesystem;

// A relative path's parts ("a/b/c": a, b, c).
std::vector<std::string> parts_of(std::string_view path) {
  std::vector<std::string> parts;
  for (const fs::path& part : fs::path(path)) parts.push_back(part.string());
  return parts;
}

bool match_parts(const std::vector<std::string>& g, size_t gi, const std::vector<std::string>& p, size_t pi, bool prefix) {
  if (gi == g.size()) return pi == p.size();
  if (g[gi] == "**") {
    for (size_t k = pi;; ++k) {
      if (match_parts(g, gi + 1, p, k, prefix)) return true;
      if (k == p.size()) return prefix;  // the path ends inside "**": anything below may match
      if (!p[k].empty() && p[k].front() == '.') return false;  // "**" skips no hidden part
    }
  }
  if (pi == p.size()) return prefix;  // the glob goes on below this directory
  const std::string &pattern = g[gi], &name = p[pi];
  return ::fnmatch(pattern.c_str(), name.c_str(), FNM_PERIOD) == 0 && match_parts(g, gi + 1, p, pi + 1, prefix);
}

// What is not sent, listed (the first few) and counted.
void note_left(msg::OutputsEnd& end, const std::string& name, uint64_t size, msg::OutputLeft::Why why) {
  if (end.left.size() < msg::kOutputsLeftListed) end.left.push_back(msg::OutputLeft{name, size, why});
  end.left_files += 1;
  end.left_bytes += size;
}

// A directory's entries, sorted by name (the order a node sends its files in).
std::vector<fs::directory_entry> entries(const fs::path& dir) {
  std::vector<fs::directory_entry> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) out.push_back(*it);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.path().filename() < b.path().filename(); });
  return out;
}

// The plan as plan_outputs() builds it: files in the order they are offered, each name once.
class Planner {
 public:
  explicit Planner(uint64_t cap) : cap_(cap) {}

  // Every file under `dir` (named `prefix` + its path under it).
  void take_tree(const fs::path& base, const std::string& name_prefix) {
    for (const auto& e : entries(base / name_prefix)) {
      const std::string name = name_prefix + e.path().filename().string();
      if (is_dir(e)) take_tree(base, name + "/");
      else offer(base, name, e);
    }
  }

  // The files under `base` that a glob matches.
  void take_matches(const fs::path& base, const std::string& name_prefix, const std::vector<std::string>& globs) {
    for (const auto& e : entries(base / name_prefix)) {
      const std::string name = name_prefix + e.path().filename().string();
      if (name == ".skyforge") continue;  // the worker's own: pip packages, the output directory
      auto any = [&](bool prefix) {
        return std::any_of(globs.begin(), globs.end(), [&](const std::string& g) { return glob_matches(g, name, prefix); });
      };
      if (any(false)) {
        if (is_dir(e)) take_tree(base, name + "/");
        else offer(base, name, e);
      } else if (is_dir(e) && any(true)) {
        take_matches(base, name + "/", globs);
      }
    }
  }

  OutputsPlan plan;

 private:
  static bool is_dir(const fs::directory_entry& e) {
    std::error_code ec;
    return e.symlink_status(ec).type() == fs::file_type::directory;  // a symlink to one is not followed
  }

  void offer(const fs::path& base, const std::string& name, const fs::directory_entry& e) {
    if (!names_.insert(name).second) return;  // the output directory's file of that name goes
    std::error_code ec;
    const bool regular = e.symlink_status(ec).type() == fs::file_type::regular;
    const uint64_t size = regular ? e.file_size(ec) : 0;
    if (!regular || ec) return leave(name, size, !regular ? msg::OutputLeft::not_regular : msg::OutputLeft::unreadable);
    if (msg::output_name_problem(name)) return leave(name, size, msg::OutputLeft::bad_name);
    if (plan.files.size() >= kMaxOutputFiles) return leave(name, size, msg::OutputLeft::too_many);
    if (size > cap_ - plan.bytes) return leave(name, size, msg::OutputLeft::over_cap);
    plan.files.push_back(OutputFile{base.string(), name, size});
    plan.bytes += size;
  }

  void leave(const std::string& name, uint64_t size, msg::OutputLeft::Why why) { note_left(plan.left, name, size, why); }

  const uint64_t cap_;
  std::set<std::string> names_;
};

// `rel` under `base`, opened for reading without following a symlink at any of its parts.
int open_beneath(const std::string& base, const std::string& rel) {
  const std::vector<std::string> parts = parts_of(rel);
  int dir = parts.empty() ? -1 : ::open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  for (size_t i = 0; dir >= 0 && i < parts.size(); ++i) {
    const std::string& part = parts[i];
    const bool last = i + 1 == parts.size();
    const int next = ::openat(dir, part.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (last ? O_NONBLOCK : O_DIRECTORY));
    const int saved = errno;
    ::close(dir);
    errno = saved;
    if (last) return next;
    dir = next;
  }
  return -1;
}

// Reads up to `want` bytes into `buf`; "" or the error.
std::string read_up_to(int fd, std::string& buf, size_t want) {
  buf.resize(want);
  size_t got = 0;
  while (got < want) {
    const ssize_t n = ::read(fd, buf.data() + got, want - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      buf.resize(got);
      return std::strerror(errno);
    }
    if (n == 0) break;
    got += size_t(n);
  }
  buf.resize(got);
  return "";
}

}  // namespace

bool glob_matches(std::string_view glob, std::string_view path, bool prefix) {
  return match_parts(parts_of(glob), 0, parts_of(path), 0, prefix);
}

OutputsPlan plan_outputs(const std::string& output_dir, const std::string& work_dir,
                         const std::vector<std::string>& globs, uint64_t cap) {
  Planner p(cap);
  p.take_tree(output_dir, "");
  if (!globs.empty()) p.take_matches(work_dir, "", globs);
  return std::move(p.plan);
}

void send_outputs(OutputsPlan plan, const std::function<void(msg::Type, std::string)>& send, OutputWindow& window,
                  const std::function<bool()>& gone) {
  send(msg::Type::OutputsBegin, net::serialize(msg::OutputsBegin{plan.files.size(), plan.bytes}));
  std::string buf;
  for (const OutputFile& f : plan.files) {
    if (gone()) return;
    const int fd = open_beneath(f.base, f.name);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      const bool link = fd < 0 ? errno == ELOOP || errno == ENOTDIR : true;
      note_left(plan.left, f.name, f.size, link ? msg::OutputLeft::not_regular : msg::OutputLeft::unreadable);
      if (fd >= 0) ::close(fd);
      continue;
    }
    msg::OutputChunk c;
    c.path = f.name;
    for (uint64_t left = f.size; !c.last;) {
      const size_t want = size_t(std::min<uint64_t>(left, msg::kOutputChunk));
      c.error = read_up_to(fd, buf, want);
      left -= buf.size();
      c.last = !c.error.empty() || buf.size() < want || left == 0;  // a file that shrank ends early
      window.acquire(buf.size());
      c.data.swap(buf);
      send(msg::Type::OutputChunk, net::serialize(c));
      c.path.clear();
      if (!c.last && gone()) break;
    }
    ::close(fd);
    if (!c.error.empty()) note_left(plan.left, f.name, f.size, msg::OutputLeft::unreadable);
  }
  send(msg::Type::OutputsEnd, net::serialize(plan.left));
}

}  // namespace skyforge
