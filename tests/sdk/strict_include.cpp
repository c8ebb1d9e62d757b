// data.hpp is compiled into every native app, often under strict warning flags: this
// translation unit instantiates each template of the header under -Wpedantic -Wconversion
// -Wsign-conversion -Wshadow -Werror (see CMakeLists.txt), so a warning in the header fails the build.
#include <skyforge/accelerator.hpp>  // read by the host, providers and framework plugins
#include <skyforge/data.hpp>
#include <skyforge/layer_schema.hpp>  // read by every compute backend and the Keras-style API

#include <cstdint>
#include <string>
#include <vector>

namespace {
struct Info {
  uint32_t node = 0, total_nodes = 1;
};
}  // namespace

size_t skyforge_sdk_strict_include_probe();

size_t skyforge_sdk_strict_include_probe() {
  const Info info{};
  const std::vector<float> x(4, 1.0f);
  const std::vector<std::string> y(4, "y");
  auto [xs, ys] = skyforge::shard(0, 1, true, 1, x, y);
  auto [xi, yi] = skyforge::shard(info, true, 1, x, y);
  skyforge::DistributedSampler sampler(10, 0, 3, true, 1, false);
  sampler.set_epoch(2);
  return skyforge::shard(10, 0, 2, true, 42).size() + skyforge::shard(info, 10).size() +
         skyforge::shard_for(info, 10).size() + xs.size() + ys.size() + xi.size() + yi.size() +
         sampler.indices().size() + skyforge::permutation(5, true, 3).size();
}
