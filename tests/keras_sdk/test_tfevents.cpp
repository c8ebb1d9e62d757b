// CRC-32C, TFRecord framing and the hand-encoded Event protobuf (skyforge/tfevents.hpp), read
// back by our own reader and by the real tensorboard package.
#include <skyforge/tfevents.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "test_util.hpp"

namespace tfe = skyforge::tfevents;
namespace fs = std::filesystem;

namespace {

// An event file with one scalar, written in `dir`: its path and its bytes.
std::pair<fs::path, std::string> one_scalar_file(const fs::path& dir) {
  fs::path path;
  {
    tfe::EventWriter w(dir);
    path = w.path();
    w.add_scalar("x", 1.0f, 1);
  }
  std::ifstream in(path, std::ios::binary);
  return {path, std::string(std::istreambuf_iterator<char>(in), {})};
}

}  // namespace

TEST(Crc32c, StandardCheckValues) {
  EXPECT_EQ(tfe::crc32c("123456789"), 0xE3069283u);  // the catalogue check value of CRC-32C
  EXPECT_EQ(tfe::crc32c(""), 0u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(tfe::crc32c(zeros), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  const std::string ones(32, '\xff');
  EXPECT_EQ(tfe::crc32c(ones), 0x62A8AB43u);  // RFC 3720 B.4: 32 bytes of 0xff
}

TEST(Crc32c, IncrementalEqualsWhole) {
  const std::string s = "The quick brown fox jumps over the lazy dog";
  const uint32_t part = tfe::crc32c(s.data(), 10);
  EXPECT_EQ(tfe::crc32c(s.data() + 10, s.size() - 10, part), tfe::crc32c(s));
}

TEST(Crc32c, MaskedAsTensorFlow) {
  // ((crc >> 15) | (crc << 17)) + 0xa282ead8; values from tensorboard's own masked_crc32c.
  EXPECT_EQ(tfe::masked_crc32c("123456789", 9), 0xC78AB0E5u);
  EXPECT_EQ(tfe::masked_crc32c("", 0), 0xA282EAD8u);
  EXPECT_EQ(tfe::unmask_crc(tfe::mask_crc(0xDEADBEEFu)), 0xDEADBEEFu);
}

TEST(TfRecord, FramingLayout) {
  const std::string rec = tfe::frame_record("abc");
  ASSERT_EQ(rec.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(rec.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(tfe::detail::get_le(reinterpret_cast<const unsigned char*>(rec.data()) + 8, 4),
            tfe::masked_crc32c(rec.data(), 8));
  EXPECT_EQ(rec.substr(12, 3), "abc");
  EXPECT_EQ(tfe::detail::get_le(reinterpret_cast<const unsigned char*>(rec.data()) + 15, 4),
            tfe::masked_crc32c("abc", 3));
}

TEST(TfEvents, ScalarEventEncodingBytes) {
  // Event{wall_time=1.5, step=3, summary{value{tag="a", simple_value=2.0}}}, encoded by hand:
  // 09 <double 1.5> 10 03 2a 0a 0a 08 0a 01 'a' 15 <float 2.0>
  const std::string e = tfe::encode_scalar_event(1.5, 3, "a", 2.0f);
  const std::string want("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f\x10\x03\x2a\x0a\x0a\x08\x0a\x01\x61\x15\x00\x00\x00\x40",
                         23);
  EXPECT_EQ(e, want);
  const tfe::Event ev = tfe::parse_event(e);
  EXPECT_EQ(ev.wall_time, 1.5);
  EXPECT_EQ(ev.step, 3);
  ASSERT_EQ(ev.scalars.size(), 1u);
  EXPECT_EQ(ev.scalars[0].first, "a");
  EXPECT_EQ(ev.scalars[0].second, 2.0f);
}

TEST(TfEvents, NegativeAndLargeSteps) {
  for (int64_t step : {int64_t{0}, int64_t{127}, int64_t{128}, int64_t{1} << 40, int64_t{-1}}) {
    const tfe::Event ev = tfe::parse_event(tfe::encode_scalar_event(0, step, "t", 1.0f));
    EXPECT_EQ(ev.step, step);
  }
}

TEST(TfEvents, WriterFileNameAndRecords) {
  TempDir dir("tfevents");
  fs::path path;
  {
    tfe::EventWriter w(dir.path / "train");
    path = w.path();
    w.add_scalar("epoch_loss", 0.5f, 0, 100.0);
    w.add_scalars({{"epoch_loss", 0.25f}, {"epoch_accuracy", 0.75f}}, 1, 101.0);
  }
  const std::string name = path.filename().string();
  EXPECT_EQ(path.parent_path(), dir.path / "train");
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_NE(name.find(tfe::hostname()), std::string::npos) << name;
  const auto recs = tfe::read_records(path);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(tfe::parse_event(recs[0]).file_version, "brain.Event:2");
  const tfe::Event e1 = tfe::parse_event(recs[1]);
  EXPECT_EQ(e1.step, 0);
  EXPECT_EQ(e1.wall_time, 100.0);
  ASSERT_EQ(e1.scalars.size(), 1u);
  EXPECT_EQ(e1.scalars[0], (std::pair<std::string, float>{"epoch_loss", 0.5f}));
  const tfe::Event e2 = tfe::parse_event(recs[2]);
  ASSERT_EQ(e2.scalars.size(), 2u);
  EXPECT_EQ(e2.scalars[1], (std::pair<std::string, float>{"epoch_accuracy", 0.75f}));

  // A second writer in the same directory in the same second gets its own file.
  tfe::EventWriter w2(dir.path / "train");
  EXPECT_NE(w2.path(), path);
}

TEST(TfEvents, ReaderRejectsCorruption) {
  TempDir dir("tfevents_bad");
  auto [path, bytes] = one_scalar_file(dir.path);
  std::string flipped = bytes;
  flipped[flipped.size() - 6] ^= 0x01;  // inside the last record's data
  {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << flipped;
  }
  try {
    tfe::read_records(path);
    FAIL() << "expected a CRC error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("data CRC mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 3);
  }
  EXPECT_THROW(tfe::read_records(path), std::runtime_error);
}

// The real reader: tensorboard's record reader (CRCs), Event protobuf and EventAccumulator.
TEST(TfEvents, ReadByTensorBoard) {
  const std::string py = venv_python_or_skip();
  if (py.empty()) GTEST_SKIP() << skip_reason();
  TempDir dir("tfevents_tb");
  {
    tfe::EventWriter w(dir.path / "run");
    for (int step = 0; step < 5; ++step) {
      w.add_scalar("epoch_loss", 1.0f / static_cast<float>(step + 1), step);
      w.add_scalars({{"epoch_accuracy", 0.1f * static_cast<float>(step)}, {"other", -2.5f}}, step);
    }
  }
  const std::string cmd = py + " " + CHECK_TFEVENTS_PY + " " + (dir.path / "run").string() +
                          " --expect epoch_loss=0:1,1:0.5,2:0.33333334,3:0.25,4:0.2" +
                          " --expect epoch_accuracy=0:0,1:0.1,2:0.2,3:0.3,4:0.4" +
                          " --expect other=0:-2.5,1:-2.5,2:-2.5,3:-2.5,4:-2.5";
  EXPECT_EQ(run_command(cmd), 0) << cmd;
}

// And a corrupted file is refused by that reader (so the check above really checks CRCs).
TEST(TfEvents, TensorBoardRefusesBadCrc) {
  const std::string py = venv_python_or_skip();
  if (py.empty()) GTEST_SKIP() << skip_reason();
  TempDir dir("tfevents_tb_bad");
  auto [path, bytes] = one_scalar_file(dir.path);
  bytes[bytes.size() - 1] ^= 0x40;  // the last data CRC
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_NE(run_command(py + " " + CHECK_TFEVENTS_PY + " " + dir.path.string()), 0);
}
