// skyforge datasets: readers for the classic image-classification files, header-only.
//
//   auto [train, test] = skyforge::datasets::load_fashion_mnist();   // /usr/share/datasets/fashion-mnist
//   train.x : float32, N x 28 x 28 x 1 (NHWC), scaled to [0, 1]
//   train.y : int32 class indices 0..9
//   load_fashion_mnist_bytes(): the same with the images kept as bytes (ByteDataset), converted
//   to those floats only by take() (a quarter of the memory, for many subsets of one set)
//
// read_idx() reads any IDX file (gzip-compressed, decompressed with libdeflate, or plain): a
// big-endian header {0, 0, dtype, rank} then rank big-endian uint32 dimensions, then the data.
// Only dtype 0x08 (unsigned byte) is supported, which covers MNIST, Fashion-MNIST, KMNIST and
// EMNIST. Every error names the file: missing, truncated, bad magic, unsupported dtype.
//
// shard(dataset, info, shuffle, seed) gives this node's part (skyforge::shard of the rows).
//
// Needs libdeflate at link time: in the skyforge tree link skyforge::datasets (= skyforge::sdk +
// libdeflate); out of tree, pkg_check_modules(DEFLATE IMPORTED_TARGET libdeflate) and link
// PkgConfig::DEFLATE next to skyforge::sdk (Debian: libdeflate-dev).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <libdeflate.h>

#include <skyforge/data.hpp>

namespace skyforge::datasets {

class DatasetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An IDX array: dims (outermost first) and the raw unsigned bytes, row-major.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
  size_t count() const {  // elements per dims
    size_t n = 1;
    for (uint32_t d : dims) n *= d;
    return n;
  }
};

namespace detail {

// The whole file, or a DatasetError naming it.
inline std::vector<uint8_t> read_file(const std::filesystem::path& path, const std::string& name) {
  std::FILE* f = std::fopen(name.c_str(), "rb");
  if (!f) throw DatasetError("IDX file " + name + ": cannot open: " + std::strerror(errno));
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  std::vector<uint8_t> bytes(ec ? 0 : static_cast<size_t>(size));
  size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f);
  bytes.resize(got);
  // A file that grew since file_size (or whose size was unknown) is read to its end.
  for (uint8_t buf[65536]; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) bytes.insert(bytes.end(), buf, buf + got);
  if (std::ferror(f)) throw DatasetError("IDX file " + name + ": read error: " + std::strerror(errno));
  return bytes;
}

inline bool is_gzip(const std::vector<uint8_t>& b) { return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b; }

// Decompresses every gzip member of `in` in turn (RFC 1952 allows several; bytes after the last
// member that do not start another one are ignored, as gzip -d does). libdeflate decompresses a
// whole buffer at once, 2-3x faster than zlib's streaming inflate; each member's ISIZE trailer
// (its size mod 2^32) sizes the output, which grows if a member is larger than that says.
inline std::vector<uint8_t> gunzip(const std::vector<uint8_t>& in, const std::string& name) {
  struct Decompressor {
    libdeflate_decompressor* d = libdeflate_alloc_decompressor();
    ~Decompressor() { libdeflate_free_decompressor(d); }
  } dec;
  if (!dec.d) throw DatasetError("IDX file " + name + ": out of memory for the gzip decompressor");
  auto le32 = [](const uint8_t* p) {
    return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
  };
  std::vector<uint8_t> out;
  size_t used = 0;  // bytes of `out` holding decompressed data
  size_t pos = 0;
  do {
    size_t want = std::max<size_t>(le32(in.data() + in.size() - 4), 1);  // the last member's ISIZE
    for (;;) {
      if (out.size() < used + want) out.resize(used + want);
      size_t in_used = 0, out_got = 0;
      const auto r = libdeflate_gzip_decompress_ex(dec.d, in.data() + pos, in.size() - pos, out.data() + used,
                                                   out.size() - used, &in_used, &out_got);
      if (r == LIBDEFLATE_SUCCESS) {
        pos += in_used;
        used += out_got;
        break;
      }
      if (r != LIBDEFLATE_INSUFFICIENT_SPACE || want > (size_t{1} << 36))
        throw DatasetError("IDX file " + name + ": corrupt gzip data (" +
                           (r == LIBDEFLATE_BAD_DATA ? "bad or truncated deflate stream" : "libdeflate error") + ")");
      want *= 2;
    }
  } while (in.size() - pos >= 18 && in[pos] == 0x1f && in[pos + 1] == 0x8b);
  out.resize(used);
  return out;
}

}  // namespace detail

