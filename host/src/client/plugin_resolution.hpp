// Plugin resolution for `skyforge run`: which plugins the client loads from the catalogue (the
// provider, the [[plugins]], the app), which ones every node loads and with which options, and
// the job's configuration that all of them read with host().config(key) (docs/plugins.md).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "catalog.hpp"
#include "loader.hpp"
#include "manifest.hpp"
#include "messages.hpp"

namespace skyforge {

// Loads the catalogue's plugin `name` (of `kind` when given, of the ABI its plugin.toml declares)
// and creates an instance with `options`. The manifest was validated against `catalog`.
std::unique_ptr<PluginInstance> create_plugin(Loader& loader, const Catalog& catalog, const std::string& name,
                                              std::optional<sf_kind> kind, const OptionList& options);

// Loads (does not create) the job's app, so that a broken or unsuitable one fails before any node
// exists: throws LoadError when it lacks the hook the job's mode needs (task for map, run
// otherwise).
const LoadedPlugin& load_app(Loader& loader, const Catalog& catalog, const JobSpec& job);

// The job-level configuration, the same on the client and on every node (docs/plugins.md lists
// the keys); node_plugins adds compute.backend for the nodes.
std::map<std::string, std::string> job_config(const Manifest& m, bool verbose);

// What every node loads (msg::Job's frameworks and app).
struct NodePlugins {
  std::vector<msg::PluginSpec> plugins;
  msg::PluginSpec app;  // no name: the job runs a command
};

// The [[plugins]] as the client loaded them (`created`, in manifest order) with their options,
// then the plugins they name through an option (keras' backend = "cpu") and, for a [train] job
// that names no compute backend, the `cpu` one, each with its plugin.toml defaults unless the
// manifest lists it itself; the app (`app`, null for a command) with [job.options]. Sets
// config's compute.backend to the compute backend the job selected.
NodePlugins node_plugins(const Manifest& m, const Catalog& catalog,
                         const std::vector<std::unique_ptr<PluginInstance>>& created, const LoadedPlugin* app,
                         std::map<std::string, std::string>& config);

// Before anything is provisioned, when the pool's nodes are processes on this machine (the
// `local` provider): the selected compute backend's probe (abi.h, sf_compute_hooks::probe), with
// the options the nodes will give it. Throws ManifestError at the manifest value that selects
// the backend when it cannot be loaded or created here or says it cannot run here (`skyforge
// run` exits 2). Other providers' nodes run the probe themselves before their job starts.
void check_compute_backend_runs_here(const Manifest& m, const Catalog& catalog);

}  // namespace skyforge
