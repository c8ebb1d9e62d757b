// Pure environment of the `huggingface` framework plugin (no I/O, no SDK). The distributed part
// is the torch plugin's (torch_env.hpp, linked, not copied); this adds what Hugging Face
// accelerate / transformers' Trainer / the Hub client read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torch_env.hpp"

namespace skyforge::huggingface {

using EnvList = skyforge::torch::EnvList;

struct Settings {
  std::string mixed_precision;          // ACCELERATE_MIXED_PRECISION: no, fp16, bf16, fp8; empty: unset
  uint32_t gradient_accumulation_steps = 0;  // ACCELERATE_GRADIENT_ACCUMULATION_STEPS; 0: unset
  std::string dynamo_backend;           // ACCELERATE_DYNAMO_BACKEND; empty: unset
  bool use_cpu = false;                 // ACCELERATE_USE_CPU=true
  bool debug = false;                   // ACCELERATE_DEBUG_MODE=true
  std::string accelerate_env;           // extra "NAME=VALUE;NAME=VALUE" (ACCELERATE_*, FSDP_*, ...)
  std::string hf_home;                  // HF_HOME; relative paths are under work_dir
  bool offline = false;                 // HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1, TRANSFORMERS_OFFLINE=1
  std::string work_dir;                 // the node's work dir (for a relative hf_home)
};

// The accelerate / Hub variables for `s`. Throws std::invalid_argument on a bad option value
// (unknown mixed_precision, malformed accelerate_env).
EnvList environment(const Settings& s);

// Parses "NAME=VALUE;NAME=VALUE" (whitespace around items ignored, empty items skipped).
EnvList parse_env_list(std::string_view text);

// `accelerate launch [flags] script ...` with the pool's shape added as accelerate's own flags
// (--num_machines, --machine_rank, --main_process_ip, --main_process_port, --num_processes),
// each only when the command does not already give it. Other commands come back unchanged.
std::vector<std::string> accelerate_launch_argv(std::vector<std::string> argv, const skyforge::torch::Ranks& r,
                                                const skyforge::torch::Rendezvous& rdzv);

}  // namespace skyforge::huggingface
