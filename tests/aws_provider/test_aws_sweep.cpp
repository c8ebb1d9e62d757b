// `skyforge sweep --provider aws` against hostile input (label `faults`): the real `skyforge`
// binary and aws plugin, against moto's EC2 API on loopback (signatures checked) or a port where
// nothing answers. Sweep reaches no instance, so no network namespace is needed and nothing
// leaves loopback.
//
// - A skyforge:pool tag is read back from the cloud, where anyone with the account's
//   credentials writes it: a tag "x/../../victim", an absolute path, or a pool's state
//   directory replaced by a symlink must never make sweep remove anything outside its state
//   root -- and resources so tagged are left alone, with a warning naming them and the tag.
// - An EC2 API that is down: sweep gives up after sweep_timeout (not teardown_timeout, 900 s),
//   saying what it tried and why it stopped.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>

#include "ec2_pool.hpp"
#include "moto.hpp"
#include "process.hpp"
#include "run_fixture.hpp"

namespace skyforge::test {
namespace {

using aws::testing::MotoServer;

class AwsSweep : public SkyforgeRunTest {
 protected:
  AwsSweep() : SkyforgeRunTest("skyforge-aws-sweep") {}

  void SetUp() override {
    SkyforgeRunTest::SetUp();
    extra_env_["AWS_ACCESS_KEY_ID"] = "AKIDSWEEPTEST";
    extra_env_["AWS_SECRET_ACCESS_KEY"] = "sweep-test-secret";
    extra_env_["AWS_REGION"] = "us-east-1";
    extra_env_["AWS_SHARED_CREDENTIALS_FILE"] = (root_ / "no-credentials").string();
    extra_env_["AWS_CONFIG_FILE"] = (root_ / "no-config").string();
    // The state root: where the aws provider keeps each pool's private key and known_hosts.
    state_ = root_ / "base" / "state";
    fs::create_directories(state_);
    extra_env_["XDG_RUNTIME_DIR"] = state_.string();
  }

  void use_moto() {
    moto_ = std::make_unique<MotoServer>();
    const auto& c = moto_->credentials();
    extra_env_["AWS_ACCESS_KEY_ID"] = c.access_key_id;
    extra_env_["AWS_SECRET_ACCESS_KEY"] = c.secret_access_key;
    extra_env_["AWS_ENDPOINT_URL_EC2"] = moto_->endpoint();
  }

  static aws::QueryParams tags(const std::string& resource_type, const std::string& pool) {
    return {{"TagSpecification.1.ResourceType", resource_type},
            {"TagSpecification.1.Tag.1.Key", "skyforge:pool"},
            {"TagSpecification.1.Tag.1.Value", pool},
            {"TagSpecification.1.Tag.2.Key", "skyforge:expires"},
            {"TagSpecification.1.Tag.2.Value", "2001-01-01T00:00:00Z"}};  // long expired
  }
  // A key pair named `name` whose skyforge:pool tag is `pool`, expired.
  void key_pair(const std::string& name, const std::string& pool) {
    aws::Ec2Client ec2(moto_->aws());
    aws::QueryParams q = {{"KeyName", name}};
    auto t = tags("key-pair", pool);
    q.insert(q.end(), t.begin(), t.end());
    ec2.call("CreateKeyPair", q);
  }
  std::string instance(const std::string& pool) {
    aws::Ec2Client ec2(moto_->aws());
    aws::QueryParams q = {{"ImageId", "ami-760aaa0f"}, {"InstanceType", "t3.micro"}, {"MinCount", "1"}, {"MaxCount", "1"}};
    auto t = tags("instance", pool);
    q.insert(q.end(), t.begin(), t.end());
    return aws::instances_of(ec2.call("RunInstances", q)).at(0).id;
  }
  std::vector<std::string> key_pairs() {
    aws::Ec2Client ec2(moto_->aws());
    std::vector<std::string> out;
    for (auto it : ec2.call("DescribeKeyPairs").select_nodes("//keySet/item"))
      out.push_back(it.node().child_value("keyName"));
    return out;
  }
  std::string state_of(const std::string& id) {
    aws::Ec2Client ec2(moto_->aws());
    return aws::instances_of(ec2.call("DescribeInstances", {{"InstanceId.1", id}})).at(0).state;
  }
  static fs::path victim(const fs::path& dir) {
    fs::create_directories(dir / "data");
    std::ofstream(dir / "data" / "precious") << "keep me\n";
    return dir;
  }
  static bool intact(const fs::path& dir) {
    std::ifstream in(dir / "data" / "precious");
    std::string line;
    return std::getline(in, line) && line == "keep me";
  }

