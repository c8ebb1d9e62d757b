// Plugin loader (docs/plugins.md): Boost.DLL with RTLD_NOW|RTLD_LOCAL, ABI checks, resident
// forever (never dlclose'd), instances created through the descriptor.
#pragma once

#include <skyforge/abi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace skyforge {

class LoadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A plugin call failed: carries the status and the plugin's own message.
class PluginError : public std::runtime_error {
 public:
  PluginError(const std::string& what, sf_status status) : std::runtime_error(what), status_(status) {}
  sf_status status() const noexcept { return status_; }

 private:
  sf_status status_;
};

const char* kind_name(sf_kind kind);                 // "framework", "provider", ...
std::optional<sf_kind> kind_from_name(const std::string& name);

struct LoadedPlugin {
  std::string path;
  std::string name;
  std::string version;
  std::string description;
  sf_kind kind = 0;
  uint16_t abi_major = 0;
  uint16_t abi_minor = 0;
  const sf_plugin_descriptor* descriptor = nullptr;
  const void* hooks = nullptr;  // per-kind table; check struct_size before reading a field
  uint32_t hooks_size = 0;      // hooks' struct_size
};

// One created plugin instance; destroys it on destruction.
class PluginInstance {
 public:
  PluginInstance(const LoadedPlugin& plugin, void* self) : plugin_(&plugin), self_(self) {}
  ~PluginInstance();
  PluginInstance(const PluginInstance&) = delete;
  PluginInstance& operator=(const PluginInstance&) = delete;

  const LoadedPlugin& plugin() const { return *plugin_; }
  void* self() const { return self_; }
  // Throws PluginError("<plugin> <hook>: <message>") unless st == SF_OK.
  void check(sf_status st, const char* hook) const;

  template <class Hooks>
  const Hooks* hooks() const { return static_cast<const Hooks*>(plugin_->hooks); }
  // True when the plugin's table is large enough to hold the member at `offset` and it is set.
  bool has_hook(size_t offset_end) const { return plugin_->hooks_size >= offset_end; }

 private:
  const LoadedPlugin* plugin_;
  void* self_;
};

// Offset of the end of a hook member: pass to PluginInstance::has_hook.
#define SKYFORGE_HOOK_END(Table, member) (offsetof(Table, member) + sizeof(((Table*)nullptr)->member))

class Loader {
 public:
  // `services` must outlive the loader (plugins keep the pointer).
  explicit Loader(const sf_host_services* services);
  ~Loader();

  // Loads (once) and validates a plugin library. Errors name the file and, for versions, both
  // the plugin's and the host's numbers. `expected_name` (from plugin.toml) must match the
  // descriptor's name when given; two different libraries may not claim one name.
  // `expected_abi` (plugin.toml's "major.minor") must be the ABI the descriptor declares.
  const LoadedPlugin& load(const std::string& library_path, const std::string& expected_name = "",
                           std::optional<sf_kind> expected_kind = std::nullopt,
                           std::optional<std::pair<int, int>> expected_abi = std::nullopt);

  // Creates an instance with the given (already validated) options.
  std::unique_ptr<PluginInstance> create(const LoadedPlugin& plugin,
                                         const std::vector<std::pair<std::string, std::string>>& options);

  const std::vector<std::unique_ptr<LoadedPlugin>>& loaded() const { return plugins_; }

 private:
  const sf_host_services* services_;
  std::vector<std::unique_ptr<LoadedPlugin>> plugins_;
};

}  // namespace skyforge
