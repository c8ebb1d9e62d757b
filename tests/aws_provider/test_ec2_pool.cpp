// A pool's EC2 lifecycle against a real EC2 API (moto on loopback, signatures checked), with
// the faults moto cannot make itself injected by a proxy in between (api_proxy.hpp): a lost
// RunInstances answer, no capacity, an API that is down for 30 s during teardown.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <future>
#include <set>

#include "api_proxy.hpp"
#include "ec2_pool.hpp"
#include "moto.hpp"
#include "provider_options.hpp"

using namespace skyforge::aws;
using skyforge::aws::testing::ApiProxy;
using skyforge::aws::testing::MotoServer;
namespace fs = std::filesystem;

namespace {

using skyforge::test::options;

class Ec2PoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = skyforge::aws::testing::moto_missing(); !why.empty()) GTEST_SKIP() << why;
    moto_ = std::make_unique<MotoServer>();
    proxy_ = std::make_unique<ApiProxy>(moto_->port());
    state_ = fs::temp_directory_path() / ("skyforge-ec2pool-test-" + std::to_string(::getpid()));
    options_ = AwsOptions::from(options({{"image", "ami-760aaa0f"}, {"instance_type", "t3.micro"},
                                            {"poll_interval_ms", "50"}, {"ttl", "1h"}, {"tags", "team=ml"}}));
  }
  void TearDown() override {
    pool_.reset();
    std::error_code ec;
    fs::remove_all(state_, ec);
  }
  // A client that goes through the proxy, with quick retries.
  std::unique_ptr<Ec2Client> client(bool through_proxy = true) {
    ResolvedAws aws = moto_->aws();
    if (through_proxy) aws.endpoint = proxy_->endpoint();
    ClientOptions o;
    o.backoff_base = std::chrono::milliseconds(20);
    o.backoff_cap = std::chrono::milliseconds(200);
    return std::make_unique<Ec2Client>(aws, o);
  }
  Ec2Pool& make_pool() {
    pool_ = std::make_unique<Ec2Pool>(options_, client(), state_, [this](const std::string& l) {
      std::lock_guard<std::mutex> lock(log_mu_);
      log_.push_back(l);
    });
    return *pool_;
  }
  // Instances moto has for a tag filter, not terminated.
  std::vector<InstanceView> live(const std::string& tag_filter, const std::string& value) {
    Ec2Client direct(moto_->aws());
    QueryParams q = {{"Filter.1.Name", tag_filter}};
    if (!value.empty()) q.emplace_back("Filter.1.Value.1", value);
    std::vector<InstanceView> out;
    for (auto& v : instances_of(direct.call("DescribeInstances", q)))
      if (v.state != "terminated") out.push_back(v);
    return out;
  }
  size_t count(const std::string& action, const std::string& xpath) {
    Ec2Client direct(moto_->aws());
    return direct.call(action, {{"Filter.1.Name", "tag-key"}, {"Filter.1.Value.1", "skyforge:pool"}})
        .select_nodes(xpath.c_str())
        .size();
  }
  std::string joined_log() {
    std::lock_guard<std::mutex> lock(log_mu_);
    std::string all;
    for (const auto& l : log_) all += l + "\n";
    return all;
  }

  std::unique_ptr<MotoServer> moto_;
  std::unique_ptr<ApiProxy> proxy_;
  fs::path state_;
  AwsOptions options_;
  std::unique_ptr<Ec2Pool> pool_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
};

