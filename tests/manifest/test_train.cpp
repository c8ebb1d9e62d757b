// The [train] table (built-in train job) and the plugin.toml rules it relies on: options that
// name another plugin (keras' backend) and `after` ordering.
#include "catalog.hpp"
#include "manifest.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "problems.hpp"

namespace fs = std::filesystem;
using namespace skyforge;
using namespace skyforge::test;

namespace {

std::map<std::string, std::string> config_of(const Manifest& m) {
  return {m.train.config.begin(), m.train.config.end()};
}

const std::string kMlp = R"([pool]
nodes = 2

[train]
dataset = "fashion-mnist"
optimizer = "adam"
learning_rate = 1e-3
metrics = ["accuracy"]
epochs = 5
batch_size = 64
seed = 42
history = "out/history.csv"

[[train.layers]]
type = "flatten"

[[train.layers]]
type = "dense"
units = 128
activation = "relu"

[[train.layers]]
type = "dense"
units = 10
)";

// A plugin directory written for one test.
struct PluginDir {
  fs::path root = fs::temp_directory_path() / ("sf-train-" + std::to_string(::getpid()) + "-" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  PluginDir() { fs::create_directories(root); }
  ~PluginDir() { fs::remove_all(root); }
  void add(const std::string& name, const std::string& toml) {
    fs::create_directories(root / name);
    std::ofstream(root / name / "plugin.toml") << toml;
  }
};

const std::string kKerasToml = R"(name = "keras"
kind = "framework"
library = "libkeras.so"
abi = "1.1"
after = ["jax", "torch"]
[options.backend]
type = "string"
default = "cpu"
choices = ["jax", "torch", "tensorflow"]
plugin = "compute_backend"
)";

const std::string kLocalToml = "name = \"local\"\nkind = \"provider\"\nlibrary = \"liblocal.so\"\nabi = \"1.0\"\n";

}  // namespace

TEST(Train, MlpBecomesTheTrainAppWithFlatConfig) {
  Manifest m = parse_manifest(kMlp, "/tmp/proj/job.toml");
  EXPECT_TRUE(m.train.present);
  EXPECT_EQ(m.job.app, "train");
  EXPECT_EQ(m.job.mode, JobMode::broadcast);
  auto c = config_of(m);
  EXPECT_EQ(c["train.epochs"], "5");
  EXPECT_EQ(c["train.batch_size"], "64");
  EXPECT_EQ(c["train.seed"], "42");
  EXPECT_EQ(c["train.optimizer"], "adam");
  EXPECT_EQ(c["train.learning_rate"], "0.001");
  EXPECT_EQ(c["train.metrics"], "accuracy");
  EXPECT_EQ(c["train.history"], "/tmp/proj/out/history.csv");  // relative to the manifest
  EXPECT_EQ(c["train.layers"], "3");
  EXPECT_EQ(c["train.layers.0.type"], "flatten");
  EXPECT_EQ(c["train.layers.1.type"], "dense");
  EXPECT_EQ(c["train.layers.1.units"], "128");
  EXPECT_EQ(c["train.layers.1.activation"], "relu");
  EXPECT_EQ(c["train.layers.2.units"], "10");
  EXPECT_EQ(c.count("train.layers.2.activation"), 0u);
}

