// The fixture of the end-to-end tests of the providers that reach other machines (ssh, slurm,
// aws): `skyforge run` of a manifest, and the runs they all pass against the same run on the
// local provider -- the examples' jobs, and (label `faults`) a training run that loses node 1
// and ends, after a restart, as the same training does uninterrupted.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <regex>
#include <set>
#include <string>

#include "process.hpp"
#include "provider_e2e.hpp"
#include "run_fixture.hpp"
#include "train_faults.hpp"

namespace skyforge::test {

class ProviderRunTest : public SkyforgeRunTest {
 protected:
  // `name`: the root's (SkyforgeRunTest); `run_timeout_s`: run()'s default.
  explicit ProviderRunTest(std::string name, double run_timeout_s = 120)
      : SkyforgeRunTest(std::move(name)), run_timeout_s_(run_timeout_s) {}

  Output run(const std::string& name, const std::string& manifest, double timeout_s = 0) {
    return skyforge({"run", write(name, manifest).string()}, timeout_s > 0 ? timeout_s : run_timeout_s_);
  }

  // examples/<file> with its [pool] replaced by `pool`, its outputs under the test's root.
  std::string example(const std::string& file, const std::string& pool) const {
    return example_manifest(file, pool, root_ / "runs");
  }

  // What a job's [job] table and manifest take, appended after its last [job] key, to bring a
  // file back from every node: staged there by [image] files, matched by [job] outputs, sent over
  // the node's control connection to <root>/outputs (docs/manifest.md, "Getting files back").
  std::string outputs_round_trip() {
    write("staged.txt", "staged on every node\n");
    return "outputs = [\"back/*.txt\"]\noutputs_dir = \"outputs\"\n\n[image]\nfiles = [{ source = \"staged.txt\", "
           "target = \"back/staged.txt\" }]\n";
  }
  // ... and every node's file is back, said.
  void expect_outputs_back(const Output& o, int nodes) {
    for (int n = 0; n < nodes; ++n)
      EXPECT_EQ(read_text(root_ / "outputs" / ("node-" + std::to_string(n)) / "back/staged.txt"), "staged on every node\n")
          << o.err;
    EXPECT_NE(o.err.find("the job's files: " + std::to_string(nodes) + " files"), std::string::npos) << o.err;
  }

  // The main job (examples/fashion-mnist.toml) on 2 nodes of `pool` trains the weights, and
  // reaches the test accuracy, it does on 2 local nodes, to the bit.
  void expect_fashion_mnist_as_local(const std::string& pool) {
    Output local = run("fm-local.toml", example("fashion-mnist.toml", "[pool]\nprovider = \"local\"\nnodes = 2\n"), 300);
    ASSERT_EQ(local.exit_code, 0) << local.err;
    Output o = run("fm.toml", example("fashion-mnist.toml", pool), 300);
    ASSERT_EQ(o.exit_code, 0) << o.err;
    const std::string w = json_field(local.out, 0, "weights_fnv1a64");
    ASSERT_FALSE(w.empty()) << local.out;
    EXPECT_EQ(json_field(o.out, 0, "weights_fnv1a64"), w) << o.out;
    EXPECT_EQ(json_field(o.out, 1, "weights_fnv1a64"), w) << o.out;
    EXPECT_EQ(json_field(o.out, 0, "test_accuracy"), json_field(local.out, 0, "test_accuracy"));
  }

  // The map example (examples/map.toml, 20 tasks) on `pool` (2 nodes, concurrency 2) gives the
  // results it gives on 2 local nodes.
  void expect_map_results_as_local(const std::string& pool) {
    Output local = run("map-local.toml", example("map.toml", "[pool]\nprovider = \"local\"\nnodes = 2\nconcurrency = 2\n"));
    ASSERT_EQ(local.exit_code, 0) << local.err;
    Output o = run("map.toml", example("map.toml", pool));
    ASSERT_EQ(o.exit_code, 0) << o.err;
    auto results = [](const std::string& out) {
      std::set<std::string> r;
      std::regex task(R"(\[task \d+\] => .*)");
      for (std::sregex_iterator it(out.begin(), out.end(), task), e; it != e; ++it) r.insert(it->str());
      return r;
    };
    EXPECT_EQ(results(o.out).size(), 20u) << o.out;
    EXPECT_EQ(results(o.out), results(local.out));
  }

  // A real PyTorch DDP command app (`scripts`/torch_ddp.py, the torch plugin's env:// rendezvous)
  // on 2 nodes of `pool`: every node's allreduce gives 3, each node holds the weights it holds on
  // 2 local nodes, and both hold the same. Skipped where /usr/bin/python3 cannot import torch.
  void expect_torch_ddp_as_local(const std::string& pool, const std::string& scripts) {
    const std::string python = "/usr/bin/python3";
    if (Child({python, "-c", "import torch"}, env()).wait(120).exit_code != 0)
      GTEST_SKIP() << python << " cannot import torch (Debian: apt-get install python3-torch)";
    const std::string job = "[[plugins]]\nname = \"torch\"\n\n[job]\ncommand = [\"" + python + "\", \"" + scripts +
                            "/torch_ddp.py\"]\n";
    Output local = run("ddp-local.toml", "[pool]\nprovider = \"local\"\nnodes = 2\n\n" + job, 170);
    ASSERT_EQ(local.exit_code, 0) << local.err;
    Output o = run("ddp.toml", pool + job, 170);
    ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
    for (int n = 0; n < 2; ++n) {
      EXPECT_EQ(node_value(o.out, n, "allreduce"), "3") << o.out;
      EXPECT_EQ(node_value(o.out, n, "weights"), node_value(local.out, n, "weights")) << "same DDP weights as on local";
    }
    EXPECT_FALSE(node_value(local.out, 0, "weights").empty()) << local.out;
    EXPECT_EQ(node_value(o.out, 0, "weights"), node_value(o.out, 1, "weights"));
  }

  // What the host says of node 1's worker killed (SIGKILL) and started again on its machine,
  // the job resuming from the last checkpoint.
  static void expect_worker_restarted(const Output& o) {
    EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(node 1 lost: its worker was killed by SIGKILL.*; restart 1/1)"))) << o.err;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(Resuming from .*ckpt-[23]\.bin)"))) << o.out;
  }

  // The main job's training on 2 nodes of `pool` with [job] max_restarts = 1: `fault` strikes
  // once the checkpoint of epoch 2 is written (waited for up to `checkpoint_s`); the run must
  // end with exit 0, having lost node 1, and with the weights and history of the uninterrupted
  // local run, to the bit. `check` looks at its output before that, for what the provider said.
  void expect_restarted_run_ends_as_local(const std::string& pool, double checkpoint_s,
                                          const std::function<void(Child& run)>& fault,
                                          const std::function<void(const Output& o)>& check) {
    const std::filesystem::path ref = root_ / "local", out = root_ / "faulty";
    Output local = run("local.toml", local_reference(ref), 240);
    ASSERT_EQ(local.exit_code, 0) << local.err;
    auto c = start_skyforge({"run", write("faulty.toml", faulty_training(pool, 1, out, 4)).string()});
    ASSERT_TRUE(wait_checkpoint(out, 2, checkpoint_s)) << c->err_so_far();
    fault(*c);
    if (HasFatalFailure()) return;
    Output o = c->wait(300);
    ASSERT_EQ(o.exit_code, 0) << o.err;
    EXPECT_NE(o.err.find("node 1 lost: "), std::string::npos) << o.err;
    check(o);
    expect_ends_as(local, ref, o, out);
  }

 private:
  double run_timeout_s_;
};

}  // namespace skyforge::test
