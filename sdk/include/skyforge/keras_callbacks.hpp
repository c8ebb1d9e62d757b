// skyforge Keras-like API: the pieces fit() uses around the training loop, usable on their own.
//
//   format_progress(...)   one Keras-style progress line (pure function)
//   ProgressBar            prints it: in place with \r on a TTY, else a line every N% of an epoch
//   History, history_csv   per-epoch metrics; the CSVLogger file format (epoch,accuracy,loss,...)
//   Checkpoint             header + backend state bytes; encode/decode, atomic file writes
//   CheckpointLock         one run per checkpoint directory; clean_checkpoint_dir, the leftovers
//
// No backend, no communicator: everything here is local and deterministic. keras.hpp drives it.
#pragma once

#include <skyforge/layer_schema.hpp>
#include <skyforge/tfevents.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <ctime>

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

namespace skyforge::keras {

// Metric name -> value for one epoch ("loss", "accuracy", "val_loss", ...).
using Logs = std::map<std::string, double>;

// Shortest text that reads back as the same double (like Python's repr): 0.1 -> "0.1".
inline std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// ---- progress bar ---------------------------------------------------------------------------
// Keras' metric formatting: " %.4f" when |v| > 1e-3, else " %.4e".
inline std::string format_metric_value(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, std::fabs(v) > 1e-3 ? "%.4f" : "%.4e", v);
  return buf;
}

// Keras' ETA: "1:02:03" above an hour, "2:03" above a minute, else "7s".
inline std::string format_eta(double seconds) {
  const auto s = static_cast<int64_t>(seconds < 0 ? 0 : seconds);
  char buf[48];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>((s % 3600) / 60), static_cast<long long>(s % 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  return buf;
}

// Keras' per-step time: "2s/step", "35ms/step", "120us/step".
inline std::string format_time_per_step(double seconds) {
  char buf[48];
  if (seconds >= 1 || seconds <= 0)
    std::snprintf(buf, sizeof buf, "%.0fs/step", seconds);
  else if (seconds >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.0fms/step", seconds * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0fus/step", seconds * 1e6);
  return buf;
}

struct ProgressState {
  uint64_t current = 0;   // steps done
  uint64_t target = 0;    // steps in the epoch
  double elapsed_s = 0;   // since the epoch started
  bool finished = false;  // the epoch's last line: total time instead of an ETA
  std::vector<std::pair<std::string, double>> metrics;  // in display order
  double samples_per_s = -1;                            // < 0: not shown
};

// One line, Keras style:
//   " 12/469 [>.............................] - ETA: 41s - loss: 1.2034 - accuracy: 0.5712 - 12345 samples/s"
//   "469/469 [==============================] - 3s 6ms/step - loss: 0.5123 - accuracy: 0.8234 - 12345 samples/s"
inline std::string format_progress(const ProgressState& p, int width = 30) {
  std::string line;
  const uint64_t target = p.target;
  const std::string t = std::to_string(target);
  std::string c = std::to_string(p.current);
  if (c.size() < t.size()) c.insert(0, t.size() - c.size(), ' ');
  line += c + "/" + t + " [";
  const double frac = target ? std::min(1.0, static_cast<double>(p.current) / static_cast<double>(target)) : 1.0;
  const int filled = static_cast<int>(width * frac);
  if (filled > 0) {
    line.append(static_cast<size_t>(filled - 1), '=');
    line += (p.current < target) ? '>' : '=';
  }
  line.append(static_cast<size_t>(width - filled), '.');
  line += "]";
  const double per_step = p.current ? p.elapsed_s / static_cast<double>(p.current) : 0.0;
  if (p.finished) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " - %.0fs ", p.elapsed_s);
    line += buf + format_time_per_step(per_step);
  } else {
    line += " - ETA: " + format_eta(per_step * static_cast<double>(target - std::min(target, p.current)));
  }
  for (const auto& [name, value] : p.metrics) line += " - " + name + ": " + format_metric_value(value);
  if (p.samples_per_s >= 0) {
    char buf[48];
    std::snprintf(buf, sizeof buf, " - %.0f samples/s", p.samples_per_s);
    line += buf;
  }
  return line;
}

// Prints an epoch's progress to `out`:
//  - tty: one line rewritten in place with \r, at most every `min_interval_s`;
//  - not a tty (skyforge streams worker stdout line by line): a full line each time another
//    `line_percent` % of the epoch is done, so an epoch prints at most 100 / line_percent lines;
//  - finish(): the final line (with validation metrics), then a newline.
class ProgressBar {
 public:
  ProgressBar(uint64_t target, std::FILE* out, bool tty, int line_percent = 10, double min_interval_s = 0.1)
      : target_(target), out_(out), tty_(tty), line_percent_(std::clamp(line_percent, 1, 100)),
        min_interval_s_(min_interval_s) {}

