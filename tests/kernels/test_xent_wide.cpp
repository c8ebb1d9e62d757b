// softmax_xent's staged path for wide rows (xent.hpp, "wide rows"): the same logits through it
// and through the one-call-per-row path, against the double reference; its bits on any thread
// count and at any batch size; and the portable exp and log it uses.
#include "reference.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>

namespace sk = skyforge::kernels;

namespace {

struct XentOut {
  std::vector<float> loss, hit, d;
};

XentOut xent(const std::vector<float>& l, const std::vector<int32_t>& labels, size_t classes, bool wide,
             bool grad = true) {
  const size_t rows = labels.size();
  XentOut o{std::vector<float>(rows), std::vector<float>(rows), std::vector<float>(grad ? rows * classes : 0)};
  std::vector<double> ws(sk::softmax_xent_workspace(rows, classes));
  sk::softmax_xent(l.data(), labels.data(), rows, classes, o.loss.data(), o.hit.data(), grad ? o.d.data() : nullptr,
                   wide ? ws.data() : nullptr);
  return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

constexpr size_t kClasses = 5003;  // K = 40 slices, the last ones a class shorter

// Rows: random logits; a tie between two slices (the lower class wins, not the lower slice);
// the maximum in the last class; a NaN past class 0; labels outside [0, classes).
struct Batch {
  std::vector<float> l = kref::randn(6 * kClasses, 11, 4.f);
  std::vector<int32_t> labels = {17, 47, 5002, 3, 5003, -1};
  Batch() {
    l[1 * kClasses + 47] = l[1 * kClasses + 9] = 40.f;  // slices 7 and 9: class 9 first
    l[2 * kClasses + 5002] = 30.f;
    l[3 * kClasses + 100] = NAN;
  }
};

TEST(XentWide, AgreesWithThePerRowPathAndTheReference) {
  const Batch b;
  const XentOut wide = xent(b.l, b.labels, kClasses, true), row = xent(b.l, b.labels, kClasses, false);
  std::vector<int32_t> ok(b.labels.begin(), b.labels.begin() + 4);
  const auto ref = kref::xent(kref::to_double(b.l), ok, 4, kClasses);
  for (size_t n = 0; n < 6; ++n) {
    SCOPED_TRACE(n);
    EXPECT_EQ(wide.hit[n], row.hit[n]);
    if (n >= 3) {  // the NaN row, the bad labels
      EXPECT_TRUE(std::isnan(wide.loss[n]));
      EXPECT_TRUE(std::isnan(row.loss[n]));
      continue;
    }
    EXPECT_NEAR(wide.loss[n], ref[n], 1e-7 * (1 + ref[n]));  // a double sum: the float rounding
    EXPECT_NEAR(wide.loss[n], row.loss[n], 1e-5 * (1 + ref[n]));
    for (size_t j = 0; j < kClasses; ++j) {
      const size_t i = n * kClasses + j;
      const double p = row.d[i] + (j == static_cast<size_t>(b.labels[n]) ? 1.0 : 0.0);  // the softmax
      ASSERT_NEAR(wide.d[i], row.d[i], 1e-5 * p + 1e-9) << j;
    }
  }
  EXPECT_EQ(wide.hit[0], 0.f);
  EXPECT_EQ(wide.hit[1], 0.f);  // class 9 is the first maximum, the label 47 ties it
  EXPECT_EQ(wide.hit[2], 1.f);
  for (size_t n : {4, 5})
    for (size_t j = 0; j < kClasses; ++j) ASSERT_EQ(wide.d[n * kClasses + j], 0.f);
  EXPECT_TRUE(std::isnan(wide.d[3 * kClasses]));  // NaN in, NaN gradient, as the per-row path
}

TEST(XentWide, SameBitsAtAnyThreadCountBatchSizeAndWithoutGradient) {
  const Batch b;
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const XentOut one = xent(b.l, b.labels, kClasses, true);
  omp_set_num_threads(std::max(3, before));
  const XentOut many = xent(b.l, b.labels, kClasses, true);
  omp_set_num_threads(before);
  EXPECT_TRUE(same_bits(one.loss, many.loss));
  EXPECT_TRUE(same_bits(one.hit, many.hit));
  EXPECT_TRUE(same_bits(one.d, many.d));
  EXPECT_TRUE(same_bits(xent(b.l, b.labels, kClasses, true, false).loss, one.loss));
  // Row 2 alone: the same bits as in the batch of six.
  const std::vector<float> row2(b.l.begin() + 2 * kClasses, b.l.begin() + 3 * kClasses);
  const XentOut alone = xent(row2, {b.labels[2]}, kClasses, true);
  EXPECT_TRUE(same_bits(alone.loss, {one.loss[2]}));
  EXPECT_TRUE(same_bits(alone.d, std::vector<float>(one.d.begin() + 2 * kClasses, one.d.begin() + 3 * kClasses)));
}

// Up to kXentWideClasses the workspace changes nothing: every existing model keeps its bits.
TEST(XentWide, NarrowRowsKeepThePerRowPath) {
  const size_t classes = sk::kXentWideClasses;
  EXPECT_EQ(sk::softmax_xent_workspace(64, classes), 0u);
  EXPECT_EQ(sk::softmax_xent_workspace(64, classes + 1), 2 * 64 * (sk::xent_slices(classes + 1) + 1));
  const auto l = kref::randn(3 * classes, 12, 3.f);
  const std::vector<int32_t> labels = {0, 7, 4095};
  std::vector<double> ws(sk::softmax_xent_workspace(3, classes + 1));
  XentOut a = xent(l, labels, classes, false), b = a;
  sk::softmax_xent(l.data(), labels.data(), 3, classes, b.loss.data(), b.hit.data(), b.d.data(), ws.data());
  EXPECT_TRUE(same_bits(a.loss, b.loss));
  EXPECT_TRUE(same_bits(a.d, b.d));
}

TEST(XentWide, PortableExpAndLogMatchTheLibrary) {
  for (double x = -707.9; x <= 0.0; x += 0.0137) {
    const double want = std::exp(x);
    ASSERT_NEAR(sk::portable_exp(x), want, 1e-15 * want) << x;  // a few units in the last place
  }
  EXPECT_EQ(sk::portable_exp(0.0), 1.0);
  EXPECT_EQ(sk::portable_exp(-800.0), 0.0);
  EXPECT_EQ(sk::portable_exp(-INFINITY), 0.0);
  EXPECT_TRUE(std::isnan(sk::portable_exp(NAN)));
  for (double x = 1.0; x < 1e12; x *= 1.0123) {
    const double want = std::log(x);
    ASSERT_NEAR(sk::portable_log_ge1(x), want, 1e-15 * want + 1e-300) << x;
  }
  EXPECT_EQ(sk::portable_log_ge1(1.0), 0.0);
  EXPECT_EQ(sk::portable_log_ge1(INFINITY), INFINITY);
}

}  // namespace
