// The bootstrap script every node runs before its worker starts (the provider runs it in the
// node's directory, docs/providers.md): the [image]'s apt packages that are missing, its pip
// packages into .skyforge/site, its files copied into place, then the shell lines the framework
// plugins' bootstrap hooks returned on the client (docs/architecture.md).
#pragma once

#include <string>
#include <vector>

#include "manifest.hpp"

namespace skyforge {

std::string bootstrap_script(const Image& image, const std::vector<std::string>& extra_lines);

}  // namespace skyforge
