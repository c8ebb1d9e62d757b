// Plugin catalogue: finds plugin.toml files in the search path and reads them without loading
// any code (`skyforge plugins`, `skyforge validate`), and checks a manifest against them.
#pragma once

#include "manifest.hpp"

#include <optional>
#include <string>
#include <vector>

namespace skyforge {

struct OptionSchema {
  std::string name;
  std::string type;  // "string" | "integer" | "float" | "boolean"
  std::optional<std::string> default_value;  // canonical text (see OptionList)
  std::vector<std::string> choices;          // canonical text; empty = any value of the type
  bool required = false;
  std::string description;
  // Set when the value names another plugin of this kind ("compute_backend"), unless it is one of
  // `choices`: the manifest check resolves it, and the run loads that plugin on every node.
  std::string plugin_kind;
};

struct PluginInfo {
  std::string name;
  std::string kind;     // "framework" | "provider" | "app" | "task_backend" | "compute_backend"
  std::string library;  // absolute path of the .so
  std::string version;
  std::string description;
  int abi_major = 0, abi_minor = 0;
  std::string manifest_path;  // absolute path of the plugin.toml
  std::vector<OptionSchema> options;  // as written in plugin.toml
  // Plugins that must come before this one in a manifest's [[plugins]] when both are listed.
  std::vector<std::string> after;
  // Providers: the most nodes it makes (plugin.toml max_nodes; kDefaultMaxNodes when absent).
  uint64_t max_nodes = 0;
  SourcePos name_pos;  // the `name` value in plugin.toml

  const OptionSchema* option(const std::string& option_name) const;
};

// A provider's node ceiling when its plugin.toml has no max_nodes.
inline constexpr uint64_t kDefaultMaxNodes = 1024;

// The plugin kinds plugin.toml may declare.
inline constexpr std::string_view kPluginKinds[] = {"framework", "provider", "app", "task_backend",
                                                    "compute_backend"};

class Catalog {
 public:
  // Scans `search_dirs` in precedence order (made absolute and normalised, duplicates dropped).
  // A directory holds plugins as <dir>/<subdir>/plugin.toml and/or <dir>/plugin.toml. Missing
  // directories are skipped silently.
  explicit Catalog(std::vector<std::string> search_dirs);

  // The manifest's plugin_path, then each entry of $SKYFORGE_PLUGIN_PATH (':'-separated), then
  // <directory of this executable>/../SKYFORGE_PLUGIN_SUBDIR; absolute, normalised, no duplicates.
  static std::vector<std::string> default_search_dirs(const std::vector<std::string>& manifest_plugin_path);

  // Plugins found, in precedence order. A name found again in a later directory is shadowed and
  // not listed.
  const std::vector<PluginInfo>& plugins() const { return plugins_; }
  const PluginInfo* find(const std::string& name) const;
  const std::vector<std::string>& search_dirs() const { return search_dirs_; }
  // "file:line:col: message" for each plugin.toml that failed to parse or validate, for two
  // plugin.toml in one search directory claiming the same name (the first one in directory order
  // wins), and "dir: message" for a search directory that exists but cannot be listed.
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> search_dirs_;
  std::vector<PluginInfo> plugins_;
  std::vector<std::string> problems_;
};

// Reads and validates one plugin.toml. Throws ManifestError listing every problem, each with
// file:line:col.
PluginInfo parse_plugin_toml(const std::string& path);

// Checks the manifest against the catalogue and fills in option defaults:
//  - [pool] provider names a plugin of kind provider; [job] app (if set) one of kind app;
//    each [[plugins]] entry one of kind framework or compute_backend, at most once; a map job's
//    [tasks] backend (default "joblib") a task_backend, its options checked like [provider]'s;
//  - options of the provider ([provider]) and of each [[plugins]] entry: no unknown option,
//    right type (an integer is accepted for a float and becomes a float), value among the
//    choices, required ones present; absent options with a default are appended with it;
//  - an option whose schema names a plugin kind resolves to such a plugin (or is a choice);
//  - a plugin listed before one its plugin.toml says it must come `after` is an error;
//  - every [image] files source exists.
// Throws ManifestError with every problem, each at the manifest's file:line:col. A missing
// plugin's message lists the directories searched.
void validate_against(Manifest& m, const Catalog& c);

// Plugins a [[plugins]] entry names through an option of kind `plugin_kind` (after
// validate_against), e.g. keras' backend = "cpu" -> the `cpu` compute backend.
std::vector<const PluginInfo*> referenced_plugins(const PluginUse& use, const Catalog& c);

// The compute backend a job selects (after validate_against): the last one a [[plugins]] entry
// names through an option (keras' backend = "cuda"; `pos` is that value), else for a [train]
// job the installed `cpu` (`pos`: [train]); `plugin` is null when the job selects none. Every
// node loads it and the config's compute.backend names it.
struct SelectedBackend {
  const PluginInfo* plugin = nullptr;
  SourcePos pos;
};
SelectedBackend selected_compute_backend(const Manifest& m, const Catalog& c);

}  // namespace skyforge
