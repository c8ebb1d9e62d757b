// The optimizer schema (sdk/include/skyforge/optimizer_schema.hpp): Keras' names, defaults and
// ranges, and the messages every backend gives for an option it refuses.
#include <skyforge/optimizer_schema.hpp>

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace schema = skyforge::schema;

namespace {

using Opts = std::map<std::string, std::string>;

std::string error_of(const std::string& name, const Opts& options) {
  try {
    schema::parse_optimizer(name, options);
  } catch (const schema::OptimizerError& e) {
    return e.what();
  }
  return "<accepted>";
}

}  // namespace

TEST(OptimizerSchema, KerasDefaultsFilledIn) {
  const schema::OptimizerConfig sgd = schema::parse_optimizer("sgd", Opts{});
  EXPECT_EQ(sgd.real("learning_rate"), 0.01);
  EXPECT_EQ(sgd.real("momentum"), 0.0);
  EXPECT_FALSE(sgd.flag("nesterov"));
  const schema::OptimizerConfig adam = schema::parse_optimizer("adam", Opts{{"learning_rate", "0.003"}});
  EXPECT_EQ(adam.real("learning_rate"), 0.003);
  EXPECT_EQ(adam.real("beta_1"), 0.9);
  EXPECT_EQ(adam.real("beta_2"), 0.999);
  EXPECT_EQ(adam.real("epsilon"), 1e-7);
  EXPECT_EQ(adam.options(), (std::vector<std::pair<std::string, std::string>>{
                                {"learning_rate", "0.003"}, {"beta_1", "0.9"}, {"beta_2", "0.999"}, {"epsilon", "1e-07"},
                                {"clipnorm", "0"}, {"global_clipnorm", "0"}}));  // 0: no clipping
  EXPECT_EQ(schema::parse_optimizer("", Opts{}).name(), "adam");  // an empty name is the default
  EXPECT_EQ(schema::default_real("sgd", "learning_rate"), 0.01);
}

TEST(OptimizerSchema, KerasRanges) {
  EXPECT_EQ(error_of("adam", {{"beta_1", "1"}}), "optimizer adam: option 'beta_1': expected a number in [0, 1), got '1'");
  EXPECT_EQ(error_of("adam", {{"beta_2", "-0.1"}}), "optimizer adam: option 'beta_2': expected a number in [0, 1), got '-0.1'");
  EXPECT_EQ(error_of("adam", {{"epsilon", "0"}}), "optimizer adam: option 'epsilon': expected a number > 0, got '0'");
  EXPECT_EQ(error_of("sgd", {{"learning_rate", "0"}}), "optimizer sgd: option 'learning_rate': expected a number > 0, got '0'");
  EXPECT_EQ(error_of("sgd", {{"momentum", "1.5"}}), "optimizer sgd: option 'momentum': expected a number in [0, 1], got '1.5'");
  EXPECT_EQ(error_of("sgd", {{"momentum", "1"}}), "<accepted>");  // Keras: momentum in [0, 1]
  EXPECT_EQ(error_of("adam", {{"beta_1", "0"}}), "<accepted>");
  EXPECT_EQ(error_of("sgd", {{"nesterov", "maybe"}}), "optimizer sgd: option 'nesterov': expected true or false, got 'maybe'");
  EXPECT_EQ(error_of("sgd", {{"learning_rate", "fast"}}),
            "optimizer sgd: option 'learning_rate': expected a number > 0, got 'fast'");
}

TEST(OptimizerSchema, UnknownNamesAreRefused) {
  EXPECT_EQ(error_of("adagrad", {}), "unknown optimizer 'adagrad' (known: adam, adamw, sgd, rmsprop)");
  EXPECT_EQ(error_of("sgd", {{"beta_1", "0.9"}}), "optimizer sgd: unknown option 'beta_1'");
  EXPECT_EQ(error_of("adam", {{"momentum", "0.9"}}), "optimizer adam: unknown option 'momentum'");
}

// AdamW and RMSprop with Keras 3's defaults (keras/src/optimizers/adamw.py, rmsprop.py), and the
// slots each optimizer keeps, in the order every backend and a state lay them out.
TEST(OptimizerSchema, AdamWAndRmspropAndTheirSlots) {
  const schema::OptimizerConfig w = schema::parse_optimizer("adamw", Opts{});
  EXPECT_EQ(w.options(), (std::vector<std::pair<std::string, std::string>>{{"learning_rate", "0.001"},
                                                                           {"beta_1", "0.9"},
                                                                           {"beta_2", "0.999"},
                                                                           {"epsilon", "1e-07"},
                                                                           {"weight_decay", "0.004"},
                                                                           {"clipnorm", "0"},
                                                                           {"global_clipnorm", "0"}}));
  const schema::OptimizerConfig r = schema::parse_optimizer("rmsprop", Opts{});
  EXPECT_EQ(r.options(), (std::vector<std::pair<std::string, std::string>>{
                             {"learning_rate", "0.001"}, {"rho", "0.9"}, {"momentum", "0"}, {"epsilon", "1e-07"}, {"centered", "false"},
                             {"clipnorm", "0"}, {"global_clipnorm", "0"}}));
  EXPECT_EQ(error_of("adamw", {{"weight_decay", "-0.1"}}),
            "optimizer adamw: option 'weight_decay': expected a number >= 0, got '-0.1'");
  EXPECT_EQ(error_of("rmsprop", {{"epsilon", "0"}}), "optimizer rmsprop: option 'epsilon': expected a number > 0, got '0'");
  EXPECT_EQ(schema::slots_per_parameter(w), 2u);
  EXPECT_EQ(schema::slots_per_parameter(r), 1u);
  EXPECT_EQ(schema::slots_per_parameter(schema::parse_optimizer("rmsprop", Opts{{"momentum", "0.9"}, {"centered", "true"}})), 3u);
  EXPECT_EQ(schema::slots_per_parameter(schema::parse_optimizer("sgd", Opts{})), 0u);
  EXPECT_EQ(schema::slots_per_parameter(schema::parse_optimizer("sgd", Opts{{"momentum", "0.9"}})), 1u);
}

TEST(OptimizerSchema, EveryDefaultPassesItsOwnCheck) {
  for (const schema::OptimizerDef& d : schema::optimizers())
    for (const schema::OptionDef& o : d.options) {
      EXPECT_FALSE(o.required()) << d.name << " " << o.name;  // Keras has a default for every option
      EXPECT_TRUE(schema::check(o, o.fallback).ok) << d.name << " " << o.name;
    }
}
