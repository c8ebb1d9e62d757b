// The `[pool] accelerator` spec parser every reader shares (sdk/include/skyforge/accelerator.hpp,
// docs/manifest.md): the host's manifest check, the local provider, the framework plugins.
#include <gtest/gtest.h>

#include <skyforge/accelerator.hpp>

using skyforge::parse_accelerator;

TEST(Accelerator, ParsesNameCountAndMigProfile) {
  auto a = parse_accelerator("A100(mig=3g.40gb)");
  EXPECT_EQ(a.name, "A100");
  EXPECT_EQ(a.count, 1u);
  EXPECT_EQ(a.mig_profile, "3g.40gb");
  a = parse_accelerator("H100:8");
  EXPECT_EQ(a.name, "H100");
  EXPECT_EQ(a.count, 8u);
  EXPECT_EQ(a.mig_profile, "");
  a = parse_accelerator("A100:2(mig=1g.10gb)");
  EXPECT_EQ(a.count, 2u);
  EXPECT_EQ(a.mig_profile, "1g.10gb");
  a = parse_accelerator("A100(mig=1g.10gb+me):4");
  EXPECT_EQ(a.count, 4u);
  EXPECT_EQ(a.mig_profile, "1g.10gb+me");
  a = parse_accelerator("");
  EXPECT_EQ(a.name, "");
  EXPECT_EQ(a.count, 0u);
}

TEST(Accelerator, RefusesMalformedSpecs) {
  for (const char* bad : {"A100:0", "A100:x", "A100(mig=3g.40gb", "A100(foo=1)", "A100(mig=)", ":4", "A100:2(mig=1g.10gb):2"})
    EXPECT_THROW(parse_accelerator(bad), std::invalid_argument) << bad;
}
