// The configuration keys (sdk/include/skyforge/config_keys.hpp): typed reads over a lookup,
// defaults and the [search] task input. collective_timeout_s() is tested through its host user,
// GlooCommunicator::parse_timeout (tests/collectives).
#include <skyforge/config_keys.hpp>

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

namespace config = skyforge::config;
namespace keys = skyforge::config::keys;

namespace {

struct Lookup {
  std::map<std::string, std::string> values;
  std::optional<std::string> operator()(const std::string& key) const {
    auto it = values.find(key);
    if (it == values.end()) return std::nullopt;
    return it->second;
  }
};

}  // namespace

TEST(ConfigKeys, TypedValuesAndDefaults) {
  const Lookup c{{{"train.batch_size", "64"}, {"train.shuffle", "false"}, {"search.params", "a\nlayers.1.units"}}};
  EXPECT_EQ(keys::train_batch_size.get(c), 64u);
  EXPECT_EQ(keys::train_epochs.get(c), 1u);  // absent: the key's default
  EXPECT_FALSE(keys::train_shuffle.get(c));
  EXPECT_EQ(keys::train_seed.find(c), std::nullopt);  // no default: absent
  EXPECT_EQ(keys::search_params.get(c), (std::vector<std::string>{"a", "layers.1.units"}));
  try {
    keys::train_layers.get(c);
    ADD_FAILURE() << "a missing key without a default was read";
  } catch (const config::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("config train.layers is missing"), std::string::npos) << e.what();
  }
  const Lookup bad{{{"train.batch_size", "x"}, {"job.resume", "yes"}}};
  EXPECT_THROW(keys::train_batch_size.get(bad), config::ConfigError);
  try {
    keys::job_resume.get(bad);
    ADD_FAILURE();
  } catch (const config::ConfigError& e) {
    EXPECT_STREQ(e.what(), "config job.resume: expected true or false, got 'yes'");
  }
}

TEST(ConfigKeys, SearchTaskInputRoundTrips) {
  config::SearchTask t;
  t.fold = 3;
  t.values = {{"layers.1.units", "64"}, {"learning_rate", "0.001"}};
  const std::string input = config::search_task_input(t);
  EXPECT_EQ(input, "fold=3;layers.1.units=64;learning_rate=0.001");
  const config::SearchTask back = config::parse_search_task(input);
  EXPECT_EQ(back.fold, 3u);
  EXPECT_EQ(back.values, t.values);
  EXPECT_EQ(config::parse_search_task("fold=0").values.size(), 0u);
  EXPECT_THROW(config::parse_search_task("learning_rate=0.1"), config::ConfigError);  // no fold
  EXPECT_THROW(config::parse_search_task("fold=x;a=1"), config::ConfigError);
  EXPECT_THROW(config::parse_search_task("fold=1;=1"), config::ConfigError);
  EXPECT_EQ(config::split_lines(config::join_lines({"1", "2"})), (std::vector<std::string>{"1", "2"}));
  EXPECT_TRUE(config::split_lines("").empty());
}
