#include "plugin_resolution.hpp"

#include "services.hpp"

#include <skyforge/config_keys.hpp>

#include <algorithm>
#include <sstream>
#include <utility>

namespace skyforge {
namespace {

// The catalogue's plugin `name`, of the ABI its plugin.toml declares.
const LoadedPlugin& load(Loader& loader, const Catalog& catalog, const std::string& name, std::optional<sf_kind> kind) {
  const PluginInfo* info = catalog.find(name);
  return loader.load(info->library, info->name, kind, std::make_pair(info->abi_major, info->abi_minor));
}

// A plugin the manifest does not list: loaded on the nodes with its plugin.toml defaults.
msg::PluginSpec with_defaults(const PluginInfo& p) {
  msg::PluginSpec spec{p.name, p.library, {}};
  for (const auto& o : p.options)
    if (o.default_value) spec.options.emplace_back(o.name, *o.default_value);
  return spec;
}

}  // namespace

std::unique_ptr<PluginInstance> create_plugin(Loader& loader, const Catalog& catalog, const std::string& name,
                                              std::optional<sf_kind> kind, const OptionList& options) {
  return loader.create(load(loader, catalog, name, kind), options);
}

const LoadedPlugin& load_app(Loader& loader, const Catalog& catalog, const JobSpec& job) {
  const LoadedPlugin& app = load(loader, catalog, job.app, SF_KIND_APP);
  const auto* h = std::get_if<sf_app_hooks>(&app.table);  // adapted at load: absent hooks are NULL
  const bool has_task = h && h->task;
  const bool has_run = h && h->run;
  if (job.mode == JobMode::map && !has_task)
    throw LoadError(app.path + ": app '" + app.name + "' has no task() hook, which mode = \"map\" needs");
  if (job.mode != JobMode::map && !has_run)
    throw LoadError(app.path + ": app '" + app.name + "' has no run() hook, which mode = \"" + std::string(mode_name(job.mode)) +
                    "\" needs");
  return app;
}

std::map<std::string, std::string> job_config(const Manifest& m, bool verbose) {
  namespace keys = config::keys;
  std::map<std::string, std::string> c;
  auto put = [&](const auto& key, std::string value) { c[std::string(key.name)] = std::move(value); };
  put(keys::job_kind, !m.job.command.empty() ? "command" : m.train.present ? "train" : "app");
  put(keys::job_mode, mode_name(m.job.mode));
  put(keys::job_manifest, m.path);
  put(keys::pool_provider, m.pool.provider);
  put(keys::pool_nodes, std::to_string(m.pool.nodes));
  put(keys::pool_concurrency, std::to_string(m.pool.concurrency));
  put(keys::log_verbose, verbose ? "true" : "false");
  if (!m.job.app.empty()) put(keys::job_app, m.job.app);
  if (m.job.timeout_s > 0) {
    std::ostringstream t;
    t << m.job.timeout_s;
    put(keys::job_timeout, t.str());
  }
  for (const auto& [key, value] : m.train.config) c[key] = value;
  for (const auto& [key, value] : m.search.config) c[key] = value;
  return c;
}

NodePlugins node_plugins(const Manifest& m, const Catalog& catalog,
                         const std::vector<std::unique_ptr<PluginInstance>>& created, const LoadedPlugin* app,
                         std::map<std::string, std::string>& config) {
  NodePlugins out;
  std::vector<msg::PluginSpec>& fws = out.plugins;
  for (size_t i = 0; i < m.plugins.size(); ++i)
    fws.push_back(msg::PluginSpec{created[i]->plugin().name, created[i]->plugin().path, m.plugins[i].options});
  auto listed = [&](const std::string& name) {
    return std::any_of(fws.begin(), fws.end(), [&](const msg::PluginSpec& f) { return f.name == name; });
  };
  for (const auto& use : m.plugins)
    for (const PluginInfo* ref : referenced_plugins(use, catalog))
      if (!listed(ref->name)) fws.push_back(with_defaults(*ref));
  // [train] with no plugin naming a backend runs on the `cpu` backend (validate_against checked
  // that it is installed).
  if (const PluginInfo* backend = selected_compute_backend(m, catalog).plugin) {
    config[std::string(skyforge::config::keys::compute_backend.name)] = backend->name;
    if (!listed(backend->name)) fws.push_back(with_defaults(*backend));
  }
  if (app) {
    out.app.name = app->name;
    out.app.library = app->path;
    out.app.options = m.job.app_options;  // [job.options], defaults added by validate_against
  }
  return out;
}

void check_compute_backend_runs_here(const Manifest& m, const Catalog& catalog) {
  if (m.pool.provider != "local") return;
  const SelectedBackend selected = selected_compute_backend(m, catalog);
  if (!selected.plugin) return;
  const PluginInfo& b = *selected.plugin;
  // With the options the nodes will give it.
  msg::PluginSpec spec = with_defaults(b);
  for (const auto& use : m.plugins)
    if (use.name == b.name) spec.options = use.options;
  Services services([](int32_t, const std::string&) {});
  Loader loader(services.table());
  auto refuse = [&](const std::string& why) {
    return ManifestError(selected.pos.str() + ": compute backend '" + b.name +
                         "' cannot run on this machine, where the `local` provider starts the nodes: " + why +
                         " (nothing was started)");
  };
  try {
    auto backend = create_plugin(loader, catalog, b.name, SF_KIND_COMPUTE_BACKEND, spec.options);
    backend->call_optional(&sf_compute_hooks::probe, "probe");
  } catch (const PluginError& e) {
    throw refuse(e.what());
  } catch (const LoadError& e) {  // e.g. a library it links is missing here: the nodes would fail alike
    throw refuse(e.what());
  }
}

}  // namespace skyforge
