// The EC2 client against a real EC2 API (moto's server on loopback, signatures checked), and
// its retry rules against a port where nothing answers.
#include <gtest/gtest.h>

#include "moto.hpp"

using namespace skyforge::aws;
using skyforge::aws::testing::MotoServer;

namespace {

class Ec2ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = skyforge::aws::testing::moto_missing(); !why.empty()) GTEST_SKIP() << why;
    moto_ = std::make_unique<MotoServer>();
  }
  std::unique_ptr<MotoServer> moto_;
};

TEST_F(Ec2ClientTest, SignedCallsSucceedWithTheIamKey) {
  Ec2Client ec2(moto_->aws());
  auto doc = ec2.call("DescribeRegions");
  EXPECT_FALSE(doc.select_nodes("//regionInfo/item").empty());
  auto images = ec2.call("DescribeAvailabilityZones");
  EXPECT_STREQ(images.select_node("//availabilityZoneInfo/item/regionName").node().child_value(), "us-east-1");
  EXPECT_EQ(ec2.requests(), 2u);
}

TEST_F(Ec2ClientTest, AWrongSecretIsAuthFailureNamingTheSourceNeverTheSecret) {
  ResolvedAws aws = moto_->aws();
  aws.credentials.secret_access_key = "wrong-secret-for-the-test";
  Ec2Client ec2(aws);
  try {
    ec2.call("DescribeRegions");
    FAIL() << "a wrong signature was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code, "AuthFailure") << e.what();
    EXPECT_EQ(e.action, "DescribeRegions");
    std::string what = e.what();
    EXPECT_NE(what.find("the test's IAM user"), std::string::npos) << what;
    EXPECT_EQ(what.find("wrong-secret-for-the-test"), std::string::npos) << what;
    EXPECT_EQ(what.find(moto_->credentials().secret_access_key), std::string::npos) << what;
  }
  EXPECT_EQ(ec2.requests(), 1u) << "an auth failure is not retried";
}

TEST_F(Ec2ClientTest, AnInvalidRequestIsNotRetriedAndSaysWhatToCheck) {
  Ec2Client ec2(moto_->aws());
  try {
    ec2.call("DescribeImages", {{"ImageId.1", "ami-0123456789abcdef0"}});
    FAIL() << "moto described an image that does not exist";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code.rfind("InvalidAMIID", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("DescribeImages (us-east-1)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("check [provider] image"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ec2.requests(), 1u);
}

TEST(Ec2ClientRetry, NoAnswerIsRetriedWithBackoffThenNamesTheEndpoint) {
  ResolvedAws aws;
  aws.credentials = {"AKIDEXAMPLE", "secret", "", "the test"};
  aws.region = "us-east-1";
  int port = skyforge::aws::testing::free_loopback_port();  // nothing listens there
  aws.endpoint = "http://127.0.0.1:" + std::to_string(port);
  ClientOptions opts;
  opts.max_attempts = 4;
  opts.backoff_base = std::chrono::milliseconds(1);
  std::vector<std::string> lines;
  opts.on_retry = [&](const std::string& l) { lines.push_back(l); };
  Ec2Client ec2(aws, opts);
  try {
    ec2.call("DescribeInstances");
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.http_status, 0);
    EXPECT_NE(std::string(e.what()).find("no answer from " + aws.endpoint), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("after 4 attempts"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ec2.requests(), 4u);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find("retry 1/3"), std::string::npos) << lines[0];
}

TEST(Ec2ClientRetry, TheDeadlineStopsRetries) {
  ResolvedAws aws;
  aws.credentials = {"AKIDEXAMPLE", "secret", "", "the test"};
  aws.region = "us-east-1";
  aws.endpoint = "http://127.0.0.1:" + std::to_string(skyforge::aws::testing::free_loopback_port());
  ClientOptions opts;
  opts.max_attempts = 1000;
  opts.backoff_base = std::chrono::milliseconds(20);
  opts.backoff_cap = std::chrono::milliseconds(50);
  opts.deadline = std::chrono::milliseconds(300);
  Ec2Client ec2(aws, opts);
  EXPECT_THROW(ec2.call("DescribeInstances"), ApiError);
  EXPECT_LT(ec2.requests(), 100u);
  EXPECT_GT(ec2.requests(), 1u);
}

TEST(Ec2ClientErrors, EachCodeSaysWhatToDo) {
  ResolvedAws aws;
  aws.region = "eu-west-1";
  aws.credentials.source = "profile 'dev' in /home/u/.aws/credentials";
  std::string m = explain("RunInstances", "UnauthorizedOperation", "You are not authorized", aws);
  EXPECT_NE(m.find("ec2:RunInstances"), std::string::npos) << m;
  EXPECT_NE(m.find("profile 'dev'"), std::string::npos) << m;
  m = explain("RunInstances", "VcpuLimitExceeded", "You have requested more vCPU capacity", aws);
  EXPECT_NE(m.find("quota"), std::string::npos) << m;
  EXPECT_NE(m.find("eu-west-1"), std::string::npos) << m;
  m = explain("RunInstances", "InsufficientInstanceCapacity", "", aws);
  EXPECT_NE(m.find("other subnets"), std::string::npos) << m;
  EXPECT_TRUE(retryable_code("RequestLimitExceeded"));
  EXPECT_FALSE(retryable_code("InvalidParameterValue"));
  EXPECT_EQ(form_encode({{"A b", "c/d"}, {"TagSpecification.1.Tag.1.Key", "skyforge:pool"}}),
            "A+b=c%2Fd&TagSpecification.1.Tag.1.Key=skyforge%3Apool");
}

}  // namespace
