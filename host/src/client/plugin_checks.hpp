// Checks that run plugin code before anything starts — a plugin's create() with its options, a
// compute backend's probe — each in a child process, so that a plugin that crashes is a problem
// of the manifest, named at its entry, and not the end of `skyforge validate` or `run`.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "catalog.hpp"
#include "manifest.hpp"

namespace skyforge {

// One check: what a crash is reported at, and the check itself.
struct IsolatedCheck {
  std::string where;                 // "job.toml:5:1: [[plugins]] foo"
  std::function<std::string()> run;  // "" when it passes, else its problems (lines)
};

// Runs `checks` in order in a child process (fork, no exec) and returns their problems; a check
// that crashes the child becomes a problem at its `where`, and the checks after it are not run.
std::vector<std::string> run_isolated(const std::vector<IsolatedCheck>& checks);

// create() the provider, every [[plugins]] entry and a map job's task backend with their options,
// as `run` will, and destroy them again; throws ManifestError with every refusal at the option it
// names.
void check_plugins_accept_their_options(const Manifest& m, const Catalog& catalog);

}  // namespace skyforge
