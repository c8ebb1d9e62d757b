// The huggingface plugin: accelerate / Hub variables and the `accelerate launch` rewrite. The
// distributed variables are torch_env's (tests/torch_plugin).
#include <gtest/gtest.h>

#include <map>

#include "../support/env_map.hpp"
#include "hf_env.hpp"

using namespace skyforge::huggingface;
using skyforge::test::as_map;
namespace st = skyforge::torch;

namespace {

TEST(HfEnv, NothingByDefault) { EXPECT_TRUE(environment(Settings{}).empty()); }

TEST(HfEnv, OptionsBecomeAccelerateAndHubVariables) {
  Settings s;
  s.mixed_precision = "bf16";
  s.gradient_accumulation_steps = 4;
  s.dynamo_backend = "inductor";
  s.use_cpu = true;
  s.debug = true;
  s.hf_home = "hf-cache";
  s.work_dir = "/work/node0";
  s.offline = true;
  const std::map<std::string, std::string> expected = {
      {"ACCELERATE_MIXED_PRECISION", "bf16"},
      {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4"},
      {"ACCELERATE_DYNAMO_BACKEND", "inductor"},
      {"ACCELERATE_USE_CPU", "true"},
      {"ACCELERATE_DEBUG_MODE", "true"},
      {"HF_HOME", "/work/node0/hf-cache"},
      {"HF_HUB_OFFLINE", "1"},
      {"HF_DATASETS_OFFLINE", "1"},
      {"TRANSFORMERS_OFFLINE", "1"},
  };
  EXPECT_EQ(as_map(environment(s)), expected);
  s.hf_home = "/data/hf";
  EXPECT_EQ(as_map(environment(s))["HF_HOME"], "/data/hf");
}

TEST(HfEnv, AccelerateEnvPassesThroughAndWins) {
  Settings s;
  s.mixed_precision = "fp16";
  s.accelerate_env = " ACCELERATE_USE_FSDP=true; FSDP_SHARDING_STRATEGY=FULL_SHARD;;ACCELERATE_MIXED_PRECISION=no ";
  auto env = as_map(environment(s));
  EXPECT_EQ(env["ACCELERATE_USE_FSDP"], "true");
  EXPECT_EQ(env["FSDP_SHARDING_STRATEGY"], "FULL_SHARD");
  EXPECT_EQ(env["ACCELERATE_MIXED_PRECISION"], "no");
}

TEST(HfEnv, BadValuesAreRefused) {
  Settings s;
  s.mixed_precision = "fp12";
  EXPECT_THROW(environment(s), std::invalid_argument);
  EXPECT_THROW(parse_env_list("NOEQUALS"), std::invalid_argument);
  EXPECT_THROW(parse_env_list("1BAD=x"), std::invalid_argument);
  EXPECT_THROW(parse_env_list("BAD-NAME=x"), std::invalid_argument);
}

TEST(HfLaunch, AccelerateLaunchGetsThePoolsShape) {
  st::Ranks r = st::compute_ranks({.node = 1, .nodes = 2, .nproc_per_node = 4});
  st::Rendezvous rdzv{"10.0.0.1", 41234, "pool"};
  auto argv = accelerate_launch_argv({"accelerate", "launch", "--multi_gpu", "train.py", "--epochs", "3"}, r, rdzv);
  EXPECT_EQ(argv, (std::vector<std::string>{"accelerate", "launch", "--num_machines", "2", "--machine_rank", "1",
                                            "--main_process_ip", "10.0.0.1", "--main_process_port", "41234",
                                            "--num_processes", "8", "--multi_gpu", "train.py", "--epochs", "3"}));
}

TEST(HfLaunch, FlagsTheUserGaveAreKept) {
  st::Ranks r = st::compute_ranks({.node = 0, .nodes = 2});
  st::Rendezvous rdzv{"10.0.0.1", 41234, "pool"};
  auto argv = accelerate_launch_argv(
      {"accelerate", "launch", "--num-processes=4", "--main_process_port", "29500", "train.py"}, r, rdzv);
  EXPECT_EQ(argv, (std::vector<std::string>{"accelerate", "launch", "--num_machines", "2", "--machine_rank", "0",
                                            "--main_process_ip", "10.0.0.1", "--num-processes=4",
                                            "--main_process_port", "29500", "train.py"}));
}

TEST(HfLaunch, OtherCommandsAreUnchanged) {
  st::Ranks r = st::compute_ranks({.node = 0, .nodes = 2});
  st::Rendezvous rdzv{"10.0.0.1", 41234, "pool"};
  std::vector<std::string> cmd = {"python", "train.py"};
  EXPECT_EQ(accelerate_launch_argv(cmd, r, rdzv), cmd);
}

}  // namespace
