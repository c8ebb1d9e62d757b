// The `cuda` plugin's options (plugin.toml's [options.*]; docs/compute-backends.md, "The
// plugin"), declared once: each one's name, its plugin.toml type, the values it takes, and the
// field of EngineOptions it sets, whose initializer (engine.hpp, device.hpp) is its one default.
// The plugin reads a manifest's options here and nowhere else; plugin.toml declares the same
// options to the host (which checks a manifest against it without loading the plugin), and
// tests/cuda_backend/test_plugin_options.cpp holds the two equal.
#pragma once

#include "engine.hpp"

#include <functional>
#include <string>
#include <vector>

namespace skyforge::cuda {

struct PluginOption {
  std::string name;
  std::string type;                  // plugin.toml's: "boolean", "integer" or "string"
  std::vector<std::string> choices;  // a string option's values; empty for the others
  std::string expected;              // the values it takes, as an error names them
  // Its value in o, written as plugin.toml writes a default ("true", "4", "auto").
  std::function<std::string(const EngineOptions& o)> text;
  // Sets it in o from a manifest's text; false (o untouched) where the text is not a value it takes.
  std::function<bool(EngineOptions& o, const std::string& text)> read;
};

// Every option, in plugin.toml's order.
const std::vector<PluginOption>& plugin_options();

// The engine's options from the plugin's: an absent option keeps its default; a name not in the
// table is the host's to refuse (it checks every manifest against plugin.toml). Throws
// Error(SF_ERR_INVALID) for a value the option does not take, naming both:
// "option 'conv_layout': expected "auto", "nhwc" or "nchw", got 'NCHW'".
EngineOptions read_plugin_options(const Options& given);

}  // namespace skyforge::cuda
