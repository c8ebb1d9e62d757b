#include "mig_env.hpp"

#include <regex>
#include <set>
#include <stdexcept>

namespace skyforge::mig {

std::vector<Gpu> parse_nvidia_smi_list(std::string_view text) {
  static const std::regex gpu_line(R"(^GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*([^)\s]+)\)\s*$)");
  static const std::regex mig_line(R"(^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*([^)\s]+)\)\s*$)");
  std::vector<Gpu> gpus;
  size_t lineno = 0;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::string line(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::smatch m;
    if (std::regex_match(line, m, gpu_line)) {
      gpus.push_back(Gpu{uint32_t(std::stoul(m[1])), m[2], m[3], {}});
    } else if (std::regex_match(line, m, mig_line)) {
      if (gpus.empty())
        throw std::invalid_argument("nvidia-smi -L line " + std::to_string(lineno) + ": a MIG device before any GPU");
      gpus.back().migs.push_back(MigDevice{uint32_t(std::stoul(m[2])), m[1], m[3]});
    }
  }
  return gpus;
}

std::vector<std::string> machine_devices(const std::vector<Gpu>& gpus, std::string_view mig_profile) {
  std::vector<std::string> out;
  if (!mig_profile.empty()) {
    std::set<std::string> seen;
    for (const auto& g : gpus)
      for (const auto& m : g.migs) {
        if (m.profile == mig_profile) out.push_back(m.uuid);
        seen.insert(m.profile);
      }
    if (out.empty()) {
      std::string have;
      for (const auto& p : seen) have += (have.empty() ? "" : ", ") + p;
      throw std::invalid_argument("no MIG device of profile " + std::string(mig_profile) + " on this machine (" +
                                  std::to_string(gpus.size()) + " GPU(s); MIG profiles present: " +
                                  (have.empty() ? std::string("none, MIG is not enabled") : have) + ")");
    }
    return out;
  }
  for (const auto& g : gpus) {
    if (g.migs.empty()) out.push_back(g.uuid);
    else
      for (const auto& m : g.migs) out.push_back(m.uuid);
  }
  return out;
}

std::vector<std::string> node_share(const std::vector<std::string>& devices, uint32_t slot, uint32_t nodes) {
  if (nodes == 0 || slot >= nodes)
    throw std::invalid_argument("node slot " + std::to_string(slot) + " is outside " + std::to_string(nodes) +
                                " node(s) on this machine");
  const size_t count = devices.size() / nodes;
  if (count == 0)
    throw std::invalid_argument(std::to_string(nodes) + " nodes share this machine but it has only " +
                                std::to_string(devices.size()) + " device(s): node slot " + std::to_string(slot) +
                                " gets none");
  const size_t first = slot * count;
  return std::vector<std::string>(devices.begin() + std::ptrdiff_t(first),
                                  devices.begin() + std::ptrdiff_t(first + count));
}

EnvList environment(const std::vector<std::string>& devices, uint32_t per_device) {
  if (devices.empty()) throw std::invalid_argument("no devices");
  if (per_device == 0) throw std::invalid_argument("per_device must be at least 1");
  std::string comma, space, per_process;
  for (const auto& d : devices) {
    comma += (comma.empty() ? "" : ",") + d;
    space += (space.empty() ? "" : " ") + d;
    for (uint32_t k = 0; k < per_device; ++k) per_process += (per_process.empty() ? "" : " ") + d;
  }
  const uint64_t nproc = uint64_t(devices.size()) * per_device;
  EnvList env = {
      {"CUDA_VISIBLE_DEVICES", comma},
      {"SKYFORGE_MIG_DEVICES", space},
      {"SKYFORGE_LOCAL_DEVICES", std::to_string(nproc)},
  };
  if (nproc > 1) {
    env.emplace_back("SKYFORGE_FANOUT_DEVICES", per_process);
    env.emplace_back("SKYFORGE_FANOUT_NPROC", std::to_string(nproc));
  }
  return env;
}

}  // namespace skyforge::mig