  fs::path state_;
  std::unique_ptr<MotoServer> moto_;
};

TEST_F(AwsSweep, HostilePoolTagsAndSymlinksNeverRemoveAnythingOutsideTheStateRoot) {
  if (auto why = aws::testing::moto_missing(); !why.empty()) GTEST_SKIP() << why;
  use_moto();
  // 1. "x/../../victim": state/skyforge-aws-x/../../victim is base/victim, beside the state root.
  const fs::path v1 = victim(root_ / "base" / "victim");
  fs::create_directories(state_ / "skyforge-aws-x");
  key_pair("hostile-dotdot", "x/../../victim");
  const std::string dotdot_instance = instance("x/../../victim");
  // 2. An absolute path, reached through a symlink the attacker made where the prefix ends:
  //    state/"skyforge-aws-" -> "/", so state/"skyforge-aws-/<abs>" is <abs>.
  const fs::path v2 = victim(root_ / "victim2");
  fs::create_directory_symlink("/", state_ / "skyforge-aws-");
  key_pair("hostile-absolute", v2.string());
  // 3. A well-formed pool id whose state directory is a symlink leading out of the state root.
  const fs::path v3 = victim(root_ / "victim3");
  fs::create_directory_symlink(v3, state_ / "skyforge-aws-0123456789ab");
  key_pair("skyforge-0123456789ab", "0123456789ab");
  // 4. A real pool left by a killed host: its key pair and local state go.
  fs::create_directories(state_ / "skyforge-aws-abcdef012345");
  std::ofstream(state_ / "skyforge-aws-abcdef012345" / "id_ed25519") << "key\n";
  key_pair("skyforge-abcdef012345", "abcdef012345");

  Output dry = skyforge({"sweep", "--provider", "aws", "--dry-run"}, 60);
  EXPECT_EQ(dry.exit_code, 0) << dry.out << dry.err;
  EXPECT_NE(dry.out.find("key pair skyforge-abcdef012345 (us-east-1, pool abcdef012345"), std::string::npos) << dry.out;
  EXPECT_EQ(dry.out.find("hostile"), std::string::npos) << "a foreign tag is not listed as skyforge's\n" << dry.out;
  EXPECT_NE(dry.err.find("key pair hostile-dotdot (us-east-1) skipped: its skyforge:pool tag \"x/../../victim\" is "
                         "not a pool id skyforge makes (12 lowercase hex digits)"),
            std::string::npos)
      << dry.err;

  Output o = skyforge({"sweep", "--provider", "aws"}, 120);
  std::cerr << o.out << o.err;
  EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_TRUE(intact(v1)) << v1 << " was removed through the tag \"x/../../victim\"";
  EXPECT_TRUE(intact(v2)) << v2 << " was removed through an absolute-path tag";
  EXPECT_TRUE(intact(v3)) << v3 << " was removed through a symlink in the state root";
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(state_ / "skyforge-aws-0123456789ab")))
      << "the symlink is refused, not followed or removed";
  // Each refusal is said, naming the resource and the tag, or the path and why.
  EXPECT_NE(o.err.find("key pair hostile-dotdot (us-east-1) skipped: its skyforge:pool tag \"x/../../victim\""),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("instance " + dotdot_instance + " (us-east-1) skipped: its skyforge:pool tag \"x/../../victim\""),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("key pair hostile-absolute (us-east-1) skipped: its skyforge:pool tag \"" + v2.string() + "\""),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("local state of pool 0123456789ab not removed: " + (state_ / "skyforge-aws-0123456789ab").string() +
                       " is a symlink (to " + v3.string() + ")"),
            std::string::npos)
      << o.err;
  // What skyforge did make goes, local state included; what it did not make stays in the cloud.
  EXPECT_NE(o.out.find("local state " + (state_ / "skyforge-aws-abcdef012345").string() + ": removed"), std::string::npos)
      << o.out;
  EXPECT_FALSE(fs::exists(state_ / "skyforge-aws-abcdef012345"));
  const auto left = key_pairs();
  EXPECT_EQ(std::count(left.begin(), left.end(), "skyforge-abcdef012345"), 0);
  EXPECT_EQ(std::count(left.begin(), left.end(), "skyforge-0123456789ab"), 0) << "its key pair is swept all the same";
  EXPECT_EQ(std::count(left.begin(), left.end(), "hostile-dotdot"), 1) << "a foreign resource is left alone";
  EXPECT_EQ(std::count(left.begin(), left.end(), "hostile-absolute"), 1);
  EXPECT_EQ(state_of(dotdot_instance), "running") << "an instance with a foreign tag is not terminated";
}

