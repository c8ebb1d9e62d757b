// The fixture of the end-to-end tests of the providers that reach other machines (ssh, slurm,
// aws): `skyforge run` of a manifest, and the fault run they all pass (label `faults`) -- a
// training run that loses node 1 and ends, after a restart, as the same training does
// uninterrupted on the local provider.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

#include "process.hpp"
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