TEST_F(Ec2PoolTest, CreateTagsEverythingInTheSameCallAndTeardownLeavesNothing) {
  Ec2Pool& pool = make_pool();
  auto made = pool.create("000000000001", 3);
  ASSERT_EQ(made.size(), 3u);
  std::set<std::string> ids;
  for (size_t i = 0; i < made.size(); ++i) {
    EXPECT_EQ(made[i].state, "running");
    EXPECT_FALSE(made[i].public_ip.empty());
    EXPECT_EQ(made[i].pool, "000000000001");
    EXPECT_EQ(made[i].launch_index, std::to_string(i)) << "node i is launch index i";
    ids.insert(made[i].id);
  }
  EXPECT_EQ(ids.size(), 3u);
  // Tags came with RunInstances: no CreateTags call ever went out.
  EXPECT_EQ(proxy_->seen("CreateTags"), 0);
  EXPECT_EQ(proxy_->seen("RunInstances"), 1);
  auto tagged = live("tag:skyforge:pool", "000000000001");
  EXPECT_EQ(tagged.size(), 3u);
  EXPECT_EQ(live("tag:team", "ml").size(), 3u);
  // skyforge:expires = now + ttl, ISO 8601.
  ASSERT_FALSE(made[0].expires.empty());
  std::tm tm{};
  ASSERT_NE(strptime(made[0].expires.c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm), nullptr) << made[0].expires;
  const auto expires = std::chrono::system_clock::from_time_t(timegm(&tm));
  EXPECT_NEAR(std::chrono::duration<double>(expires - std::chrono::system_clock::now()).count(), 3600, 120);

  Ec2Client direct(moto_->aws());
  auto attr = direct.call("DescribeInstanceAttribute",
                          {{"InstanceId", made[0].id}, {"Attribute", "instanceInitiatedShutdownBehavior"}});
  EXPECT_STREQ(attr.select_node("//instanceInitiatedShutdownBehavior/value").node().child_value(), "terminate");
  EXPECT_EQ(count("DescribeKeyPairs", "//keySet/item"), 1u);
  EXPECT_EQ(count("DescribeSecurityGroups", "//securityGroupInfo/item"), 1u);
  EXPECT_TRUE(fs::exists(pool.identity_file()));
  EXPECT_EQ(pool.ssh_user(), "ubuntu");

  pool.teardown();
  EXPECT_TRUE(live("tag:skyforge:pool", "000000000001").empty());
  EXPECT_EQ(count("DescribeKeyPairs", "//keySet/item"), 0u);
  EXPECT_EQ(count("DescribeSecurityGroups", "//securityGroupInfo/item"), 0u);
  EXPECT_FALSE(fs::exists(state_)) << "the pool's private key goes with it";
  pool.teardown();  // idempotent
  std::string log = joined_log();
  EXPECT_NE(log.find("node 2 "), std::string::npos) << log;
  EXPECT_NE(log.find("3 instance(s) terminated"), std::string::npos) << log;
}

TEST_F(Ec2PoolTest, TheDeadManSwitchIsTheUserData) {
  Ec2Pool& pool = make_pool();
  auto made = pool.create("000000000002", 1);
  Ec2Client direct(moto_->aws());
  auto attr = direct.call("DescribeInstanceAttribute", {{"InstanceId", made[0].id}, {"Attribute", "userData"}});
  std::string b64 = attr.select_node("//userData/value").node().child_value();
  ASSERT_FALSE(b64.empty());
  std::string decoded(b64.size(), '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(decoded.data()),
                          reinterpret_cast<const unsigned char*>(b64.data()), int(b64.size()));
  ASSERT_GT(n, 0);
  decoded.resize(size_t(n));
  while (!decoded.empty() && decoded.back() == '\0') decoded.pop_back();
  EXPECT_EQ(decoded, dead_man_user_data(std::chrono::hours(1), "ubuntu")) << "the lease is the login user's";
  EXPECT_NE(decoded.find("skyforge-dead-man 3600 'ubuntu' '/run/skyforge/lease' 5 "), std::string::npos) << decoded;
  EXPECT_NE(decoded.find("poweroff"), std::string::npos);
}

TEST_F(Ec2PoolTest, ALostRunInstancesAnswerIsAdoptedNeverDoubled) {
  proxy_->drop_answers("RunInstances", 1);
  Ec2Pool& pool = make_pool();
  auto made = pool.create("000000000003", 2);
  EXPECT_EQ(made.size(), 2u);
  EXPECT_EQ(proxy_->seen("RunInstances"), 1) << "the lookup found them: nothing was sent again";
  EXPECT_EQ(live("tag:skyforge:pool", "000000000003").size(), 2u) << joined_log();
  EXPECT_NE(joined_log().find("adopting them"), std::string::npos) << joined_log();
  pool.teardown();
  EXPECT_TRUE(live("tag:skyforge:pool", "000000000003").empty());
}

TEST_F(Ec2PoolTest, NoCapacityTriesTheNextTypeListed) {
  options_.instance_types = {"p4d.24xlarge", "t3.micro"};
  proxy_->fail_with("RunInstances", "InsufficientInstanceCapacity", 1);
  Ec2Pool& pool = make_pool();
  auto made = pool.create("000000000004", 2);
  Ec2Client direct(moto_->aws());
  auto doc = direct.call("DescribeInstances", {{"InstanceId.1", made[0].id}});
  EXPECT_STREQ(doc.select_node("//instancesSet/item/instanceType").node().child_value(), "t3.micro");
  EXPECT_EQ(proxy_->seen("RunInstances"), 2);
  EXPECT_NE(joined_log().find("no capacity for p4d.24xlarge"), std::string::npos) << joined_log();
}