// Ec2Pool::sweep on its own: a resource whose tag is not a pool id is neither listed, nor
// terminated or deleted, nor handed on as a pool whose local state may go; each is a warning.
TEST_F(AwsSweep, ForeignTagsAreLeftAloneAndSaidByEc2PoolSweep) {
  if (auto why = aws::testing::moto_missing(); !why.empty()) GTEST_SKIP() << why;
  use_moto();
  key_pair("hostile-dotdot", "x/../../victim");
  key_pair("hostile-control", "ab\x1b[2Jcd");
  const std::string foreign = instance("/etc");
  key_pair("skyforge-abcdef012345", "abcdef012345");
  aws::Ec2Pool sweeper(aws::AwsOptions{}, std::make_unique<aws::Ec2Client>(moto_->aws()), fs::path(), nullptr);
  std::set<std::string> pools;
  std::vector<std::string> warnings;
  auto report = sweeper.sweep(true, std::chrono::system_clock::now(), &pools, &warnings);
  std::string all, warned;
  for (const auto& l : report) all += l + "\n";
  for (const auto& l : warnings) warned += l + "\n";
  EXPECT_EQ(pools, std::set<std::string>{"abcdef012345"});
  EXPECT_EQ(report.size(), 1u) << all;
  EXPECT_EQ(warnings.size(), 3u) << warned;
  EXPECT_NE(warned.find("instance " + foreign + " (us-east-1) skipped: its skyforge:pool tag \"/etc\" is not a pool id "
                        "skyforge makes (12 lowercase hex digits); left alone"),
            std::string::npos)
      << warned;
  EXPECT_NE(warned.find("key pair hostile-control (us-east-1) skipped: its skyforge:pool tag \"ab\\x1b[2Jcd\""),
            std::string::npos)
      << "a control byte is shown escaped, never sent to the terminal\n"
      << warned;
  const auto left = key_pairs();
  EXPECT_EQ(std::count(left.begin(), left.end(), "hostile-dotdot"), 1);
  EXPECT_EQ(std::count(left.begin(), left.end(), "hostile-control"), 1);
  EXPECT_EQ(std::count(left.begin(), left.end(), "skyforge-abcdef012345"), 0);
  EXPECT_EQ(state_of(foreign), "running");
}

