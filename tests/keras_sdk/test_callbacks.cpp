// Progress bar formatting, the CSV log and checkpoint files (skyforge/keras_callbacks.hpp).
#include <skyforge/keras_callbacks.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace K = skyforge::keras;
namespace fs = std::filesystem;

namespace {
std::string slurp(std::FILE* f) {
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}
size_t count(const std::string& s, char c) { return static_cast<size_t>(std::count(s.begin(), s.end(), c)); }
}  // namespace

TEST(Progress, MidEpochLine) {
  K::ProgressState p;
  p.current = 12;
  p.target = 469;
  p.elapsed_s = 1.2;  // 0.1 s/step -> 45.7 s left
  p.metrics = {{"loss", 1.20346}, {"accuracy", 0.57123}};
  p.samples_per_s = 1280.4;
  EXPECT_EQ(K::format_progress(p),
            " 12/469 [..............................] - ETA: 45s - loss: 1.2035 - accuracy: 0.5712 - 1280 samples/s");
  p.current = 235;
  p.elapsed_s = 23.5;
  EXPECT_EQ(K::format_progress(p).substr(0, 41), "235/469 [==============>...............] ");
}

TEST(Progress, FinalLine) {
  K::ProgressState p;
  p.current = p.target = 469;
  p.elapsed_s = 3.2;
  p.finished = true;
  p.metrics = {{"loss", 0.51234}, {"accuracy", 0.82341}, {"val_loss", 0.0004}};
  p.samples_per_s = 18750;
  EXPECT_EQ(K::format_progress(p), "469/469 [==============================] - 3s 7ms/step - loss: 0.5123 - "
                                   "accuracy: 0.8234 - val_loss: 4.0000e-04 - 18750 samples/s");
}

TEST(Progress, EtaAndTimeFormats) {
  EXPECT_EQ(K::format_eta(7.9), "7s");
  EXPECT_EQ(K::format_eta(123), "2:03");
  EXPECT_EQ(K::format_eta(3723), "1:02:03");
  EXPECT_EQ(K::format_time_per_step(2.4), "2s/step");
  EXPECT_EQ(K::format_time_per_step(0.035), "35ms/step");
  EXPECT_EQ(K::format_time_per_step(0.00012), "120us/step");
  EXPECT_EQ(K::format_metric_value(0.5), "0.5000");
  EXPECT_EQ(K::format_metric_value(1e-5), "1.0000e-05");
}

TEST(Progress, BarWidthIsConstant) {
  for (uint64_t cur = 0; cur <= 7; ++cur) {
    K::ProgressState p;
    p.current = cur;
    p.target = 7;
    const std::string line = K::format_progress(p);
    const size_t open = line.find('['), close = line.find(']');
    EXPECT_EQ(close - open - 1, 30u) << line;
    EXPECT_EQ(line.find('>') != std::string::npos, cur > 0 && cur < 7) << line;
  }
}

TEST(Progress, NonTtyPrintsEveryTenPercent) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  K::ProgressBar bar(469, f, /*tty=*/false, /*line_percent=*/10);
  int printed = 0;
  for (uint64_t s = 1; s <= 469; ++s) {
    K::ProgressState p;
    p.current = s;
    p.target = 469;
    p.elapsed_s = 0.01 * static_cast<double>(s);
    if (s < 469) printed += bar.update(p) ? 1 : 0;
    else bar.finish(p);
  }
  const std::string out = slurp(f);
  std::fclose(f);
  EXPECT_EQ(printed, 9);               // 10 %, 20 %, ..., 90 %
  EXPECT_EQ(count(out, '\n'), 10u);    // + the final line
  EXPECT_EQ(count(out, '\r'), 0u);
  EXPECT_NE(out.find("469/469 [==============================] - 5s 10ms/step"), std::string::npos) << out;
}

TEST(Progress, TtyRewritesInPlace) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  K::ProgressBar bar(100, f, /*tty=*/true, 10, /*min_interval_s=*/0.5);
  for (uint64_t s = 1; s <= 100; ++s) {
    K::ProgressState p;
    p.current = s;
    p.target = 100;
    p.elapsed_s = 0.1 * static_cast<double>(s);  // 10 s in all: a redraw every 0.5 s
    if (s < 100) bar.update(p);
    else bar.finish(p);
  }
  const std::string out = slurp(f);
  std::fclose(f);
  EXPECT_EQ(count(out, '\n'), 1u);
  EXPECT_GE(count(out, '\r'), 15u);
  EXPECT_LE(count(out, '\r'), 22u);
}

