// The built-in [train] job end to end: the real `skyforge` binary, real workers on the local
// provider, the `cpu` backend plugin, the Gloo communicator and Debian's Fashion-MNIST files.
// Each test runs under its own TMPDIR and checks that no process or file is left behind.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <regex>
#include <set>
#include <sstream>

#include "process.hpp"
#include "fashion_run_test.hpp"
#include "run_fixture.hpp"

using namespace skyforge::test;

namespace {

class TrainE2E : public FashionRunTest {
 protected:
  TrainE2E() : FashionRunTest("skyforge-train") {}
  Output skyforge(const std::vector<std::string>& args, double timeout_s = 240) {
    return SkyforgeRunTest::skyforge(args, timeout_s);
  }
};

// The main job's manifest with a short schedule; outputs under `out`.
std::string mlp_manifest(int nodes, int epochs, int steps, const std::string& out, bool resume = false) {
  return "[pool]\nprovider = \"local\"\nnodes = " + std::to_string(nodes) +
         "\n\n[[plugins]]\nname = \"keras\"\nbackend = \"cpu\"\nseed = 42\n\n"
         "[train]\ndataset = \"fashion-mnist\"\noptimizer = \"adam\"\nlearning_rate = 1e-3\n"
         "batch_size = 64\nthreads = 1\nepochs = " +
         std::to_string(epochs) + "\nsteps_per_epoch = " + std::to_string(steps) + "\n" +
         (out.empty() ? "" : "history = \"" + out + "/history.csv\"\ntensorboard = \"" + out + "/tb\"\ncheckpoint = \"" + out + "/ckpt\"\n") +
         (resume ? "resume = true\n" : "") +
         "\n[[train.layers]]\ntype = \"flatten\"\n\n[[train.layers]]\ntype = \"dense\"\nunits = 128\nactivation = \"relu\"\n\n"
         "[[train.layers]]\ntype = \"dense\"\nunits = 10\n";
}

// The JSON result line of node n: "[node n] => {...}".
std::string result_of(const std::string& out, int n) {
  std::smatch m;
  std::regex line("\\[node " + std::to_string(n) + "\\] => (\\{.*\\})");
  return std::regex_search(out, m, line) ? m[1].str() : "";
}
std::string field(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\": \"?([^,\"}]+)");
  return std::regex_search(json, m, re) ? m[1].str() : "";
}
std::vector<std::string> csv_rows(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> rows;
  for (std::string l; std::getline(in, l);) rows.push_back(l);
  return rows;
}
// The result line's "epoch_seconds": [a, b, ...].
std::vector<double> epoch_seconds(const std::string& result) {
  std::smatch m;
  std::vector<double> out;
  if (!std::regex_search(result, m, std::regex(R"("epoch_seconds": \[([^\]]*)\])"))) return {-1, -1, -1};
  std::stringstream in(m[1].str());
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stod(item));
  return out;
}
std::vector<float> read_floats(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> w(bytes.size() / sizeof(float));
  std::memcpy(w.data(), bytes.data(), w.size() * sizeof(float));
  return w;
}

