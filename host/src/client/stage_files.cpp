// The files a pool's nodes need from this machine (stage_files.hpp).
#include "stage_files.hpp"

#include <filesystem>
#include <set>

namespace skyforge {

std::vector<std::string> stage_files(const std::string& worker, const NodePlugins& plugins, const Catalog& catalog,
                                     const Image& image) {
  std::set<std::string> out;
  auto add = [&](const std::filesystem::path& p) {
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(p, ec).lexically_normal();
    if (std::filesystem::is_directory(abs, ec)) {
      for (auto it = std::filesystem::recursive_directory_iterator(abs, ec);
           !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file(ec)) out.insert(it->path().string());
    } else if (std::filesystem::is_regular_file(abs, ec)) {
      out.insert(abs.string());
    }
  };
  add(worker);
  auto add_plugin = [&](const std::string& name, const std::string& library) {
    add(library);
    if (const PluginInfo* info = catalog.find(name)) add(info->manifest_path);
  };
  for (const auto& p : plugins.plugins) add_plugin(p.name, p.library);
  if (!plugins.app.library.empty()) add_plugin(plugins.app.name, plugins.app.library);
  for (const auto& f : image.files) add(f.source);
  return {out.begin(), out.end()};
}

}  // namespace skyforge
