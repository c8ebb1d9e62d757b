// The `aws` provider: a pool of EC2 instances made for one job and gone after it (Ec2Pool),
// reached and run over SSH exactly as the `ssh` provider runs hosts (SshProvider, given the
// instances' addresses and the pool's key). docs/providers.md, "aws".
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <skyforge/sdk.hpp>

#include "ec2_pool.hpp"
#include "ssh_provider.hpp"

namespace skyforge::aws {

class AwsProvider : public Provider {
 public:
  explicit AwsProvider(const Context& ctx);
  ~AwsProvider() override;

  Provisioned provision(const PoolSpec& spec) override;
  void bootstrap(const std::string& node_id, const std::string& script, sf_sink log) override;
  void start_worker(const std::string& node_id, const std::vector<std::string>& argv,
                    const std::map<std::string, std::string>& env) override;
  void terminate(const std::vector<std::string>& node_ids) override;
  int worker_alive(const std::string& node_id) override;
  int worker_exit(const std::string& node_id, WorkerExit& out) override;
  void cancel() override;
  std::vector<std::string> reconcile(bool terminate) override;
  std::string offers(const std::string& accelerator) override;
  // The node's instance is gone (a spot interruption, a machine powered off): it is terminated
  // for good, another is launched like it, and the node moves there (bootstrap follows).
  std::string replace_node(const std::string& node_id) override;

 private:
  ssh::SshProvider& ssh(const char* op);
  std::unique_ptr<Ec2Client> make_client(ClientOptions copt = {});
  // Where the offers come from: the offers_file option, else the file beside this plugin.
  std::string offers_path() const;
  // The region for offers: the option, else AWS_REGION / AWS_DEFAULT_REGION; "" for all.
  std::string offers_region() const;
  // `instances[i]` is node first_node + i.
  void wait_for_sshd(const std::vector<InstanceView>& instances, uint32_t first_node = 0);

  Context ctx_;
  std::string known_hosts_;  // the pool's own (provision)
  AwsOptions opt_;
  int ssh_timeout_s_ = 300;
  std::string offers_file_;
  std::chrono::steady_clock::time_point requested_;  // provision() began: the elapsed times shown
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::unique_ptr<Ec2Pool> pool_;
  std::unique_ptr<ssh::SshProvider> ssh_;
  std::map<std::string, std::string> instance_of_;  // node id -> instance id
};

}  // namespace skyforge::aws
