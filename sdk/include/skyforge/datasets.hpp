// skyforge datasets: readers for the classic image-classification files, header-only.
//
//   auto [train, test] = skyforge::datasets::load_fashion_mnist();   // /usr/share/datasets/fashion-mnist
//   train.x : float32, N x 28 x 28 x 1 (NHWC), scaled to [0, 1]
//   train.y : int32 class indices 0..9
//
// read_idx() reads any IDX file (gzip-compressed or plain; zlib's gzread handles both): a
// big-endian header {0, 0, dtype, rank} then rank big-endian uint32 dimensions, then the data.
// Only dtype 0x08 (unsigned byte) is supported, which covers MNIST, Fashion-MNIST, KMNIST and
// EMNIST. Every error names the file: missing, truncated, bad magic, unsupported dtype.
//
// shard(dataset, info, shuffle, seed) gives this node's part (skyforge::shard of the rows).
//
// Needs zlib at link time: in the skyforge tree link skyforge::datasets (= skyforge::sdk +
// ZLIB::ZLIB); out of tree, find_package(ZLIB) and link ZLIB::ZLIB next to skyforge::sdk.
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

#include <zlib.h>

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

// Reads an IDX file, gzip-compressed or not. Throws DatasetError naming `path`.
inline IdxArray read_idx(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw DatasetError("IDX file " + name + ": not found (or not a regular file)");
  gzFile f = gzopen(name.c_str(), "rb");
  if (!f) throw DatasetError("IDX file " + name + ": cannot open: " + std::strerror(errno));
  struct Closer {
    gzFile f;
    ~Closer() { gzclose(f); }
  } closer{f};
  auto fail = [&](const std::string& why) -> DatasetError { return DatasetError("IDX file " + name + ": " + why); };
  // Reads up to n bytes (fewer only at the end of the data); throws on a gzip error.
  auto read_exact = [&](void* buf, size_t n) -> size_t {
    auto* p = static_cast<unsigned char*>(buf);
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, size_t{1} << 30));
      const int got = gzread(f, p + done, chunk);
      if (got < 0) {
        int err = 0;
        const char* msg = gzerror(f, &err);
        throw fail(std::string("corrupt gzip data: ") + (msg ? msg : "read error"));
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  };
  unsigned char magic[4];
  if (read_exact(magic, 4) != 4) throw fail("truncated: no 4-byte IDX header");
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
  for (auto& d : out.dims) {
    unsigned char b[4];
    if (read_exact(b, 4) != 4) throw fail("truncated in the dimensions");
    d = (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
  }
  const size_t n = out.count();
  if (n > (size_t{1} << 34)) throw fail("implausible size " + std::to_string(n) + " elements");
  out.data.resize(n);
  const size_t got = read_exact(out.data.data(), n);
  if (got != n)
    throw fail("truncated: expected " + std::to_string(n) + " data bytes, got " + std::to_string(got));
  unsigned char extra;
  if (read_exact(&extra, 1) != 0) throw fail("trailing data after " + std::to_string(n) + " data bytes");
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
    out.sample_shape = sample_shape;
    const size_t s = sample_size();
    out.x.resize(idx.size() * s);
    out.y.resize(idx.size());
    for (size_t i = 0; i < idx.size(); ++i) {
      if (idx[i] >= y.size())
        throw DatasetError("Dataset::take: index " + std::to_string(idx[i]) + " is not below " +
                           std::to_string(y.size()));
      std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(idx[i] * s), s, out.x.begin() + static_cast<std::ptrdiff_t>(i * s));
      out.y[i] = y[idx[i]];
    }
    return out;
  }
};

// This node's part of `d` (skyforge::shard: deterministic, identical on every node, sizes
// differ by at most one). `info` is skyforge::InstanceInfo or anything with node/total_nodes.
template <class Info>
Dataset shard(const Dataset& d, const Info& info, bool shuffle = true, uint64_t seed = 0) {
  return d.take(skyforge::shard(d.size(), static_cast<uint32_t>(info.node), static_cast<uint32_t>(info.total_nodes),
                                shuffle, seed));
}

// Images (N x H x W, or N x H x W x C) and labels (N) from two IDX files. Pixels are divided
// by 255, so they lie in [0, 1]; a channel axis of 1 is added to rank-3 images.
inline Dataset load_idx_pair(const std::filesystem::path& images, const std::filesystem::path& labels) {
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
  Dataset d;
  d.sample_shape.assign(im.dims.begin() + 1, im.dims.end());
  if (d.sample_shape.size() == 2) d.sample_shape.push_back(1);
  d.x.resize(im.data.size());
  for (size_t i = 0; i < im.data.size(); ++i) d.x[i] = static_cast<float>(im.data[i]) / 255.0f;
  d.y.assign(lb.data.begin(), lb.data.end());
  return d;
}

struct TrainTest {
  Dataset train;
  Dataset test;
};

// Fashion-MNIST (Zalando): 60000 train + 10000 test 28x28 grayscale images, 10 classes
// (0 T-shirt/top, 1 Trouser, 2 Pullover, 3 Dress, 4 Coat, 5 Sandal, 6 Shirt, 7 Sneaker, 8 Bag,
// 9 Ankle boot). `dir` holds the four files under their canonical names, gzip-compressed
// (train-images-idx3-ubyte.gz, ...) or not (train-images-idx3-ubyte, ...).
inline TrainTest load_fashion_mnist(const std::filesystem::path& dir = "/usr/share/datasets/fashion-mnist") {
  auto file = [&](const std::string& stem) {
    const std::filesystem::path gz = dir / (stem + ".gz");
    std::error_code ec;
    if (std::filesystem::exists(gz, ec)) return gz;
    const std::filesystem::path plain = dir / stem;
    if (std::filesystem::exists(plain, ec)) return plain;
    return gz;  // read_idx names it in the "not found" error
  };
  TrainTest t;
  t.train = load_idx_pair(file("train-images-idx3-ubyte"), file("train-labels-idx1-ubyte"));
  t.test = load_idx_pair(file("t10k-images-idx3-ubyte"), file("t10k-labels-idx1-ubyte"));
  return t;
}

}  // namespace skyforge::datasets