// [train]'s defaults are filled in by the table, from config_keys.hpp (the train app has none of
// its own), and an optimizer's learning rate is its own, Keras': sgd without one trains at 0.01
// (it trained at 0.001, [train]'s old default for every optimizer).
TEST(Train, DefaultsAreFilledInWithTheOptimizersOwnLearningRate) {
  const std::string layers = "[[train.layers]]\ntype = \"flatten\"\n";
  auto c = config_of(parse_manifest("[train]\noptimizer = \"sgd\"\n" + layers, "job.toml"));
  EXPECT_EQ(c["train.optimizer"], "sgd");
  EXPECT_EQ(c["train.learning_rate"], "0.01");
  EXPECT_EQ(c["train.momentum"], "0");
  EXPECT_EQ(c["train.batch_size"], "32");
  EXPECT_EQ(c["train.epochs"], "1");
  EXPECT_EQ(c["train.shuffle"], "true");
  EXPECT_EQ(c["train.evaluate"], "true");
  EXPECT_EQ(c["train.resume"], "false");
  EXPECT_EQ(c["train.metrics"], "accuracy");
  EXPECT_EQ(c["train.loss"], "sparse_categorical_crossentropy");
  EXPECT_EQ(c["train.checkpoint_every"], "epoch");
  EXPECT_EQ(c["train.dataset"], "fashion-mnist");
  EXPECT_EQ(c["train.data_dir"], "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(c.count("train.seed"), 0u);  // absent: the pool's seed
  auto a = config_of(parse_manifest("[train]\n" + layers, "job.toml"));
  EXPECT_EQ(a["train.optimizer"], "adam");
  EXPECT_EQ(a["train.learning_rate"], "0.001");
  EXPECT_EQ(a.count("train.momentum"), 0u);  // not an option of adam
}

// Optimizer options are checked against the optimizer schema: Keras' ranges (momentum in [0, 1]).
TEST(Train, OptimizerOptionsFollowTheOptimizerSchema) {
  const std::string layers = "[[train.layers]]\ntype = \"flatten\"\n";
  auto c = config_of(parse_manifest("[train]\noptimizer = \"sgd\"\nmomentum = 1\nlearning_rate = 0.05\n" + layers, "job.toml"));
  EXPECT_EQ(c["train.momentum"], "1");
  EXPECT_EQ(c["train.learning_rate"], "0.05");
  auto p = problems_of("[train]\noptimizer = \"sgd\"\nmomentum = 1.5\nlearning_rate = 0\n" + layers);
  ASSERT_EQ(p.size(), 2u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:3:12: [train] momentum: expected a number in [0, 1], got a float (1.5)");
  EXPECT_EQ(p[1], "job.toml:4:17: [train] learning_rate: expected a number > 0, got an integer (0)");
}

// adamw's weight_decay, sgd's nesterov and rmsprop's rho and centered are [train] keys too; a
// boolean option takes a TOML boolean, and each is checked against its optimizer's schema.
TEST(Train, AdamWSgdNesterovAndRmspropOptions) {
  const std::string layers = "[[train.layers]]\ntype = \"flatten\"\n";
  auto w = config_of(parse_manifest("[train]\noptimizer = \"adamw\"\nweight_decay = 0.01\n" + layers, "job.toml"));
  EXPECT_EQ(w["train.optimizer"], "adamw");
  EXPECT_EQ(w["train.weight_decay"], "0.01");
  EXPECT_EQ(w["train.learning_rate"], "0.001");
  EXPECT_EQ(config_of(parse_manifest("[train]\noptimizer = \"adamw\"\n" + layers, "job.toml"))["train.weight_decay"],
            "0.004");  // Keras' default
  auto s = config_of(parse_manifest("[train]\noptimizer = \"sgd\"\nmomentum = 0.9\nnesterov = true\n" + layers, "job.toml"));
  EXPECT_EQ(s["train.nesterov"], "true");
  auto r = config_of(parse_manifest("[train]\noptimizer = \"rmsprop\"\nrho = 0.8\ncentered = true\n" + layers, "job.toml"));
  EXPECT_EQ(r["train.rho"], "0.8");
  EXPECT_EQ(r["train.centered"], "true");
  EXPECT_EQ(r["train.momentum"], "0");
  EXPECT_EQ(r["train.learning_rate"], "0.001");
  auto p = problems_of("[train]\noptimizer = \"rmsprop\"\nrho = 2\ncentered = \"yes\"\nweight_decay = -1\n" + layers);
  ASSERT_EQ(p.size(), 3u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:3:7: [train] rho: expected a number in [0, 1], got an integer (2)");
  EXPECT_EQ(p[1], "job.toml:4:12: [train] centered: expected true or false, got a string (\"yes\")");
  EXPECT_EQ(p[2], "job.toml:5:16: [train] weight_decay: expected a number >= 0, got an integer (-1)");
}

TEST(Train, ExamplesParse) {
  for (const char* name : {"fashion-mnist.toml", "fashion-mnist-convnet.toml", "fashion-mnist-resnet.toml", "fashion-mnist-vit.toml",
                           "fashion-mnist-schedule.toml"}) {
    const fs::path p = fs::path(SKYFORGE_SOURCE_DIR) / "examples" / name;
    if (!fs::exists(p)) continue;
    Manifest m = load_manifest(p.string());
    EXPECT_TRUE(m.train.present) << name;
  }
}

TEST(Train, UnknownLayerTypeNamesTheLineAndTheChoices) {
  auto p = problems_of("[train]\n[[train.layers]]\ntype = \"dense2\"\nunits = 3\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_NE(p[0].find("job.toml:3:8"), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("one of dense, conv2d"), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("did you mean 'dense'"), std::string::npos) << p[0];
}

TEST(Train, LayerOptionsAreChecked) {
  auto p = problems_of(
      "[train]\n[[train.layers]]\ntype = \"dense\"\nunits = 0\nactivaton = \"relu\"\n"
      "[[train.layers]]\ntype = \"dropout\"\nrate = 1.5\n[[train.layers]]\ntype = \"conv2d\"\nfilters = 8\n");
  ASSERT_EQ(p.size(), 4u) << ::testing::PrintToString(p);
  EXPECT_NE(p[0].find("job.toml:4:9: [[train.layers]] #1 units: expected an integer between 1 and 2147483647, got 0"), std::string::npos) << p[0];
  EXPECT_NE(p[1].find("job.toml:5:1: unknown key 'activaton'"), std::string::npos) << p[1];
  EXPECT_NE(p[1].find("did you mean 'activation'"), std::string::npos) << p[1];
  EXPECT_NE(p[2].find("#2 rate: expected a number in [0, 1)"), std::string::npos) << p[2];
  EXPECT_NE(p[3].find("#3 (conv2d): missing 'kernel_size'"), std::string::npos) << p[3];
}

// Layer options are the layer schema's (skyforge/layer_schema.hpp): sizes as an integer or a
// [height, width] pair, numbers in the schema's ranges, canonical text in the config keys.
TEST(Train, LayerOptionsFollowTheLayerSchema) {
  Manifest m = parse_manifest(
      "[train]\n[[train.layers]]\ntype = \"conv2d\"\nfilters = 8\nkernel_size = [3, 5]\nstrides = 2\n"
      "activation = \"none\"\n[[train.layers]]\ntype = \"batch_normalization\"\nmomentum = 1\nepsilon = 1e-5\n"
      "[[train.layers]]\ntype = \"flatten\"\n[[train.layers]]\ntype = \"dense\"\nunits = 10\n",
      "job.toml");
  auto c = config_of(m);
  EXPECT_EQ(c["train.layers.0.kernel_size"], "3,5");
  EXPECT_EQ(c["train.layers.0.strides"], "2");
  EXPECT_EQ(c["train.layers.0.activation"], "linear");  // none = linear
  EXPECT_EQ(c["train.layers.1.momentum"], "1");
  EXPECT_EQ(c["train.layers.1.epsilon"], "1e-05");
  EXPECT_EQ(c.count("train.layers.1.center"), 0u);  // defaults are the schema's, filled in by compile()

  auto p = problems_of(
      "[train]\n[[train.layers]]\ntype = \"conv2d\"\nfilters = 8\nkernel_size = [3, 0]\npadding = \"sam\"\n"
      "[[train.layers]]\ntype = \"batch_normalization\"\nepsilon = 0\ncenter = \"yes\"\n");
  ASSERT_EQ(p.size(), 4u) << ::testing::PrintToString(p);
  EXPECT_NE(p[0].find("job.toml:5:15: [[train.layers]] #1 kernel_size: expected an integer between 1 and 2147483647, "
                      "or a pair like 3,5, got 3,0"),
            std::string::npos)
      << p[0];
  EXPECT_NE(p[1].find("job.toml:6:11: [[train.layers]] #1 padding: expected one of valid, same, got \"sam\" "
                      "(did you mean 'same'?)"),
            std::string::npos)
      << p[1];
  EXPECT_NE(p[2].find("job.toml:9:11: [[train.layers]] #2 epsilon: expected a number > 0, got 0"), std::string::npos)
      << p[2];
  EXPECT_NE(p[3].find("job.toml:10:10: [[train.layers]] #2 center: expected true or false, got a string"),
            std::string::npos)
      << p[3];
}

TEST(Train, TableKeysAreChecked) {
  auto p = problems_of(
      "[train]\nepochs = \"5\"\noptimizer = \"lamb\"\nresume = true\nbatchsize = 3\n[[train.layers]]\ntype = \"flatten\"\n");
  ASSERT_EQ(p.size(), 4u) << ::testing::PrintToString(p);
  EXPECT_NE(p[0].find("job.toml:2:10: [train] epochs: expected an integer >= 1"), std::string::npos) << p[0];
  EXPECT_NE(p[1].find("job.toml:3:13: [train] optimizer: expected one of adam, adamw, sgd, rmsprop"), std::string::npos)
      << p[1];
  EXPECT_NE(p[2].find("job.toml:4:1: [train] resume: needs 'checkpoint'"), std::string::npos) << p[2];
  EXPECT_NE(p[3].find("unknown key 'batchsize'"), std::string::npos) << p[3];
}

// checkpoint_every: "epoch" or N steps >= 1, and only with a checkpoint directory.
TEST(Train, CheckpointEveryIsEpochOrStepsAndNeedsACheckpoint) {
  auto p = problems_of("[train]\ncheckpoint_every = 0\n[[train.layers]]\ntype = \"flatten\"\n");
  ASSERT_EQ(p.size(), 2u) << ::testing::PrintToString(p);
  EXPECT_NE(p[0].find("job.toml:2:1: [train] checkpoint_every: needs 'checkpoint'"), std::string::npos) << p[0];
  EXPECT_NE(p[1].find("job.toml:2:20: [train] checkpoint_every: expected \"epoch\" or a number of steps >= 1"),
            std::string::npos)
      << p[1];
  p = problems_of("[train]\ncheckpoint = \"ck\"\ncheckpoint_every = \"step\"\n[[train.layers]]\ntype = \"flatten\"\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_NE(p[0].find("job.toml:3:20: [train] checkpoint_every: expected \"epoch\" or a number of steps >= 1"),
            std::string::npos)
      << p[0];
}

TEST(Train, LayersAreRequired) {
  auto p = problems_of("[train]\nepochs = 1\n");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("job.toml:1:1: [train]: missing 'layers'"), std::string::npos) << p[0];
}

TEST(Train, JobAppOrCommandConflictsWithTrain) {
  auto p = problems_of("[job]\ncommand = [\"true\"]\n[train]\n[[train.layers]]\ntype = \"flatten\"\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_NE(p[0].find("job.toml:2:1: [job] command: not allowed with a [train] table"), std::string::npos) << p[0];
}

TEST(Train, PluginOptionMustNameAPluginOfItsKind) {
  PluginDir d;
  d.add("keras", kKerasToml);
  d.add("local", kLocalToml);
  d.add("cpu", "name = \"cpu\"\nkind = \"compute_backend\"\nlibrary = \"libcpu.so\"\nabi = \"1.1\"\n");
  d.add("hello", "name = \"hello\"\nkind = \"app\"\nlibrary = \"libhello.so\"\nabi = \"1.0\"\n");
  Catalog c({d.root.string()});
  ASSERT_TRUE(c.problems().empty()) << ::testing::PrintToString(c.problems());

  Manifest ok = parse_manifest("[[plugins]]\nname = \"keras\"\nbackend = \"cpu\"\n" + std::string("[job]\napp = \"hello\"\n"), "job.toml");
  validate_against(ok, c);
  auto refs = referenced_plugins(ok.plugins[0], c);
  ASSERT_EQ(refs.size(), 1u);
  EXPECT_EQ(refs[0]->name, "cpu");

  Manifest jax = parse_manifest("[[plugins]]\nname = \"keras\"\nbackend = \"jax\"\n[job]\ncommand = [\"true\"]\n", "job.toml");
  validate_against(jax, c);
  EXPECT_TRUE(referenced_plugins(jax.plugins[0], c).empty());  // a choice, not a plugin

  for (const char* bad : {"hello", "cpuu"}) {
    Manifest m = parse_manifest(std::string("[[plugins]]\nname = \"keras\"\nbackend = \"") + bad + "\"\n[job]\napp = \"hello\"\n",
                                "job.toml");
    try {
      validate_against(m, c);
      ADD_FAILURE() << bad << " accepted";
    } catch (const ManifestError& e) {
      ASSERT_EQ(e.problems().size(), 1u) << e.what();
      const std::string& p = e.problems()[0];
      EXPECT_NE(p.find("job.toml:3:11: [[plugins]] keras backend"), std::string::npos) << p;
      if (std::string(bad) == "hello")
        EXPECT_NE(p.find("is an app plugin, expected compute_backend"), std::string::npos) << p;
      else
        EXPECT_NE(p.find("no plugin named 'cpuu' (searched: " + d.root.string()), std::string::npos) << p;
    }
  }
}

TEST(Train, AfterOrderIsEnforced) {
  PluginDir d;
  d.add("keras", kKerasToml);
  d.add("local", kLocalToml);
  d.add("jax", "name = \"jax\"\nkind = \"framework\"\nlibrary = \"libjax.so\"\nabi = \"1.0\"\n");
  Catalog c({d.root.string()});
  Manifest good = parse_manifest("[[plugins]]\nname = \"jax\"\n[[plugins]]\nname = \"keras\"\nbackend = \"jax\"\n[job]\ncommand = [\"true\"]\n",
                                 "job.toml");
  validate_against(good, c);
  Manifest bad = parse_manifest("[[plugins]]\nname = \"keras\"\nbackend = \"jax\"\n[[plugins]]\nname = \"jax\"\n[job]\ncommand = [\"true\"]\n",
                                "job.toml");
  try {
    validate_against(bad, c);
    ADD_FAILURE() << "keras before jax accepted";
  } catch (const ManifestError& e) {
    ASSERT_EQ(e.problems().size(), 1u) << e.what();
    EXPECT_NE(e.problems()[0].find("job.toml:2:8: [[plugins]] keras: must come after 'jax' (listed at job.toml:5:8)"),
              std::string::npos)
        << e.what();
  }
}

namespace {
std::vector<std::string> validation_problems(Manifest& m, const Catalog& c) {
  try {
    validate_against(m, c);
  } catch (const ManifestError& e) {
    return e.problems();
  }
  return {};
}
}  // namespace

// [job.options]: a native app's options, checked against its plugin.toml like a plugin's.
TEST(JobOptions, CheckedAgainstTheAppsSchemaWithDefaults) {
  PluginDir d;
  d.add("local", kLocalToml);
  d.add("fit", "name = \"fit\"\nkind = \"app\"\nlibrary = \"libfit.so\"\nabi = \"1.1\"\n"
               "[options.epochs]\ntype = \"integer\"\ndefault = 5\n[options.out]\ntype = \"string\"\ndefault = \"\"\n");
  Catalog c({d.root.string()});
  Manifest ok = parse_manifest("[job]\napp = \"fit\"\n[job.options]\nepochs = 2\n", "job.toml");
  ASSERT_TRUE(validation_problems(ok, c).empty());
  const std::map<std::string, std::string> opts(ok.job.app_options.begin(), ok.job.app_options.end());
  EXPECT_EQ(opts.at("epochs"), "2");
  EXPECT_EQ(opts.at("out"), "");  // default added

  Manifest unknown = parse_manifest("[job]\napp = \"fit\"\n[job.options]\nepoch = 2\n", "job.toml");
  auto p = validation_problems(unknown, c);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("job.toml:4:9: [job.options]: unknown option 'epoch'"), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("epoch"), std::string::npos) << p[0];

  Manifest wrong = parse_manifest("[job]\napp = \"fit\"\n[job.options]\nepochs = \"two\"\n", "job.toml");
  p = validation_problems(wrong, c);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("job.toml:4:"), std::string::npos) << p[0];

  auto cmd = problems_of("[job]\ncommand = [\"true\"]\n[job.options]\nepochs = 2\n");
  ASSERT_EQ(cmd.size(), 1u);
  EXPECT_NE(cmd[0].find("only a native app ('app') takes options"), std::string::npos) << cmd[0];
}

// [train] runs on the `cpu` backend unless a plugin names another; without either it is refused.
TEST(Train, NeedsAComputeBackend) {
  PluginDir d;
  d.add("local", kLocalToml);
  d.add("train", "name = \"train\"\nkind = \"app\"\nlibrary = \"libtrain.so\"\nabi = \"1.1\"\n");
  Catalog none({d.root.string()});
  Manifest m = parse_manifest(kMlp, "job.toml");
  auto p = validation_problems(m, none);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("job.toml:4:1: [train]: needs a compute backend"), std::string::npos) << p[0];

  d.add("cpu", "name = \"cpu\"\nkind = \"compute_backend\"\nlibrary = \"libcpu.so\"\nabi = \"1.1\"\n");
  Catalog with_cpu({d.root.string()});
  Manifest m2 = parse_manifest(kMlp, "job.toml");
  EXPECT_TRUE(validation_problems(m2, with_cpu).empty());
}

