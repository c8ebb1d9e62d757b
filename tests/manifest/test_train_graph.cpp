// [[train.layers]] as a model graph: `name` and `inputs`, the graph's errors at the layer's line,
// the model summary with its "Connected to" column, and a [search] grid over a named layer.
#include "manifest.hpp"
#include "train_graph.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "problems.hpp"

using namespace skyforge;
using namespace skyforge::test;

namespace {

std::map<std::string, std::string> config_of(const Manifest& m) {
  return {m.train.config.begin(), m.train.config.end()};
}

// A residual block: conv -> bn -> relu -> conv -> bn, added to the stem's output.
const std::string kResidual = R"([train]
[[train.layers]]
type = "conv2d"
name = "stem"
filters = 8
kernel_size = 3
padding = "same"
[[train.layers]]
type = "conv2d"
filters = 8
kernel_size = 3
padding = "same"
[[train.layers]]
type = "batch_normalization"
name = "b1_bn2"
[[train.layers]]
type = "add"
name = "b1_add"
inputs = ["stem", "b1_bn2"]
[[train.layers]]
type = "global_average_pooling2d"
inputs = "b1_add"
[[train.layers]]
type = "dense"
units = 10
)";

// kResidual with line `line` (from 1) replaced by `text`.
std::string with_line(int line, const std::string& text) {
  std::string out;
  int n = 1;
  for (size_t start = 0; start < kResidual.size(); ++n) {
    const size_t end = kResidual.find('\n', start);
    out += (n == line ? text : kResidual.substr(start, end - start)) + "\n";
    start = end + 1;
  }
  return out;
}

}  // namespace

TEST(TrainGraph, NamesAndInputsBecomeTheLayersTextOptions) {
  auto c = config_of(parse_manifest(kResidual, "job.toml"));
  EXPECT_EQ(c["train.layers.0.name"], "stem");
  EXPECT_EQ(c.count("train.layers.1.name"), 0u);
  EXPECT_EQ(c["train.layers.3.inputs"], "stem,b1_bn2");
  EXPECT_EQ(c["train.layers.4.inputs"], "b1_add");  // one input: a string, as Keras' layer(x)
  EXPECT_EQ(c.count("train.layers.5.inputs"), 0u);  // none: the previous layer's output
  auto s = config_of(parse_manifest(with_line(4, "name = \"stem\"\ninputs = \"input\""), "job.toml"));
  EXPECT_EQ(s["train.layers.0.inputs"], "input");  // the model's input
}

// The layer options of the new kinds: reshape's target_shape (an array, one -1) and
// concatenate's axis (a signed integer).
TEST(TrainGraph, ReshapeAndConcatenateOptions) {
  auto c = config_of(parse_manifest(
      "[train]\n[[train.layers]]\ntype = \"reshape\"\nname = \"r\"\ntarget_shape = [-1, 28]\n"
      "[[train.layers]]\ntype = \"dense\"\nname = \"d\"\nunits = 4\n[[train.layers]]\ntype = \"concatenate\"\naxis = -1\n"
      "inputs = [\"r\", \"d\"]\n[[train.layers]]\ntype = \"global_average_pooling1d\"\n",
      "job.toml"));
  EXPECT_EQ(c["train.layers.0.target_shape"], "-1,28");
  EXPECT_EQ(c["train.layers.2.axis"], "-1");
}

TEST(TrainGraph, ValuesOfNameAndInputsAreChecked) {
  auto p = problems_of(with_line(4, "name = \"input\""));
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:4:8: [[train.layers]] #1 name: 'input' names the model's input; choose another name");
  p = problems_of(with_line(19, "inputs = []"));
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:19:10: [[train.layers]] #4 inputs: expected a layer's name or a non-empty array of them, "
                  "e.g. [\"stem\", \"b1_bn2\"], got an array");
  p = problems_of(with_line(19, "inputs = [\"stem\", 3, \"a,b\"]"));
  ASSERT_EQ(p.size(), 2u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:19:19: [[train.layers]] #4 inputs[1]: expected a layer's name or \"input\", got an integer (3)");
  EXPECT_EQ(p[1], "job.toml:19:22: [[train.layers]] #4 inputs[2]: a layer name may not hold control characters, "
                  "commas or quotes: 'a,b'");
}

