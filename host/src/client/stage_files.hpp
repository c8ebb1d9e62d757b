// What a pool's nodes need from this machine at the same path (sf_pool_spec.stage_files): the
// provider copies them before it bootstraps a node.
#pragma once

#include <string>
#include <vector>

#include "catalog.hpp"
#include "manifest.hpp"
#include "plugin_resolution.hpp"

namespace skyforge {

// The worker, every plugin library the nodes load with its plugin.toml, the image's file
// sources (the regular files under a directory source). Absolute, each once, in a stable order.
std::vector<std::string> stage_files(const std::string& worker, const NodePlugins& plugins, const Catalog& catalog,
                                     const Image& image);

}  // namespace skyforge