// ---- [search]: a grid search of the train job -------------------------------------------------

TEST(Search, MakesAMapJobOfTheSklearnBackendWithTheGridAsTheTrainTableWouldHoldIt) {
  Manifest m = parse_manifest(kMlp + "\n[search]\nparam_grid = { learning_rate = [1e-3, 3e-4], layers = { 1 = { units = [64, 256] } }, "
                                     "optimizer = [\"sgd\", \"adam\"] }\ncv = 3\ncsv = \"out/cv.csv\"\n",
                              "/tmp/proj/job.toml");
  EXPECT_EQ(m.job.app, "train");
  EXPECT_EQ(m.job.mode, JobMode::map);
  EXPECT_EQ(m.job.task_backend, "sklearn");
  std::map<std::string, std::string> c(m.search.config.begin(), m.search.config.end());
  EXPECT_EQ(c["search.params"], "layers.1.units\nlearning_rate\noptimizer");  // sorted, as ParameterGrid
  EXPECT_EQ(c["search.param_grid.learning_rate"], "0.001\n3e-04");  // canonical, as [train] holds it
  EXPECT_EQ(c["search.param_grid.layers.1.units"], "64\n256");
  EXPECT_EQ(c["search.param_grid.optimizer"], "sgd\nadam");
  EXPECT_EQ(c["search.cv"], "3");
  EXPECT_EQ(c["search.seed"], "0");
  EXPECT_EQ(c["search.csv"], "/tmp/proj/out/cv.csv");
  // A quoted dotted name is the same parameter.
  Manifest q = parse_manifest(kMlp + "\n[search]\nparam_grid = { \"layers.1.units\" = [64] }\n", "job.toml");
  std::map<std::string, std::string> qc(q.search.config.begin(), q.search.config.end());
  EXPECT_EQ(qc["search.param_grid.layers.1.units"], "64");
  EXPECT_EQ(qc["search.cv"], "5");  // scikit-learn's default
  // The optimizers' own [train] keys too, each checked as [train] checks it.
  Manifest w = parse_manifest(kMlp + "\n[search]\nparam_grid = { optimizer = [\"adamw\"], weight_decay = [0, 0.01] }\n",
                              "job.toml");
  std::map<std::string, std::string> wc(w.search.config.begin(), w.search.config.end());
  EXPECT_EQ(wc["search.param_grid.weight_decay"], "0\n0.01");
}

