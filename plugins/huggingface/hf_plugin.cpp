// The `huggingface` framework plugin: the torch plugin's environment (torch_env, the same
// MASTER_PORT key on the pool's store, so torch and huggingface side by side agree) plus what
// accelerate, transformers' Trainer and the Hub client read (hf_env.hpp). A command that is
// `accelerate launch ...` gets the pool's shape as accelerate's own flags; a torchrun command is
// left to torchrun; any other command runs nproc_per_node times (plugins/common/fanout.hpp).
#include <skyforge/sdk.hpp>

#include <stdexcept>

#include "fanout.hpp"
#include "hf_env.hpp"
#include "rendezvous.hpp"
#include "torch_node.hpp"

namespace {

namespace st = skyforge::torch;
namespace shf = skyforge::huggingface;
namespace fw = skyforge::fw;

class HuggingFace : public skyforge::Framework {
 public:
  explicit HuggingFace(const skyforge::Context& ctx)
      : Framework(ctx), backend_(st::backend_option(options(), "huggingface")) {
    try {
      int64_t steps = options().get_int("gradient_accumulation_steps", 0);
      if (steps < 0 || steps > 1000000)
        throw std::invalid_argument("gradient_accumulation_steps: expected 0 (unset) or a count, got " +
                                    std::to_string(steps));
      settings_.mixed_precision = options().get("mixed_precision", "");
      settings_.gradient_accumulation_steps = uint32_t(steps);
      settings_.dynamo_backend = options().get("dynamo_backend", "");
      settings_.use_cpu = options().get_bool("use_cpu", false);
      settings_.debug = options().get_bool("debug", false);
      settings_.accelerate_env = options().get("accelerate_env", "");
      settings_.hf_home = options().get("hf_home", "");
      settings_.offline = options().get_bool("offline", false);
      shf::environment(settings_);  // validates
    } catch (const std::invalid_argument& e) {
      throw skyforge::Error(std::string("huggingface: ") + e.what(), SF_ERR_INVALID);
    }
    rendezvous_ = fw::rendezvous_options(options(), "huggingface", "master_port");
  }

  void around_app_enter(const skyforge::InstanceInfo& info, const skyforge::Env& env) override {
    node_ = st::export_node_environment(host(), info, env, options(), backend_, rendezvous_, "huggingface");
    shf::Settings s = settings_;
    s.work_dir = info.work_dir;
    for (const auto& [key, value] : shf::environment(s)) env.set(key, value);
  }

  std::vector<std::string> launcher(const skyforge::InstanceInfo&, std::vector<std::string> argv) override {
    if (fw::is_accelerate_launch(argv)) return shf::accelerate_launch_argv(std::move(argv), node_.ranks, node_.rendezvous);
    if (node_.nproc <= 1 || fw::is_torchrun(argv)) return argv;
    return fw::fanout_argv(std::move(argv));
  }

 private:
  std::string backend_;
  shf::Settings settings_;
  fw::RendezvousOptions rendezvous_;
  st::Node node_;
};

}  // namespace

SKYFORGE_PLUGIN(HuggingFace, "huggingface", "0.1.0",
                "Hugging Face accelerate/Trainer: the torch environment plus ACCELERATE_* and HF_* options")