TEST_F(TrainE2E, TwoNodesWriteHistoryTensorboardCheckpointsAndResume) {
  const fs::path out = root_ / "run";
  Output o = skyforge({"run", write("job.toml", mlp_manifest(2, 2, 60, out.string())).string()});
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  // Progress and the summary come from the head only.
  EXPECT_NE(o.out.find("[node 0] Epoch 1/2"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("[node 0] Epoch 2/2"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("[node 1] Epoch"), std::string::npos) << o.out;
  EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(\[node 0\] 60/60 \[=+\] .*loss: \d\.\d{4} - accuracy: 0\.\d{4}.* samples/s)")))
      << o.out;
  EXPECT_NE(o.out.find("[node 0] Test loss: "), std::string::npos) << o.out;
  const std::string r0 = result_of(o.out, 0), r1 = result_of(o.out, 1);
  ASSERT_FALSE(r0.empty()) << o.out;
  ASSERT_FALSE(r1.empty()) << o.out;
  EXPECT_EQ(field(r0, "epochs"), "2");
  EXPECT_EQ(field(r0, "weights_fnv1a64"), field(r1, "weights_fnv1a64")) << "replicas diverged";
  EXPECT_EQ(field(r0, "test_accuracy"), field(r1, "test_accuracy"));
  EXPECT_GT(std::stod(field(r0, "test_accuracy")), 0.6) << "120 steps of Adam on Fashion-MNIST";
  EXPECT_EQ(epoch_seconds(r0).size(), 2u) << r0;  // one wall time per epoch run, inside fit()'s
  double sum = 0;
  for (double e : epoch_seconds(r0)) sum += e;
  EXPECT_LE(sum, std::stod(field(r0, "train_seconds")) + 1e-6) << r0;

  // history.csv: header + one row per epoch; the TensorBoard scalars carry the same values.
  auto rows = csv_rows(out / "history.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], "epoch,accuracy,loss");
  EXPECT_TRUE(fs::exists(out / "ckpt" / "latest"));
  const std::string py = VENV_PYTHON;
  if (::access(py.c_str(), X_OK) == 0) {
    std::string expect_loss = " --expect epoch_loss=", expect_acc = " --expect epoch_accuracy=";
    for (int e = 0; e < 2; ++e) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(rows[e + 1], m, std::regex(R"((\d+),([^,]+),([^,]+))"))) << rows[e + 1];
      expect_acc += (e ? "," : "") + m[1].str() + ":" + m[2].str();
      expect_loss += (e ? "," : "") + m[1].str() + ":" + m[3].str();
    }
    const std::string cmd = py + " " + CHECK_TFEVENTS_PY + " " + (out / "tb" / "train").string() + expect_loss +
                            expect_acc + " --tol 1e-6 >&2";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  } else {
    std::cerr << "[  SKIPPED ] TensorBoard read-back: no " << py << " (run .ci/setup-venv)\n";
  }

  // resume = true with epochs = 3: epochs 1-2 come from the checkpoint, one more is trained.
  Output o2 = skyforge({"run", write("job2.toml", mlp_manifest(2, 3, 60, out.string(), true)).string()});
  ASSERT_EQ(o2.exit_code, 0) << o2.out << o2.err;
  EXPECT_NE(o2.out.find("Resuming from"), std::string::npos) << o2.out;
  EXPECT_EQ(o2.out.find("Epoch 1/3"), std::string::npos) << o2.out;
  EXPECT_NE(o2.out.find("[node 0] Epoch 3/3"), std::string::npos) << o2.out;
  auto rows2 = csv_rows(out / "history.csv");
  ASSERT_EQ(rows2.size(), 4u);
  EXPECT_EQ(rows2[1], rows[1]);
  EXPECT_EQ(rows2[2], rows[2]);
  EXPECT_EQ(field(result_of(o2.out, 0), "epochs"), "3");
  EXPECT_EQ(epoch_seconds(result_of(o2.out, 0)).size(), 1u) << "only the epoch this run trained has a time";
}

// Data parallelism's two promises, over real processes and Gloo: the replicas are bit-identical
// after every step, and 2 nodes on a global batch follow 1 node on the same batch.
TEST_F(TrainE2E, ReplicasAreBitIdenticalEveryStepAndMatchOneNode) {
  auto manifest = [&](int nodes) {
    return "[pool]\nnodes = " + std::to_string(nodes) + "\n\n[[plugins]]\nname = \"cpu\"\n\n[job]\napp = \"replica_check\"\n" +
           "plugin_path = [\"" + TRAIN_FIXTURES + "\"]\n\n[job.options]\nsteps = 25\nout_dir = \"" + root_.string() + "\"\n";
  };
  Output two = skyforge({"run", write("two.toml", manifest(2)).string()});
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  std::smatch m0, m1;
  ASSERT_TRUE(std::regex_search(two.out, m0, std::regex(R"(\[node 0\] => checksums=([0-9a-f,]+))"))) << two.out;
  ASSERT_TRUE(std::regex_search(two.out, m1, std::regex(R"(\[node 1\] => checksums=([0-9a-f,]+))"))) << two.out;
  EXPECT_EQ(m0[1].str(), m1[1].str()) << "the replicas differ after some step";
  std::set<std::string> distinct;
  std::stringstream ss(m0[1].str());
  for (std::string h; std::getline(ss, h, ',');) distinct.insert(h);
  EXPECT_EQ(distinct.size(), 25u) << "every step changes the weights";

  Output one = skyforge({"run", write("one.toml", manifest(1)).string()});
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  const auto w1 = read_floats(root_ / "weights-w1-n0.bin");
  const auto w2 = read_floats(root_ / "weights-w2-n0.bin");
  ASSERT_EQ(w1.size(), 784u * 128 + 128 + 128 * 10 + 10);
  ASSERT_EQ(w2.size(), w1.size());
  double worst = 0;
  for (size_t i = 0; i < w1.size(); ++i) worst = std::max(worst, double{std::fabs(w1[i] - w2[i])});
  EXPECT_LT(worst, 1e-4) << "25 Adam steps: 2 nodes x 32 vs 1 node x 64";
  EXPECT_GT(worst, 0.0) << "different summation orders should not be bit-identical; is the 2-node run data-parallel?";
}

// The same model as a native app (tests/train/fixtures/fashion_native.cpp) takes exactly the
// steps of the manifest's [train] job: the same test loss and accuracy.
TEST_F(TrainE2E, NativeAppGivesTheManifestsNumbers) {
  Output manifest = skyforge({"run", write("job.toml", mlp_manifest(2, 1, 40, "")).string()});
  ASSERT_EQ(manifest.exit_code, 0) << manifest.out << manifest.err;
  const std::string r = result_of(manifest.out, 0);
  Output native = skyforge({"run", write("native.toml", "[pool]\nnodes = 2\n\n[[plugins]]\nname = \"cpu\"\n\n[job]\n"
                                                          "app = \"fashion_native\"\nplugin_path = [\"" +
                                                              std::string(TRAIN_FIXTURES) +
                                                              "\"]\n\n[job.options]\nepochs = 1\nsteps_per_epoch = 40\n")
                                          .string()});
  ASSERT_EQ(native.exit_code, 0) << native.out << native.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(native.out, m, std::regex(R"(\[node 0\] => test_loss=(\S+) test_accuracy=(\S+))")))
      << native.out;
  EXPECT_EQ(m[1].str(), field(r, "test_loss"));
  EXPECT_EQ(m[2].str(), field(r, "test_accuracy"));
}

