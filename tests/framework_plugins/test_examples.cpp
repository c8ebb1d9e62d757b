// The examples of examples/frameworks, run as their pages in docs/frameworks say: `skyforge run
// <example>.toml`, files unchanged (copied into the test's root), `python3` on PATH being the one
// with the framework: .venv-tf's for tensorflow-cpu, .venv's for jax, Debian's /usr/bin/python3 for
// python3-torch (all made by .ci/setup-deps and .ci/setup-venv). The tests check what each
// example prints. One whose Python cannot import its framework skips, saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <regex>
#include <set>

#include "fw_e2e.hpp"

using namespace skyforge::test;
using namespace skyforge::test::fw_e2e;

namespace {

class ExampleE2E : public FrameworkE2E {
 protected:
  // Empty when `python` imports `module`; then `python`'s directory comes first on PATH (its
  // python3, torchrun) for the example's run. Else why not.
  std::string use_python(const std::string& python, const std::string& module) {
    if (auto why = cannot_import(python, module); !why.empty()) return why;
    const char* path = std::getenv("PATH");
    extra_env_["PATH"] = fs::path(python).parent_path().string() + ":" + (path ? path : "/usr/bin:/bin");
    return "";
  }
  // examples/frameworks/<name>.toml, from a copy of that directory.
  Output run_example(const std::string& name, double timeout_s = 170) {
    fs::copy(FW_EXAMPLES, root_ / "frameworks", fs::copy_options::recursive);
    return run(root_ / "frameworks" / (name + ".toml"), timeout_s);
  }
  // The one line of node n's output that matches `re` (its groups in m); fails unless exactly one.
  void one_line(const Output& o, int n, const std::regex& re, std::smatch& m, std::string& line) {
    int found = 0;
    for (const auto& l : node_lines(o.out, n))
      if (std::regex_match(l, re)) line = l, ++found;
    ASSERT_EQ(found, 1) << "node " << n << ":\n" << o.out;
    std::regex_match(line, m, re);
  }
};

// tf_mwms.py: MultiWorkerMirroredStrategy on 3 workers, a custom training loop. Every worker
// trains on its own shard (their first losses differ, and the global loss is their mean), the
// gradients are all-reduced (every worker ends with the same weights), and the loss falls.
TEST_F(ExampleE2E, TensorflowTrainsOneModelOnThreeWorkers) {
  if (auto why = use_python(kTfVenvPython, "tensorflow"); !why.empty())
    GTEST_SKIP() << why << " (.ci/setup-venv installs tensorflow-cpu there)";
  Output o = run_example("tensorflow");
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  const std::regex re(R"(worker (\d)/3 replicas 3 first_loss ([0-9.]+) loss ([0-9.]+) -> ([0-9.]+) weights ([0-9a-f]{16}))");
  std::set<std::string> first_losses, global_losses, weights;
  double first_sum = 0, global_first = 0;
  for (int n = 0; n < 3; ++n) {
    std::smatch m;
    std::string line;
    ASSERT_NO_FATAL_FAILURE(one_line(o, n, re, m, line));
    EXPECT_EQ(m[1], std::to_string(n)) << "node n is TF_CONFIG's task n: " << line;
    first_losses.insert(m[2]);
    first_sum += std::stod(m[2]);
    global_losses.insert(m[3].str() + " -> " + m[4].str());
    global_first = std::stod(m[3]);
    weights.insert(m[5]);
    EXPECT_LT(std::stod(m[4]), global_first / 10) << "training lowered the loss: " << line;
  }
  EXPECT_EQ(first_losses.size(), 3u) << "each worker trains on its own shard\n" << o.out;
  EXPECT_EQ(global_losses.size(), 1u) << "one global loss\n" << o.out;
  EXPECT_NEAR(first_sum / 3, global_first, 1e-3) << "the global loss is the mean of the workers' own\n" << o.out;
  EXPECT_EQ(weights.size(), 1u) << "all-reduced gradients: the same weights on every worker\n" << o.out;
}

// jax_psum.py: 2 processes x 2 CPU devices form one global mesh of 4; the sum over it of each
// device's index is 0 + 1 + 2 + 3 on both.
TEST_F(ExampleE2E, JaxSumsOverTheGlobalMeshOfFourDevices) {
  if (auto why = use_python(kVenvPython, "jax"); !why.empty()) GTEST_SKIP() << why << " (run .ci/setup-venv)";
  Output o = run_example("jax");
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  for (int n = 0; n < 2; ++n) {
    auto lines = node_lines(o.out, n);
    const std::string want = "process " + std::to_string(n) + "/2 devices 4 sum_of_device_indices 6";
    EXPECT_EQ(std::count(lines.begin(), lines.end(), want), 1) << want << "\n" << o.out;
  }
}

// torch_ddp.py on 2 nodes x 2 processes: 4 DDP ranks over gloo, node n's being 2n and 2n+1; the
// all_reduce of the ranks is 0 + 1 + 2 + 3 on each.
void expect_four_ddp_ranks(const Output& o) {
  const std::regex re(R"(rank (\d)/4 loss [0-9.]+ sum_of_ranks 6)");
  for (int n = 0; n < 2; ++n) {
    std::set<std::string> ranks;
    for (const auto& l : node_lines(o.out, n)) {
      std::smatch m;
      if (std::regex_match(l, m, re)) ranks.insert(m[1]);
    }
    EXPECT_EQ(ranks, (std::set<std::string>{std::to_string(2 * n), std::to_string(2 * n + 1)})) << o.out;
  }
}

TEST_F(ExampleE2E, TorchRunsFourDdpRanks) {
  if (auto why = use_python(kSystemPython, "torch"); !why.empty())
    GTEST_SKIP() << why << " (Debian: apt-get install python3-torch)";
  Output o = run_example("torch");
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  expect_four_ddp_ranks(o);
}

// The same script under an unchanged `torchrun`, which starts the 2 processes of each node.
TEST_F(ExampleE2E, TorchrunRunsFourDdpRanks) {
  if (auto why = use_python(kSystemPython, "torch"); !why.empty())
    GTEST_SKIP() << why << " (Debian: apt-get install python3-torch)";
  // torchrun alone, with its own defaults: Debian 12's fails so. Its torch, 1.13.1, predates
  // Python 3.11 (supported from torch 2.0): there Std.from_str("0") is None, as 3.11's Flag
  // iteration leaves out the 0 member.
  // (Under a TMPDIR of its own: torchrun leaves its log directory there.)
  fs::create_directories(root_ / "probe");
  Output alone = Child({"/usr/bin/torchrun", "--standalone", "--nproc_per_node", "1", "--no_python", "true"},
                       {{"TMPDIR", (root_ / "probe").string()}})
                     .wait(60);
  if (alone.exit_code != 0)
    GTEST_SKIP() << "/usr/bin/torchrun fails on its own, without skyforge (Debian 12's torch 1.13.1 predates "
                    "Python 3.11, supported from torch 2.0): "
                 << tail_of(alone.err, 300);
  Output o = run_example("torchrun");
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  expect_four_ddp_ranks(o);
}

// hf_accelerate.py: Accelerator() on 2 nodes, CPU, with the plugin's options.
TEST_F(ExampleE2E, HuggingfaceAcceleratesOnTwoProcesses) {
  if (auto why = use_python(kSystemPython, "accelerate"); !why.empty())
    GTEST_SKIP() << why << " (accelerate needs torch >= 2.0 and Debian 12 packages neither it nor such a torch)";
  Output o = run_example("huggingface");
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  for (int n = 0; n < 2; ++n) {
    std::smatch m;
    std::string line;
    ASSERT_NO_FATAL_FAILURE(one_line(o, n, std::regex("process " + std::to_string(n) + R"(/2 accumulation 2 loss [0-9.]+)"),
                                     m, line));
  }
}

}  // namespace