  // Whether update() with `current` steps done at `elapsed_s` would print: fit() reads the
  // engine's deferred results back only then (docs/compute-backends.md, "Bound data").
  bool due(uint64_t current, double elapsed_s) const {
    if (!out_ || current >= target_) return false;  // the last step is finish()'s
    if (tty_) return !printed_ || elapsed_s - last_print_s_ >= min_interval_s_;
    return bucket_of(current) > last_bucket_;
  }

  // Returns true when it printed.
  bool update(const ProgressState& s) {
    if (!due(s.current, s.elapsed_s)) return false;
    if (tty_) {
      write_tty(format_progress(s));
    } else {
      last_bucket_ = bucket_of(s.current);
      std::fprintf(out_, "%s\n", format_progress(s).c_str());
      std::fflush(out_);
    }
    printed_ = true;
    last_print_s_ = s.elapsed_s;
    return true;
  }
  void finish(ProgressState s) {
    if (!out_) return;
    s.finished = true;
    const std::string line = format_progress(s);
    if (tty_) {
      write_tty(line);
      std::fputc('\n', out_);
    } else {
      std::fprintf(out_, "%s\n", line.c_str());
    }
    std::fflush(out_);
  }

 private:
  // Line k is due once current/target reaches k * line_percent %.
  uint64_t bucket_of(uint64_t current) const {
    const uint64_t pct = target_ ? (current * 100) / target_ : 100;
    return pct / static_cast<uint64_t>(line_percent_);
  }
  void write_tty(const std::string& line) {
    std::string s = "\r" + line;
    if (line.size() < last_len_) s.append(last_len_ - line.size(), ' ');  // clear a longer previous line
    last_len_ = line.size();
    std::fwrite(s.data(), 1, s.size(), out_);
    std::fflush(out_);
  }
  uint64_t target_;
  std::FILE* out_;
  bool tty_;
  int line_percent_;
  double min_interval_s_;
  bool printed_ = false;
  double last_print_s_ = 0;
  uint64_t last_bucket_ = 0;
  size_t last_len_ = 0;
};

// ---- history and the CSV log -----------------------------------------------------------------
// What fit() returns: Keras' History.history, plus the epoch indices (0-based, as Keras').
struct History {
  std::vector<uint32_t> epoch;
  std::map<std::string, std::vector<double>> history;  // "loss", "accuracy", "val_loss", ...

  void append(uint32_t e, const Logs& logs) {
    const size_t row = epoch.size();
    epoch.push_back(e);
    for (const auto& [k, v] : logs) {
      auto& col = history[k];
      col.resize(row, std::nan(""));  // a metric first seen now: earlier epochs have none
      col.push_back(v);
    }
    for (auto& [k, col] : history) col.resize(row + 1, std::nan(""));
  }
  const std::vector<double>& operator[](const std::string& key) const {
    auto it = history.find(key);
    if (it == history.end()) throw std::out_of_range("History: no metric '" + key + "'");
    return it->second;
  }
  bool has(const std::string& key) const { return history.count(key) != 0; }
  size_t size() const { return epoch.size(); }
  Logs row(size_t i) const {
    Logs l;
    for (const auto& [k, col] : history) l[k] = col.at(i);
    return l;
  }
};

// Keras' CSVLogger format: header "epoch" + the metric names sorted, one row per epoch, the
// epoch 0-based, values in shortest round-trip form.
inline std::string history_csv(const History& h, char sep = ',') {
  std::string out = "epoch";
  for (const auto& [k, col] : h.history) out += sep + k;
  out += "\n";
  for (size_t i = 0; i < h.epoch.size(); ++i) {
    out += std::to_string(h.epoch[i]);
    for (const auto& [k, col] : h.history) out += sep + format_double(col[i]);
    out += "\n";
  }
  return out;
}

