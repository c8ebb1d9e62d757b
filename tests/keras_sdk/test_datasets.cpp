// The IDX reader (skyforge/datasets.hpp) on the real Fashion-MNIST files and on broken ones.
//
// The Fashion-MNIST facts below were computed independently with Python's gzip module over the
// files in /usr/share/datasets/fashion-mnist (sum of every raw pixel byte, first labels, class
// counts), and match the dataset's documentation (60000 + 10000 images, 10 balanced classes).
#include <skyforge/datasets.hpp>

#include <gtest/gtest.h>

#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace ds = skyforge::datasets;
namespace fs = std::filesystem;

namespace {

bool have_fashion_mnist() { return fs::exists(fs::path(FASHION_MNIST_DIR) / "train-images-idx3-ubyte.gz"); }

// IDX bytes: magic {0, 0, dtype, rank}, big-endian dims, data.
std::string idx_bytes(uint8_t dtype, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string s = {'\0', '\0', static_cast<char>(dtype), static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((d >> shift) & 0xFF));
  s.append(data.begin(), data.end());
  return s;
}

void write_gz(const fs::path& p, const std::string& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

void write_plain(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

// Expects read_idx(p) to throw a DatasetError whose message names the file and says `why`.
void expect_error(const fs::path& p, const std::string& why) {
  try {
    ds::read_idx(p);
    FAIL() << "expected an error reading " << p;
  } catch (const ds::DatasetError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(p.string()), std::string::npos) << m;
    EXPECT_NE(m.find(why), std::string::npos) << m;
  }
}

}  // namespace

TEST(FashionMnist, ShapesLabelsAndPixelChecksums) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST in " << FASHION_MNIST_DIR;
  const ds::TrainTest t = ds::load_fashion_mnist(FASHION_MNIST_DIR);
  ASSERT_EQ(t.train.size(), 60000u);
  ASSERT_EQ(t.test.size(), 10000u);
  EXPECT_EQ(t.train.sample_shape, (std::vector<uint32_t>{28, 28, 1}));
  EXPECT_EQ(t.train.x.size(), 60000u * 784u);
  EXPECT_EQ(t.test.x.size(), 10000u * 784u);

  // Labels: 0..9, 6000 / 1000 of each, and the first ten as in the files.
  std::vector<int> train_counts(10), test_counts(10);
  for (int32_t y : t.train.y) {
    ASSERT_GE(y, 0);
    ASSERT_LE(y, 9);
    ++train_counts[static_cast<size_t>(y)];
  }
  for (int32_t y : t.test.y) ++test_counts[static_cast<size_t>(y)];
  EXPECT_EQ(train_counts, std::vector<int>(10, 6000));
  EXPECT_EQ(test_counts, std::vector<int>(10, 1000));
  EXPECT_EQ(std::vector<int32_t>(t.train.y.begin(), t.train.y.begin() + 10),
            (std::vector<int32_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5}));
  EXPECT_EQ(std::vector<int32_t>(t.test.y.begin(), t.test.y.begin() + 10),
            (std::vector<int32_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7}));

  // Pixels in [0, 1], x * 255 is the raw byte exactly; the byte sums are Python's.
  auto byte_sum = [](const std::vector<float>& x) {
    uint64_t s = 0;
    for (float v : x) {
      EXPECT_GE(v, 0.0f);
      EXPECT_LE(v, 1.0f);
      s += static_cast<uint64_t>(std::lround(v * 255.0f));
    }
    return s;
  };
  EXPECT_EQ(byte_sum(t.train.x), 3431114169ull);
  EXPECT_EQ(byte_sum(t.test.x), 573469082ull);
}

TEST(FashionMnist, RawIdxHeader) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST in " << FASHION_MNIST_DIR;
  const ds::IdxArray a = ds::read_idx(fs::path(FASHION_MNIST_DIR) / "t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(a.dims, (std::vector<uint32_t>{10000, 28, 28}));
  EXPECT_EQ(a.data.size(), 7840000u);
}

TEST(Idx, PlainAndGzipReadTheSame) {
  TempDir dir("idx");
  const std::string bytes = idx_bytes(0x08, {2, 2, 3}, {0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255});
  write_plain(dir.path / "a.idx", bytes);
  write_gz(dir.path / "a.idx.gz", bytes);
  for (const char* name : {"a.idx", "a.idx.gz"}) {
    const ds::IdxArray a = ds::read_idx(dir.path / name);
    EXPECT_EQ(a.dims, (std::vector<uint32_t>{2, 2, 3}));
    EXPECT_EQ(a.data[11], 255);
  }
}

// gzip allows several members one after another (`cat a.gz b.gz`); gzip -d and zlib's gzread
// read them as one stream, and so must the reader. A member with a wrong CRC is corrupt.
TEST(Idx, ConcatenatedGzipMembersAndABadChecksum) {
  TempDir dir("idx_members");
  std::vector<uint8_t> pixels(2 * 28 * 28);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  const std::string bytes = idx_bytes(0x08, {2, 28, 28}, pixels);
  const size_t cut = 1000;  // inside the data
  write_gz(dir.path / "head.gz", bytes.substr(0, cut));
  write_gz(dir.path / "tail.gz", bytes.substr(cut));
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  write_plain(dir.path / "both.gz", slurp(dir.path / "head.gz") + slurp(dir.path / "tail.gz"));
  const ds::IdxArray a = ds::read_idx(dir.path / "both.gz");
  EXPECT_EQ(a.dims, (std::vector<uint32_t>{2, 28, 28}));
  EXPECT_EQ(a.data, pixels);

  std::string gz = slurp(dir.path / "tail.gz");
  gz[gz.size() - 8] = static_cast<char>(gz[gz.size() - 8] ^ 1);  // the CRC-32 trailer
  write_plain(dir.path / "crc.gz", gz);
  expect_error(dir.path / "crc.gz", "corrupt gzip data");
}