// Reads an IDX file, gzip-compressed or not (told apart by the gzip magic bytes, not the name).
// Throws DatasetError naming `path`.
inline IdxArray read_idx(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw DatasetError("IDX file " + name + ": not found (or not a regular file)");
  std::vector<uint8_t> bytes = detail::read_file(path, name);
  if (detail::is_gzip(bytes)) {
    if (bytes.size() < 18) throw DatasetError("IDX file " + name + ": corrupt gzip data (shorter than a gzip header)");
    bytes = detail::gunzip(bytes, name);
  }
  auto fail = [&](const std::string& why) -> DatasetError { return DatasetError("IDX file " + name + ": " + why); };
  if (bytes.size() < 4) throw fail("truncated: no 4-byte IDX header");
  const uint8_t* magic = bytes.data();
  if (magic[0] != 0 || magic[1] != 0 || magic[2] == 0 || magic[3] == 0 || magic[3] > 8) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%02X%02X%02X%02X", magic[0], magic[1], magic[2], magic[3]);
    throw fail(std::string("bad magic ") + hex + " (expected 0x0000TTRR: dtype TT, rank RR of 1..8)");
  }
  if (magic[2] != 0x08) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", magic[2]);
    throw fail(std::string("unsupported dtype ") + hex + " (only 0x08, unsigned byte)");
  }
  IdxArray out;
  out.dims.resize(magic[3]);
  const size_t header = 4 + 4 * out.dims.size();
  if (bytes.size() < header) throw fail("truncated in the dimensions");
  for (size_t i = 0; i < out.dims.size(); ++i) {
    const uint8_t* b = bytes.data() + 4 + 4 * i;
    out.dims[i] = (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
  }
  const size_t n = out.count();
  if (n > (size_t{1} << 34)) throw fail("implausible size " + std::to_string(n) + " elements");
  const size_t got = bytes.size() - header;
  if (got < n) throw fail("truncated: expected " + std::to_string(n) + " data bytes, got " + std::to_string(got));
  if (got > n) throw fail("trailing data after " + std::to_string(n) + " data bytes");
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(header));
  out.data = std::move(bytes);
  return out;
}

// Images as float32 NHWC plus int32 labels.
struct Dataset {
  std::vector<float> x;          // size() * 28 * 28 * 1 for MNIST-like sets
  std::vector<int32_t> y;
  std::vector<uint32_t> sample_shape;  // one sample, e.g. {28, 28, 1}
  size_t size() const { return y.size(); }
  size_t sample_size() const {
    size_t n = 1;
    for (uint32_t d : sample_shape) n *= d;
    return n;
  }
  // The samples at `idx`, in that order.
  Dataset take(const std::vector<size_t>& idx) const {
    Dataset out;
    take(idx, out);
    return out;
  }
  // The same into `out`, reusing its memory: a loop that takes same-sized subsets again and
  // again (a grid search's folds) copies into pages it already has instead of faulting in
  // fresh ones each time, which costs more than the copy itself. `out` must not be *this.
  void take(const std::vector<size_t>& idx, Dataset& out) const {
    take_rows(*this, "Dataset", idx, out, [](const float* from, size_t n, float* to) { std::copy_n(from, n, to); });
  }

  // `d`'s samples at `idx` into `out` (memory reused), each row written by copy(from, n, to).
  // Shared by Dataset::take and ByteDataset::take.
  template <class Source, class Copy>
  static void take_rows(const Source& d, const char* who, const std::vector<size_t>& idx, Dataset& out, Copy copy) {
    for (const size_t i : idx)
      if (i >= d.y.size())
        throw DatasetError(std::string(who) + "::take: index " + std::to_string(i) + " is not below " +
                           std::to_string(d.y.size()));
    out.sample_shape = d.sample_shape;
    const size_t s = d.sample_size();
    out.x.resize(idx.size() * s);
    out.y.resize(idx.size());
    for (size_t i = 0; i < idx.size(); ++i) {
      copy(d.x.data() + idx[i] * s, s, out.x.data() + i * s);
      out.y[i] = d.y[idx[i]];
    }
  }
};

// This node's part of `d` (skyforge::shard: deterministic, identical on every node, sizes
// differ by at most one). `info` is skyforge::InstanceInfo or anything with node/total_nodes.
template <class Info>
Dataset shard(const Dataset& d, const Info& info, bool shuffle = true, uint64_t seed = 0) {
  return d.take(skyforge::shard(d.size(), static_cast<uint32_t>(info.node), static_cast<uint32_t>(info.total_nodes),
                                shuffle, seed));
}