TEST(HistoryCsv, KerasCsvLoggerFormat) {
  K::History h;
  h.append(0, {{"loss", 0.5}, {"accuracy", 0.8}, {"val_loss", 0.45}, {"val_accuracy", 0.825}});
  h.append(1, {{"loss", 0.25}, {"accuracy", 0.9}, {"val_loss", 0.4}, {"val_accuracy", 0.1 + 0.2}});
  EXPECT_EQ(K::history_csv(h),
            "epoch,accuracy,loss,val_accuracy,val_loss\n"
            "0,0.8,0.5,0.825,0.45\n"
            "1,0.9,0.25,0.30000000000000004,0.4\n");
  const K::History back = K::parse_history_csv(K::history_csv(h));
  EXPECT_EQ(back.epoch, h.epoch);
  EXPECT_EQ(back.history, h.history);
  EXPECT_EQ(h["loss"], (std::vector<double>{0.5, 0.25}));
  EXPECT_THROW(h["nope"], std::out_of_range);
}

TEST(HistoryCsv, LateMetricIsPadded) {
  K::History h;
  h.append(0, {{"loss", 1}});
  h.append(1, {{"loss", 2}, {"val_loss", 3}});
  ASSERT_EQ(h["val_loss"].size(), 2u);
  EXPECT_TRUE(std::isnan(h["val_loss"][0]));
  EXPECT_EQ(K::history_csv(h), "epoch,loss,val_loss\n0,1,nan\n1,2,3\n");
  EXPECT_TRUE(std::isnan(K::parse_history_csv(K::history_csv(h))["val_loss"][0]));
}

