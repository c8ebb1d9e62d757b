// The offers data file the aws plugin ships, and choosing from it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "offers.hpp"

using namespace skyforge::aws;
namespace fs = std::filesystem;

namespace {

const std::string kShipped = std::string(SKYFORGE_SOURCE_DIR) + "/providers/aws/offers.csv";

TEST(Offers, TheShippedFileSaysItsSourceAndReads) {
  std::ifstream in(kShipped);
  std::string first, second;
  std::getline(in, first);
  std::getline(in, second);
  EXPECT_NE(second.find("Source: github.com/skypilot-org/skypilot-catalog"), std::string::npos) << second;
  auto all = load_offers(kShipped);
  EXPECT_GT(all.size(), 100u);
  for (const auto& o : all) {
    EXPECT_GT(o.accelerator_count, 0u) << o.instance_type;
    EXPECT_TRUE(o.price || o.spot_price) << o.instance_type << " " << o.region;
  }
}

// The cheapest that fits, checked against a plain scan of the CSV text.
TEST(Offers, TheCheapestFitIsTheLowestPriceOfThatAcceleratorCountAndRegion) {
  auto all = load_offers(kShipped);
  for (bool spot : {false, true}) {
    auto fit = offers_for(all, "a10g", 1, "us-east-1", spot);
    ASSERT_FALSE(fit.empty());
    std::ifstream in(kShipped);
    std::string line;
    double lowest = std::numeric_limits<double>::infinity();
    while (std::getline(in, line)) {
      std::vector<std::string> f;
      std::stringstream ss(line);
      for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
      if (f.size() < 8 || f[1] != "A10G" || f[2] != "1.0" || f[7] != "us-east-1") continue;
      const std::string& p = spot ? f[6] : f[5];
      if (!p.empty()) lowest = std::min(lowest, std::stod(p));
    }
    EXPECT_EQ(*(spot ? fit[0].spot_price : fit[0].price), lowest);
    for (size_t i = 1; i < fit.size(); ++i)
      EXPECT_LE(*(spot ? fit[i - 1].spot_price : fit[i - 1].price), *(spot ? fit[i].spot_price : fit[i].price));
    for (const auto& o : fit) {
      EXPECT_EQ(o.accelerator, "A10G");
      EXPECT_EQ(o.accelerator_count, 1u);
      EXPECT_EQ(o.region, "us-east-1");
    }
  }
  EXPECT_TRUE(offers_for(all, "A100", 1, "us-east-1", false).empty()) << "no 1 x A100 type on EC2";
  EXPECT_FALSE(offers_for(all, "A100", 8, "", false).empty());
  EXPECT_NE(format_offers(offers_for(all, "H100", 8, "us-east-1", false)).find("p5.48xlarge"), std::string::npos);
}

TEST(Offers, AMalformedFileIsNamedWithItsLine) {
  const fs::path p = fs::temp_directory_path() / ("skyforge-offers-" + std::to_string(::getpid()) + ".csv");
  std::ofstream(p) << "# comment\ninstance_type,accelerator,accelerator_count,vcpus,memory_gib,price,spot_price,region\n"
                      "g5.xlarge,A10G,1,4,16,1.0,0.4,us-east-1\ng5.2xlarge,A10G,one,8,32,1.2,,us-east-1\n";
  try {
    load_offers(p.string());
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(p.string() + " line 4: accelerator_count"), std::string::npos) << e.what();
  }
  std::ofstream(p) << "type,price\n";
  EXPECT_THROW(load_offers(p.string()), std::runtime_error);
  fs::remove(p);
}

}  // namespace
