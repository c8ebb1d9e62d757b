// The `mig` framework plugin: one process per GPU — or per MIG device with an accelerator spec
// like "A100(mig=3g.40gb)" — each with CUDA_VISIBLE_DEVICES set to its own device's UUID.
// On each node it runs `nvidia-smi -L`, picks the devices (mig_env.hpp), shares them among the
// skyforge nodes on the machine, and starts the command once per device through the shared
// fan-out launcher (plugins/common/fanout.hpp).
//
// With torch / jax / huggingface: list `mig` FIRST and give the framework nproc_per_node = 0; it
// then reads SKYFORGE_LOCAL_DEVICES, so RANK / JAX_PROCESS_ID count one process per device.
#include <skyforge/sdk.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <stdexcept>

#include <skyforge/accelerator.hpp>
#include "fanout.hpp"
#include "mig_env.hpp"

namespace {

namespace sm = skyforge::mig;
namespace fw = skyforge::fw;

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// `<nvidia_smi> -L`; nullopt-like empty string plus `why` when it cannot run.
bool run_listing(const std::string& nvidia_smi, std::string& out, std::string& why) {
  const std::string cmd = shell_quote(nvidia_smi) + " -L 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    why = "cannot run " + nvidia_smi;
    return false;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    why = nvidia_smi + " -L failed" +
          (WIFEXITED(st) ? " (exit " + std::to_string(WEXITSTATUS(st)) + ")" : std::string()) +
          (out.empty() ? "" : ": " + out.substr(0, 300));
    return false;
  }
  return true;
}

class Mig : public skyforge::Framework {
 public:
  explicit Mig(const skyforge::Context& ctx) : Framework(ctx) {
    nvidia_smi_ = options().get("nvidia_smi", "nvidia-smi");
    if (nvidia_smi_.empty()) throw skyforge::Error("mig: nvidia_smi: must not be empty", SF_ERR_INVALID);
    int64_t per = options().get_int("per_device", 1);
    if (per < 1 || per > 64)
      throw skyforge::Error("mig: per_device: expected 1..64 processes per device, got " + std::to_string(per),
                            SF_ERR_INVALID);
    per_device_ = uint32_t(per);
    profile_option_ = options().get("profile", "");
    required_ = options().get_bool("required", false);
  }

  void around_app_enter(const skyforge::InstanceInfo& info, const skyforge::Env& env) override {
    skyforge::AcceleratorSpec spec;
    try {
      spec = skyforge::parse_accelerator(info.accelerator);
    } catch (const std::invalid_argument& e) {
      throw skyforge::Error(std::string("mig: ") + e.what(), SF_ERR_INVALID);
    }
    const std::string profile = !profile_option_.empty() ? profile_option_ : spec.mig_profile;
    std::string listing, why;
    if (!run_listing(nvidia_smi_, listing, why)) {
      if (!profile.empty() || required_) throw skyforge::Error("mig: " + why);
      host().warn("mig: " + why + "; no GPU, CUDA_VISIBLE_DEVICES left alone");
      return;
    }
    sm::EnvList vars;
    try {
      auto gpus = sm::parse_nvidia_smi_list(listing);
      auto all = sm::machine_devices(gpus, profile);
      if (all.empty()) {
        if (required_) throw std::invalid_argument(nvidia_smi_ + " -L lists no GPU");
        host().warn("mig: " + nvidia_smi_ + " -L lists no GPU; CUDA_VISIBLE_DEVICES left alone");
        return;
      }
      devices_ = sm::node_share(all, info.local_rank, info.local_world_size);
      if (size_t unused = all.size() % info.local_world_size; unused != 0 && info.local_rank == 0)
        host().warn("mig: " + std::to_string(info.local_world_size) + " nodes share " + std::to_string(all.size()) +
                    " devices on this machine; " + std::to_string(unused) +
                    " stay unused so that every node runs the same number of processes");
      vars = sm::environment(devices_, per_device_);
    } catch (const std::invalid_argument& e) {
      throw skyforge::Error("mig: node " + std::to_string(info.node) + ": " + e.what(), SF_ERR_INVALID);
    }
    nproc_ = uint32_t(devices_.size()) * per_device_;
    for (const auto& [key, value] : vars) {
      if (key == fw::kFanoutNproc) {
        // A framework listed before us decided the process count; keep it, but say so.
        if (auto have = env.get(key)) {
          if (*have != value)
            host().warn("mig: " + std::string(fw::kFanoutNproc) + " is " + *have + " (set by a plugin listed before " +
                        "mig) but this node has " + value + " device slot(s); list mig first and use " +
                        "nproc_per_node = 0");
          continue;
        }
      }
      env.set(key, value);
    }
  }

  std::vector<std::string> launcher(const skyforge::InstanceInfo&, std::vector<std::string> argv) override {
    if (nproc_ <= 1) return argv;
    if (fw::is_torchrun(argv) || fw::is_accelerate_launch(argv)) {
      host().warn("mig: the command starts its own processes (torchrun / accelerate launch), which all see every "
                  "device in CUDA_VISIBLE_DEVICES; CUDA enumerates only one MIG device per process. Run the script "
                  "directly to get one device per process.");
      return argv;
    }
    return fw::fanout_argv(std::move(argv));
  }

 private:
  std::string nvidia_smi_;
  uint32_t per_device_ = 1;
  std::string profile_option_;
  bool required_ = false;
  std::vector<std::string> devices_;
  uint32_t nproc_ = 0;
};

}  // namespace

SKYFORGE_PLUGIN(Mig, "mig", "0.1.0",
                "one process per GPU or MIG device, each with CUDA_VISIBLE_DEVICES set to its own device UUID")