// Reads history_csv() back. Throws std::runtime_error on a malformed text.
inline History parse_history_csv(std::string_view text, char sep = ',') {
  auto split = [sep](std::string_view line) {
    std::vector<std::string_view> f;
    size_t start = 0;
    for (;;) {
      const size_t p = line.find(sep, start);
      f.push_back(line.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
      if (p == std::string_view::npos) break;
      start = p + 1;
    }
    return f;
  };
  std::vector<std::string_view> lines;
  for (size_t start = 0; start < text.size();) {
    size_t p = text.find('\n', start);
    if (p == std::string_view::npos) p = text.size();
    if (p > start) lines.push_back(text.substr(start, p - start));
    start = p + 1;
  }
  History h;
  if (lines.empty()) return h;
  const auto header = split(lines[0]);
  if (header.empty() || header[0] != "epoch") throw std::runtime_error("history csv: header must start with 'epoch'");
  for (size_t r = 1; r < lines.size(); ++r) {
    const auto f = split(lines[r]);
    if (f.size() != header.size())
      throw std::runtime_error("history csv: row " + std::to_string(r) + " has " + std::to_string(f.size()) +
                               " fields, header has " + std::to_string(header.size()));
    uint32_t e = 0;
    if (std::from_chars(f[0].data(), f[0].data() + f[0].size(), e).ec != std::errc())
      throw std::runtime_error("history csv: bad epoch '" + std::string(f[0]) + "'");
    Logs logs;
    for (size_t i = 1; i < f.size(); ++i) {
      double v = 0;
      const std::string s(f[i]);
      if (s == "nan") v = std::nan("");
      else if (std::from_chars(s.data(), s.data() + s.size(), v).ec != std::errc())
        throw std::runtime_error("history csv: bad value '" + s + "'");
      logs[std::string(header[i])] = v;
    }
    h.append(e, logs);
  }
  return h;
}

// ---- files ---------------------------------------------------------------------------------
namespace detail {
// 16 hex digits from getrandom(2): the unguessable part of a temporary's name.
inline std::string random_suffix() {
  unsigned char b[8] = {};
  size_t got = 0;
  while (got < sizeof b) {
    const ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      throw std::runtime_error(std::string("cannot name a temporary file: getrandom: ") + std::strerror(errno));
    }
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (const unsigned char c : b) {
    s.push_back(kHex[c >> 4]);
    s.push_back(kHex[c & 15]);
  }
  return s;
}

// Creates a new file beside `path`, <path>.tmp.<random>, the way mkstemp(3) does: O_EXCL, so
// that nothing already there (a file, a symbolic link planted at the name, to a file or to
// nowhere) is ever opened, truncated or followed; another name is drawn then. `mode` is masked
// by the umask as open(2) does. Returns the descriptor; `tmp` is set to the name. next_suffix:
// the name's random part (a test hook).
inline int create_temporary(const std::filesystem::path& path, mode_t mode, std::filesystem::path& tmp,
                            std::string (*next_suffix)() = random_suffix) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp = path.string() + ".tmp." + next_suffix();
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0) return fd;
    if (errno == EEXIST || errno == ELOOP) continue;
    throw std::runtime_error("cannot create " + tmp.string() + ": " + std::strerror(errno));
  }
  throw std::runtime_error("cannot create a temporary file beside " + path.string() +
                           ": 100 random names were all taken (is someone planting files there?)");
}
}  // namespace detail

// Writes `bytes` to `path` atomically: a new temporary file beside it (<path>.tmp.<16 random hex
// digits>, created exclusively, never through a symbolic link: detail::create_temporary), fsync,
// rename over `path` (which replaces a link at `path` itself, never its target). Readers see the
// old file or the new one, never a torn one. The file's mode is `mode` less the umask.
inline void write_file_atomic(const std::filesystem::path& path, std::string_view bytes, mode_t mode = 0644) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) throw std::runtime_error("cannot create directory " + path.parent_path().string() + ": " + ec.message());
  std::filesystem::path tmp;
  const int fd = detail::create_temporary(path, mode, tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : EIO;
      ::close(fd);
      std::filesystem::remove(tmp, ec);
      throw std::runtime_error("cannot write " + tmp.string() + ": " + std::strerror(err));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    std::filesystem::remove(tmp, ec);
    throw std::runtime_error("cannot sync " + tmp.string() + ": " + std::strerror(err));
  }
  if (::close(fd) != 0) {
    const int err = errno;
    std::filesystem::remove(tmp, ec);
    throw std::runtime_error("cannot sync " + tmp.string() + ": " + std::strerror(err));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignore;
    std::filesystem::remove(tmp, ignore);
    throw std::runtime_error("cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
  }
}

inline std::string read_file(const std::filesystem::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rbe");
  if (!f) throw std::runtime_error("cannot open " + path.string() + ": " + std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad) throw std::runtime_error("cannot read " + path.string());
  return out;
}