// The same samples with the images kept as the file's bytes: a quarter of the floats' memory,
// for a loader that hands out many subsets (a grid search's folds): take() converts only the
// samples it copies, to exactly the floats Dataset holds (byte / 255).
struct ByteDataset {
  std::vector<uint8_t> x;
  std::vector<int32_t> y;
  std::vector<uint32_t> sample_shape;
  size_t size() const { return y.size(); }
  size_t sample_size() const {
    size_t n = 1;
    for (uint32_t d : sample_shape) n *= d;
    return n;
  }
  static float to_float(uint8_t v) { return static_cast<float>(v) / 255.0f; }
  // Every sample as floats.
  Dataset to_floats() const {
    Dataset d;
    d.sample_shape = sample_shape;
    d.x.reserve(x.size());  // filled in one pass: no zeroing first (a fifth of the load time)
    for (const uint8_t v : x) d.x.push_back(to_float(v));
    d.y = y;
    return d;
  }
  // The samples at `idx`, in that order, as floats into `out`, reusing its memory (as
  // Dataset::take(idx, out)).
  void take(const std::vector<size_t>& idx, Dataset& out) const {
    float lut[256];  // the 256 values to_float() gives: a load per pixel instead of a division
    for (int v = 0; v < 256; ++v) lut[v] = to_float(static_cast<uint8_t>(v));
    Dataset::take_rows(*this, "ByteDataset", idx, out, [&](const uint8_t* from, size_t n, float* to) {
      for (size_t k = 0; k < n; ++k) to[k] = lut[from[k]];
    });
  }
};

// Images (N x H x W, or N x H x W x C) and labels (N) from two IDX files, the images as bytes;
// a channel axis of 1 is added to rank-3 images.
inline ByteDataset load_idx_pair_bytes(const std::filesystem::path& images, const std::filesystem::path& labels) {
  IdxArray im = read_idx(images);
  IdxArray lb = read_idx(labels);
  if (im.dims.size() != 3 && im.dims.size() != 4)
    throw DatasetError("IDX file " + images.string() + ": expected images of rank 3 or 4, got rank " +
                       std::to_string(im.dims.size()));
  if (lb.dims.size() != 1)
    throw DatasetError("IDX file " + labels.string() + ": expected labels of rank 1, got rank " +
                       std::to_string(lb.dims.size()));
  if (im.dims[0] != lb.dims[0])
    throw DatasetError("IDX files " + images.string() + " and " + labels.string() + " disagree: " +
                       std::to_string(im.dims[0]) + " images, " + std::to_string(lb.dims[0]) + " labels");
  ByteDataset d;
  d.sample_shape.assign(im.dims.begin() + 1, im.dims.end());
  if (d.sample_shape.size() == 2) d.sample_shape.push_back(1);
  d.x = std::move(im.data);
  d.y.assign(lb.data.begin(), lb.data.end());
  return d;
}

// The same with the pixels as floats divided by 255, so they lie in [0, 1].
inline Dataset load_idx_pair(const std::filesystem::path& images, const std::filesystem::path& labels) {
  return load_idx_pair_bytes(images, labels).to_floats();
}

struct TrainTest {
  Dataset train;
  Dataset test;
};
struct ByteTrainTest {
  ByteDataset train;
  ByteDataset test;
};

// Fashion-MNIST (Zalando): 60000 train + 10000 test 28x28 grayscale images, 10 classes
// (0 T-shirt/top, 1 Trouser, 2 Pullover, 3 Dress, 4 Coat, 5 Sandal, 6 Shirt, 7 Sneaker, 8 Bag,
// 9 Ankle boot). `dir` holds the four files under their canonical names, gzip-compressed
// (train-images-idx3-ubyte.gz, ...) or not (train-images-idx3-ubyte, ...).
inline ByteTrainTest load_fashion_mnist_bytes(const std::filesystem::path& dir = "/usr/share/datasets/fashion-mnist") {
  auto file = [&](const std::string& stem) {
    const std::filesystem::path gz = dir / (stem + ".gz");
    std::error_code ec;
    if (std::filesystem::exists(gz, ec)) return gz;
    const std::filesystem::path plain = dir / stem;
    if (std::filesystem::exists(plain, ec)) return plain;
    return gz;  // read_idx names it in the "not found" error
  };
  ByteTrainTest t;
  t.train = load_idx_pair_bytes(file("train-images-idx3-ubyte"), file("train-labels-idx1-ubyte"));
  t.test = load_idx_pair_bytes(file("t10k-images-idx3-ubyte"), file("t10k-labels-idx1-ubyte"));
  return t;
}
// The same with float pixels in [0, 1].
inline TrainTest load_fashion_mnist(const std::filesystem::path& dir = "/usr/share/datasets/fashion-mnist") {
  ByteTrainTest b = load_fashion_mnist_bytes(dir);
  return {b.train.to_floats(), b.test.to_floats()};
}

}  // namespace skyforge::datasets