TEST(Checkpoint, RoundTripAndLatest) {
  TempDir dir("ckpt");
  K::Checkpoint c;
  c.epoch = 3;
  c.step = 1407;
  c.spec = "input=28x28x1;dense(units=10)";
  c.fingerprint = K::fnv1a64(c.spec);
  c.history = "epoch,loss\n0,1\n1,0.5\n2,0.25\n";
  c.state = std::string("\0\1\2state", 8);
  const fs::path p = K::write_checkpoint(dir.path, c);
  EXPECT_EQ(p, dir.path / "ckpt-3.bin");
  EXPECT_EQ(K::read_file(dir.path / "latest"), "ckpt-3.bin\n");
  ASSERT_EQ(K::latest_checkpoint(dir.path), p);
  const K::Checkpoint back = K::decode_checkpoint(K::read_file(p), p.string());
  EXPECT_EQ(back.epoch, 3u);
  EXPECT_EQ(back.step, 1407u);
  EXPECT_EQ(back.fingerprint, c.fingerprint);
  EXPECT_EQ(back.spec, c.spec);
  EXPECT_EQ(back.history, c.history);
  EXPECT_EQ(back.state, c.state);
  // No temporary files are left behind.
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(Checkpoint, EmptyDirHasNone) {
  TempDir dir("ckpt_empty");
  EXPECT_FALSE(K::latest_checkpoint(dir.path).has_value());
  EXPECT_FALSE(K::latest_checkpoint(dir.path / "not-created").has_value());
}

TEST(Checkpoint, MaxToKeep) {
  TempDir dir("ckpt_keep");
  K::Checkpoint c;
  for (uint32_t e = 1; e <= 4; ++e) {
    c.epoch = e;
    K::write_checkpoint(dir.path, c, /*max_to_keep=*/2);
  }
  EXPECT_FALSE(fs::exists(dir.path / "ckpt-1.bin"));
  EXPECT_FALSE(fs::exists(dir.path / "ckpt-2.bin"));
  EXPECT_TRUE(fs::exists(dir.path / "ckpt-3.bin"));
  EXPECT_TRUE(fs::exists(dir.path / "ckpt-4.bin"));
}

TEST(Checkpoint, CorruptionIsDetected) {
  K::Checkpoint c;
  c.epoch = 1;
  c.spec = "s";
  c.state = std::string(100, 'x');
  const std::string good = K::encode_checkpoint(c);
  auto error_of = [](const std::string& bytes) -> std::string {
    try {
      K::decode_checkpoint(bytes, "/ck/ckpt-1.bin");
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  std::string flipped = good;
  flipped[60] ^= 0x10;
  EXPECT_NE(error_of(flipped).find("checkpoint /ck/ckpt-1.bin: checksum mismatch"), std::string::npos);
  EXPECT_NE(error_of(good.substr(0, good.size() - 10)).find("checksum mismatch"), std::string::npos);
  EXPECT_NE(error_of("PK\3\4 not a checkpoint at all").find("bad magic"), std::string::npos);
  EXPECT_NE(error_of("").find("bad magic"), std::string::npos);
}

// Format 2 carries a mid-epoch position and the epoch's running sums; a mid-epoch checkpoint
// lives until the next checkpoint replaces it; format 1 files (written before) still load, and a
// format from a newer skyforge is refused saying so.
TEST(Checkpoint, MidEpochFieldsOlderFormatAndNewerFormat) {
  TempDir dir("ckpt_mid");
  K::Checkpoint c;
  c.epoch = 2;
  c.step = 2200;
  c.epoch_step = 324;
  c.loss_sum = 0.1 + 1e-17 * 3;  // a double's bits survive
  c.correct = 17000;
  c.seen = 20736;
  c.spec = "s";
  c.state = "state";
  const fs::path mid = K::write_checkpoint(dir.path, c);
  EXPECT_EQ(mid, dir.path / "ckpt-2-324.bin");
  const K::Checkpoint back = K::decode_checkpoint(K::read_file(mid), mid.string());
  EXPECT_EQ(back.epoch_step, 324u);
  EXPECT_EQ(back.loss_sum, c.loss_sum);
  EXPECT_EQ(back.correct, 17000u);
  EXPECT_EQ(back.seen, 20736u);
  c.epoch_step = 500;
  K::write_checkpoint(dir.path, c);
  EXPECT_FALSE(fs::exists(mid)) << "replaced by the newer mid-epoch checkpoint";
  c.epoch = 3;
  c.epoch_step = 0;
  K::write_checkpoint(dir.path, c);
  EXPECT_FALSE(fs::exists(dir.path / "ckpt-2-500.bin")) << "replaced by the epoch's checkpoint";
  EXPECT_EQ(K::read_file(dir.path / "latest"), "ckpt-3.bin\n");

  // Format 1, as the build before wrote it: no mid-epoch fields.
  std::string v1 = "SKYFCKPT";
  auto le = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) v1.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  le(1, 4);     // format
  le(4, 4);     // epoch
  le(3752, 8);  // step
  le(K::fnv1a64("s"), 8);
  le(1, 4);
  v1 += "s";
  le(0, 4);  // history
  le(5, 8);
  v1 += "state";
  le(skyforge::tfevents::crc32c(v1.data(), v1.size()), 4);
  const K::Checkpoint old = K::decode_checkpoint(v1, "old.bin");
  EXPECT_EQ(old.epoch, 4u);
  EXPECT_EQ(old.step, 3752u);
  EXPECT_EQ(old.epoch_step, 0u);
  EXPECT_EQ(old.state, "state");

  std::string v4 = K::encode_checkpoint(c);
  v4[8] = 4;  // the format field
  const uint32_t crc = skyforge::tfevents::crc32c(v4.data(), v4.size() - 4);
  for (int i = 0; i < 4; ++i) v4[v4.size() - 4 + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  try {
    K::decode_checkpoint(v4, "new.bin");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("format 4 is not supported (this build reads formats 1 to 3; it was written by a newer skyforge)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, LatestNamingAMissingFile) {
  TempDir dir("ckpt_dangling");
  K::write_file_atomic(dir.path / "latest", "ckpt-9.bin\n");
  try {
    K::latest_checkpoint(dir.path);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt-9.bin, which is missing"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, SpecDifferenceNamesTheLayer) {
  EXPECT_EQ(K::spec_difference("input=4;dense(units=10);loss=x", "input=4;dense(units=5);loss=x"),
            "checkpoint has 'dense(units=10)', this model has 'dense(units=5)'");
  EXPECT_EQ(K::spec_difference("input=4;relu()", "input=4;relu();dropout(rate=0.5)"),
            "checkpoint has '<none>', this model has 'dropout(rate=0.5)'");
}
