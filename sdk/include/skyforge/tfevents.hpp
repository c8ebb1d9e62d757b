// skyforge TensorBoard event files, header-only, no protobuf and no TensorFlow.
//
// An event file is a sequence of TFRecords:
//
//     uint64 length (little-endian)
//     uint32 masked_crc32c(length bytes)
//     byte   data[length]              a serialized tensorflow.Event protobuf
//     uint32 masked_crc32c(data)
//
// The Event message is hand-encoded; only the fields TensorBoard needs for scalars are written:
//
//     Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//     Summary { repeated Value value = 1; }
//     Value   { string tag = 1; float simple_value = 2; }
//
// The first record of a file carries file_version = "brain.Event:2". Files are named
// events.out.tfevents.<unix seconds>.<hostname> (TensorBoard finds them by the "tfevents" part).
//
//   skyforge::tfevents::EventWriter w("logs/train");
//   w.add_scalar("epoch_loss", 0.42f, /*step=*/0);
//   w.flush();
//
// crc32c() is CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): crc32c("123456789") is
// 0xE3069283. read_records() and parse_event() read the same format back (CRCs checked), for
// tests and tools.
#pragma once

#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

namespace skyforge::tfevents {

// ---- CRC-32C ------------------------------------------------------------------------------
namespace detail {
inline constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : (c >> 1);
    t[i] = c;
  }
  return t;
}
inline constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();
}  // namespace detail

// CRC-32C of `size` bytes. Pass a previous result as `crc` to continue a running checksum.
inline uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = detail::kCrc32cTable[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}
inline uint32_t crc32c(std::string_view s) { return crc32c(s.data(), s.size()); }

// TFRecord's masking: rotate right by 15 and add a constant, so a CRC of data that itself
// holds CRCs stays well distributed.
inline uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }
inline uint32_t unmask_crc(uint32_t masked) {
  const uint32_t rot = masked - 0xA282EAD8u;
  return (rot >> 17) | (rot << 15);
}
inline uint32_t masked_crc32c(const void* data, size_t size) { return mask_crc(crc32c(data, size)); }

// ---- little-endian and protobuf wire encoding ---------------------------------------------
namespace detail {
inline void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}
inline uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
inline void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7Fu) | 0x80u));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
// Field key: (number << 3) | wire type. Wire types: 0 varint, 1 64-bit, 2 bytes, 5 32-bit.
inline void put_key(std::string& out, uint32_t field, uint32_t wire) { put_varint(out, (field << 3) | wire); }
inline void put_bytes_field(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}
inline void put_double_field(std::string& out, uint32_t field, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 1);
  put_le(out, bits, 8);
}
inline void put_float_field(std::string& out, uint32_t field, float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 5);
  put_le(out, bits, 4);
}
inline void put_int64_field(std::string& out, uint32_t field, int64_t v) {
  put_key(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));  // int64: two's complement, 10 bytes when negative
}
}  // namespace detail

// One TFRecord around `data`.
inline std::string frame_record(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  detail::put_le(out, data.size(), 8);
  detail::put_le(out, masked_crc32c(out.data(), 8), 4);
  out.append(data.data(), data.size());
  detail::put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

// Serialized Event{wall_time, step, file_version}.
inline std::string encode_file_version_event(double wall_time, std::string_view version = "brain.Event:2") {
  std::string e;
  detail::put_double_field(e, 1, wall_time);
  detail::put_int64_field(e, 2, 0);
  detail::put_bytes_field(e, 3, version);
  return e;
}

// Serialized Event{wall_time, step, summary{value{tag, simple_value}...}}.
inline std::string encode_scalars_event(double wall_time, int64_t step,
                                        const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    detail::put_bytes_field(v, 1, tag);
    detail::put_float_field(v, 2, value);
    detail::put_bytes_field(summary, 1, v);
  }
  std::string e;
  detail::put_double_field(e, 1, wall_time);
  detail::put_int64_field(e, 2, step);
  detail::put_bytes_field(e, 5, summary);
  return e;
}
inline std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  return encode_scalars_event(wall_time, step, {{tag, value}});
}

// Seconds since the Unix epoch, as TensorBoard's wall_time.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// ---- the writer -----------------------------------------------------------------------------
// Appends events to a new file in `dir` (created with its parents). Not thread-safe.
class EventWriter {
 public:
  explicit EventWriter(const std::filesystem::path& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw std::runtime_error("tensorboard: cannot create directory " + dir.string() + ": " + ec.message());
    const double t = now_seconds();
    const std::string base = "events.out.tfevents." + std::to_string(static_cast<int64_t>(t)) + "." + hostname();
    path_ = dir / base;
    // Two writers in one directory within a second (a resumed run, a test): keep both files.
    for (int i = 1; std::filesystem::exists(path_); ++i) path_ = dir / (base + "." + std::to_string(i));
    f_ = std::fopen(path_.c_str(), "wbe");
    if (!f_) throw std::runtime_error("tensorboard: cannot create " + path_.string() + ": " + std::strerror(errno));
    write_event(encode_file_version_event(t));
    flush();
  }
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  EventWriter(EventWriter&& o) noexcept : f_(std::exchange(o.f_, nullptr)), path_(std::move(o.path_)) {}
  EventWriter& operator=(EventWriter&& o) noexcept {
    if (this != &o) {
      close();
      f_ = std::exchange(o.f_, nullptr);
      path_ = std::move(o.path_);
    }
    return *this;
  }
  ~EventWriter() { close(); }

