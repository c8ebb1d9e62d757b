// The `cuda` plugin's options (backends/cuda/plugin_options.hpp): the table and plugin.toml
// declare the same options with the same types, defaults and choices (the host reads one, the
// plugin the other), a manifest's values reach EngineOptions, and a value an option does not take
// is refused with the option's name and the values it takes.
#include <gtest/gtest.h>

#include "catalog.hpp"  // the host's plugin.toml reader
#include "plugin_options.hpp"

#include <set>

namespace cu = skyforge::cuda;

namespace {

skyforge::Options given(const std::vector<std::pair<std::string, std::string>>& values) {
  std::vector<sf_kv> kv;
  for (const auto& [key, value] : values) kv.push_back({key.c_str(), value.c_str()});
  return skyforge::Options(kv.data(), kv.size());
}

// Every option's value in o, by name.
std::map<std::string, std::string> texts(const cu::EngineOptions& o) {
  std::map<std::string, std::string> out;
  for (const cu::PluginOption& option : cu::plugin_options()) out[option.name] = option.text(o);
  return out;
}

std::string refusal(const std::string& name, const std::string& value) {
  try {
    cu::read_plugin_options(given({{name, value}}));
  } catch (const skyforge::Error& e) {
    EXPECT_EQ(e.status(), SF_ERR_INVALID);
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST(CudaPluginOptions, PluginTomlDeclaresExactlyTheTablesOptionsWithTheirDefaults) {
  const skyforge::PluginInfo info = skyforge::parse_plugin_toml(SKYFORGE_SOURCE_DIR "/backends/cuda/plugin.toml");
  const cu::EngineOptions defaults;
  std::set<std::string> declared;
  for (const skyforge::OptionSchema& schema : info.options) {
    declared.insert(schema.name);
    const auto it = std::find_if(cu::plugin_options().begin(), cu::plugin_options().end(),
                                 [&](const cu::PluginOption& o) { return o.name == schema.name; });
    ASSERT_NE(it, cu::plugin_options().end()) << "plugin.toml declares '" << schema.name << "', the table does not";
    EXPECT_EQ(schema.type, it->type) << schema.name;
    EXPECT_EQ(schema.default_value.value_or("(none)"), it->text(defaults)) << schema.name;
    EXPECT_EQ(schema.choices, it->choices) << schema.name;
  }
  for (const cu::PluginOption& option : cu::plugin_options())
    EXPECT_TRUE(declared.count(option.name)) << "the table has '" << option.name << "', plugin.toml does not";
}

TEST(CudaPluginOptions, AbsentOptionsKeepTheirDefaultsAndGivenOnesReachTheEngine) {
  EXPECT_EQ(texts(cu::read_plugin_options(given({}))), texts(cu::EngineOptions{}));
  const cu::EngineOptions o = cu::read_plugin_options(given({{"bucket_cap_mb", "16"},
                                                             {"cuda_graphs", "false"},
                                                             {"tf32", "true"},
                                                             {"deterministic", "false"},
                                                             {"autotune", "true"},
                                                             {"conv_layout", "nchw"},
                                                             {"reductions", "fp32"},
                                                             {"not_ours", "x"}}));
  EXPECT_EQ(o.bucket_bytes, size_t{16} << 20);
  EXPECT_FALSE(o.graphs);
  EXPECT_TRUE(o.tf32);
  EXPECT_FALSE(o.deterministic);
  EXPECT_TRUE(o.autotune);
  EXPECT_EQ(o.conv_layout, cu::DeviceOptions::ConvLayout::nchw);
  EXPECT_EQ(o.reductions, cu::DeviceOptions::Reductions::fp32);
  EXPECT_EQ(cu::EngineOptions{}.reductions, cu::DeviceOptions::Reductions::automatic);
  EXPECT_EQ(cu::read_plugin_options(given({{"reductions", "fp64"}})).reductions, cu::DeviceOptions::Reductions::fp64);
  EXPECT_EQ(cu::read_plugin_options(given({{"conv_layout", "nhwc"}})).conv_layout,
            cu::DeviceOptions::ConvLayout::nhwc);
  EXPECT_EQ(cu::read_plugin_options(given({{"conv_layout", "auto"}})).conv_layout,
            cu::DeviceOptions::ConvLayout::automatic);
  EXPECT_EQ(cu::read_plugin_options(given({{"bucket_cap_mb", "4096"}})).bucket_bytes, size_t{4096} << 20);
}

TEST(CudaPluginOptions, AValueAnOptionDoesNotTakeIsRefusedNamingItAndWhatItTakes) {
  EXPECT_EQ(refusal("conv_layout", "NCHW"), "option 'conv_layout': expected \"auto\", \"nhwc\" or \"nchw\", got 'NCHW'");
  EXPECT_EQ(refusal("reductions", "double"),
            "option 'reductions': expected \"auto\", \"fp64\" or \"fp32\", got 'double'");
  EXPECT_EQ(refusal("tf32", "yes"), "option 'tf32': expected true or false, got 'yes'");
  EXPECT_EQ(refusal("cuda_graphs", "1"), "option 'cuda_graphs': expected true or false, got '1'");
  for (const char* bad : {"0", "4097", "-1", "16MiB", "", "99999999999999999999"})
    EXPECT_EQ(refusal("bucket_cap_mb", bad),
              std::string("option 'bucket_cap_mb': expected an integer from 1 to 4096 (MiB), got '") + bad + "'");
}
