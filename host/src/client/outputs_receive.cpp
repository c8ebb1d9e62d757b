// The nodes' job files, received and written under <dir>/node-<N>/ (outputs_receive.hpp).
#include "outputs_receive.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "bounded_archive.hpp"
#include "run_output.hpp"
#include "toml_reader.hpp"

namespace skyforge {
namespace {

using toml_in::quote;

constexpr mode_t kDirMode = 0750, kFileMode = 0640;  // the user's, readable by the group, never the world's to write

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// The directory `name` in `dir` (made if missing), opened without following a symlink.
int open_dir_at(int dir, const std::string& name) {
  if (::mkdirat(dir, name.c_str(), kDirMode) != 0 && errno != EEXIST) return -1;
  return ::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

const char* why_left(uint8_t why) {
  switch (why) {
    case msg::OutputLeft::over_cap: return "over [job] outputs_max_bytes";
    case msg::OutputLeft::not_regular: return "not a regular file (a symlink, a socket, a device): not followed";
    case msg::OutputLeft::unreadable: return "could not be read";
    case msg::OutputLeft::too_many: return "more files than a node sends";
    case msg::OutputLeft::bad_name: return "a name the client refuses";
    default: return "left behind";
  }
}

}  // namespace

std::string byte_text(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = double(bytes) / 1024;
  size_t u = 0;
  for (; v >= 1024 && u + 1 < std::size(units); ++u) v /= 1024;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string outputs_dir(const Manifest& m, const RunOptions& options, const std::string& pool_id) {
  if (!options.outputs_dir.empty()) return detail::normalise_path(options.outputs_dir);
  if (!m.job.outputs_dir.empty()) return m.job.outputs_dir;
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
  return detail::normalise_path("skyforge-outputs/" + std::string(stamp) + "-" + pool_id);
}

struct OutputsReceiver::Node {
  uint32_t rank = 0;
  bool begun = false, ended = false, stopped = false;  // stopped: nothing more is taken from it
  uint64_t files = 0, bytes = 0;                       // announced
  uint64_t files_in = 0, bytes_in = 0;                 // written under their names
  std::unique_ptr<OutputAcks> acks;
  Clock::time_point started{}, heard{}, progress_said{};
  // the file coming in
  bool in_file = false, skipping = false;  // skipping: its chunks are dropped (refused, or failed)
  std::string name, tmp, final_part;
  int dir_fd = -1, fd = -1;
  uint64_t written = 0;
};

OutputsReceiver::OutputsReceiver(std::string dir, uint64_t cap, uint32_t nodes, Say say, Clock::duration progress_every)
    : dir_(std::move(dir)), cap_(cap), say_(std::move(say)), progress_every_(progress_every) {
  for (uint32_t i = 0; i < nodes; ++i) {
    nodes_.push_back(std::make_unique<Node>());
    nodes_.back()->rank = i;
  }
}

OutputsReceiver::~OutputsReceiver() { finish(); }

std::string OutputsReceiver::node_dir(uint32_t node) const { return dir_ + "/node-" + std::to_string(node); }

void OutputsReceiver::on_frame(uint32_t node, msg::Type type, std::string_view payload,
                               const std::function<void(uint64_t)>& ack) {
  std::lock_guard<std::mutex> lock(mu_);
  if (node >= nodes_.size()) return;
  Node& n = *nodes_[node];
  if (n.stopped) return;
  n.heard = Clock::now();
  if (!n.acks) n.acks = std::make_unique<OutputAcks>(ack, msg::kOutputsWindow);
  try {
    switch (type) {
      case msg::Type::OutputsBegin:
        if (n.begun) throw std::runtime_error("a second OutputsBegin");
        on_begin(n, net::deserialize<msg::OutputsBegin>(payload));
        break;
      case msg::Type::OutputChunk:
        if (!n.begun || n.ended) throw std::runtime_error("a file outside OutputsBegin ... OutputsEnd");
        on_chunk(n, net::deserialize<msg::OutputChunk>(payload));
        break;
      default:
        if (!n.begun || n.ended || n.in_file) throw std::runtime_error("an OutputsEnd out of place");
        on_end(n, net::deserialize<msg::OutputsEnd>(payload));
        break;
    }
  } catch (const std::exception& e) {
    if (n.in_file && !n.skipping) drop_file(n, "");
    n.stopped = true;
    say_("node " + std::to_string(node) + ": its files are refused from here on: " + e.what());
  }
}

void OutputsReceiver::on_begin(Node& n, const msg::OutputsBegin& b) {
  n.begun = true;
  n.files = b.files;
  n.bytes = b.bytes;
  n.started = n.progress_said = n.heard;
}

void OutputsReceiver::on_chunk(Node& n, msg::OutputChunk&& c) {
  if (c.data.size() > msg::kOutputChunk) throw std::runtime_error("a chunk of " + byte_text(c.data.size()));
  if (!c.path.empty()) {
    if (n.in_file) throw std::runtime_error("a new file before " + quote(n.name) + " ended");
    n.in_file = true;
    n.skipping = false;
    n.name = c.path;
    n.written = 0;
    std::string why = msg::output_name_problem(c.path) ? std::string("its name ") + msg::output_name_problem(c.path)
                                                       : open_file(n, c.path);
    if (!why.empty()) {
      n.skipping = true;
      say_("node " + std::to_string(n.rank) + ": " + quote(c.path) + " not written: " + why);
    }
  } else if (!n.in_file) {
    throw std::runtime_error("a chunk of no file");
  }
  const size_t size = c.data.size();
  if (!n.skipping && n.bytes_in + n.written + size > cap_)
    drop_file(n, "it goes past [job] outputs_max_bytes = " + byte_text(cap_));
  for (size_t off = 0; !n.skipping && off < size;) {
    const ssize_t w = ::write(n.fd, c.data.data() + off, size - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) drop_file(n, errno_text("writing it"));
    else off += size_t(w);
  }
  if (!n.skipping) n.written += size;
  n.acks->done(size);
  if (c.last) {
    if (!n.skipping && !c.error.empty()) drop_file(n, "the node could not read it to its end: " + c.error);
    if (!n.skipping) {
      const int closed = ::close(n.fd);
      n.fd = -1;
      if (closed != 0 || ::renameat(n.dir_fd, n.tmp.c_str(), n.dir_fd, n.final_part.c_str()) != 0) {
        drop_file(n, errno_text("finishing it"));
      } else {
        n.files_in += 1;
        n.bytes_in += n.written;
        ::close(n.dir_fd);
        n.dir_fd = -1;
      }
    }
    n.in_file = n.skipping = false;
    n.written = 0;  // counted in bytes_in, or dropped
  }
  if (n.heard - n.started >= progress_every_ && n.heard - n.progress_said >= progress_every_) {
    n.progress_said = n.heard;
    say_("node " + std::to_string(n.rank) + ": receiving its files: " + byte_text(n.bytes_in + n.written) + " of " +
         byte_text(n.bytes) + " (" + std::to_string(n.files_in) + " of " + std::to_string(n.files) + " files)");
  }
}

void OutputsReceiver::on_end(Node& n, const msg::OutputsEnd& e) {
  n.ended = true;
  const std::string who = "node " + std::to_string(n.rank) + ": ";
  for (const auto& l : e.left)
    say_(who + "left on the node: " + quote(l.path) +
         (l.why == msg::OutputLeft::not_regular ? "" : " (" + byte_text(l.size) + ")") + ": " + why_left(l.why) +
         (l.why == msg::OutputLeft::over_cap ? " = " + byte_text(cap_) : ""));
  if (e.left_files > e.left.size())
    say_(who + "and " + std::to_string(e.left_files - e.left.size()) + " more files left on the node (" +
         byte_text(e.left_bytes) + " in all left behind)");
}

std::string OutputsReceiver::open_file(Node& n, const std::string& name) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(dir_).parent_path(), ec);
  if (::mkdir(dir_.c_str(), kDirMode) != 0 && errno != EEXIST) return errno_text("making " + dir_);
  int dir = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return errno_text("opening " + dir_);
  std::string part = "node-" + std::to_string(n.rank);
  for (size_t b = 0;;) {  // node-<N>, then each directory of `name`, made if missing, never through a symlink
    const int next = open_dir_at(dir, part);
    const int saved = errno;
    ::close(dir);
    if (next < 0) {
      errno = saved;
      return errno_text("opening its directory " + quote(part));
    }
    dir = next;
    const size_t e = name.find('/', b);
    if (e == std::string::npos) {
      n.final_part = name.substr(b);
      break;
    }
    part = name.substr(b, e - b);
    b = e + 1;
  }
  for (int k = 0; k < 100 && n.fd < 0; ++k) {  // a temporary name that is free (a killed run may have left one)
    n.tmp = ".skyforge-part-" + std::to_string(::getpid()) + "-" + std::to_string(k);
    n.fd = ::openat(dir, n.tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, kFileMode);
    if (n.fd < 0 && errno != EEXIST) break;
  }
  if (n.fd < 0) {
    const std::string why = errno_text("creating it");
    ::close(dir);
    return why;
  }
  n.dir_fd = dir;
  return "";
}

void OutputsReceiver::drop_file(Node& n, const std::string& why) {
  if (n.fd >= 0) ::close(n.fd);
  if (n.dir_fd >= 0) {
    ::unlinkat(n.dir_fd, n.tmp.c_str(), 0);
    ::close(n.dir_fd);
  }
  n.fd = n.dir_fd = -1;
  n.skipping = true;
  if (!why.empty()) say_("node " + std::to_string(n.rank) + ": " + quote(n.name) + " not written: " + why);
}

void OutputsReceiver::cut_short(Node& n) {
  if (!n.begun || n.ended || n.stopped) return;
  n.stopped = true;
  std::string during;
  if (n.in_file) {
    during = " during " + quote(n.name);
    if (!n.skipping) drop_file(n, "");
  }
  say_("node " + std::to_string(n.rank) + ": its files stopped coming" + during + " (" + std::to_string(n.files_in) +
       " of " + std::to_string(n.files) + " came): what it had not sent is lost");
}

void OutputsReceiver::on_closed(uint32_t node) {
  std::lock_guard<std::mutex> lock(mu_);
  if (node < nodes_.size()) cut_short(*nodes_[node]);
}

bool OutputsReceiver::busy(Clock::duration idle) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  for (const auto& n : nodes_)
    if (n->begun && !n->ended && !n->stopped && now - n->heard < idle) return true;
  return false;
}

void OutputsReceiver::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  uint64_t files = 0, bytes = 0, from = 0;
  for (auto& n : nodes_) {
    cut_short(*n);
    n->stopped = true;
    files += n->files_in;
    bytes += n->bytes_in;
    from += n->files_in > 0 ? 1 : 0;
  }
  if (files > 0)
    say_("the job's files: " + std::to_string(files) + (files == 1 ? " file (" : " files (") + byte_text(bytes) + ") from " +
         std::to_string(from) + (from == 1 ? " node in " : " nodes in ") + dir_);
}

}  // namespace skyforge
