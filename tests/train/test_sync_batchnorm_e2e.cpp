// batch_normalization with synchronized = true in the built-in [train] job: 2 local nodes (real
// workers, Gloo) end with the same state (weights, optimizer slots and moving statistics: the
// result line's state_fnv1a64), which per-replica statistics do not give.
#include <gtest/gtest.h>

#include <regex>

#include "fashion_run_test.hpp"
#include "process.hpp"
#include "run_fixture.hpp"

using namespace skyforge::test;

namespace {

class SyncBatchNormE2E : public FashionRunTest {
 protected:
  SyncBatchNormE2E() : FashionRunTest("skyforge-syncbn") {}

  // The output of 3 steps of a small BatchNorm convnet on 2 nodes.
  std::string three_steps(bool synchronized) {
    const std::string manifest =
        "[pool]\nprovider = \"local\"\nnodes = 2\n\n[[plugins]]\nname = \"keras\"\nbackend = \"cpu\"\nseed = 7\n\n"
        "[train]\ndataset = \"fashion-mnist\"\noptimizer = \"sgd\"\nlearning_rate = 0.1\nbatch_size = 32\n"
        "threads = 1\nepochs = 1\nsteps_per_epoch = 3\nevaluate = false\n\n"
        "[[train.layers]]\ntype = \"conv2d\"\nfilters = 4\nkernel_size = 3\nstrides = 2\nuse_bias = false\n\n"
        "[[train.layers]]\ntype = \"batch_normalization\"\nsynchronized = " +
        std::string(synchronized ? "true" : "false") +
        "\n\n[[train.layers]]\ntype = \"relu\"\n\n[[train.layers]]\ntype = \"global_average_pooling2d\"\n\n"
        "[[train.layers]]\ntype = \"dense\"\nunits = 10\n";
    const Output o = skyforge({"run", write("job.toml", manifest).string()}, 240);
    EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
    return o.out;
  }
};

// Node `node`'s hash `key` in its result line.
std::string hash_of(const std::string& out, int node, const std::string& key) {
  std::smatch m;
  const std::regex re("\\[node " + std::to_string(node) + "\\] => \\{.*\"" + key + "\": \"([0-9a-f]+)\"");
  return std::regex_search(out, m, re) ? m[1].str() : "missing from: " + out;
}

}  // namespace

TEST_F(SyncBatchNormE2E, TwoNodesEndWithTheSameMovingStatistics) {
  const std::string synced = three_steps(true);
  EXPECT_EQ(hash_of(synced, 0, "state_fnv1a64"), hash_of(synced, 1, "state_fnv1a64"))
      << "the nodes' states (moving statistics included) differ";
  // Per-replica statistics: the same weights, other moving statistics on each node.
  const std::string own = three_steps(false);
  EXPECT_EQ(hash_of(own, 0, "weights_fnv1a64"), hash_of(own, 1, "weights_fnv1a64"));
  EXPECT_NE(hash_of(own, 0, "state_fnv1a64"), hash_of(own, 1, "state_fnv1a64"))
      << "with per-replica statistics the nodes' states should differ; is the run data-parallel?";
}
