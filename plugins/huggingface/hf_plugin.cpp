// The `huggingface` framework plugin: the torch plugin's environment (torch_env, the same
// MASTER_PORT key on the pool's store, so torch and huggingface side by side agree) plus what
// accelerate, transformers' Trainer and the Hub client read (hf_env.hpp). A command that is
// `accelerate launch ...` gets the pool's shape as accelerate's own flags; a torchrun command is
// left to torchrun; any other command runs nproc_per_node times (plugins/common/fanout.hpp).
#include <skyforge/sdk.hpp>

#include <stdexcept>

#include <skyforge/accelerator.hpp>
#include "devices.hpp"
#include "fanout.hpp"
#include "hf_env.hpp"
#include "rendezvous.hpp"
#include "torch_env.hpp"

namespace {

namespace st = skyforge::torch;
namespace shf = skyforge::huggingface;
namespace fw = skyforge::fw;

class HuggingFace : public skyforge::Framework {
 public:
  explicit HuggingFace(const skyforge::Context& ctx) : Framework(ctx) {
    try {
      backend_ = options().get("backend", "auto");
      st::resolve_backend(backend_, 0);
      st::resolve_nproc(options().get_int("nproc_per_node", 1), 0);
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
    master_port_ = fw::port_option(options(), "huggingface", "master_port");
    timeout_ms_ = fw::timeout_ms_option(options(), "huggingface");
  }

  void around_app_enter(const skyforge::InstanceInfo& info, const skyforge::Env& env) override {
    if (info.head_addr.empty()) throw skyforge::Error("huggingface: the pool has no head address");
    try {
      nproc_ = st::resolve_nproc(options().get_int("nproc_per_node", 1), fw::local_devices(info, env));
      ranks_ = st::compute_ranks(fw::placement(info, nproc_));
    } catch (const std::invalid_argument& e) {
      throw skyforge::Error(std::string("huggingface: ") + e.what(), SF_ERR_INVALID);
    }
    uint16_t port = fw::head_port(host(), info, "torch/" + info.pool_id + "/master_port", master_port_, timeout_ms_,
                                  "huggingface", "MASTER_PORT (or set the master_port option)");
    rdzv_ = st::Rendezvous{info.head_addr, port, info.pool_id};
    for (auto [key, value] : st::environment(ranks_, rdzv_, st::resolve_backend(backend_, info.accelerators))) {
      if (key == fw::kFanoutAdd) value = fw::add_words(env.get(key).value_or(""), fw::split_words(value));
      env.set(key, value);
    }
    for (const auto& [key, value] : st::default_environment(ranks_))
      if (!env.get(key)) env.set(key, value);
    shf::Settings s = settings_;
    s.work_dir = info.work_dir;
    for (const auto& [key, value] : shf::environment(s)) env.set(key, value);
  }

  std::vector<std::string> launcher(const skyforge::InstanceInfo&, std::vector<std::string> argv) override {
    if (fw::is_accelerate_launch(argv)) return shf::accelerate_launch_argv(std::move(argv), ranks_, rdzv_);
    if (nproc_ <= 1 || fw::is_torchrun(argv)) return argv;
    return fw::fanout_argv(std::move(argv));
  }

 private:
  std::string backend_;
  shf::Settings settings_;
  uint16_t master_port_ = 0;
  int64_t timeout_ms_ = 120000;
  uint32_t nproc_ = 1;
  st::Ranks ranks_;
  st::Rendezvous rdzv_;
};

}  // namespace

SKYFORGE_PLUGIN(HuggingFace, "huggingface", "0.1.0",
                "Hugging Face accelerate/Trainer: the torch environment plus ACCELERATE_* and HF_* options")