// The convnet example, cut to a few steps: every layer kind of the Keras guide's model trains
// data-parallel and the replicas agree.
TEST_F(TrainE2E, ConvnetExampleTrainsAFewSteps) {
  std::ifstream in(std::string(EXAMPLES_DIR) + "/fashion-mnist-convnet.toml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text = std::regex_replace(text, std::regex(R"(epochs = \d+)"), "epochs = 1\nsteps_per_epoch = 4\nevaluate = false");
  text = std::regex_replace(text, std::regex(R"((history|tensorboard|checkpoint) = "[^"]*")"), "$1 = \"" + root_.string() + "/$1\"");
  Output o = skyforge({"run", write("convnet.toml", text).string()});
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("batch_normalization"), std::string::npos) << "the summary lists the model";
  EXPECT_NE(o.out.find("[node 0] 4/4 ["), std::string::npos) << o.out;
  EXPECT_EQ(field(result_of(o.out, 0), "weights_fnv1a64"), field(result_of(o.out, 1), "weights_fnv1a64"));
  EXPECT_EQ(csv_rows(root_ / "history").size(), 2u);
}

TEST_F(TrainE2E, MissingDatasetFailsNamingThePathAndLeavesNothing) {
  std::string text = mlp_manifest(2, 1, 5, "");
  text = std::regex_replace(text, std::regex("dataset = \"fashion-mnist\""),
                            "dataset = \"fashion-mnist\"\ndata_dir = \"" + root_.string() + "/nowhere\"");
  Output o = skyforge({"run", write("job.toml", text).string()});
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE((o.out + o.err).find(root_.string() + "/nowhere/train-images-idx3-ubyte.gz"), std::string::npos)
      << o.out << o.err;
}

// [search]: GridSearchCV of the train job. The fits are spread over the pool by the `sklearn`
// task backend; the scores do not depend on the pool (each fit's data, seed and steps are its
// own), so 2 nodes x 2 slots give exactly what 1 node gives, fit for fit.
TEST_F(TrainE2E, GridSearchGivesTheSameCvResultsOnAnyPoolAndWritesTheCsv) {
  auto manifest = [&](const std::string& name, int nodes, int slots) {
    return write(name, "[pool]\nnodes = " + std::to_string(nodes) + "\nconcurrency = " + std::to_string(slots) +
                           "\n\n[train]\nbatch_size = 64\nsteps_per_epoch = 40\nseed = 3\n"
                           "\n[[train.layers]]\ntype = \"flatten\"\n\n[[train.layers]]\ntype = \"dense\"\nunits = 64\n"
                           "activation = \"relu\"\n\n[[train.layers]]\ntype = \"dense\"\nunits = 10\n"
                           "\n[search]\nparam_grid = { learning_rate = [1e-3, 1e-2], \"layers.1.units\" = [16, 64] }\ncv = 3\n"
                           "csv = \"" + name + ".csv\"\n");
  };
  Output one = skyforge({"run", manifest("one", 1, 1).string()});
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  Output pool = skyforge({"run", manifest("pool", 2, 2).string()});
  ASSERT_EQ(pool.exit_code, 0) << pool.out << pool.err;
  EXPECT_NE(pool.err.find("grid search: 4 candidates x 3 folds = 12 fits"), std::string::npos) << pool.err;
  EXPECT_NE(pool.out.find("cv_results (3-fold, validation accuracy):"), std::string::npos) << pool.out;
  EXPECT_TRUE(std::regex_search(pool.out, std::regex(R"(best params: layers\.1\.units = \d+, learning_rate = [0-9.e-]+ \(mean accuracy 0\.\d{4}\))")))
      << pool.out;
  // The scores (not the fit times, the last column) are the same, fit for fit.
  auto scores = [](const std::vector<std::string>& rows) {
    std::vector<std::string> out;
    for (const auto& r : rows) out.push_back(r.substr(0, r.rfind(',')));
    return out;
  };
  const auto a = csv_rows(root_ / "one.csv"), b = csv_rows(root_ / "pool.csv");
  ASSERT_EQ(a.size(), 5u);
  EXPECT_EQ(a[0], "param_layers.1.units,param_learning_rate,split0_test_score,split1_test_score,split2_test_score,"
                  "mean_test_score,std_test_score,rank_test_score,mean_fit_time");
  EXPECT_EQ(scores(a), scores(b));
  EXPECT_EQ(a[1].substr(0, 9), "16,0.001,") << "ParameterGrid's order: names sorted, the last varying fastest";
  EXPECT_EQ(a[2].substr(0, 8), "16,0.01,");
  EXPECT_EQ(a[3].substr(0, 9), "64,0.001,");
}

TEST_F(TrainE2E, ExamplesAreValid) {
  for (const char* name : {"fashion-mnist.toml", "fashion-mnist-convnet.toml", "fashion-mnist-search.toml"}) {
    Output o = skyforge({"validate", std::string(EXAMPLES_DIR) + "/" + name}, 30);
    EXPECT_EQ(o.exit_code, 0) << name << ":\n" << o.out << o.err;
  }
}

}  // namespace
