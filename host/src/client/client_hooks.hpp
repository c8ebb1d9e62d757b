// The framework plugins' hooks that run on the client (abi.h, sf_framework_hooks), in manifest
// order: transform_image edits the nodes' image, bootstrap adds lines to their bootstrap script,
// around_client_enter; around_client_exit at the end, in reverse, for every plugin entered.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loader.hpp"
#include "manifest.hpp"

namespace skyforge {

class ClientHooks {
 public:
  // `plugins`: the [[plugins]] as created (those that are not frameworks have no client hooks);
  // they outlive this.
  explicit ClientHooks(const std::vector<std::unique_ptr<PluginInstance>>& plugins) : plugins_(plugins) {}

  // Throws PluginError when a hook fails; a plugin whose around_client_enter was called (even
  // one that failed) counts as entered.
  void enter(const sf_cluster& cluster, Image& image, std::vector<std::string>& bootstrap_lines);
  // around_client_exit for the plugins entered, last first; a failure is handed to `error` and
  // the others still run.
  void exit(const sf_cluster& cluster, bool ok, const std::function<void(const std::string&)>& error);

 private:
  const std::vector<std::unique_ptr<PluginInstance>>& plugins_;
  size_t entered_ = 0;
};

}  // namespace skyforge
