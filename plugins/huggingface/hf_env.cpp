#include "hf_env.hpp"

#include <algorithm>
#include <stdexcept>

#include "fanout.hpp"

namespace skyforge::huggingface {

namespace {
std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

bool valid_name(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}
}  // namespace

EnvList parse_env_list(std::string_view text) {
  EnvList out;
  while (!text.empty()) {
    auto semi = text.find(';');
    std::string_view item = trim(text.substr(0, semi));
    text = semi == std::string_view::npos ? std::string_view() : text.substr(semi + 1);
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string_view::npos)
      throw std::invalid_argument("accelerate_env: '" + std::string(item) + "' is not NAME=VALUE");
    std::string_view name = trim(item.substr(0, eq));
    if (!valid_name(name))
      throw std::invalid_argument("accelerate_env: '" + std::string(name) + "' is not a variable name");
    out.emplace_back(std::string(name), std::string(trim(item.substr(eq + 1))));
  }
  return out;
}

EnvList environment(const Settings& s) {
  EnvList env;
  if (!s.mixed_precision.empty()) {
    static const char* const kChoices[] = {"no", "fp16", "bf16", "fp8"};
    if (std::find(std::begin(kChoices), std::end(kChoices), s.mixed_precision) == std::end(kChoices))
      throw std::invalid_argument("mixed_precision: expected no, fp16, bf16 or fp8, got '" + s.mixed_precision + "'");
    env.emplace_back("ACCELERATE_MIXED_PRECISION", s.mixed_precision);
  }
  if (s.gradient_accumulation_steps > 0)
    env.emplace_back("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", std::to_string(s.gradient_accumulation_steps));
  if (!s.dynamo_backend.empty()) env.emplace_back("ACCELERATE_DYNAMO_BACKEND", s.dynamo_backend);
  if (s.use_cpu) env.emplace_back("ACCELERATE_USE_CPU", "true");
  if (s.debug) env.emplace_back("ACCELERATE_DEBUG_MODE", "true");
  if (!s.hf_home.empty()) {
    std::string home = s.hf_home;
    if (home.front() != '/' && !s.work_dir.empty()) home = s.work_dir + "/" + home;
    env.emplace_back("HF_HOME", home);
  }
  if (s.offline) {
    env.emplace_back("HF_HUB_OFFLINE", "1");
    env.emplace_back("HF_DATASETS_OFFLINE", "1");
    env.emplace_back("TRANSFORMERS_OFFLINE", "1");
  }
  // Explicit pairs last: they win over the options above.
  for (auto& kv : parse_env_list(s.accelerate_env)) {
    auto it = std::find_if(env.begin(), env.end(), [&](const auto& e) { return e.first == kv.first; });
    if (it != env.end()) it->second = kv.second;
    else env.push_back(std::move(kv));
  }
  return env;
}

std::vector<std::string> accelerate_launch_argv(std::vector<std::string> argv, const skyforge::torch::Ranks& r,
                                                const skyforge::torch::Rendezvous& rdzv) {
  if (!skyforge::fw::is_accelerate_launch(argv) || skyforge::fw::is_fanout(argv)) return argv;
  // Where accelerate's own flags go: right after "launch" / "accelerate.commands.launch".
  size_t at = 0;
  for (size_t i = 0; i < argv.size(); ++i)
    if (argv[i] == "launch" || argv[i] == "accelerate.commands.launch") {
      at = i + 1;
      break;
    }
  // Flags the user gave (before the script: accelerate stops parsing its options there; a
  // value-taking flag consumes the next word, which is never the script).
  auto given = [&](const std::string& flag) {
    std::string dashed = flag;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    for (size_t i = at; i < argv.size(); ++i) {
      const std::string& a = argv[i];
      if (a.rfind("--", 0) != 0) {
        if (i > at && argv[i - 1].rfind("--", 0) == 0 && argv[i - 1].find('=') == std::string::npos) continue;
        break;  // the training script
      }
      for (const auto& f : {flag, dashed})
        if (a == f || a.rfind(f + "=", 0) == 0) return true;
    }
    return false;
  };
  std::vector<std::string> add;
  auto put = [&](const std::string& flag, const std::string& value) {
    if (!given(flag)) {
      add.push_back(flag);
      add.push_back(value);
    }
  };
  put("--num_machines", std::to_string(r.group_world_size));
  put("--machine_rank", std::to_string(r.group_rank));
  put("--main_process_ip", rdzv.master_addr);
  put("--main_process_port", std::to_string(rdzv.master_port));
  put("--num_processes", std::to_string(r.world_size));
  argv.insert(argv.begin() + std::ptrdiff_t(at), add.begin(), add.end());
  return argv;
}

}  // namespace skyforge::huggingface
