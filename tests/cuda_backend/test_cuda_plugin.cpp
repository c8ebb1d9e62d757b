// The `cuda` plugin through the real `skyforge` binary (docs/compute-backends.md, "The cuda
// engine"): on a machine without a driver or device it is listed, a manifest selecting it
// validates, and `skyforge run` stops before provisioning with exit 2 and the reason, at the
// manifest line that selects it. On a machine with a usable device this test skips (Gpu.* run).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include "process.hpp"
#include "run_fixture.hpp"

using namespace skyforge::test;

namespace {

class CudaPlugin : public SkyforgeRunTest {
 protected:
  CudaPlugin() : SkyforgeRunTest("skyforge-cuda-plugin") {}
};

// The main job's manifest on `cuda` for one epoch, writing nothing beside it.
std::string main_job_on_cuda() {
  std::ifstream in(SKYFORGE_SOURCE_DIR "/examples/fashion-mnist.toml");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = std::regex_replace(ss.str(), std::regex("backend = \"cpu\""), "backend = \"cuda\"");
  text = std::regex_replace(text, std::regex("\nepochs = [0-9]+"), "\nepochs = 1");
  return std::regex_replace(text, std::regex("\n(history|tensorboard|checkpoint) = [^\n]*"), "");
}

}  // namespace

TEST_F(CudaPlugin, WithoutADeviceItIsListedValidatesAndRunStopsBeforeProvisioningWithExit2) {
  Output o = skyforge({"plugins"}, 30);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(std::regex_search(o.out, std::regex("\ncompute_backend +cuda +0\\.1\\.0 +1\\.3 +\\S+/libcuda_backend\\.so\n")))
      << o.out;

  const std::string text = main_job_on_cuda();
  ASSERT_NE(text.find("backend = \"cuda\""), std::string::npos);
  auto m = write("fashion-mnist-cuda.toml", text);
  o = skyforge({"validate", m.string()}, 30);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  // Its options (plugin.toml) are checked where the manifest is, GPU or not.
  auto with_options = [&](const std::string& name, const std::string& options) {
    return write(name, text + "\n[[plugins]]\nname = \"cuda\"\n" + options);
  };
  const std::string good = "tf32 = true\ncuda_graphs = false\nbucket_cap_mb = 16\ndeterministic = false\nautotune = true\n"
                           "conv_layout = \"nchw\"\n";
  o = skyforge({"validate", with_options("opts.toml", good).string()}, 30);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  o = skyforge({"validate", with_options("bad.toml", "tf32 = \"yes\"\n").string()}, 30);
  EXPECT_EQ(o.exit_code, 2) << o.out;
  const std::regex refused(R"(bad\.toml:\d+:8: \[\[plugins\]\] cuda tf32: expected a boolean, got a string \("yes"\))");
  EXPECT_TRUE(std::regex_search(o.err, refused)) << o.err;
  o = skyforge({"validate", with_options("bad2.toml", "autotune = 1\n").string()}, 30);
  EXPECT_EQ(o.exit_code, 2) << o.out;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(bad2\.toml:\d+:12: \[\[plugins\]\] cuda autotune: expected a boolean)")))
      << o.err;
  o = skyforge({"validate", with_options("bad3.toml", "conv_layout = \"NCHW\"\n").string()}, 30);
  EXPECT_EQ(o.exit_code, 2) << o.out;
  EXPECT_TRUE(std::regex_search(
      o.err, std::regex(R"(bad3\.toml:\d+:15: \[\[plugins\]\] cuda conv_layout: 'NCHW' is not one of: auto, nhwc, nchw)")))
      << o.err;

  o = skyforge({"run", m.string()}, 60);
  if (o.exit_code == 0) GTEST_SKIP() << "this machine has a usable CUDA device: the job ran on it";
  EXPECT_EQ(o.exit_code, 2) << o.err;
  // The value `backend = "cuda"` (line 14, column 11 of the example) and what is missing: no
  // driver here; a driver without a device, or a device older than the built architectures,
  // elsewhere.
  const std::regex expected(std::regex_replace(m.string(), std::regex("[.]"), "[.]") +
                            ":14:11: compute backend 'cuda' cannot run on this machine, where the `local` provider "
                            "starts the nodes: plugin 'cuda' probe: cuda: (no usable CUDA driver [(].+[)]|no CUDA device "
                            "visible [(]CUDA_VISIBLE_DEVICES[?][)]|device 0 [(].+[)] has compute capability .+) "
                            "[(]nothing was started[)]\n");
  EXPECT_TRUE(std::regex_match(o.err, expected)) << o.err;
  EXPECT_EQ(o.out, "");  // no node said anything: none was started
}