TEST(Search, EachValueIsCheckedWhereItIsWritten) {
  const std::string base = kMlp + "\n[search]\n";  // [search] is line 26
  auto p = problems_of(base + "param_grid = { learning_rate = [1e-3, -2] }\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:27:39: [search] param_grid learning_rate: [train] learning_rate: expected a number > 0, got an integer (-2)");
  p = problems_of(base + "param_grid = { \"layers.1.activation\" = [\"relu\", \"rleu\"] }\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_NE(p[0].find("job.toml:27:49: [search] param_grid layers.1.activation: [[train.layers]] #2 activation: expected one of linear, relu, softmax, gelu, tanh, sigmoid, got \"rleu\""), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("(did you mean 'relu'?)"), std::string::npos) << p[0];
  p = problems_of(base + "param_grid = { dataset = [\"mnist\"] }\n");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("[search] param_grid dataset: expected a [train] key (optimizer, learning_rate"), std::string::npos) << p[0];
  p = problems_of(base + "param_grid = { \"layers.7.units\" = [1] }\n");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("[train] has no layer 7 (layers count from 0)"), std::string::npos) << p[0];
  p = problems_of(base + "param_grid = { \"layers.1.unit\" = [1] }\n");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("layer 1 (dense) has no option 'unit'"), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("(did you mean 'units'?)"), std::string::npos) << p[0];
  p = problems_of(base + "param_grid = { epochs = [] }\ncv = 1\n");
  ASSERT_EQ(p.size(), 2u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:27:25: [search] param_grid epochs: expected a non-empty array of the values to try, got an array");
  EXPECT_EQ(p[1], "job.toml:28:6: [search] cv: expected an integer >= 2, got 1");
  p = problems_of(base + "param_grid = { epochs = [1, 1] }\n");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], "job.toml:27:25: [search] param_grid epochs: a value is listed twice");
  p = problems_of(base + "param_grid = { rho = [0.9, 1.5] }\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:27:28: [search] param_grid rho: [train] rho: expected a number in [0, 1], got a float (1.5)");
}