// The local-state removal on its own: what it takes and what it refuses.
TEST(AwsPoolState, OnlyARealDirectoryInsideTheStateRootIsRemoved) {
  std::string tmpl = (fs::temp_directory_path() / "skyforge-pool-state-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const fs::path base = tmpl, root = base / "state";
  fs::create_directories(root / "skyforge-aws-x");
  fs::create_directories(base / "victim");
  std::string why;
  EXPECT_EQ(aws::remove_pool_state(root, "x/../../victim", &why), "");
  EXPECT_NE(why.find("\"x/../../victim\" is not one skyforge makes"), std::string::npos) << why;
  EXPECT_EQ(aws::remove_pool_state(root, "/etc", &why), "");
  EXPECT_NE(why.find("not one skyforge makes"), std::string::npos) << why;
  EXPECT_EQ(aws::remove_pool_state(root, "ABCDEF012345", &why), "") << "upper case is not what skyforge writes";
  EXPECT_EQ(aws::remove_pool_state(root, "abcdef01234\n", &why), "");
  EXPECT_NE(why.find("\\x0a"), std::string::npos) << "a control byte is shown escaped: " << why;
  // A regular file where the directory should be: left alone.
  std::ofstream(root / "skyforge-aws-aaaaaaaaaaaa") << "x";
  EXPECT_EQ(aws::remove_pool_state(root, "aaaaaaaaaaaa", &why), "");
  EXPECT_NE(why.find("is not a directory"), std::string::npos) << why;
  EXPECT_TRUE(fs::exists(root / "skyforge-aws-aaaaaaaaaaaa"));
  // Nothing there: nothing said.
  EXPECT_EQ(aws::remove_pool_state(root, "bbbbbbbbbbbb", &why), "");
  EXPECT_EQ(why, "");
  // The state root itself reached through a symlink: its own directories still go.
  fs::create_directory_symlink(root, base / "root-link");
  fs::create_directories(root / "skyforge-aws-cccccccccccc" / "sub");
  EXPECT_NE(aws::remove_pool_state(base / "root-link", "cccccccccccc", &why), "") << why;
  EXPECT_FALSE(fs::exists(root / "skyforge-aws-cccccccccccc"));
  EXPECT_TRUE(fs::exists(base / "victim"));
  fs::remove_all(base);
}

// The provider writes no skyforge:pool tag that sweep would not trust: create() takes only the
// pool ids skyforge makes, and refuses others before any call.
TEST(AwsPoolState, CreateTakesOnlyPoolIdsSkyforgeMakes) {
  EXPECT_TRUE(aws::is_pool_id("0123456789ab"));
  for (const char* bad : {"", "0123456789a", "0123456789abc", "0123456789aB", "x/../../victim", "/etc/passwd",
                          "0123456789a/", "..", "0123456789a\n"})
    EXPECT_FALSE(aws::is_pool_id(bad)) << bad;
  aws::ClientOptions o;
  o.max_attempts = 1;
  aws::ResolvedAws at;
  at.credentials = {"AKIDEXAMPLE", "secret", "", "the test"};
  at.region = "us-east-1";
  at.endpoint = "http://127.0.0.1:" + std::to_string(aws::testing::free_loopback_port());
  aws::Ec2Pool pool(aws::AwsOptions{}, std::make_unique<aws::Ec2Client>(at, o), fs::path(), nullptr);
  try {
    pool.create("x/../../victim", 1);
    FAIL() << "a pool id that is a path was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pool id \"x/../../victim\": expected 12 lowercase hex digits"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(pool.client().requests(), 0u) << "refused before any call";
}

// The sweep's budget on its own: each failed call is said, and the whole sweep ends within
// sweep_timeout (plus one request), naming what it tried, how often, and the last failure.
TEST(AwsSweepBudget, SweepGivesUpAfterSweepTimeoutNotTeardownTimeout) {
  aws::ResolvedAws at;
  at.credentials = {"AKIDEXAMPLE", "secret", "", "the test"};
  at.region = "us-east-1";
  at.endpoint = "http://127.0.0.1:" + std::to_string(aws::testing::free_loopback_port());  // closed
  aws::AwsOptions opt;
  opt.sweep_timeout = std::chrono::seconds(2);
  std::vector<std::string> log;
  aws::Ec2Pool pool(opt, std::make_unique<aws::Ec2Client>(at), fs::path(), [&](const std::string& l) { log.push_back(l); });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    pool.sweep(false, std::chrono::system_clock::now());
    FAIL() << "a sweep against a closed port succeeded";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("sweep gave up: DescribeInstances at " + at.endpoint + " (us-east-1) failed "), std::string::npos)
        << what;
    EXPECT_NE(what.find(", sweep_timeout 2 s); the last time: aws DescribeInstances (us-east-1): no answer from " +
                        at.endpoint),
              std::string::npos)
        << what;
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 4.0);
  EXPECT_GE(took, 2.0) << "it gave up before its budget was spent";
  ASSERT_GE(log.size(), 1u);
  EXPECT_NE(log[0].find("aws: sweep: DescribeInstances failed ("), std::string::npos) << log[0];
  EXPECT_NE(log[0].find("try 2 in 500 ms (sweep_timeout 2 s)"), std::string::npos) << log[0];
  EXPECT_EQ(pool.client().requests(), log.size() + 1) << "one request a try, no hidden retries";
}

