#include "gpus.hpp"

#include <skyforge/sdk.hpp>

#include <algorithm>
#include <system_error>

namespace skyforge::local {

namespace fs = std::filesystem;

VisibleGpus visible_gpus(const char* cuda_visible_devices, const fs::path& driver_gpus) {
  VisibleGpus out;
  if (cuda_visible_devices) {
    const std::string v = cuda_visible_devices;
    out.source = "CUDA_VISIBLE_DEVICES=" + v;
    size_t at = 0;
    while (at <= v.size()) {
      const size_t comma = std::min(v.find(',', at), v.size());
      std::string id = v.substr(at, comma - at);
      id.erase(0, id.find_first_not_of(" \t"));
      id.erase(id.find_last_not_of(" \t") + 1);
      if (id.empty()) break;
      out.ids.push_back(id);
      at = comma + 1;
    }
    return out;
  }
  std::error_code ec;
  size_t n = 0;
  for (fs::directory_iterator it(driver_gpus, ec), end; !ec && it != end; it.increment(ec)) ++n;
  for (size_t i = 0; i < n; ++i) out.ids.push_back(std::to_string(i));
  out.pci_order = true;
  out.source = fs::exists(driver_gpus, ec)
                   ? driver_gpus.string() + " lists " + std::to_string(n)
                   : "CUDA_VISIBLE_DEVICES is unset and " + driver_gpus.string() + " does not exist (no NVIDIA driver)";
  return out;
}

GpuPlacement place_gpus(const AcceleratorSpec& spec, const std::string& spec_text, uint32_t nodes,
                        const VisibleGpus& gpus) {
  GpuPlacement out;
  out.per_node.resize(nodes);
  if (spec.name.empty() || !spec.mig_profile.empty()) return out;
  const std::string asked = "[pool] accelerator = \"" + spec_text + "\" asks for " + std::to_string(spec.count) +
                            " GPU" + (spec.count == 1 ? "" : "s") + " per node";
  if (gpus.ids.empty()) {
    out.warning = "local provider: " + asked + ", and this machine offers none (" + gpus.source +
                  "); CUDA_VISIBLE_DEVICES left as it is";
    return out;
  }
  const uint64_t need = uint64_t(spec.count) * nodes;
  if (need > gpus.ids.size())
    throw Error("local provider: " + asked + ", " + std::to_string(need) + " for " + std::to_string(nodes) + " node" +
                    (nodes == 1 ? "" : "s") + "; this machine offers " + std::to_string(gpus.ids.size()) + " (" +
                    gpus.source + ")",
                SF_ERR_INVALID);
  for (uint32_t i = 0; i < nodes; ++i)
    for (uint32_t k = 0; k < spec.count; ++k)
      out.per_node[i] += (k ? "," : "") + gpus.ids[size_t(i) * spec.count + k];
  return out;
}

}  // namespace skyforge::local
