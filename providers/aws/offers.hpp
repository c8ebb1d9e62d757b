// EC2 accelerator offers: instance types with their accelerators and prices, from the data file
// the aws plugin ships (providers/aws/offers.csv: its source and date are in its header), for
// `skyforge offers --provider aws` and for `[pool] accelerator` picking the cheapest type that
// fits (docs/providers.md, "aws: accelerators").
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace skyforge::aws {

struct Offer {
  std::string instance_type;
  std::string accelerator;  // "A100", "A10G", ...
  unsigned accelerator_count = 0;
  double vcpus = 0, memory_gib = 0;
  std::optional<double> price, spot_price;  // USD per hour; absent where the source has none
  std::string region;
};

// Reads the data file. Throws std::runtime_error naming the file, the line and what was expected.
std::vector<Offer> load_offers(const std::string& path);
// The data file next to this plugin's library (installed beside it).
std::string default_offers_path();

// The offers whose accelerator is `name` (case-insensitive) with exactly `count` per instance,
// in `region` (every region when empty), priced (spot price when `spot`), cheapest first.
std::vector<Offer> offers_for(const std::vector<Offer>& all, const std::string& name, unsigned count,
                              const std::string& region, bool spot);
// A table of offers, one per line, cheapest first, with a header.
std::string format_offers(const std::vector<Offer>& offers);

}  // namespace skyforge::aws
