// TF_CONFIG as MultiWorkerMirroredStrategy reads it.
#include <gtest/gtest.h>

#include "tf_env.hpp"

using namespace skyforge::tensorflow;

namespace {

TEST(TfConfig, ListsEveryWorkerInNodeOrderAndThisNodesIndex) {
  std::vector<std::string> w = {"10.0.0.1:41001", "10.0.0.2:41002", "10.0.0.3:41003"};
  for (uint32_t i = 0; i < 3; ++i)
    EXPECT_EQ(tf_config(w, i),
              "{\"cluster\": {\"worker\": [\"10.0.0.1:41001\", \"10.0.0.2:41002\", \"10.0.0.3:41003\"]}, "
              "\"task\": {\"type\": \"worker\", \"index\": " +
                  std::to_string(i) + "}}");
}

TEST(TfConfig, OneWorker) {
  EXPECT_EQ(tf_config({"127.0.0.1:5000"}, 0),
            "{\"cluster\": {\"worker\": [\"127.0.0.1:5000\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}");
}

TEST(TfConfig, RefusesBadInput) {
  EXPECT_THROW(tf_config({"a:1"}, 1), std::invalid_argument);
  EXPECT_THROW(tf_config({"a:1", ""}, 0), std::invalid_argument);
  EXPECT_THROW(tf_config({}, 0), std::invalid_argument);
}

TEST(TfConfig, EscapesJson) {
  EXPECT_EQ(json_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
  EXPECT_EQ(json_string(std::string("\x01", 1)), "\"\\u0001\"");
}

TEST(TfConfig, KeysArePerPoolAndNode) {
  EXPECT_EQ(worker_key("pool-a", 2), "tensorflow/pool-a/worker/2");
  EXPECT_NE(worker_key("pool-a", 0), worker_key("pool-b", 0));
}

}  // namespace