// ---- checkpoints -----------------------------------------------------------------------------
// <dir>/ckpt-<epoch>.bin after an epoch, <dir>/ckpt-<epoch>-<epoch_step>.bin within one
// (Callbacks::checkpoint_every_steps), little-endian:
//   "SKYFCKPT"            8 bytes magic
//   u32 format            3 (formats 1 and 2 are read too: format 1, written before mid-epoch
//                         checkpoints, lacks the fields marked 2+ and 3+, format 2 those marked
//                         3+; they are then 0)
//   u32 epoch             epochs completed (training resumes at this 0-based epoch)
//   u64 step              train steps completed
//   u64 epoch_step     2+ steps of epoch `epoch` done (0: at its start)
//   f64 loss_sum       2+ that epoch's running sums so far, so that its logs come out the same:
//   u64 correct        2+   the loss summed over samples, the correct predictions and the
//   u64 seen           2+   samples seen
//   u64 seed           3+ the run's: fit()'s seed (data order), its global batch and steps per
//   u64 batch_size     3+   epoch, so that a resume by another run is refused (0: written
//   u64 steps_per_epoch 3+  outside fit(), not checked)
//   u64 fingerprint       FNV-1a 64 of the model spec text (architecture, optimizer kind, loss)
//   u32 n + bytes         the spec text itself (for the mismatch message)
//   u32 n + bytes         history_csv() so far
//   u64 n + bytes         the backend's state_dict()
//   u32 crc32c            of everything above
// <dir>/latest holds the file name of the newest checkpoint ("ckpt-3.bin\n"); <dir>/lock is the
// lock of the run writing there (CheckpointLock).
struct Checkpoint {
  uint32_t epoch = 0;
  uint64_t step = 0;
  uint64_t epoch_step = 0;  // > 0: a checkpoint within epoch `epoch` (0-based), after this many steps
  double loss_sum = 0;
  uint64_t correct = 0, seen = 0;
  uint64_t seed = 0, batch_size = 0, steps_per_epoch = 0;  // the run's (format 3+); batch_size 0: unknown
  uint64_t fingerprint = 0;
  std::string spec;
  std::string history;  // history_csv()
  std::string state;    // backend bytes
};

inline constexpr char kCheckpointMagic[8] = {'S', 'K', 'Y', 'F', 'C', 'K', 'P', 'T'};
inline constexpr uint32_t kCheckpointFormat = 3;

// FNV-1a, 64-bit.
inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

inline std::string encode_checkpoint(const Checkpoint& c) {
  std::string out(kCheckpointMagic, sizeof kCheckpointMagic);
  using tfevents::detail::put_le;
  put_le(out, kCheckpointFormat, 4);
  put_le(out, c.epoch, 4);
  put_le(out, c.step, 8);
  put_le(out, c.epoch_step, 8);
  uint64_t loss_bits = 0;
  std::memcpy(&loss_bits, &c.loss_sum, sizeof loss_bits);
  put_le(out, loss_bits, 8);
  put_le(out, c.correct, 8);
  put_le(out, c.seen, 8);
  put_le(out, c.seed, 8);
  put_le(out, c.batch_size, 8);
  put_le(out, c.steps_per_epoch, 8);
  put_le(out, c.fingerprint, 8);
  put_le(out, c.spec.size(), 4);
  out += c.spec;
  put_le(out, c.history.size(), 4);
  out += c.history;
  put_le(out, c.state.size(), 8);
  out += c.state;
  put_le(out, tfevents::crc32c(out.data(), out.size()), 4);
  return out;
}

// `name` is used in error messages only.
inline Checkpoint decode_checkpoint(std::string_view b, const std::string& name) {
  auto fail = [&](const std::string& why) { return std::runtime_error("checkpoint " + name + ": " + why); };
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  if (b.size() < sizeof kCheckpointMagic + 4 || std::memcmp(b.data(), kCheckpointMagic, sizeof kCheckpointMagic) != 0)
    throw fail("not a skyforge checkpoint (bad magic)");
  if (b.size() < 4 + 8 + 4 + 4 + 8 + 8 + 4 + 4 + 8) throw fail("truncated");
  const size_t body = b.size() - 4;
  if (tfevents::detail::get_le(p + body, 4) != tfevents::crc32c(b.data(), body))
    throw fail("checksum mismatch (truncated or corrupt file)");
  size_t at = sizeof kCheckpointMagic;
  auto take = [&](int n) -> uint64_t {
    if (at + static_cast<size_t>(n) > body) throw fail("truncated");
    const uint64_t v = tfevents::detail::get_le(p + at, n);
    at += static_cast<size_t>(n);
    return v;
  };
  auto take_bytes = [&](uint64_t n) -> std::string {
    if (n > body - at) throw fail("truncated");
    std::string s(b.substr(at, static_cast<size_t>(n)));
    at += static_cast<size_t>(n);
    return s;
  };
  const auto format = static_cast<uint32_t>(take(4));
  if (format < 1 || format > kCheckpointFormat)
    throw fail("format " + std::to_string(format) + " is not supported (this build reads formats 1 to " +
               std::to_string(kCheckpointFormat) + (format > kCheckpointFormat ? "; it was written by a newer skyforge)" : ")"));
  Checkpoint c;
  c.epoch = static_cast<uint32_t>(take(4));
  c.step = take(8);
  if (format >= 2) {
    c.epoch_step = take(8);
    const uint64_t loss_bits = take(8);
    std::memcpy(&c.loss_sum, &loss_bits, sizeof c.loss_sum);
    c.correct = take(8);
    c.seen = take(8);
  }
  if (format >= 3) {
    c.seed = take(8);
    c.batch_size = take(8);
    c.steps_per_epoch = take(8);
  }
  c.fingerprint = take(8);
  c.spec = take_bytes(take(4));
  c.history = take_bytes(take(4));
  c.state = take_bytes(take(8));
  if (at != body) throw fail("unexpected bytes after the state");
  return c;
}

