// The model-graph examples (examples/fashion-mnist-resnet.toml, examples/fashion-mnist-vit.toml)
// and the schedule example (examples/fashion-mnist-schedule.toml) cut to a few steps on 2 local nodes (real workers, Gloo, the cpu backend): every layer of a
// residual net and of a transformer trains data-parallel, and the replicas end bit-identical.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "fashion_run_test.hpp"
#include "process.hpp"
#include "run_fixture.hpp"

using namespace skyforge::test;

namespace {

class GraphExamplesE2E : public FashionRunTest {
 protected:
  GraphExamplesE2E() : FashionRunTest("skyforge-graph-examples") {}

  // examples/<name>.toml for 3 steps of one epoch, its files in this test's directory.
  Output three_steps(const std::string& name) {
    std::ifstream in(std::string(EXAMPLES_DIR) + "/" + name + ".toml");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_FALSE(text.empty()) << name;
    text = std::regex_replace(text, std::regex(R"(\nepochs = \d+)"), "\nepochs = 1\nsteps_per_epoch = 3\nevaluate = false");
    text = std::regex_replace(text, std::regex(R"((history|tensorboard|checkpoint) = "[^"]*")"),
                              "$1 = \"" + root_.string() + "/$1\"");
    return skyforge({"run", write(name + ".toml", text).string()}, 240);
  }
};

// Node `node`'s hash `key` in its result line.
std::string hash_of(const std::string& out, int node, const std::string& key) {
  std::smatch m;
  const std::regex re("\\[node " + std::to_string(node) + "\\] => \\{.*\"" + key + "\": \"([0-9a-f]+)\"");
  return std::regex_search(out, m, re) ? m[1].str() : "missing from: " + out;
}

}  // namespace

TEST_F(GraphExamplesE2E, ResNetTrainsAFewStepsWithIdenticalReplicas) {
  const Output o = three_steps("fashion-mnist-resnet");
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("[node 0] 3/3 ["), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("b2_shortcut"), std::string::npos) << "the summary lists the model";
  EXPECT_EQ(hash_of(o.out, 0, "weights_fnv1a64"), hash_of(o.out, 1, "weights_fnv1a64"));
}

// examples/fashion-mnist-schedule.toml: a cosine schedule with warmup and global_clipnorm on
// 2 nodes; TensorBoard's train log gets the rate of the next update.
TEST_F(GraphExamplesE2E, ScheduleExampleTrainsAFewStepsWithIdenticalReplicas) {
  const Output o = three_steps("fashion-mnist-schedule");
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("[node 0] 3/3 ["), std::string::npos) << o.out;
  EXPECT_EQ(hash_of(o.out, 0, "state_fnv1a64"), hash_of(o.out, 1, "state_fnv1a64"));
  bool logged = false;
  for (const auto& f : std::filesystem::directory_iterator(root_ / "tensorboard" / "train")) {
    std::ifstream in(f.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    logged |= bytes.find("epoch_learning_rate") != std::string::npos;
  }
  EXPECT_TRUE(logged);
}

TEST_F(GraphExamplesE2E, VitTrainsAFewStepsWithIdenticalReplicas) {
  const Output o = three_steps("fashion-mnist-vit");
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("[node 0] 3/3 ["), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("t2_attention"), std::string::npos) << "the summary lists the model";
  EXPECT_EQ(hash_of(o.out, 0, "state_fnv1a64"), hash_of(o.out, 1, "state_fnv1a64"));  // no moving statistics: all of it
}
