// The manifest's `[pool] accelerator` spec, as the framework plugins read it (pure).
//
//   ""                      no accelerator
//   "A100"                  one A100 per node
//   "H100:8"                eight per node
//   "A100(mig=3g.40gb)"     one A100, used through its MIG devices of profile 3g.40gb
//   "A100:2(mig=1g.10gb)"   (the count may also follow the parenthesis: "A100(mig=1g.10gb):2")
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace skyforge::fw {

struct AcceleratorSpec {
  std::string name;         // "A100"; empty: none
  uint32_t count = 0;       // per node; 1 when a name is given without a count
  std::string mig_profile;  // "3g.40gb"; empty: whole GPUs
};

// Throws std::invalid_argument on a malformed spec (bad count, unknown key in parentheses).
AcceleratorSpec parse_accelerator(std::string_view spec);

}  // namespace skyforge::fw
