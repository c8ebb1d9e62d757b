// [train] clipnorm / global_clipnorm and [train.learning_rate_schedule] (Keras' CosineDecay,
// ExponentialDecay, PiecewiseConstantDecay): the config keys they become, and the errors at
// their file:line:col.
#include "manifest.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "problems.hpp"

using namespace skyforge;
using namespace skyforge::test;

namespace {

const std::string kLayers = "\n[[train.layers]]\ntype = \"flatten\"\n";

std::map<std::string, std::string> config_of(const std::string& train) {
  const Manifest m = parse_manifest("[train]\n" + train + kLayers, "job.toml");
  return {m.train.config.begin(), m.train.config.end()};
}

}  // namespace

TEST(TrainSchedule, ClippingKeys) {
  auto c = config_of("optimizer = \"sgd\"\nclipnorm = 1\n");
  EXPECT_EQ(c["train.clipnorm"], "1");
  EXPECT_EQ(c["train.global_clipnorm"], "0");  // the schema's default: off
  EXPECT_EQ(config_of("global_clipnorm = 0.5\n")["train.global_clipnorm"], "0.5");
  auto p = problems_of("[train]\nclipnorm = 0\nglobal_clipnorm = \"1\"\n" + kLayers);
  ASSERT_EQ(p.size(), 2u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:2:12: [train] clipnorm: expected a number > 0, got an integer (0)");
  EXPECT_EQ(p[1], "job.toml:3:19: [train] global_clipnorm: expected a number > 0, got a string (\"1\")");
  p = problems_of("[train]\nclipnorm = 1\nglobal_clipnorm = 1\n" + kLayers);
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:3:19: [train] global_clipnorm: give clipnorm or global_clipnorm, not both (Keras takes one)");
}

TEST(TrainSchedule, EachTypeBecomesConfigKeys) {
  auto c = config_of("optimizer = \"adamw\"\n[train.learning_rate_schedule]\ntype = \"cosine_decay\"\n"
                     "initial_learning_rate = 0\ndecay_steps = 1000\nwarmup_target = 1e-3\nwarmup_steps = 100\n");
  EXPECT_EQ(c["train.learning_rate_schedule"], "cosine_decay");
  EXPECT_EQ(c["train.learning_rate_schedule.initial_learning_rate"], "0");
  EXPECT_EQ(c["train.learning_rate_schedule.decay_steps"], "1000");
  EXPECT_EQ(c["train.learning_rate_schedule.warmup_target"], "0.001");
  EXPECT_EQ(c["train.learning_rate_schedule.warmup_steps"], "100");
  EXPECT_EQ(c.count("train.learning_rate"), 0u);  // the schedule is the learning rate
  c = config_of("[train.learning_rate_schedule]\ntype = \"exponential_decay\"\ninitial_learning_rate = 0.1\n"
                "decay_steps = 10\ndecay_rate = 0.9\nstaircase = true\n");
  EXPECT_EQ(c["train.learning_rate_schedule.staircase"], "true");
  c = config_of("[train.learning_rate_schedule]\ntype = \"piecewise_constant_decay\"\nboundaries = [100, 200]\n"
                "values = [0.1, 0.01, 1e-3]\n");
  EXPECT_EQ(c["train.learning_rate_schedule.boundaries"], "100,200");
  EXPECT_EQ(c["train.learning_rate_schedule.values"], "0.1,0.01,0.001");
}

TEST(TrainSchedule, ErrorsNameTheLineAndWhatWasExpected) {
  const std::string schedule = "[train.learning_rate_schedule]\ntype = ";  // lines 1-2
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"[train]\nlearning_rate = 0.1\n[train.learning_rate_schedule]\ntype = \"cosine_decy\"\n",
       {"job.toml:2:17: [train] learning_rate: give it or [train.learning_rate_schedule], not both (the schedule is the learning rate)",
        "job.toml:4:8: [train.learning_rate_schedule] type: expected one of cosine_decay, exponential_decay, "
        "piecewise_constant_decay (did you mean 'cosine_decay'?), got a string (\"cosine_decy\")"}},
      {schedule + "\"cosine_decay\"\ninitial_learning_rate = 0.1\n",
       {"job.toml:1:1: [train.learning_rate_schedule] (cosine_decay): option 'decay_steps' is required"}},
      {schedule + "\"cosine_decay\"\ninitial_learning_rate = 0.1\ndecay_steps = 0\nalpha = 2\nwarmup_steps = 5\ndecay_rate = 1\n",
       {"job.toml:4:15: [train.learning_rate_schedule] (cosine_decay) decay_steps: expected a number > 0, got 0",
        "job.toml:5:9: [train.learning_rate_schedule] (cosine_decay) alpha: expected a number in [0, 1], got 2",
        "job.toml:7:1: unknown key 'decay_rate' in [train.learning_rate_schedule] (cosine_decay) (known: type, "
        "initial_learning_rate, decay_steps, alpha, warmup_target, warmup_steps)"}},
      {schedule + "\"cosine_decay\"\ninitial_learning_rate = 0.1\ndecay_steps = 10\nwarmup_steps = 5\n",
       {"job.toml:1:1: [train.learning_rate_schedule] (cosine_decay): warmup_steps needs warmup_target (the rate the warmup ends at)"}},
      {schedule + "\"piecewise_constant_decay\"\nboundaries = [200, 100]\nvalues = [0.1, 0.01, 1e-3]\n",
       {"job.toml:3:14: [train.learning_rate_schedule] (piecewise_constant_decay): boundaries: expected increasing steps, got 200,100"}},
      {schedule + "\"piecewise_constant_decay\"\nboundaries = [100]\nvalues = [0.1]\n",
       {"job.toml:4:10: [train.learning_rate_schedule] (piecewise_constant_decay): values: expected one more than boundaries (2), got 1"}},
      {schedule + "\"piecewise_constant_decay\"\nboundaries = [1.5]\nvalues = [0.1, \"x\"]\n",
       {"job.toml:3:14: [train.learning_rate_schedule] (piecewise_constant_decay) boundaries: expected an array of steps (integers >= 0), got an array",
        "job.toml:4:10: [train.learning_rate_schedule] (piecewise_constant_decay) values: expected an array of numbers, got an array"}},
  };
  for (const auto& [toml, want] : cases) EXPECT_EQ(problems_of(toml + kLayers), want) << toml;
}

