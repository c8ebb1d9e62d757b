// The `slurm` provider: a pool allocated as one Slurm job. `sbatch` holds the allocation (its
// batch script watches the pool's steps and cleans the nodes when they are gone), the host's
// files reach the nodes with `sbcast` (no shared filesystem assumed), and each node runs one job
// step (`srun --overlap -w <node>`) that bootstraps it and then runs its worker (the agent of
// providers/common/node_session.hpp). Every exit path ends in `scancel`. See docs/providers.md.
//
// The class is usable without the plugin glue (tests drive it directly); plugin.cpp registers it.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <skyforge/sdk.hpp>

#include "session_provider.hpp"
#include "spawn.hpp"

namespace skyforge::slurm {

struct SlurmConfig {
  std::string partition, time_limit, account, qos, constraint, gres;
  std::vector<std::string> extra_sbatch_args;
  int queue_timeout_s = 600;
  uint32_t spare_nodes = 0;  // allocated beside the pool's (with --no-kill): a lost node moves to one
  std::string stage_dir = "/tmp";  // on every node: the pool's directory goes under it
  std::string control_address;

  // From the plugin's options. Throws Error(SF_ERR_INVALID) naming the option.
  static SlurmConfig from(const Options& options);
};

// The sbatch command line that allocates the pool (what `provision` runs), without the program.
std::vector<std::string> sbatch_args(const SlurmConfig& c, uint32_t nodes, const std::string& pool_id,
                                     const std::string& batch_script);

// The shell program (for `sh -c PROGRAM sh POOL_DIR DIR...`) that makes the pool's directory on
// a node and the stage directories under it. The pool's directory is this user's alone (0700):
// one that is there already and is not (made by another user who read the pool id in squeue, or
// a symlink) is refused, so nobody else can swap a staged file before the job runs it.
std::string stage_dirs_program();

// "NodeName=n1 ... NodeAddr=10.0.0.2 ..." lines (`scontrol -o show node`) → name → address.
std::map<std::string, std::string> node_addresses(const std::string& scontrol_output);

// A node: one Slurm node of the allocation.
struct SlurmNode : providers::SessionNode {
  std::string name, address;
};

class SlurmProvider : public providers::SessionProvider<SlurmNode> {
 public:
  explicit SlurmProvider(const Context& ctx);
  ~SlurmProvider() override;

  Provisioned provision(const PoolSpec& spec) override;
  void bootstrap(const std::string& node_id, const std::string& script, sf_sink log) override;
  // Empty list: everything. Once no node is left: the nodes cleaned in one last step, scancel.
  void terminate(const std::vector<std::string>& node_ids) override;
  // A node whose Slurm node is gone moves, under the same id, to a spare node of the allocation
  // (`spare_nodes`); bootstrap follows. SF_ERR_UNSUPPORTED when no spare is left.
  std::string replace_node(const std::string& node_id) override;

  const SlurmConfig& config() const { return config_; }
  std::string job_id() const;

 private:
  using Node = SlurmNode;

  std::string where(const Node& n) const override;
  std::string program(const std::string& name) const;
  providers::CommandResult slurm(const std::string& tool, const std::vector<std::string>& args,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
  std::string pool_dir() const;  // on the nodes
  void stage();                  // sbcast the host's files, once
  void cancel_job(std::vector<std::string>& problems);

  SlurmConfig config_;
  std::string pool_id_;
  std::vector<std::string> stage_files_;
  // Under mu_, with nodes_:
  std::string job_;  // "" until sbatch answered; cleared once cancelled
  std::vector<std::pair<std::string, std::string>> spares_;  // (name, address) of unused spare nodes
  std::vector<std::string> lost_names_;  // Slurm nodes a pool node was moved away from
  std::mutex stage_mu_;
  bool staged_ = false;
};

}  // namespace skyforge::slurm