inline std::filesystem::path checkpoint_path(const std::filesystem::path& dir, uint32_t epoch, uint64_t epoch_step = 0) {
  return dir / ("ckpt-" + std::to_string(epoch) + (epoch_step ? "-" + std::to_string(epoch_step) : "") + ".bin");
}

// What a file is, for messages: "a FIFO", "a directory", ...
inline std::string file_type_name(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// The bytes of `path`, which must be a regular file: opened without following a symbolic link
// and without blocking (a FIFO would wait for a writer), its type checked on the open file.
// `what` starts each error message; more than max_bytes is an error.
inline std::string read_regular_file(const std::filesystem::path& path, const std::string& what,
                                     uint64_t max_bytes = UINT64_MAX) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) throw std::runtime_error(what + " is a symbolic link; expected a regular file");
    throw std::runtime_error(what + ": cannot open " + path.string() + ": " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error(what + " is " + file_type_name(st.st_mode) + "; expected a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw std::runtime_error(what + " is " + std::to_string(st.st_size) + " bytes; expected at most " +
                             std::to_string(max_bytes));
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(what + ": cannot read " + path.string() + ": " + std::strerror(err));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      throw std::runtime_error(what + " is more than " + std::to_string(max_bytes) + " bytes; expected at most " +
                               std::to_string(max_bytes));
    }
  }
  ::close(fd);
  return out;
}

// The checkpoint file name `<dir>/latest` holds, or nullopt when there is no `latest`. It must be
// a regular file naming a regular file inside <dir> by a plain name (no '/', not '..'); anything
// else is an error naming the directory, the file and what was expected.
inline std::optional<std::string> latest_name(const std::filesystem::path& dir) {
  const auto latest = dir / "latest";
  const std::string what = "checkpoint: " + latest.string();
  const std::string expected = "the file name of a checkpoint in " + dir.string() + " (like ckpt-3.bin)";
  struct stat st {};
  if (::lstat(latest.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    throw std::runtime_error(what + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode))
    throw std::runtime_error(what + " is " + file_type_name(st.st_mode) + "; expected a regular file holding " + expected);
  std::string name = read_regular_file(latest, what, 4096);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
  const bool control = std::any_of(name.begin(), name.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20; });
  if (name.empty() || control || name.size() > 255)
    throw std::runtime_error(what + " does not name a checkpoint file; expected " + expected);
  if (name.find('/') != std::string::npos || name == "." || name.find("..") != std::string::npos)
    throw std::runtime_error(what + " names '" + name + "'; expected " + expected + ", without '/' or '..'");
  const auto path = dir / name;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) throw std::runtime_error(what + " names " + path.string() + ", which is missing");
    throw std::runtime_error(what + " names " + path.string() + ": " + std::strerror(errno));
  }
  if (S_ISLNK(st.st_mode)) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(path, ec);
    const bool dangling = !std::filesystem::exists(path, ec);
    throw std::runtime_error(what + " names " + path.string() + ", which is a symbolic link" +
                             (target.empty() ? "" : " to '" + target.string() + "'") +
                             (dangling ? " that leads nowhere" : "") + "; expected a regular checkpoint file in " +
                             dir.string());
  }
  if (!S_ISREG(st.st_mode))
    throw std::runtime_error(what + " names " + path.string() + ", which is " + file_type_name(st.st_mode) +
                             "; expected a regular checkpoint file");
  return name;
}

