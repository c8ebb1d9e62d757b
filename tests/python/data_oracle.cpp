// The C++ SDK's data API (skyforge/data.hpp) on the command line, for python/tests to check the
// Python port against, answer for answer:
//   data_oracle permutation N SHUFFLE SEED
//   data_oracle shard N NODE TOTAL SHUFFLE SEED
//   data_oracle sampler SIZE RANK WORLD SHUFFLE SEED DROP_LAST EPOCH
//   data_oracle next SEED COUNT          (the raw generator stream)
//   data_oracle below SEED BOUND...      (one bounded draw per bound, from one generator)
// Prints the numbers on one line, separated by spaces.
#include <skyforge/data.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

uint64_t arg(char** argv, int i) { return std::strtoull(argv[i], nullptr, 10); }

template <class V>
void print(const V& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : " ") + std::to_string(x);
  std::printf("%s\n", out.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  try {
    if (what == "permutation" && argc == 5) {
      print(skyforge::permutation(arg(argv, 2), arg(argv, 3) != 0, arg(argv, 4)));
    } else if (what == "shard" && argc == 7) {
      print(skyforge::shard(arg(argv, 2), uint32_t(arg(argv, 3)), uint32_t(arg(argv, 4)), arg(argv, 5) != 0, arg(argv, 6)));
    } else if (what == "sampler" && argc == 9) {
      skyforge::DistributedSampler s(arg(argv, 2), uint32_t(arg(argv, 3)), uint32_t(arg(argv, 4)), arg(argv, 5) != 0,
                                     arg(argv, 6), arg(argv, 7) != 0);
      s.set_epoch(arg(argv, 8));
      print(s.indices());
    } else if (what == "next" && argc == 4) {
      skyforge::Rng rng(arg(argv, 2));
      std::vector<uint64_t> v;
      for (uint64_t i = 0; i < arg(argv, 3); ++i) v.push_back(rng.next());
      print(v);
    } else if (what == "below" && argc >= 4) {
      skyforge::Rng rng(arg(argv, 2));
      std::vector<uint64_t> v;
      for (int i = 3; i < argc; ++i) v.push_back(rng.below(arg(argv, i)));
      print(v);
    } else {
      std::fprintf(stderr, "usage: see the head of data_oracle.cpp\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
