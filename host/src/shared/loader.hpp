// Plugin loader (docs/plugins.md): Boost.DLL with RTLD_NOW|RTLD_LOCAL, ABI checks, resident
// forever (never dlclose'd), instances created through the descriptor.
#pragma once

#include <skyforge/abi.h>

#include "crash_context.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>
#include <variant>
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
  // The kind's hook table adapted to this host's struct at load (NCCL's way with its
  // ncclNet_vN tables): the bytes the plugin's struct_size covers, copied into a zeroed table of
  // the current size, so a hook past an older plugin's table reads as NULL and no caller checks
  // struct_size again. `hooks` points into `table` (the plugin's own table for a kind with none).
  std::variant<std::monostate, sf_framework_hooks, sf_provider_hooks, sf_app_hooks, sf_compute_hooks, sf_task_hooks>
      table;
  const void* hooks = nullptr;
  uint32_t hooks_size = 0;  // the struct_size the plugin declared (what it was built against)
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

  // The plugin's hook table, adapted to this host's struct (every member readable; an absent
  // hook is NULL); NULL when the plugin is not of the table's kind.
  template <class Hooks>
  const Hooks* hooks() const {
    return std::get_if<Hooks>(&plugin_->table);
  }

  // Calls a hook of this plugin's table with its instance and returns what it returns, as a
  // PluginCallScope named `name` (crash_context.hpp): invoke(&sf_provider_hooks::bootstrap,
  // "bootstrap", id, script, log). The host calls hooks through here (or call/call_optional),
  // so that a crash names the plugin and the hook.
  template <class Hooks, class R, class... P, class... A>
  R invoke(R (*Hooks::*member)(void*, P...), const char* name, A&&... args) const {
    const auto fn = table<Hooks>().*member;
    PluginCallScope in_plugin(plugin_->name.c_str(), plugin_->path.c_str(), name);
    return fn(self_, std::forward<A>(args)...);
  }
  // Calls a required hook: call(&sf_provider_hooks::provision, "provision", spec, sink). Throws
  // PluginError naming the plugin and the hook unless it returns SF_OK.
  template <class Hooks, class R, class... P, class... A>
  void call(R (*Hooks::*member)(void*, P...), const char* name, A&&... args) const {
    check(invoke(member, name, std::forward<A>(args)...), name);
  }
  // The same for an optional hook: false (and nothing called) when the plugin has none.
  template <class Hooks, class R, class... P, class... A>
  bool call_optional(R (*Hooks::*member)(void*, P...), const char* name, A&&... args) const {
    if (!(table<Hooks>().*member)) return false;
    call(member, name, std::forward<A>(args)...);
    return true;
  }
  // The plugin's last_error() for this instance ("" when it gives none).
  std::string last_error() const;

 private:
  template <class Hooks>
  const Hooks& table() const {
    if (const Hooks* t = hooks<Hooks>()) return *t;
    throw std::logic_error("plugin '" + plugin_->name + "' is a " + kind_name(plugin_->kind) +
                           " plugin: it has no " + typeid(Hooks).name());
  }
  const LoadedPlugin* plugin_;
  void* self_;
};

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