// A grid may vary the clipping norms, checked as [train] checks them; not a schedule's
// arguments, and not learning_rate beside a schedule.
TEST(TrainSchedule, SearchGridsVaryTheClippingNorms) {
  const std::string train = "[train]\noptimizer = \"sgd\"\n";  // lines 1-2
  const Manifest m = parse_manifest(train + kLayers + "\n[search]\nparam_grid = { clipnorm = [0.5, 1] }\n", "job.toml");
  const std::map<std::string, std::string> c(m.search.config.begin(), m.search.config.end());
  EXPECT_EQ(c.at("search.param_grid.clipnorm"), "0.5\n1");
  auto p = problems_of(train + kLayers + "\n[search]\nparam_grid = { global_clipnorm = [1, -1] }\n");
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0], "job.toml:8:38: [search] param_grid global_clipnorm: [train] global_clipnorm: expected a number > 0, got an integer (-1)");
  p = problems_of(train + "[train.learning_rate_schedule]\ntype = \"exponential_decay\"\ninitial_learning_rate = 0.1\n"
                  "decay_steps = 10\ndecay_rate = 0.5\n" + kLayers + "\n[search]\nparam_grid = { learning_rate = [0.1], "
                  "\"learning_rate_schedule.decay_rate\" = [0.5] }\n");
  ASSERT_EQ(p.size(), 2u) << ::testing::PrintToString(p);
  EXPECT_NE(p[0].find("[search] param_grid learning_rate: [train] learning_rate: give it or [train.learning_rate_schedule], not both"), std::string::npos) << p[0];
  EXPECT_NE(p[1].find("[search] param_grid learning_rate_schedule.decay_rate: expected a [train] key"), std::string::npos) << p[1];
}
