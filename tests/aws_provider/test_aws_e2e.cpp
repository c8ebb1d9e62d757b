// The aws provider end to end: the real `skyforge` binary, moto's EC2 API (signatures checked),
// and a harness that plays the hypervisor (ec2_hypervisor.hpp): every instance moto makes
// becomes a machine in a network namespace of its own, with sshd and its user data. The whole
// path runs -- API, SSH, bootstrap, worker, lease expiry, self-termination, sweep -- and each
// test fails when anything is left: an instance, a group or key pair in moto, a machine, a
// namespace, a process.
//
// No packet leaves: main() moves this process (and so moto, the machines and skyforge) into a
// network namespace of its own with loopback and the harness's bridge only.
#include <gtest/gtest.h>

#include <sched.h>
#include <sys/stat.h>

#include <regex>

#include "api_proxy.hpp"
#include "ec2_hypervisor.hpp"
#include "moto.hpp"
#include "process.hpp"
#include "provider_e2e.hpp"
#include "provider_run_test.hpp"

namespace skyforge::test {
namespace {

using aws::testing::Ec2Hypervisor;
using aws::testing::MotoServer;

bool g_isolated = false;

class AwsE2E : public ProviderRunTest {
 protected:
  AwsE2E() : ProviderRunTest("skyforge-aws-e2e", 180) {}

  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "not root: the harness's machines are network namespaces";
    if (!g_isolated) GTEST_SKIP() << "could not make the test's own network namespace (unshare CLONE_NEWNET)";
    if (auto why = aws::testing::moto_missing(); !why.empty()) GTEST_SKIP() << why;
    if (::access("/usr/sbin/sshd", X_OK) != 0) GTEST_SKIP() << "no /usr/sbin/sshd (openssh-server)";
    SkyforgeRunTest::SetUp();
    moto_ = std::make_unique<MotoServer>();
    hv_ = std::make_unique<Ec2Hypervisor>(moto_->aws(), root_ / "hv");
    const auto& c = moto_->credentials();
    extra_env_["AWS_ACCESS_KEY_ID"] = c.access_key_id;
    extra_env_["AWS_SECRET_ACCESS_KEY"] = c.secret_access_key;
    extra_env_["AWS_REGION"] = "us-east-1";
    extra_env_["AWS_ENDPOINT_URL_EC2"] = moto_->endpoint();
    extra_env_["AWS_SHARED_CREDENTIALS_FILE"] = (root_ / "no-credentials").string();
    extra_env_["AWS_CONFIG_FILE"] = (root_ / "no-config").string();
  }
  void TearDown() override {
    if (!hv_) return;
    // Nothing of the pools may be left in the "cloud".
    EXPECT_TRUE(live_instances().empty()) << "instances left running: " << live_instances()[0];
    EXPECT_EQ(tagged("DescribeSecurityGroups", "//securityGroupInfo/item"), 0u) << "a security group was left";
    EXPECT_EQ(tagged("DescribeKeyPairs", "//keySet/item"), 0u) << "a key pair was left";
    for (int i = 0; i < 100 && !hv_->machines().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(hv_->machines().empty()) << "a machine still runs: " << hv_->machines()[0];
    hv_.reset();
    EXPECT_TRUE(Ec2HypervisorNamespacesGone());
    moto_.reset();
    SkyforgeRunTest::TearDown();
  }
  bool Ec2HypervisorNamespacesGone() {
    std::error_code ec;
    for (auto& e : fs::directory_iterator("/run/netns", ec))
      if (e.path().filename().string().rfind("sfhv-" + std::to_string(::getpid() % 100000) + "-", 0) == 0) return false;
    return true;
  }

  std::vector<std::string> live_instances() {
    aws::Ec2Client ec2(moto_->aws());
    std::vector<std::string> out;
    for (auto& v : aws::instances_of(ec2.call("DescribeInstances", {{"Filter.1.Name", "tag-key"},
                                                                    {"Filter.1.Value.1", "skyforge:pool"}})))
      if (v.state != "terminated") out.push_back(v.id + " " + v.state);
    return out;
  }
  size_t tagged(const std::string& action, const std::string& xpath) {
    aws::Ec2Client ec2(moto_->aws());
    return ec2.call(action, {{"Filter.1.Name", "tag-key"}, {"Filter.1.Value.1", "skyforge:pool"}})
        .select_nodes(xpath.c_str())
        .size();
  }

  std::string aws_pool(int nodes, const std::string& extra = "") const {
    return "[pool]\nprovider = \"aws\"\nnodes = " + std::to_string(nodes) +
           "\n\n[provider]\nimage = \"ami-760aaa0f\"\ninstance_type = \"t3.micro\"\nsubnet = \"" + hv_->subnet() +
           "\"\nuse_private_ip = true\nssh_user = \"root\"\nremote_dir = \"" + (root_ / "remote").string() +
           "\"\npoll_interval_ms = 100\nttl = \"1m\"\n" + extra + "\n";
  }
  std::string command_job(const std::string& cmd) const {
    return "[job]\nmode = \"broadcast\"\ncommand = [\"sh\", \"-c\", \"" + cmd + "\"]\n";
  }
  // Waits until moto says every instance of every pool is terminated.
  bool wait_all_terminated(double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
    while (std::chrono::steady_clock::now() < deadline) {
      if (live_instances().empty()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }

  std::unique_ptr<MotoServer> moto_;
  std::unique_ptr<Ec2Hypervisor> hv_;
};

TEST_F(AwsE2E, HelloOnTwoInstancesAndNothingIsLeft) {
  // Through a counting proxy: the API calls one pool costs (a figure of the README).
  aws::testing::ApiProxy proxy(moto_->port());
  extra_env_["AWS_ENDPOINT_URL_EC2"] = proxy.endpoint();
  Output o = skyforge({"run", "--timings",
                       write("hello.toml",
                             aws_pool(2) + "[job]\napp = \"hello\"\nmode = \"broadcast\"\n" + outputs_round_trip())
                           .string()},
                      180);
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  std::string calls;
  int total = 0;
  for (const char* a : {"DescribeSubnets", "ImportKeyPair", "CreateSecurityGroup", "AuthorizeSecurityGroupIngress",
                        "RunInstances", "DescribeInstances", "TerminateInstances", "DeleteSecurityGroup", "DeleteKeyPair"}) {
    calls += std::string(" ") + a + "=" + std::to_string(proxy.seen(a));
    total += proxy.seen(a);
  }
  std::smatch t;
  std::regex_search(o.err, t, std::regex("timings:.*"));
  std::cerr << "[ figure ] aws pool of 2 on the harness: " << total << " API calls:" << calls << "\n[ figure ] " << t.str()
            << "\n";
  EXPECT_EQ(proxy.seen("RunInstances"), 1);
  EXPECT_EQ(proxy.seen("CreateTags"), 0);
  EXPECT_NE(o.out.find("hello from node 0 of 2"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("hello from node 1 of 2"), std::string::npos) << o.out;
  // Each node ran on its own machine, at the address moto gave its instance.
  std::regex ip(R"(\[node (\d)\] => node \d/2 host=\S+ ip=(\S+))");
  std::set<std::string> ips;
  for (std::sregex_iterator it(o.out.begin(), o.out.end(), ip), e; it != e; ++it) ips.insert((*it)[2]);
  ASSERT_EQ(ips.size(), 2u) << o.out;
  for (const auto& a : ips) EXPECT_EQ(a.rfind(Ec2Hypervisor::kSubnetPrefix, 0), 0u) << a;
  // What the user saw while it waited: per node, the states and SSH.
  for (const char* step : {"aws: requesting 2 x t3.micro", "aws: node 0 i-", ": running (", ": ssh up (", ": bootstrapped (",
                           "instance(s) terminated", "security group", "key pair"})
    EXPECT_NE(o.err.find(step), std::string::npos) << step << "\n" << o.err;
  EXPECT_EQ(o.err.find(moto_->credentials().secret_access_key), std::string::npos) << "a secret was printed";
  expect_outputs_back(o, 2);
}

// [pool] accelerator without an instance type: the cheapest type that fits, from the offers the
// plugin ships, is what RunInstances asks for; `skyforge offers` lists the same first.
TEST_F(AwsE2E, AnAcceleratorPicksTheCheapestTypeThatFits) {
  Output listed = skyforge({"offers", "--provider", "aws", "--accelerator", "A10G:1"}, 30);
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  std::smatch first;
  ASSERT_TRUE(std::regex_search(listed.out, first, std::regex(R"(\n(\S+)\s+A10G\s+1\s)"))) << listed.out;
  EXPECT_NE(listed.out.find("in us-east-1"), std::string::npos) << listed.out;
  std::string pool = aws_pool(1);
  pool = std::regex_replace(pool, std::regex("instance_type = \"t3.micro\"\n"), "");
  pool = std::regex_replace(pool, std::regex("nodes = 1\n"), "nodes = 1\naccelerator = \"A10G:1\"\n");
  Output o = run("acc.toml", pool + "[job]\napp = \"hello\"\n");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.err.find("accelerator A10G:1 -> " + first[1].str()), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("requesting 1 x " + first[1].str()), std::string::npos) << o.err;
}

// The main job, [pool] changed only: the same trained weights as on local.
TEST_F(AwsE2E, FashionMnistOnTwoInstancesTrainsTheWeightsLocalTrains) { expect_fashion_mnist_as_local(aws_pool(2)); }

// Ctrl-C while the machines still boot: the wait stops at once (ABI 1.6 cancel) and every
// instance, the group and the key pair go.
TEST_F(AwsE2E, CtrlCWhileTheMachinesBootTerminatesEverything) {
  hv_->set_boot_delay(std::chrono::seconds(120));
  auto c = start_skyforge({"run", write("boot.toml", aws_pool(2) + "[job]\napp = \"hello\"\n").string()});
  ASSERT_TRUE(c->wait_for_output(": running (", 60));
  const auto t0 = std::chrono::steady_clock::now();
  c->signal(SIGINT);
  Output o = c->wait(200);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(o.exit_code, 130) << o.err;
  EXPECT_LT(took, 20.0) << "the first Ctrl-C stops the wait for SSH\n" << o.err;
  EXPECT_NE(o.err.find("interrupted"), std::string::npos) << o.err;
  EXPECT_EQ(o.err.find("ssh up"), std::string::npos) << "no machine had booted\n" << o.err;
  EXPECT_TRUE(live_instances().empty());
}

// The cloud takes an instance away mid-run (a spot interruption): the run fails naming the
// node, and the rest of the pool is torn down.
TEST_F(AwsE2E, AnInstanceTakenAwayMidRunFailsTheRunNamingItsNode) {
  auto c = start_skyforge({"run", write("spot.toml", aws_pool(2) + command_job("echo up; exec sleep 300")).string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 120));
  std::smatch m;
  std::string err = c->err_so_far();
  ASSERT_TRUE(std::regex_search(err, m, std::regex(R"(aws: node 1 (i-[0-9a-f]+): running)"))) << err;
  hv_->interrupt(m[1]);
  Output o = c->wait(300);
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("node 1"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("lost"), std::string::npos) << o.err;
}

// A spot interruption mid-training ([job] max_restarts): node 1's instance is taken away, the
// restart finds it gone, the provider terminates it for good and launches another like it, node
// 1 is bootstrapped there, and the run ends with the weights and history of an uninterrupted run
// on the local provider, to the bit. Then nothing is left: every instance, the group, the key.
TEST_F(AwsE2E, AnInstanceTakenAwayMidTrainingIsReplacedAtRestartAndTheRunEndsAsOnLocal) {
  std::string lost;
  expect_restarted_run_ends_as_local(
      aws_pool(2), 240,
      [&](Child& run) {
        std::smatch m;
        std::string err = run.err_so_far();
        ASSERT_TRUE(std::regex_search(err, m, std::regex(R"(aws: node 1 (i-[0-9a-f]+): running)"))) << err;
        lost = m[1];
        hv_->interrupt(lost);
      },
      [&](const Output& o) {
        EXPECT_NE(o.err.find("aws: node-1 " + lost + " is gone; launching another in its place"), std::string::npos) << o.err;
        EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(restart 1/1: node 1 replaced: now at \S+, bootstrapped in \d+ ms)")))
            << o.err;
        print_replacement(o.err);
      });
}

// The host killed mid-job: each worker loses its lease, ages the machine's lease file, and the
// dead-man switch powers the machine off -- terminated, by the shutdown behaviour -- in seconds,
// not after the ttl. `skyforge sweep` then finds the group and key pair once they expire.
TEST_F(AwsE2E, AKilledHostsMachinesPowerThemselvesOffAndSweepTakesTheRest) {
  auto c = start_skyforge({"run", write("kill.toml", aws_pool(2) + command_job("echo up; exec sleep 300")).string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 120));
  const auto t0 = std::chrono::steady_clock::now();
  c->signal(SIGKILL);
  c->wait(10);
  ASSERT_TRUE(wait_all_terminated(40)) << "still running: " << live_instances()[0];
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << "[ figure ] host SIGKILL -> every instance terminated by its own dead-man switch: " << took << " s\n";
  EXPECT_EQ(hv_->powered_off().size(), 2u) << "each machine powered itself off";
  // The group and key pair outlive the host until their expiry (ttl = 1 min) passes.
  Output early = skyforge({"sweep", "--provider", "aws", "--dry-run"}, 60);
  EXPECT_EQ(early.exit_code, 0) << early.err;
  EXPECT_NE(early.out.find("nothing left behind"), std::string::npos) << early.out;
  std::this_thread::sleep_for(std::chrono::seconds(62) - (std::chrono::steady_clock::now() - t0));
  Output swept = skyforge({"sweep", "--provider", "aws"}, 120);
  EXPECT_EQ(swept.exit_code, 0) << swept.err;
  EXPECT_NE(swept.out.find("security group"), std::string::npos) << swept.out;
  EXPECT_NE(swept.out.find("key pair"), std::string::npos) << swept.out;
  EXPECT_NE(swept.out.find("local state"), std::string::npos) << "the pool's private key, left by the killed host\n"
                                                              << swept.out;
}

// The host killed while the machines boot: no worker ever starts, so nothing renews the lease
// file the user data made at boot; after the ttl every machine powers itself off.
TEST_F(AwsE2E, AHostKilledDuringProvisioningLeavesNothingAfterTheTtl) {
  hv_->set_boot_delay(std::chrono::seconds(3));
  auto c = start_skyforge({"run", write("early.toml", aws_pool(2, "ssh_timeout = 600\n") + "[job]\napp = \"hello\"\n").string()});
  ASSERT_TRUE(c->wait_for_output(": running (", 60));
  // Kill it before SSH: a bootstrap in flight would start the agent, not the worker.
  c->signal(SIGKILL);
  c->wait(10);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_all_terminated(120)) << "still running: " << live_instances()[0];
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << "[ figure ] host SIGKILL during provisioning -> every instance terminated by its ttl (60 s): " << took
            << " s\n";
  EXPECT_GE(took, 50.0) << "before the ttl: the lease made at boot was not due";
  Output swept = skyforge({"sweep", "--provider", "aws"}, 120);
  EXPECT_EQ(swept.exit_code, 0) << swept.err;
}

}  // namespace
}  // namespace skyforge::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::string(argv[i]).rfind("--gtest_list_tests", 0) == 0;
  if (!listing && ::geteuid() == 0 && ::unshare(CLONE_NEWNET) == 0) {
    skyforge::test::g_isolated = skyforge::providers::run_command({"ip", "link", "set", "lo", "up"}).status == 0;
  }
  return RUN_ALL_TESTS();
}