TEST(Idx, LoadPairScalesAndAddsChannel) {
  TempDir dir("idx_pair");
  write_gz(dir.path / "im.gz", idx_bytes(0x08, {2, 1, 2}, {0, 255, 51, 102}));
  write_gz(dir.path / "lb.gz", idx_bytes(0x08, {2}, {7, 3}));
  const ds::Dataset d = ds::load_idx_pair(dir.path / "im.gz", dir.path / "lb.gz");
  EXPECT_EQ(d.sample_shape, (std::vector<uint32_t>{1, 2, 1}));
  EXPECT_EQ(d.x, (std::vector<float>{0.0f, 1.0f, 0.2f, 0.4f}));
  EXPECT_EQ(d.y, (std::vector<int32_t>{7, 3}));
  write_gz(dir.path / "lb3.gz", idx_bytes(0x08, {3}, {1, 2, 3}));
  try {
    ds::load_idx_pair(dir.path / "im.gz", dir.path / "lb3.gz");
    FAIL();
  } catch (const ds::DatasetError& e) {
    EXPECT_NE(std::string(e.what()).find("2 images, 3 labels"), std::string::npos) << e.what();
  }
}

TEST(Idx, MissingFileIsNamed) {
  TempDir dir("idx_missing");
  expect_error(dir.path / "nope-idx3-ubyte.gz", "not found");
  try {
    ds::load_fashion_mnist(dir.path);
    FAIL();
  } catch (const ds::DatasetError& e) {
    EXPECT_NE(std::string(e.what()).find("train-images-idx3-ubyte.gz"), std::string::npos) << e.what();
  }
}

TEST(Idx, TruncatedFilesAreNamed) {
  TempDir dir("idx_trunc");
  const std::string full = idx_bytes(0x08, {10, 28, 28}, std::vector<uint8_t>(7840, 7));
  write_gz(dir.path / "data.gz", full.substr(0, full.size() - 100));
  expect_error(dir.path / "data.gz", "truncated: expected 7840 data bytes, got 7740");
  write_gz(dir.path / "dims.gz", full.substr(0, 9));
  expect_error(dir.path / "dims.gz", "truncated in the dimensions");
  write_gz(dir.path / "empty.gz", "");
  expect_error(dir.path / "empty.gz", "truncated");

  // A gzip stream cut in the middle (the real files, half downloaded).
  std::string gz;
  {
    write_gz(dir.path / "whole.gz", full);
    std::ifstream in(dir.path / "whole.gz", std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(in), {});
  }
  write_plain(dir.path / "cut.gz", gz.substr(0, gz.size() / 2));
  try {
    ds::read_idx(dir.path / "cut.gz");
    FAIL() << "expected an error";
  } catch (const ds::DatasetError& e) {
    EXPECT_NE(std::string(e.what()).find((dir.path / "cut.gz").string()), std::string::npos) << e.what();
  }
}

TEST(Idx, BadMagicAndDtype) {
  TempDir dir("idx_magic");
  write_gz(dir.path / "png.gz", std::string("\x89PNG\r\n\x1a\n", 8));
  expect_error(dir.path / "png.gz", "bad magic 0x89504E47");
  write_plain(dir.path / "zero_rank", idx_bytes(0x08, {}, {}));
  expect_error(dir.path / "zero_rank", "bad magic");
  write_gz(dir.path / "float.gz", idx_bytes(0x0D, {1}, {0, 0, 0, 0}));
  expect_error(dir.path / "float.gz", "unsupported dtype 0x0D");
  write_gz(dir.path / "trailing.gz", idx_bytes(0x08, {2}, {1, 2, 3}));
  expect_error(dir.path / "trailing.gz", "trailing data");
}

// A ByteDataset's take() gives exactly the floats of the float loader, into reused memory.
TEST(Idx, BytesTakeEqualsTheFloatLoaderAndReusesMemory) {
  TempDir dir("idx_bytes");
  std::vector<uint8_t> pixels(5 * 2 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 37 + 11);
  write_gz(dir.path / "im.gz", idx_bytes(0x08, {5, 2, 3}, pixels));
  write_gz(dir.path / "lb.gz", idx_bytes(0x08, {5}, {4, 3, 2, 1, 0}));
  const ds::ByteDataset bytes = ds::load_idx_pair_bytes(dir.path / "im.gz", dir.path / "lb.gz");
  const ds::Dataset floats = ds::load_idx_pair(dir.path / "im.gz", dir.path / "lb.gz");
  EXPECT_EQ(bytes.sample_shape, floats.sample_shape);
  ds::Dataset out;
  bytes.take({4, 0, 2}, out);
  const ds::Dataset want = floats.take({4, 0, 2});
  EXPECT_EQ(out.x, want.x);
  EXPECT_EQ(out.y, (std::vector<int32_t>{0, 4, 2}));
  const float* memory = out.x.data();
  bytes.take({1, 3, 2}, out);
  EXPECT_EQ(out.x.data(), memory) << "same size: the same memory";
  EXPECT_EQ(out.x, floats.take({1, 3, 2}).x);
  EXPECT_THROW(bytes.take({5}, out), ds::DatasetError);
}
