// The EC2 client against a real EC2 API (moto's server on loopback, signatures checked), and
// its retry rules against a port where nothing answers.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <atomic>

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

// A real HTTP server on loopback that answers one request with `head` and then `body_bytes` of
// body (or until the client hangs up), counting what it managed to send.
class StreamingServer {
 public:
  StreamingServer(std::string head, uint64_t body_bytes, std::string body_prefix = "")
      : head_(std::move(head)), body_bytes_(body_bytes), prefix_(std::move(body_prefix)) {
    fd_ = skyforge::aws::testing::loopback_socket(port_, 4);
    thread_ = std::thread([this] { serve(); });
  }
  ~StreamingServer() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  uint64_t body_sent() const { return sent_; }
  bool done() const { return done_; }

 private:
  void serve() {
    int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    std::string req;
    char buf[65536];
    while (req.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      req.append(buf, size_t(n));
    }
    ::send(c, head_.data(), head_.size(), MSG_NOSIGNAL);
    std::string chunk = prefix_;
    chunk.resize(std::max<size_t>(chunk.size(), 1 << 16), 'x');
    uint64_t left = body_bytes_;
    while (left > 0) {
      ssize_t n = ::send(c, chunk.data(), size_t(std::min<uint64_t>(left, chunk.size())), MSG_NOSIGNAL);
      if (n <= 0) break;  // the client hung up
      sent_ += uint64_t(n);
      left -= uint64_t(n);
      if (chunk.size() > (1 << 16)) chunk.resize(1 << 16);
      std::fill(chunk.begin(), chunk.end(), 'x');
    }
    ::close(c);
    done_ = true;
  }
  std::string head_;
  uint64_t body_bytes_;
  std::string prefix_;
  int fd_ = -1, port_ = 0;
  std::atomic<uint64_t> sent_{0};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

ResolvedAws aws_at(const std::string& endpoint) {
  ResolvedAws aws;
  aws.credentials = {"AKIDEXAMPLE", "secret", "", "the test"};
  aws.region = "us-east-1";
  aws.endpoint = endpoint;
  return aws;
}

long max_rss_kib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// An endpoint that streams an answer without end (close-delimited, no length; the server stops at
// 512 MiB, 8 times the limit, so that a client without one fails here without exhausting the
// machine): the client stops reading at kMaxResponseBytes, says so, and never holds more.
TEST(Ec2ClientResponseCap, AnEndlessAnswerIsCutAtTheLimitAndNamed) {
  const uint64_t huge = uint64_t(512) << 20;
  StreamingServer server("HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nConnection: close\r\n\r\n", huge,
                         "<DescribeInstancesResponse>");
  Ec2Client ec2(aws_at(server.endpoint()));
  const long rss_before = max_rss_kib();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    ec2.call("DescribeInstances");
    FAIL() << "a 512 MiB answer was read";
  } catch (const ApiError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code, "ResponseTooLarge") << what;
    EXPECT_EQ(e.action, "DescribeInstances");
    EXPECT_EQ(e.http_status, 200);
    EXPECT_NE(what.find("aws DescribeInstances (us-east-1): the answer from " + server.endpoint() +
                        " (HTTP 200) is longer than 64 MiB, the most the aws client reads"),
              std::string::npos)
        << what;
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long rss_growth_mib = (max_rss_kib() - rss_before) / 1024;
  for (int i = 0; i < 500 && !server.done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(server.done()) << "the client still reads: the transfer was not stopped";
  std::cerr << "[ figure ] endless answer: transfer stopped after " << (server.body_sent() >> 20)
            << " MiB sent (limit 64 MiB) in " << took << " s; peak RSS grew " << rss_growth_mib << " MiB\n";
  EXPECT_EQ(ec2.requests(), 1u) << "an answer over the limit is not retried";
  // Stopped soon after the limit: what is in flight on loopback (socket buffers) at most.
  EXPECT_LT(server.body_sent(), kMaxResponseBytes + (uint64_t(32) << 20));
  EXPECT_GE(server.body_sent(), kMaxResponseBytes);
  // The body is held up to the limit and no more: its buffer grows in place (realloc), so the
  // peak is about the limit, not twice it, and never the whole answer.
  EXPECT_LT(rss_growth_mib, long(kMaxResponseBytes >> 20) + 24);
}

// A Content-Length over the limit (3 GiB declared; 512 MiB sent at most) is refused before the
// body is read.
TEST(Ec2ClientResponseCap, ADeclaredLengthOverTheLimitIsRefusedAtOnce) {
  const uint64_t huge = uint64_t(3) << 30;
  StreamingServer server("HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nContent-Length: " + std::to_string(huge) +
                             "\r\n\r\n",
                         uint64_t(512) << 20);
  Ec2Client ec2(aws_at(server.endpoint()));
  try {
    ec2.call("DescribeImages");
    FAIL() << "an answer of 3 GiB declared was read";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code, "ResponseTooLarge") << e.what();
    EXPECT_NE(std::string(e.what()).find("DescribeImages (us-east-1): the answer from " + server.endpoint()),
              std::string::npos)
        << e.what();
  }
  for (int i = 0; i < 500 && !server.done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(server.done());
  EXPECT_LT(server.body_sent(), uint64_t(32) << 20) << "the body was read although its length was over the limit";
}

// The limit is the client's option: an answer up to it is read and parsed, one byte more is not.
TEST(Ec2ClientResponseCap, TheLimitIsExact) {
  const std::string xml = "<DescribeRegionsResponse><regionInfo/></DescribeRegionsResponse>";
  ClientOptions opts;
  opts.max_response_bytes = xml.size();
  {
    StreamingServer server("HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nConnection: close\r\n\r\n", xml.size(), xml);
    Ec2Client ec2(aws_at(server.endpoint()), opts);
    auto doc = ec2.call("DescribeRegions");
    EXPECT_TRUE(doc.child("DescribeRegionsResponse"));
  }
  {
    StreamingServer server("HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nConnection: close\r\n\r\n",
                           xml.size() + 1, xml + " ");
    Ec2Client ec2(aws_at(server.endpoint()), opts);
    try {
      ec2.call("DescribeRegions");
      FAIL() << "one byte over the limit was read";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.code, "ResponseTooLarge") << e.what();
      EXPECT_NE(std::string(e.what()).find("is longer than " + std::to_string(xml.size()) + " bytes"), std::string::npos)
          << e.what();
    }
  }
  {
    // An error status with a long body: not retried either.
    StreamingServer server("HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n", 1 << 20);
    Ec2Client ec2(aws_at(server.endpoint()), opts);
    try {
      ec2.call("DescribeRegions");
      FAIL();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.code, "ResponseTooLarge") << e.what();
      EXPECT_EQ(e.http_status, 503);
    }
    EXPECT_EQ(ec2.requests(), 1u);
  }
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