// Whether `name` is a mid-epoch checkpoint's: ckpt-<epoch>-<step>.bin.
inline bool is_mid_epoch_checkpoint_name(std::string_view name) {
  if (name.size() < 10 || name.substr(0, 5) != "ckpt-" || name.substr(name.size() - 4) != ".bin") return false;
  const std::string_view mid = name.substr(5, name.size() - 9);
  const size_t dash = mid.find('-');
  if (dash == 0 || dash == std::string_view::npos || dash + 1 == mid.size()) return false;
  for (size_t i = 0; i < mid.size(); ++i)
    if (i != dash && (mid[i] < '0' || mid[i] > '9')) return false;
  return true;
}

// Writes ckpt-<epoch>.bin (or ckpt-<epoch>-<epoch_step>.bin), then points `latest` at it (both
// atomically: write, fsync, rename, so a checkpoint cut off mid-write is never the one `latest`
// names). A mid-epoch checkpoint is kept only until the next one of any kind replaces it; with
// max_to_keep > 0 the epoch checkpoint max_to_keep epochs older is removed.
inline std::filesystem::path write_checkpoint(const std::filesystem::path& dir, const Checkpoint& c,
                                              uint32_t max_to_keep = 0) {
  const auto path = checkpoint_path(dir, c.epoch, c.epoch_step);
  std::string before;  // the mid-epoch checkpoint `latest` named, if any
  try {
    before = latest_name(dir).value_or("");
  } catch (const std::exception&) {  // a broken `latest` is replaced below
  }
  if (!is_mid_epoch_checkpoint_name(before)) before.clear();
  write_file_atomic(path, encode_checkpoint(c));
  write_file_atomic(dir / "latest", path.filename().string() + "\n");
  std::error_code ec;
  if (!before.empty() && before != path.filename().string()) std::filesystem::remove(dir / before, ec);
  if (max_to_keep > 0 && c.epoch_step == 0 && c.epoch > max_to_keep)
    std::filesystem::remove(checkpoint_path(dir, c.epoch - max_to_keep), ec);
  return path;
}

// The path `latest` names, or nullopt when the directory holds no checkpoint yet (latest_name's
// checks).
inline std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& dir) {
  if (auto name = latest_name(dir)) return dir / *name;
  return std::nullopt;
}

