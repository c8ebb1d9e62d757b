// TF_CONFIG as MultiWorkerMirroredStrategy reads it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tf_env.hpp"

using namespace skyforge::tensorflow;

namespace {

TEST(TfConfig, ListsEveryWorkerInNodeOrderAndThisNodesIndex) {
  std::vector<std::string> w = {"10.0.0.1:41001", "10.0.0.2:41002", "10.0.0.3:41003"};
  for (uint32_t i = 0; i < 3; ++i) {
    const auto cfg = nlohmann::json::parse(tf_config(w, i));
    // Exactly MultiWorkerMirroredStrategy's schema: nothing more, nothing less.
    EXPECT_EQ(cfg, nlohmann::json({{"cluster", {{"worker", w}}}, {"task", {{"type", "worker"}, {"index", i}}}}));
  }
}

TEST(TfConfig, OneWorker) {
  EXPECT_EQ(tf_config({"127.0.0.1:5000"}, 0),
            R"({"cluster":{"worker":["127.0.0.1:5000"]},"task":{"type":"worker","index":0}})");
}

TEST(TfConfig, RefusesBadInput) {
  EXPECT_THROW(tf_config({"a:1"}, 1), std::invalid_argument);
  EXPECT_THROW(tf_config({"a:1", ""}, 0), std::invalid_argument);
  EXPECT_THROW(tf_config({}, 0), std::invalid_argument);
}

TEST(TfConfig, AddressesAreEscaped) {
  const std::vector<std::string> odd = {"a\"b\\c\n:1", std::string("\x01:2", 3)};
  EXPECT_EQ(nlohmann::json::parse(tf_config(odd, 1))["cluster"]["worker"], nlohmann::json(odd));
}

TEST(TfConfig, KeysArePerPoolAndNode) {
  EXPECT_EQ(worker_key("pool-a", 2), "tensorflow/pool-a/worker/2");
  EXPECT_NE(worker_key("pool-a", 0), worker_key("pool-b", 0));
}

}  // namespace
