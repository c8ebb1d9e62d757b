// The `cuda` plugin's option table (plugin_options.hpp).
#include "plugin_options.hpp"

#include <charconv>
#include <utility>

namespace skyforge::cuda {

namespace {

PluginOption boolean(std::string name, bool EngineOptions::*field) {
  return {std::move(name), "boolean", {}, "true or false",
          [field](const EngineOptions& o) { return std::string(o.*field ? "true" : "false"); },
          [field](EngineOptions& o, const std::string& text) {
            if (text != "true" && text != "false") return false;
            o.*field = text == "true";
            return true;
          }};
}

// A string option that takes one of `values`, each the text of an enumerator.
template <class Enum>
PluginOption one_of(std::string name, Enum EngineOptions::*field, std::vector<std::pair<std::string, Enum>> values) {
  PluginOption out{std::move(name), "string", {}, "", nullptr, nullptr};
  for (size_t i = 0; i < values.size(); ++i) {
    out.choices.push_back(values[i].first);
    out.expected += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + ("\"" + values[i].first + "\"");
  }
  out.text = [field, values](const EngineOptions& o) {
    for (const auto& [text, value] : values)
      if (o.*field == value) return text;
    return std::string();
  };
  out.read = [field, values](EngineOptions& o, const std::string& text) {
    for (const auto& [t, value] : values)
      if (t == text) return o.*field = value, true;
    return false;
  };
  return out;
}

}  // namespace

const std::vector<PluginOption>& plugin_options() {
  using Layout = DeviceOptions::ConvLayout;
  using Precision = DeviceOptions::Precision;
  using Reductions = DeviceOptions::Reductions;
  constexpr int64_t kMaxBucketMb = 4096;
  static const std::vector<PluginOption> table = {
      {"bucket_cap_mb", "integer", {}, "an integer from 1 to " + std::to_string(kMaxBucketMb) + " (MiB)",
       [](const EngineOptions& o) { return std::to_string(o.bucket_bytes >> 20); },
       [](EngineOptions& o, const std::string& text) {
         int64_t mb = 0;
         const char* end = text.data() + text.size();
         const auto [at, ec] = std::from_chars(text.data(), end, mb);
         if (ec != std::errc{} || at != end || mb < 1 || mb > kMaxBucketMb) return false;
         o.bucket_bytes = static_cast<size_t>(mb) << 20;
         return true;
       }},
      boolean("cuda_graphs", &EngineOptions::graphs),
      boolean("tf32", &EngineOptions::tf32),
      boolean("deterministic", &EngineOptions::deterministic),
      boolean("autotune", &EngineOptions::autotune),
      one_of<Layout>("conv_layout", &EngineOptions::conv_layout,
                     {{"auto", Layout::automatic}, {"nhwc", Layout::nhwc}, {"nchw", Layout::nchw}}),
      one_of<Precision>("precision", &EngineOptions::precision, {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}}),
      one_of<Reductions>("reductions", &EngineOptions::reductions,
                         {{"auto", Reductions::automatic}, {"fp64", Reductions::fp64}, {"fp32", Reductions::fp32}}),
  };
  return table;
}

EngineOptions read_plugin_options(const Options& given) {
  EngineOptions o;
  for (const PluginOption& option : plugin_options()) {
    if (!given.has(option.name)) continue;
    const std::string text = given.get(option.name);
    if (!option.read(o, text))
      throw Error("option '" + option.name + "': expected " + option.expected + ", got '" + text + "'", SF_ERR_INVALID);
  }
  return o;
}

}  // namespace skyforge::cuda