// ---- one run per checkpoint directory ------------------------------------------------------
// <dir>/lock, held with flock(2) by the run writing checkpoints in <dir> for as long as fit()
// runs: a second run fails at once, naming the holder (the file holds "host=", "pid=",
// "started=" lines). The OS lets go of the lock when the holder's process ends however it ends,
// so the lock of a dead run (SIGKILL, a lost machine's worker) is simply taken, and said.
class CheckpointLock {
 public:
  CheckpointLock() = default;
  CheckpointLock(CheckpointLock&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)), locked_(std::exchange(o.locked_, false)), previous_(std::move(o.previous_)) {}
  CheckpointLock& operator=(CheckpointLock&& o) noexcept {
    if (this != &o) {
      release();
      fd_ = std::exchange(o.fd_, -1);
      locked_ = std::exchange(o.locked_, false);
      previous_ = std::move(o.previous_);
    }
    return *this;
  }
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;
  ~CheckpointLock() { release(); }

  // Makes <dir> when missing (mode 0700) and refuses one another user could write (prepare_dir:
  // a symbolic link, another user's, group- or world-writable, or in a world-writable parent
  // without the sticky bit; a dangling link or a non-directory is an error too), before anything
  // is written there; then takes <dir>/lock. Held by another process: waits up to wait_s (saying
  // so on `note`), then throws "checkpoint directory D is in use by another run (host H, pid P,
  // started T) ...".
  static CheckpointLock acquire(const std::filesystem::path& dir, double wait_s = 0, std::FILE* note = nullptr) {
    const int dfd = prepare_dir(dir);
    const auto file = dir / "lock";
    CheckpointLock l;
    l.fd_ = ::openat(dfd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    const int open_err = errno;
    ::close(dfd);
    if (l.fd_ < 0) {
      const int err = open_err;
      throw std::runtime_error("checkpoint: cannot open the lock file " + file.string() + ": " +
                               (err == ELOOP ? std::string("it is a symbolic link; expected a regular file") : std::strerror(err)));
    }
    struct stat st {};
    if (::fstat(l.fd_, &st) != 0 || !S_ISREG(st.st_mode))
      throw std::runtime_error("checkpoint: the lock file " + file.string() + " is " + file_type_name(st.st_mode) +
                               "; expected a regular file");
    const auto t0 = std::chrono::steady_clock::now();
    bool said = false;
    for (;;) {
      if (::flock(l.fd_, LOCK_EX | LOCK_NB) == 0) {
        l.locked_ = true;
        break;
      }
      const int err = errno;
      if (err == EINTR) continue;
      if (err != EWOULDBLOCK)
        throw std::runtime_error("checkpoint: cannot lock " + file.string() + ": " + std::strerror(err));
      const std::string holder = describe(l.contents());
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited >= wait_s)
        throw std::runtime_error("checkpoint directory " + dir.string() + " is in use by another run (" + holder +
                                 "; lock file " + file.string() + (wait_s > 0 ? ", waited " + format_seconds(wait_s) : "") +
                                 "): two runs writing one directory would overwrite each other's checkpoints; "
                                 "give this run its own checkpoint directory, or let that run end first");
      if (!said && note) {
        std::fprintf(note, "Waiting up to %s for the run holding %s (%s) to end\n", format_seconds(wait_s).c_str(),
                     dir.c_str(), holder.c_str());
        std::fflush(note);
        said = true;
      }
      ::usleep(100000);
    }
    l.previous_ = l.contents();
    const std::string mine = "host=" + hostname() + "\npid=" + std::to_string(::getpid()) + "\nstarted=" + utc_now() + "\n";
    if (::ftruncate(l.fd_, 0) != 0 || ::pwrite(l.fd_, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size()))
      throw std::runtime_error("checkpoint: cannot write the lock file " + file.string() + ": " + std::strerror(errno));
    return l;
  }

  bool held() const { return locked_; }
  // The holder a lock was taken from ("host H, pid P, started T"), when the run before did not
  // let go of it itself (it died); empty when it did.
  std::string taken_over() const { return previous_.empty() ? "" : describe(previous_); }

  // "host H, pid P, started T" from the lock file's lines.
  static std::string describe(const std::string& text) {
    auto field = [&](const std::string& key) -> std::string {
      const std::string k = key + "=";
      for (size_t b = 0; b < text.size();) {
        const size_t e = std::min(text.find('\n', b), text.size());
        if (text.compare(b, k.size(), k) == 0) return text.substr(b + k.size(), std::min<size_t>(e - b - k.size(), 200));
        b = e + 1;
      }
      return "?";
    };
    if (text.empty()) return "its holder is not written in the lock file yet";
    return "host " + field("host") + ", pid " + field("pid") + ", started " + field("started");
  }

 private:
  void release() {
    if (fd_ < 0) return;
    if (locked_ && ::ftruncate(fd_, 0) != 0) {  // a run that ended cleanly leaves no holder behind
    }
    ::close(fd_);  // lets go of the flock
    fd_ = -1;
    locked_ = false;
  }
  std::string contents() const {
    std::string out;
    char buf[1024];
    const ssize_t n = ::pread(fd_, buf, sizeof buf, 0);
    if (n > 0) out.assign(buf, static_cast<size_t>(n));
    return out;
  }
  // Makes <dir> when missing (mode 0700; missing parents as mkdir -p does), then checks it is
  // safe to trust: a directory itself (not a symbolic link, which could be turned elsewhere
  // between this check and the writes), owned by this process's effective user and writable by
  // no one else (group and others: no w bit), inside no directory that anyone may write without
  // the sticky bit (where another user could swap it for their own). Whoever else can write a
  // checkpoint directory can plant a checkpoint the run resumes (CRC-32C is not a MAC) or remove
  // its lock. Returns the directory open (O_DIRECTORY|O_NOFOLLOW), as checked.
  static int prepare_dir(const std::filesystem::path& dir) {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0 && errno == ENOENT) {
      // The missing parents 0755 at most (not writable by others even with a umask of 0), the
      // directory itself 0700.
      const std::filesystem::path last = dir.has_filename() ? dir : dir.parent_path();  // "ckpt/": ckpt
      std::vector<std::filesystem::path> missing{last};
      for (auto p = last.parent_path(); !p.empty() && p != p.root_path() && ::lstat(p.c_str(), &st) != 0;
           p = p.parent_path())
        missing.push_back(p);
      for (auto it = missing.rbegin(); it != missing.rend(); ++it)
        if (::mkdir(it->c_str(), *it == last ? 0700 : 0755) != 0 && errno != EEXIST)
          throw std::runtime_error("cannot create checkpoint directory " + dir.string() + ": " + it->string() + ": " +
                                   std::strerror(errno));
    }
    if (::lstat(dir.c_str(), &st) != 0)
      throw std::runtime_error("checkpoint directory " + dir.string() + ": " + std::strerror(errno));
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const auto target = std::filesystem::read_symlink(dir, ec);
      struct stat tst {};
      if (::stat(dir.c_str(), &tst) != 0)
        throw std::runtime_error("checkpoint directory " + dir.string() + " is a symbolic link to '" + target.string() +
                                 "', which does not exist: create that directory or name another checkpoint directory");
      const auto real = std::filesystem::canonical(dir, ec);
      throw std::runtime_error("checkpoint directory " + dir.string() + " is a symbolic link to '" + target.string() +
                               "'; expected the directory itself (a link can be turned elsewhere between the check "
                               "and the writes): name " + (ec ? target : real).string() + " instead");
    }
    if (!S_ISDIR(st.st_mode))
      throw std::runtime_error("checkpoint directory " + dir.string() + " is " + file_type_name(st.st_mode) +
                               "; expected a directory");
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("cannot open checkpoint directory " + dir.string() + ": " + std::strerror(errno));
    try {
      if (::fstat(fd, &st) != 0)
        throw std::runtime_error("cannot stat checkpoint directory " + dir.string() + ": " + std::strerror(errno));
      const uid_t me = ::geteuid();
      const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
      if (st.st_uid != me || others_write)
        throw std::runtime_error(
            "checkpoint directory " + dir.string() + " is owned by " + user_name(st.st_uid) + " with mode " +
            mode_text(st.st_mode) + "; expected a directory owned by this run's user (" + user_name(me) +
            ") that no other user can write (like 0700 or 0755): another user who can write there could plant a "
            "checkpoint this run would resume or remove its lock; " +
            (st.st_uid == me ? "`chmod go-w " + dir.string() + "`, or name another directory"
                             : std::string("name a directory of your own (a missing one is made with mode 0700)")));
      std::error_code ec;
      const auto real = std::filesystem::canonical(dir, ec);
      for (auto p = real.parent_path(); !ec && !p.empty(); p = p.parent_path()) {
        struct stat pst {};
        if (::stat(p.c_str(), &pst) == 0 && (pst.st_mode & S_IWOTH) && !(pst.st_mode & S_ISVTX))
          throw std::runtime_error("checkpoint directory " + dir.string() + " is inside " + p.string() + " (owned by " +
                                   user_name(pst.st_uid) + ", mode " + mode_text(pst.st_mode) +
                                   "), which any user can write and which has no sticky bit: another user could "
                                   "put a directory of their own in its place; expected parents only their owners "
                                   "can write (or sticky, like /tmp): name a directory elsewhere");
        if (p == p.root_path()) break;
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    return fd;
  }
  // "uid 65534 (nobody)".
  static std::string user_name(uid_t uid) {
    std::string s = "uid " + std::to_string(uid);
    struct passwd pw {};
    struct passwd* found = nullptr;
    char buf[4096];
    if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found && found->pw_name) s += std::string(" (") + found->pw_name + ")";
    return s;
  }
  // "0777", "1777".
  static std::string mode_text(mode_t mode) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
    return buf;
  }
  static std::string hostname() {
    char h[256] = {};
    if (::gethostname(h, sizeof h - 1) != 0) return "?";
    return h;
  }
  static std::string utc_now() {
    const std::time_t t = std::time(nullptr);
    std::tm tm {};
    ::gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
  }
  static std::string format_seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f s", s);
    return buf;
  }

  int fd_ = -1;
  bool locked_ = false;
  std::string previous_;
};