// Every graph error is at the line of the layer's key it is about: `inputs` (an unknown name, a
// cycle, a merge given one input), `name` (given twice), else `type` (shapes, an unused output).
TEST(TrainGraph, GraphErrorsAreAtTheLayersLine) {
  auto one = [](const std::string& text) {
    auto p = problems_of(text);
    EXPECT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
    return p.empty() ? std::string() : p[0];
  };
  EXPECT_EQ(one(with_line(19, "inputs = [\"stem\", \"b1_bn3\"]")),
            "job.toml:19:1: layer 3 (add 'b1_add'): input 'b1_bn3' names no layer (named layers: stem, b1_bn2, "
            "b1_add; the model's input is 'input')");
  EXPECT_EQ(one(with_line(15, "name = \"stem\"")), "job.toml:15:1: layer 2 (batch_normalization 'stem'): the name "
                                                    "'stem' is also layer 0 (conv2d 'stem')'s");
  EXPECT_EQ(one(with_line(19, "inputs = [\"b1_bn2\"]")),
            "job.toml:19:1: layer 3 (add 'b1_add'): takes two or more inputs, 1 named");
  EXPECT_EQ(one(with_line(22, "inputs = \"stem\"")).substr(0, 66),
            "job.toml:17:1: layer 3 (add 'b1_add'): its output feeds no layer a");
  const std::string cycle = one(with_line(9, "type = \"conv2d\"\ninputs = \"b1_add\""));
  EXPECT_EQ(cycle.substr(0, 43), "job.toml:10:1: layer 1 (conv2d): the inputs") << cycle;
  EXPECT_NE(cycle.find("form a cycle among layer 1 (conv2d), layer 2 (batch_normalization 'b1_bn2'), layer 3"),
            std::string::npos) << cycle;
  // Shapes: the stem's 8 channels and a block of 4 do not add.
  EXPECT_EQ(one(with_line(10, "filters = 4")), "job.toml:17:1: layer 3 (add 'b1_add'): inputs must have one shape: "
                                                "input 1 is (None, 28, 28, 8), input 2 is (None, 28, 28, 4)");
}

// A Sequential model's shapes are checked as a graph's: on the dataset's 28x28x1 samples, and its
// output must be (classes,).
TEST(TrainGraph, SequentialShapesAndTheOutputAreChecked) {
  auto p = problems_of("[train]\n[[train.layers]]\ntype = \"flatten\"\n[[train.layers]]\ntype = \"conv2d\"\nfilters = 4\nkernel_size = 3\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0].substr(0, 38), "job.toml:5:1: layer 1 (conv2d): expect") << p[0];
  p = problems_of("[train]\n[[train.layers]]\ntype = \"conv2d\"\nfilters = 4\nkernel_size = 3\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0].substr(0, 62), "job.toml:3:1: layer 0 (conv2d): the model's output (None, 26, ") << p[0];
}

TEST(TrainGraph, SummaryShowsWhatEachLayerIsConnectedTo) {
  const std::string s = train_model_summary(parse_manifest(kResidual, "job.toml").train);
  EXPECT_NE(s.find("Model: \"functional\""), std::string::npos) << s;
  EXPECT_NE(s.find("Connected to"), std::string::npos) << s;
  EXPECT_NE(s.find(" input (InputLayer)         (None, 28, 28, 1)         0           -\n"), std::string::npos) << s;
  EXPECT_NE(s.find(" b1_add (Add)               (None, 28, 28, 8)         0           stem, b1_bn2\n"), std::string::npos) << s;
  EXPECT_NE(s.find(" conv2d (Conv2D)            (None, 28, 28, 8)         584         stem\n"), std::string::npos) << s;  // unnamed layers are numbered among their type as Keras does
  EXPECT_NE(s.find("Total params: 786\n"), std::string::npos) << s;  // 80 + 584 + 32 (16 of them moving) + 90
  const std::string q = train_model_summary(
      parse_manifest("[train]\n[[train.layers]]\ntype = \"flatten\"\n[[train.layers]]\ntype = \"dense\"\nunits = 10\n", "job.toml").train);
  EXPECT_NE(q.find("Model: \"sequential\""), std::string::npos) << q;
  EXPECT_EQ(q.find("Connected to"), std::string::npos) << q;
}

// A grid over a named layer's option: each candidate's model is checked as [train] checks it,
// and a value that breaks the model elsewhere is refused at the value (line 27).
TEST(TrainGraph, SearchGridsOverNamedLayers) {
  const Manifest m = parse_manifest(kResidual + "[search]\nparam_grid = { \"layers.1.kernel_size\" = [3, 5] }\n", "job.toml");
  const std::map<std::string, std::string> c(m.search.config.begin(), m.search.config.end());
  EXPECT_EQ(c.at("search.param_grid.layers.1.kernel_size"), "3\n5");
  auto p = problems_of(kResidual + "[search]\nparam_grid = { \"layers.1.filters\" = [8, 4] }\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:27:41: [search] param_grid layers.1.filters: with this value, job.toml:17:1: layer 3 (add "
                  "'b1_add'): inputs must have one shape: input 1 is (None, 28, 28, 8), input 2 is (None, 28, 28, 4)");
}