  void add_scalar(const std::string& tag, float value, int64_t step, std::optional<double> wall_time = {}) {
    write_event(encode_scalar_event(wall_time ? *wall_time : now_seconds(), step, tag, value));
  }
  // Several scalars in one event (one step).
  void add_scalars(const std::vector<std::pair<std::string, float>>& scalars, int64_t step,
                   std::optional<double> wall_time = {}) {
    write_event(encode_scalars_event(wall_time ? *wall_time : now_seconds(), step, scalars));
  }
  // A pre-serialized Event.
  void write_event(std::string_view event) {
    if (!f_) throw std::runtime_error("tensorboard: writer is closed");
    const std::string rec = frame_record(event);
    if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size())
      throw std::runtime_error("tensorboard: write to " + path_.string() + " failed: " + std::strerror(errno));
  }
  void flush() {
    if (f_ && std::fflush(f_) != 0)
      throw std::runtime_error("tensorboard: flush of " + path_.string() + " failed: " + std::strerror(errno));
  }
  void close() {
    if (f_) {
      std::fclose(f_);
      f_ = nullptr;
    }
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::FILE* f_ = nullptr;
  std::filesystem::path path_;
};

// ---- reading back ---------------------------------------------------------------------------
// Every record's data, CRCs verified; throws naming the file and the record on corruption.
inline std::vector<std::string> read_records(const std::filesystem::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rbe");
  if (!f) throw std::runtime_error("tfrecord: cannot open " + path.string() + ": " + std::strerror(errno));
  std::vector<std::string> out;
  auto fail = [&](const std::string& why) {
    std::fclose(f);
    throw std::runtime_error("tfrecord: " + path.string() + ": record " + std::to_string(out.size()) + ": " + why);
  };
  for (;;) {
    unsigned char head[12];
    const size_t got = std::fread(head, 1, sizeof head, f);
    if (got == 0) break;
    if (got != sizeof head) fail("truncated header");
    const uint64_t len = detail::get_le(head, 8);
    if (unmask_crc(static_cast<uint32_t>(detail::get_le(head + 8, 4))) != crc32c(head, 8)) fail("length CRC mismatch");
    if (len > (uint64_t{1} << 31)) fail("implausible length " + std::to_string(len));
    std::string data(static_cast<size_t>(len), '\0');
    unsigned char tail[4];
    if (std::fread(data.data(), 1, data.size(), f) != data.size() || std::fread(tail, 1, 4, f) != 4)
      fail("truncated data");
    if (unmask_crc(static_cast<uint32_t>(detail::get_le(tail, 4))) != crc32c(data.data(), data.size()))
      fail("data CRC mismatch");
    out.push_back(std::move(data));
  }
  std::fclose(f);
  return out;
}

// The fields of an Event this header writes (other fields are skipped).
struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> scalars;  // summary values with a simple_value
};

namespace detail {
struct Reader {
  const unsigned char* p;
  const unsigned char* end;
  bool done() const { return p >= end; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) throw std::runtime_error("protobuf: truncated varint");
      const unsigned char b = *p++;
      v |= static_cast<uint64_t>(b & 0x7Fu) << shift;
      if (!(b & 0x80u)) return v;
    }
    throw std::runtime_error("protobuf: varint too long");
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    if (n > static_cast<uint64_t>(end - p)) throw std::runtime_error("protobuf: truncated bytes field");
    std::string_view s(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
    p += n;
    return s;
  }
  uint64_t fixed(int n) {
    if (end - p < n) throw std::runtime_error("protobuf: truncated fixed field");
    const uint64_t v = get_le(p, n);
    p += n;
    return v;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case 0: varint(); break;
      case 1: fixed(8); break;
      case 2: bytes(); break;
      case 5: fixed(4); break;
      default: throw std::runtime_error("protobuf: unsupported wire type " + std::to_string(wire));
    }
  }
};
inline Reader reader_of(std::string_view s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  return Reader{b, b + s.size()};
}
}  // namespace detail

inline Event parse_event(std::string_view data) {
  Event ev;
  detail::Reader r = detail::reader_of(data);
  while (!r.done()) {
    const uint64_t key = r.varint();
    const auto field = static_cast<uint32_t>(key >> 3), wire = static_cast<uint32_t>(key & 7u);
    if (field == 1 && wire == 1) {
      const uint64_t bits = r.fixed(8);
      std::memcpy(&ev.wall_time, &bits, sizeof bits);
    } else if (field == 2 && wire == 0) {
      ev.step = static_cast<int64_t>(r.varint());
    } else if (field == 3 && wire == 2) {
      ev.file_version = std::string(r.bytes());
    } else if (field == 5 && wire == 2) {
      detail::Reader s = detail::reader_of(r.bytes());
      while (!s.done()) {
        const uint64_t sk = s.varint();
        if ((sk >> 3) != 1 || (sk & 7u) != 2) {
          s.skip(static_cast<uint32_t>(sk & 7u));
          continue;
        }
        detail::Reader v = detail::reader_of(s.bytes());
        std::string tag;
        std::optional<float> value;
        while (!v.done()) {
          const uint64_t vk = v.varint();
          if (vk == ((1u << 3) | 2u)) {
            tag = std::string(v.bytes());
          } else if (vk == ((2u << 3) | 5u)) {
            const auto bits = static_cast<uint32_t>(v.fixed(4));
            float f = 0;
            std::memcpy(&f, &bits, sizeof f);
            value = f;
          } else {
            v.skip(static_cast<uint32_t>(vk & 7u));
          }
        }
        if (value) ev.scalars.emplace_back(std::move(tag), *value);
      }
    } else {
      r.skip(wire);
    }
  }
  return ev;
}

}  // namespace skyforge::tfevents
