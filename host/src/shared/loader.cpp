#include "loader.hpp"

#include "lent.hpp"

#include <boost/dll/shared_library.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sstream>

namespace skyforge {

const char* kind_name(sf_kind kind) {
  switch (kind) {
    case SF_KIND_FRAMEWORK: return "framework";
    case SF_KIND_PROVIDER: return "provider";
    case SF_KIND_TASK_BACKEND: return "task_backend";
    case SF_KIND_COMPUTE_BACKEND: return "compute_backend";
    case SF_KIND_APP: return "app";
    default: return "unknown";
  }
}

std::optional<sf_kind> kind_from_name(const std::string& name) {
  for (sf_kind k : {SF_KIND_FRAMEWORK, SF_KIND_PROVIDER, SF_KIND_TASK_BACKEND, SF_KIND_COMPUTE_BACKEND, SF_KIND_APP})
    if (name == kind_name(k)) return k;
  return std::nullopt;
}

namespace {

std::string version_str(unsigned major, unsigned minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

// A plugin's hook table as this host's struct: see LoadedPlugin::table.
template <class Table>
Table adapt(const void* hooks) {
  Table t{};
  if (hooks) {
    const uint32_t declared = *static_cast<const uint32_t*>(hooks);
    std::memcpy(&t, hooks, std::min<size_t>(declared, sizeof t));
  }
  t.struct_size = sizeof t;
  return t;
}

void adapt_table(LoadedPlugin& p) {
  switch (p.kind) {
    case SF_KIND_FRAMEWORK: p.table = adapt<sf_framework_hooks>(p.descriptor->hooks); break;
    case SF_KIND_PROVIDER: p.table = adapt<sf_provider_hooks>(p.descriptor->hooks); break;
    case SF_KIND_APP: p.table = adapt<sf_app_hooks>(p.descriptor->hooks); break;
    case SF_KIND_COMPUTE_BACKEND: p.table = adapt<sf_compute_hooks>(p.descriptor->hooks); break;
    case SF_KIND_TASK_BACKEND: p.table = adapt<sf_task_hooks>(p.descriptor->hooks); break;
    default: p.hooks = p.descriptor->hooks; return;
  }
  std::visit([&](const auto& t) { p.hooks = &t; }, p.table);
}

// Hooks a plugin of each kind must provide (abi.h marks them), checked once, at load, on the
// adapted table; an app's run/task is checked against the job's mode when a job names it
// (load_app, plugin_resolution.cpp).
struct RequiredHook {
  const char* name;
  bool (*present)(const LoadedPlugin& p);
};

#define SKYFORGE_REQUIRED(Table, member) \
  RequiredHook { #member, [](const LoadedPlugin& p) { return std::get<Table>(p.table).member != nullptr; } }

std::vector<RequiredHook> required_hooks(sf_kind kind) {
  if (kind == SF_KIND_PROVIDER)
    return {SKYFORGE_REQUIRED(sf_provider_hooks, provision), SKYFORGE_REQUIRED(sf_provider_hooks, bootstrap),
            SKYFORGE_REQUIRED(sf_provider_hooks, start_worker), SKYFORGE_REQUIRED(sf_provider_hooks, terminate)};
  if (kind == SF_KIND_COMPUTE_BACKEND)
    return {SKYFORGE_REQUIRED(sf_compute_hooks, engine_create), SKYFORGE_REQUIRED(sf_compute_hooks, engine_destroy),
            SKYFORGE_REQUIRED(sf_compute_hooks, engine_last_error), SKYFORGE_REQUIRED(sf_compute_hooks, train_step),
            SKYFORGE_REQUIRED(sf_compute_hooks, eval_step), SKYFORGE_REQUIRED(sf_compute_hooks, predict),
            SKYFORGE_REQUIRED(sf_compute_hooks, param_count), SKYFORGE_REQUIRED(sf_compute_hooks, get_params),
            SKYFORGE_REQUIRED(sf_compute_hooks, set_params), SKYFORGE_REQUIRED(sf_compute_hooks, state_dict),
            SKYFORGE_REQUIRED(sf_compute_hooks, load_state)};
  if (kind == SF_KIND_TASK_BACKEND)
    return {SKYFORGE_REQUIRED(sf_task_hooks, begin), SKYFORGE_REQUIRED(sf_task_hooks, next_batch),
            SKYFORGE_REQUIRED(sf_task_hooks, completed), SKYFORGE_REQUIRED(sf_task_hooks, node_lost),
            SKYFORGE_REQUIRED(sf_task_hooks, state)};
  return {};
}

std::string plugin_message(const LoadedPlugin& p, void* self) {
  const char* m = nullptr;
  if (p.descriptor->last_error) {
    PluginCallScope in_plugin(p.name.c_str(), p.path.c_str(), "last_error");
    m = p.descriptor->last_error(self);
  }
  return (m && *m) ? m : "(the plugin gave no message)";
}

// Libraries stay resident for the life of the process (abi.h: never dlclose): the
// registry is reachable from a static and never destroyed, so nothing ever unloads one.
void keep_resident(boost::dll::shared_library lib) {
  static std::mutex mu;
  static auto* libs = new std::vector<boost::dll::shared_library>();
  std::lock_guard<std::mutex> lock(mu);
  libs->push_back(std::move(lib));
}

}  // namespace

Loader::Loader(const sf_host_services* services) : services_(services) {}
Loader::~Loader() = default;

PluginInstance::~PluginInstance() {
  if (!self_ || !plugin_->descriptor->destroy) return;
  PluginCallScope in_plugin(plugin_->name.c_str(), plugin_->path.c_str(), "destroy");
  plugin_->descriptor->destroy(self_);
}

std::string PluginInstance::last_error() const {
  if (!plugin_->descriptor->last_error) return "";
  PluginCallScope in_plugin(plugin_->name.c_str(), plugin_->path.c_str(), "last_error");
  const char* m = plugin_->descriptor->last_error(self_);
  return m ? m : "";
}

void PluginInstance::check(sf_status st, const char* hook) const {
  // A callback the host lent to this hook failed (abi.h: it returned normally to the plugin).
  if (std::string lent_failure = take_lent_failure(); !lent_failure.empty())
    throw PluginError("plugin '" + plugin_->name + "' " + hook + ": a host callback it called failed: " + lent_failure,
                      SF_ERR);
  if (st == SF_OK) return;
  throw PluginError("plugin '" + plugin_->name + "' " + hook + ": " + plugin_message(*plugin_, self_), st);
}

const LoadedPlugin& Loader::load(const std::string& library_path, const std::string& expected_name,
                                 std::optional<sf_kind> expected_kind, std::optional<std::pair<int, int>> expected_abi) {
  std::error_code fs_ec;
  std::string path = std::filesystem::weakly_canonical(library_path, fs_ec).string();
  if (fs_ec || path.empty()) path = library_path;
  for (const auto& p : plugins_)
    if (p->path == path) return *p;

  if (!std::filesystem::exists(path)) throw LoadError(path + ": plugin library not found");

  boost::dll::shared_library lib;
  boost::system::error_code ec;
  // RTLD_NOW: unresolved symbols fail here, not mid-run. RTLD_LOCAL: plugins cannot see
  // each other's symbols (two plugins may bundle different versions of one library).
  // Until the descriptor names it, a crash names the plugin as plugin.toml does (else by file).
  const std::string crash_name = expected_name.empty() ? std::filesystem::path(path).stem().string() : expected_name;
  {
    PluginCallScope in_plugin(crash_name.c_str(), path.c_str(), "");  // its static initialisers run
    lib.load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  }
  if (ec) throw LoadError(path + ": cannot load shared library: " + ec.message());
  if (!lib.has(SKYFORGE_ENTRY_SYMBOL))
    throw LoadError(path + ": not a skyforge plugin (no exported symbol '" SKYFORGE_ENTRY_SYMBOL "')");

  auto entry = lib.get<std::remove_pointer_t<sf_entry_fn>>(SKYFORGE_ENTRY_SYMBOL);
  const sf_plugin_descriptor* d = nullptr;
  {
    PluginCallScope in_plugin(crash_name.c_str(), path.c_str(), SKYFORGE_ENTRY_SYMBOL);
    d = entry(services_, SKYFORGE_ABI_MAJOR, SKYFORGE_ABI_MINOR);
  }
  keep_resident(std::move(lib));  // resident from here on, whatever happens next
  if (!d) throw LoadError(path + ": the plugin's entry returned no descriptor (it declined this host)");

  // The first three fields are fixed forever: read the ABI before trusting anything else.
  if (d->abi_major != SKYFORGE_ABI_MAJOR)
    throw LoadError(path + ": plugin ABI " + version_str(d->abi_major, d->abi_minor) +
                    " is incompatible with host ABI " + version_str(SKYFORGE_ABI_MAJOR, SKYFORGE_ABI_MINOR) +
                    " (major versions differ): it was built for another skyforge SDK major; use a skyforge of its "
                    "major, or port it to this SDK");
  if (d->abi_minor > SKYFORGE_ABI_MINOR)
    throw LoadError(path + ": plugin ABI " + version_str(d->abi_major, d->abi_minor) + " is newer than host ABI " +
                    version_str(SKYFORGE_ABI_MAJOR, SKYFORGE_ABI_MINOR) + "; upgrade skyforge");
  if (d->struct_size < offsetof(sf_plugin_descriptor, hooks) + sizeof(d->hooks))
    throw LoadError(path + ": descriptor too small (" + std::to_string(d->struct_size) + " bytes)");

  auto p = std::make_unique<LoadedPlugin>();
  p->path = path;
  p->name = d->name ? d->name : "";
  p->version = d->version ? d->version : "";
  p->description = d->description ? d->description : "";
  p->kind = d->kind;
  p->abi_major = d->abi_major;
  p->abi_minor = d->abi_minor;
  p->descriptor = d;
  p->hooks_size = d->hooks ? *static_cast<const uint32_t*>(d->hooks) : 0;

  if (p->name.empty()) throw LoadError(path + ": plugin descriptor has no name");
  if (!d->create || !d->destroy || !d->last_error)
    throw LoadError(path + ": plugin '" + p->name + "' is missing create/destroy/last_error");
  if (!expected_name.empty() && p->name != expected_name)
    throw LoadError(path + ": plugin.toml says name '" + expected_name + "' but the library calls itself '" +
                    p->name + "'");
  if (expected_abi && expected_abi->first != SKYFORGE_ABI_MAJOR)  // rebuilding cannot fix this one
    throw LoadError(path + ": plugin.toml says abi \"" + version_str(expected_abi->first, expected_abi->second) +
                    "\": the plugin was written for another skyforge SDK major than this host's ABI " +
                    version_str(SKYFORGE_ABI_MAJOR, SKYFORGE_ABI_MINOR) + "; use a skyforge of major " +
                    std::to_string(expected_abi->first) + ", or port it to this SDK (abi = \"" +
                    std::to_string(SKYFORGE_ABI_MAJOR) + ".N\")");
  if (expected_abi && (expected_abi->first != p->abi_major || expected_abi->second != p->abi_minor))
    throw LoadError(path + ": plugin.toml says abi \"" + version_str(expected_abi->first, expected_abi->second) +
                    "\" but the library declares ABI " + version_str(p->abi_major, p->abi_minor) +
                    " (skyforge_add_plugin() builds the library with plugin.toml's abi: rebuild it)");
  if (expected_kind && p->kind != *expected_kind)
    throw LoadError(path + ": plugin '" + p->name + "' is a " + kind_name(p->kind) + " plugin, expected a " +
                    kind_name(*expected_kind) + " plugin");
  for (const auto& other : plugins_)
    if (other->name == p->name)
      throw LoadError("two plugins are named '" + p->name + "': " + other->path + " and " + path);
  if (p->kind == SF_KIND_TASK_BACKEND && p->abi_minor < 5)  // the kind had no hooks before 1.5
    throw LoadError(path + ": task_backend plugin '" + p->name + "' declares ABI " + version_str(p->abi_major, p->abi_minor) +
                    "; task backends have hooks from ABI 1.5 on: rebuild it against this SDK with abi = \"1.5\"");
  if (!d->hooks)
    throw LoadError(path + ": " + kind_name(p->kind) + " plugin '" + p->name + "' has no hook table");
  adapt_table(*p);
  for (const auto& req : required_hooks(p->kind))
    if (!req.present(*p))
      throw LoadError(path + ": " + kind_name(p->kind) + " plugin '" + p->name + "' lacks the required hook '" +
                      req.name + "'");
  if (p->kind == SF_KIND_COMPUTE_BACKEND) {
    // Bound data (ABI 1.8): a caller that finds bind_data uses the other four.
    const auto& t = std::get<sf_compute_hooks>(p->table);
    const int n = !!t.bind_data + !!t.release_data + !!t.train_step_indexed + !!t.eval_step_indexed + !!t.take_results;
    if (n != 0 && n != 5)
      throw LoadError(path + ": compute_backend plugin '" + p->name +
                      "' has some of the bound-data hooks (ABI 1.8) but not all: bind_data, release_data, "
                      "train_step_indexed, eval_step_indexed and take_results go together");
  }

  plugins_.push_back(std::move(p));
  return *plugins_.back();
}

std::unique_ptr<PluginInstance> Loader::create(const LoadedPlugin& plugin,
                                               const std::vector<std::pair<std::string, std::string>>& options) {
  std::vector<sf_kv> kv;
  kv.reserve(options.size());
  for (const auto& [k, v] : options) kv.push_back(sf_kv{k.c_str(), v.c_str()});
  void* self = nullptr;
  sf_status st;
  {
    PluginCallScope in_plugin(plugin.name.c_str(), plugin.path.c_str(), "create");
    st = plugin.descriptor->create(services_, kv.data(), kv.size(), &self);
  }
  if (st != SF_OK || !self)
    throw PluginError(plugin.path + ": plugin '" + plugin.name + "' failed to initialise: " +
                          plugin_message(plugin, nullptr),
                      st == SF_OK ? SF_ERR : st);
  return std::make_unique<PluginInstance>(plugin, self);
}

}  // namespace skyforge