// A listening socket that never answers (connect succeeds, no response), on loopback.
class SilentListener {
 public:
  SilentListener() { fd_ = aws::testing::loopback_socket(port_, 64); }
  ~SilentListener() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1, port_ = 0;
};

TEST_F(AwsSweep, ADeadEndpointEndsTheDryRunWithinSweepTimeoutAndSaysWhy) {
  const int port = aws::testing::free_loopback_port();  // closed: connection refused
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(port);
  extra_env_["AWS_ENDPOINT_URL_EC2"] = endpoint;
  Output o = skyforge({"sweep", "--provider", "aws", "--dry-run", "-o", "sweep_timeout=3"}, 60);
  std::cerr << o.err << "[ figure ] sweep --dry-run, connection refused, sweep_timeout = 3 s: " << o.seconds << " s\n";
  EXPECT_EQ(o.exit_code, 1) << o.out << o.err;
  EXPECT_LT(o.seconds, 10.0) << "it kept retrying past sweep_timeout";
  EXPECT_NE(o.err.find("sweep gave up: DescribeInstances at " + endpoint + " (us-east-1) failed "), std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find(", sweep_timeout 3 s); the last time: "), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("no answer from " + endpoint), std::string::npos) << "the last failure, said\n" << o.err;
  EXPECT_NE(o.err.find("aws: sweep: DescribeInstances failed"), std::string::npos) << "each retry is said\n" << o.err;
  EXPECT_EQ(o.err.find("teardown_timeout"), std::string::npos) << o.err;
}

TEST_F(AwsSweep, AnEndpointThatNeverAnswersEndsTheDryRunWithinSweepTimeout) {
  SilentListener silent;  // accepts connections (the backlog), never answers
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(silent.port());
  extra_env_["AWS_ENDPOINT_URL_EC2"] = endpoint;
  Output o = skyforge({"sweep", "--provider", "aws", "--dry-run", "-o", "sweep_timeout=2"}, 60);
  std::cerr << o.err << "[ figure ] sweep --dry-run, no answer, sweep_timeout = 2 s: " << o.seconds << " s\n";
  EXPECT_EQ(o.exit_code, 1) << o.out << o.err;
  EXPECT_LT(o.seconds, 10.0) << "one request outlasted sweep_timeout";
  EXPECT_NE(o.err.find("sweep gave up: DescribeInstances at " + endpoint), std::string::npos) << o.err;
  EXPECT_NE(o.err.find(", sweep_timeout 2 s); the last time: "), std::string::npos) << o.err;
}

TEST_F(AwsSweep, ABadSweepTimeoutIsNamed) {
  extra_env_["AWS_ENDPOINT_URL_EC2"] = "http://127.0.0.1:9";
  Output o = skyforge({"sweep", "--provider", "aws", "--dry-run", "-o", "sweep_timeout=0"}, 30);
  EXPECT_EQ(o.exit_code, 2) << o.out << o.err;
  EXPECT_NE(o.err.find("option 'sweep_timeout': expected 1 to 3600 seconds"), std::string::npos) << o.err;
}

}  // namespace
}  // namespace skyforge::test