// What an interrupted run left in a checkpoint directory, removed at the next start (under the
// directory's lock): temporaries of atomic writes (ckpt-*.tmp.*, latest.tmp.*) and the mid-epoch
// checkpoints `latest` does not name (all of them when it names an epoch's). Only regular files
// are removed, by name, never through a symbolic link; nothing is pruned while `latest` is
// missing or broken. Returns the names removed.
inline std::vector<std::string> clean_checkpoint_dir(const std::filesystem::path& dir) {
  std::optional<std::string> latest;
  bool latest_ok = true;
  try {
    latest = latest_name(dir);
  } catch (const std::exception&) {
    latest_ok = false;
  }
  std::vector<std::string> removed;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code tec;
    if (it->symlink_status(tec).type() != std::filesystem::file_type::regular) continue;
    const bool temporary = (name.rfind("ckpt-", 0) == 0 && name.find(".tmp.") != std::string::npos) ||
                           name.rfind("latest.tmp.", 0) == 0;
    const bool stale = latest_ok && latest && is_mid_epoch_checkpoint_name(name) && name != *latest;
    if (!temporary && !stale) continue;
    if (::unlink(it->path().c_str()) == 0) removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

// The first difference between two spec texts ("a;b;c" lists), for a mismatch message.
inline std::string spec_difference(std::string_view have, std::string_view want) {
  const auto d = schema::first_difference(have, want);
  return d ? "checkpoint has '" + d->first + "', this model has '" + d->second + "'" : "specs are equal";
}

}  // namespace skyforge::keras