TEST_F(Ec2PoolTest, AnErrorAUserMustFixFailsAtOnceNamingIt) {
  proxy_->fail_with("RunInstances", "VcpuLimitExceeded", 1);
  Ec2Pool& pool = make_pool();
  try {
    pool.create("000000000005", 2);
    FAIL();
  } catch (const skyforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("VcpuLimitExceeded"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("quota"), std::string::npos) << e.what();
  }
  pool.teardown();
  EXPECT_EQ(count("DescribeKeyPairs", "//keySet/item"), 0u);
  EXPECT_EQ(count("DescribeSecurityGroups", "//securityGroupInfo/item"), 0u);
}

TEST_F(Ec2PoolTest, TeardownFromAnotherThreadStopsAProvisionThatIsWaiting) {
  proxy_->delay("DescribeInstances", std::chrono::milliseconds(300));
  Ec2Pool& pool = make_pool();
  auto creating = std::async(std::launch::async, [&] { return pool.create("000000000006", 2); });
  for (int i = 0; i < 1000 && proxy_->seen("DescribeInstances") == 0; ++i)  // 20 s: a loaded machine
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GT(proxy_->seen("DescribeInstances"), 0) << joined_log();
  pool.teardown();  // a second Ctrl-C: from the host's signal thread
  try {
    creating.get();
    FAIL() << "create() went on after teardown";
  } catch (const skyforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cancelled"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(live("tag:skyforge:pool", "000000000006").empty());
}

TEST_F(Ec2PoolTest, TeardownOutlastsAnApiThatIsDownFor30Seconds) {
  Ec2Pool& pool = make_pool();
  pool.create("000000000007", 2);
  const auto t0 = std::chrono::steady_clock::now();
  proxy_->down_until(t0 + std::chrono::seconds(30));
  pool.teardown();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_TRUE(live("tag:skyforge:pool", "000000000007").empty());
  EXPECT_EQ(count("DescribeKeyPairs", "//keySet/item"), 0u);
  EXPECT_EQ(count("DescribeSecurityGroups", "//securityGroupInfo/item"), 0u);
  EXPECT_NE(joined_log().find("retrying until it answers"), std::string::npos) << joined_log();
}

TEST_F(Ec2PoolTest, AHundredProvisionsAndTeardownsLeaveNothing) {
  for (int i = 0; i < 100; ++i) {
    Ec2Pool pool(options_, client(false), state_, nullptr);
    char id[16];
    std::snprintf(id, sizeof id, "100000000%03x", i);  // a pool id as skyforge makes them: 12 hex digits
    pool.create(id, 1 + i % 3);
    pool.teardown();
  }
  EXPECT_TRUE(live("tag-key", "skyforge:pool").empty());
  EXPECT_EQ(count("DescribeKeyPairs", "//keySet/item"), 0u);
  EXPECT_EQ(count("DescribeSecurityGroups", "//securityGroupInfo/item"), 0u);
}

// A host killed before its teardown leaves its pool; sweep finds it by its expiry tag and takes
// it down, and leaves a pool that has not expired alone.
TEST_F(Ec2PoolTest, SweepTakesDownWhatExpiredAndNothingElse) {
  // The dead host: a process that makes its pool and dies without tearing anything down.
  fs::create_directories(state_);  // the state root of both pools (each makes only its own directory)
  pid_t child = ::fork();
  if (child == 0) {
    try {
      Ec2Pool dead(options_, client(false), state_ / "dead", nullptr);
      dead.create("deaddeaddead", 2);
      ::_exit(0);  // no destructor runs: as kill -9
    } catch (...) {
      ::_exit(1);
    }
  }
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ASSERT_EQ(live("tag:skyforge:pool", "deaddeaddead").size(), 2u);

  AwsOptions longer = options_;
  longer.ttl = std::chrono::hours(4);
  Ec2Pool alive(longer, client(false), state_ / "alive", nullptr);
  alive.create("a1a1a1a1a1a1", 1);

  const auto later = std::chrono::system_clock::now() + std::chrono::hours(2);  // past "dead"'s 1 h ttl
  Ec2Pool sweeper(options_, client(false), fs::path(), nullptr);
  auto listed = sweeper.sweep(false, later);
  std::string all;
  for (const auto& l : listed) all += l + "\n";
  EXPECT_EQ(listed.size(), 4u) << all << "(2 instances, a group, a key pair)";
  EXPECT_EQ(all.find("pool a1a1a1a1a1a1"), std::string::npos) << all;
  EXPECT_NE(all.find("would be terminated"), std::string::npos) << all;
  EXPECT_EQ(live("tag:skyforge:pool", "deaddeaddead").size(), 2u) << "a dry run tears nothing down";
  EXPECT_TRUE(sweeper.sweep(false, std::chrono::system_clock::now()).empty()) << "nothing has expired yet";

  listed = sweeper.sweep(true, later);
  EXPECT_EQ(listed.size(), 4u);
  EXPECT_TRUE(live("tag:skyforge:pool", "deaddeaddead").empty());
  EXPECT_EQ(live("tag:skyforge:pool", "a1a1a1a1a1a1").size(), 1u);
  EXPECT_EQ(count("DescribeKeyPairs", "//keySet/item"), 1u) << "only the live pool's key pair is left";
  EXPECT_EQ(count("DescribeSecurityGroups", "//securityGroupInfo/item"), 1u);
  EXPECT_TRUE(sweeper.sweep(true, later).empty());
  alive.teardown();
}

TEST_F(Ec2PoolTest, ANamedImageIsTheNewestOfItsOwnerAndPattern) {
  Ec2Client direct(moto_->aws());
  const std::string owner = "099720109477", pattern = "ubuntu/images/hvm-ssd/ubuntu-*";
  std::string id = newest_image(direct, owner, pattern);
  // The listing, read independently: the chosen one has the greatest creationDate.
  auto doc = direct.call("DescribeImages", {{"Owner.1", owner}});
  std::string best, best_id;
  int matching = 0;
  for (auto it : doc.select_nodes("//imagesSet/item")) {
    std::string name = it.node().child_value("name");
    if (name.rfind("ubuntu/images/hvm-ssd/ubuntu-", 0) != 0) continue;
    ++matching;
    if (std::string(it.node().child_value("creationDate")) > best) {
      best = it.node().child_value("creationDate");
      best_id = it.node().child_value("imageId");
    }
  }
  EXPECT_GE(matching, 2) << "moto ships more than one Ubuntu image to choose from";
  EXPECT_EQ(id, best_id);
  EXPECT_THROW(newest_image(direct, owner, "no-such-image-*"), skyforge::Error);
}

TEST(AwsOptionsTest, BadOptionsAreNamed) {
  auto expect_invalid = [](const std::map<std::string, std::string>& kv, const std::string& needle) {
    const std::string error = skyforge::test::error_of([&] { AwsOptions::from(options(kv)); });
    EXPECT_NE(error.find(needle), std::string::npos) << (error.empty() ? "accepted: " : error) << needle;
  };
  expect_invalid({{"ttl", "soon"}}, "option 'ttl'");
  expect_invalid({{"ttl", "30s"}}, "at least 1 minute");
  expect_invalid({{"tags", "skyforge:pool=x"}}, "reserved");
  expect_invalid({{"tags", "novalue"}}, "key=value");
  expect_invalid({{"max_price", "0.5"}}, "spot = true");
  expect_invalid({{"spot", "true"}, {"max_price", "cheap"}}, "option 'max_price'");
  expect_invalid({{"image", "centos-7"}}, "ubuntu-24.04");
  expect_invalid({{"key_name", "mine"}}, "identity_file");
  expect_invalid({{"sweep_timeout", "0"}}, "option 'sweep_timeout': expected 1 to 3600 seconds");
  // The login name goes into the instances' user data (the lease's owner): a name, never a command.
  expect_invalid({{"ssh_user", "ubuntu; poweroff"}}, "option 'ssh_user': expected a login name");
  expect_invalid({{"ssh_user", "-u0"}}, "option 'ssh_user'");
  expect_invalid({{"ssh_user", "a'b"}}, "option 'ssh_user'");
  EXPECT_EQ(AwsOptions::from(options({{"ssh_user", "ec2-user"}})).ssh_user, "ec2-user");
  EXPECT_EQ(AwsOptions::from(options({})).sweep_timeout, std::chrono::seconds(30));
  AwsOptions ok = AwsOptions::from(options({{"ttl", "90m"}, {"instance_type", "g5.xlarge"},
                                               {"fallback_instance_types", "g5.2xlarge\ng6.xlarge"}}));
  EXPECT_EQ(ok.ttl, std::chrono::minutes(90));
  EXPECT_EQ(ok.instance_types, (std::vector<std::string>{"g5.xlarge", "g5.2xlarge", "g6.xlarge"}));
  EXPECT_EQ(parse_duration("2h"), std::chrono::hours(2));
  EXPECT_EQ(parse_duration("3600"), std::chrono::seconds(3600));
}

}  // namespace