// [train] holds one optimizer's default learning rate: a grid of optimizers whose defaults differ
// would train the others at it, so it needs the learning rate set.
TEST(Search, AGridOfOptimizersNeedsTheLearningRateSet) {
  std::string mlp = kMlp;
  mlp.erase(mlp.find("learning_rate = 1e-3\n"), std::string("learning_rate = 1e-3\n").size());
  auto p = problems_of(mlp + "\n[search]\nparam_grid = { optimizer = [\"adam\", \"sgd\"] }\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:26:28: [search] param_grid optimizer: the optimizers' default learning rates differ (adam 0.001, "
                  "sgd 0.01): set [train] learning_rate or add it to param_grid");
  EXPECT_NO_THROW(parse_manifest(mlp + "\n[search]\nparam_grid = { optimizer = [\"adam\", \"sgd\"], learning_rate = [0.01] }\n",
                                 "job.toml"));
  EXPECT_NO_THROW(parse_manifest(kMlp + "\n[search]\nparam_grid = { optimizer = [\"adam\", \"sgd\"] }\n", "job.toml"));
}

// A [search] job's tasks are fits in the search's task format: only `sklearn` reads it, so another
// [tasks] backend is refused at its line rather than silently replacing it.
TEST(Search, ATasksBackendOtherThanSklearnIsRefused) {
  const std::string search = kMlp + "\n[search]\nparam_grid = { epochs = [1, 2] }\n[tasks]\n";
  auto p = problems_of(search + "backend = \"joblib\"\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:29:11: [tasks] backend: a [search] job's fits are spread by the \"sklearn\" task backend (its "
                  "task format is the search's); got \"joblib\": remove the key or set it to \"sklearn\"");
  EXPECT_EQ(parse_manifest(search + "backend = \"sklearn\"\n", "job.toml").job.task_backend, "sklearn");
}

// A layer index beyond size_t is "no layer N", not an uncaught std::out_of_range (found by
// tests/fuzz/fuzz_manifest).
TEST(Search, AHugeLayerIndexIsNoSuchLayer) {
  auto p = problems_of(kMlp + "[search]\nparam_grid = { \"layers.19223372036854775808.units\" = [64, 128] }\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_NE(p[0].find("[search] param_grid layers.19223372036854775808.units: [train] has no layer 19223372036854775808"),
            std::string::npos)
      << p[0];
}

TEST(Search, NeedsATrainTable) {
  auto p = problems_of("[job]\napp = \"hello\"\n[search]\nparam_grid = { epochs = [1] }\n");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], "job.toml:3:1: [search]: a grid search needs a [train] table (it searches the built-in train job)");
}