// ---- on a GPU (label gpu: `ctest --test-dir build -L gpu`; skipped visibly without one) ---------

namespace {

class GpuE2E : public SkyforgeRunTest {
 protected:
  GpuE2E() : SkyforgeRunTest("skyforge-cuda-gpu") {}
  // The main job on `backend` for `steps` steps of one epoch, its manifest edited by `edit`.
  Output run_main_job(const std::string& backend, int steps, int nodes, const std::string& pool_extra = "") {
    std::string text = main_job_on_cuda();
    text = std::regex_replace(text, std::regex("backend = \"cuda\""), "backend = \"" + backend + "\"");
    text = std::regex_replace(text, std::regex("\nnodes = [0-9]+"), "\nnodes = " + std::to_string(nodes) + pool_extra);
    text = std::regex_replace(text, std::regex("\nepochs = 1"), "\nepochs = 1\nsteps_per_epoch = " + std::to_string(steps));
    return skyforge({"run", write(backend + std::to_string(nodes) + ".toml", text).string()}, 600);
  }
  // The result line of node `node`: {"node": 0, ..., "loss": ..., "weights_fnv1a64": "..."}.
  static std::string field(const std::string& out, int node, const std::string& key) {
    std::smatch m;
    const std::regex line("\\[node " + std::to_string(node) + "\\] => \\{.*\"" + key + "\": \"?([^,\"}]+)");
    return std::regex_search(out, m, line) ? m[1].str() : "";
  }
  // Node 0 of run a trained like node 0 of run b: loss to 1e-3 relative, test accuracy within
  // 0.005 (docs/compute-backends.md, the GPU tolerances).
  static void expect_trains_like(const Output& a, const Output& b, const std::string& what) {
    const double la = std::stod(field(a.out, 0, "loss")), lb = std::stod(field(b.out, 0, "loss"));
    EXPECT_LE(std::fabs(la - lb) / lb, 1e-3) << what << ": loss " << la << " vs " << lb;
    const double aa = std::stod(field(a.out, 0, "test_accuracy")), ab = std::stod(field(b.out, 0, "test_accuracy"));
    EXPECT_LE(std::fabs(aa - ab), 0.005) << what << ": test accuracy " << aa << " vs " << ab;
  }
};

}  // namespace

// The main job's MLP, 200 steps on 1 GPU and on the cpu backend from the same seed and batches:
// the same loss to 1e-3 relative and test accuracy within 0.005.
TEST_F(GpuE2E, TheMainJobOnOneGpuTrainsLikeCpu) {
  Output gpu = run_main_job("cuda", 200, 1);
  if (gpu.exit_code == 2) GTEST_SKIP() << "no usable GPU: " << gpu.err;
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  Output cpu = run_main_job("cpu", 200, 1);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  expect_trains_like(gpu, cpu, "cuda vs cpu");
}

// Two nodes, one GPU each (the local provider's placement), data-parallel over NCCL: the replicas
// end bit-identical, and they follow one GPU on the same global batch (each node takes half of
// every step's 64) to the cuda-vs-cpu tolerance (on the cpu backend the two runs agree to 2e-9).
TEST_F(GpuE2E, TwoNodesOneGpuEachEndWithIdenticalReplicas) {
  Output o = run_main_job("cuda", 100, 2, "\naccelerator = \"cuda\"");
  if (o.exit_code == 2) GTEST_SKIP() << "no usable GPU: " << o.err;
  if (o.exit_code != 0 && o.err.find("this machine offers 1 ") != std::string::npos)
    GTEST_SKIP() << "one GPU only: " << o.err;
  ASSERT_EQ(o.exit_code, 0) << o.err;
  const std::string h0 = field(o.out, 0, "weights_fnv1a64"), h1 = field(o.out, 1, "weights_fnv1a64");
  EXPECT_FALSE(h0.empty()) << o.out;
  EXPECT_EQ(h0, h1) << o.out;
  Output one = run_main_job("cuda", 100, 1);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  expect_trains_like(o, one, "2 GPUs vs 1 GPU");
}
