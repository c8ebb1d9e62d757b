// The slurm provider end to end: the real `skyforge` binary against a real Slurm cluster of two
// nodes, each in its own network namespace (slurm_cluster.hpp). Each test makes its own cluster
// and fails when a run leaves anything behind: a job in the queue, a process, a node directory.
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "process.hpp"
#include "provider_e2e.hpp"
#include "provider_run_test.hpp"
#include "slurm_cluster.hpp"

namespace skyforge::test {
namespace {

class SlurmE2E : public ProviderRunTest {
 protected:
  SlurmE2E() : ProviderRunTest("skyforge-slurm-e2e") {}

  void SetUp() override {
    if (auto why = SlurmCluster::unavailable(); !why.empty()) GTEST_SKIP() << "no real Slurm cluster here: " << why;
    SkyforgeRunTest::SetUp();
    make_cluster(2);
    nodes_dir_ = root_ / "nodes";  // the nodes' stage_dir (one filesystem here, as the hosts share this one)
    fs::create_directories(nodes_dir_);
  }
  // The daemons' files outside the test's root: their working directories are there, and the
  // root must be free of processes once a run is over.
  void make_cluster(uint32_t nodes) {
    cluster_.reset();
    char dir[] = "/tmp/skyforge-slurm-cluster-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    cluster_ = std::make_unique<SlurmCluster>(dir, nodes);
    extra_env_["SLURM_CONF"] = cluster_->conf().string();
  }
  void TearDown() override {
    if (!cluster_) return;
    if (!root_.empty()) {
      for (int i = 0; i < 100 && skyforge_jobs() != ""; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      EXPECT_EQ(skyforge_jobs(), "") << "a job was left in the queue";
      for (int i = 0; i < 100 && !entries_of(nodes_dir_).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      EXPECT_TRUE(entries_of(nodes_dir_).empty()) << "a pool directory was left on the nodes: " << entries_of(nodes_dir_)[0];
    }
    SkyforgeRunTest::TearDown();
    cluster_.reset();
  }
  // The pool's jobs still queued or running.
  std::string skyforge_jobs() const {
    std::string out;
    std::istringstream q(cluster_->queue());
    for (std::string l; std::getline(q, l);)
      if (l.find(" skyforge-") != std::string::npos) out += l + "\n";
    return out;
  }
  std::string slurm_pool(int nodes, const std::string& provider_extra = "", const std::string& pool_extra = "") const {
    return "[pool]\nprovider = \"slurm\"\nnodes = " + std::to_string(nodes) + "\n" + pool_extra +
           "\n[provider]\ntime_limit = \"10\"\nstage_dir = \"" + nodes_dir_.string() + "\"\n" + provider_extra + "\n";
  }

  std::unique_ptr<SlurmCluster> cluster_;
  fs::path nodes_dir_;
};

TEST_F(SlurmE2E, HelloRunsOnEveryNodeOfOneJob) {
  Output o = run("hello.toml", slurm_pool(2) + "[job]\napp = \"hello\"\nmode = \"broadcast\"\n" + outputs_round_trip());
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  std::smatch job;
  ASSERT_TRUE(std::regex_search(o.err, job, std::regex(R"(slurm: job (\d+) submitted \(2 nodes\))"))) << o.err;
  EXPECT_NE(o.err.find("slurm: job " + job[1].str() + " running on "), std::string::npos) << o.err;
  std::regex ip(R"(\[node (\d)\] => node \d/2 host=\S+ ip=(\S+) head=(\S+))");
  std::set<std::string> ips;
  for (std::sregex_iterator it(o.out.begin(), o.out.end(), ip), e; it != e; ++it) ips.insert((*it)[2]);
  const auto addresses = cluster_->addresses();
  EXPECT_EQ(ips, std::set<std::string>(addresses.begin(), addresses.end()))
      << "each node reports its own address\n" << o.out;
  expect_outputs_back(o, 2);
}

TEST_F(SlurmE2E, MapJobGivesTheResultsItGivesOnLocal) {
  expect_map_results_as_local(slurm_pool(2, "", "concurrency = 2\n"));
}

TEST_F(SlurmE2E, FashionMnistOnTwoNodesTrainsTheWeightsLocalTrains) { expect_fashion_mnist_as_local(slurm_pool(2)); }

TEST_F(SlurmE2E, TorchDdpAcrossTwoNodesTrainsTheWeightsLocalTrains) {
  expect_torch_ddp_as_local(slurm_pool(2), FW_TEST_SCRIPTS);
}

TEST_F(SlurmE2E, AJobWaitingPastQueueTimeoutIsCancelledSayingWhy) {
  // Another job holds both nodes.
  auto hold = providers::run_command({"sbatch", "--parsable", "-N2", "--exclusive", "-J", "holder", "-o", "/dev/null",
                                      "--wrap", "exec sleep 300"});
  ASSERT_EQ(hold.status, 0) << hold.err;
  const std::string holder = providers::last_line(hold.out);
  Output o = run("queued.toml", slurm_pool(2, "queue_timeout = 2\n") + "[job]\napp = \"hello\"\n", 60);
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(slurm: job \d+ PENDING)"))) << "its state shown while it waits\n" << o.err;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(job \d+ still PENDING \(\w+\) after queue_timeout = 2 s; it was cancelled)")))
      << o.err;
  EXPECT_LT(o.seconds, 15);
  providers::run_command({"scancel", holder});
}

TEST_F(SlurmE2E, ABadSbatchOptionFailsWithSbatchsReason) {
  Output o = run("bad.toml", slurm_pool(2, "extra_sbatch_args = [\"--no-such-option\"]\n") + "[job]\napp = \"hello\"\n", 60);
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("sbatch refused the job"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("no-such-option"), std::string::npos) << o.err;
}

// A worker lost on its Slurm node ([job] max_restarts): the node's job step starts the next one,
// the job resumes from the head's last checkpoint, and the run ends with the weights and history
// of an uninterrupted run on the local provider, to the bit.
TEST_F(SlurmE2E, ALostWorkerRestartsInItsStepAndTheRunEndsAsOnLocal) {
  expect_restarted_run_ends_as_local(
      slurm_pool(2), 180, [&](Child&) { kill_worker_of(nodes_dir_, 1); },
      expect_worker_restarted);
}

// A Slurm node that is gone ([job] max_restarts, [provider] spare_nodes = 1): every process of
// node 1's machine is SIGKILLed mid-training, slurmd included; the restart finds its job step
// gone, the node moves to the allocation's spare node under the same rank, and the run ends with
// the weights and history of an uninterrupted run on the local provider, to the bit.
TEST_F(SlurmE2E, ALostNodeMovesToASpareNodeAtRestartAndTheRunEndsAsOnLocal) {
  make_cluster(3);
  expect_restarted_run_ends_as_local(
      slurm_pool(2, "spare_nodes = 1\n"), 180, [&](Child&) { cluster_->kill_node(1); },
      [&](const Output& o) {
        EXPECT_NE(o.err.find("slurm: node-1 moves from " + cluster_->node_names()[1] + " to the spare node " +
                             cluster_->node_names()[2]),
                  std::string::npos)
            << o.err;
        EXPECT_NE(o.err.find("restart 1/1: node 1 replaced: now at " + cluster_->addresses()[2]), std::string::npos)
            << o.err;
        print_replacement(o.err);
      });
  // The job was cancelled; Slurm ends it once it has declared the lost node down (SlurmdTimeout,
  // 10 s in this cluster): then nothing is left (TearDown).
  for (int i = 0; i < 600 && skyforge_jobs() != ""; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

TEST_F(SlurmE2E, AKilledHostLeavesNoWorkerNoDirectoryAndNoJobAfterTheLease) {
  auto c = start_skyforge({"run", write("sleep.toml", slurm_pool(2) + "[job]\ncommand = [\"sh\", \"-c\", \"echo up; exec sleep 120\"]\n").string()});
  ASSERT_TRUE(c->wait_for_output("[node 1] up", 60));
  ASSERT_NE(skyforge_jobs(), "");
  c->signal(SIGKILL);
  c->wait(10);
  // The workers' lease runs out (4 s), they leave and their steps end; the batch script sees no
  // step left, cleans the nodes and ends the job.
  for (int i = 0; i < 300 && (skyforge_jobs() != "" || !processes_under(root_).empty()); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(skyforge_jobs(), "") << "the job ended once its workers had left";
  EXPECT_TRUE(processes_under(root_).empty());
}

}  // namespace
}  // namespace skyforge::test
