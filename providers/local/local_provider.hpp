// The `local` provider: a pool of N nodes on this machine. Each node is a private work
// directory (and, with isolation = "netns", its own network namespace and address); its worker
// is a child process of the host in a session of its own. See docs/providers.md.
//
// The class is usable without the plugin glue (tests drive it directly); plugin.cpp registers it.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <skyforge/sdk.hpp>

namespace skyforge::local {

class NetnsPool;

enum class Isolation { none, netns };

struct LocalConfig {
  Isolation isolation = Isolation::none;
  std::filesystem::path work_root;  // where pool directories go
  bool keep_workdirs = false;

  // From the plugin's options (isolation, work_root, keep_workdirs). Throws Error(SF_ERR_INVALID).
  static LocalConfig from(const Options& options);
};

class LocalProvider : public Provider {
 public:
  explicit LocalProvider(const Context& ctx);
  ~LocalProvider() override;

  Provisioned provision(const PoolSpec& spec) override;
  void bootstrap(const std::string& node_id, const std::string& script, sf_sink log) override;
  void start_worker(const std::string& node_id, const std::vector<std::string>& argv,
                    const std::map<std::string, std::string>& env) override;
  // Empty list: everything this instance made. Unknown ids are ignored. Pool-wide resources
  // (bridge, pool directory) go once no node of the pool is left.
  void terminate(const std::vector<std::string>& node_ids) override;
  int worker_alive(const std::string& node_id) override;
  // Signal or exit status once the worker has been reaped, and the last line of its worker.log
  // (a worker killed by a fatal signal writes there which task of which app it was running).
  int worker_exit(const std::string& node_id, WorkerExit& out) override;

  // ---- introspection (tests, diagnostics) ----
  const LocalConfig& config() const { return config_; }
  std::filesystem::path pool_dir() const;
  std::filesystem::path node_dir(const std::string& node_id) const;
  pid_t worker_pid(const std::string& node_id) const;        // -1: none
  std::optional<int> worker_exit_code(const std::string& node_id) const;  // once reaped
  std::string netns_name(const std::string& node_id) const;  // "" without isolation
  std::string bridge_name() const;                           // "" without isolation
  std::string subnet() const;                                // "" without isolation
  // The node's cgroup (cgroup.hpp), and the pool's; empty when processes are not contained in
  // cgroups (cgroup_off_reason() says why).
  std::filesystem::path node_cgroup(const std::string& node_id) const;
  std::filesystem::path pool_cgroup() const;
  std::string cgroup_off_reason() const;

 private:
  struct Node {
    uint32_t index = 0;
    std::string id;
    std::filesystem::path dir;
    std::string address;
    std::string gpus;  // its worker's CUDA_VISIBLE_DEVICES (gpus.hpp); empty: inherited as is
    bool gpus_pci_order = false;  // indices in PCI order: CUDA_DEVICE_ORDER=PCI_BUS_ID too
    bool dir_made = false;
    bool net_made = false;
    bool gone = false;  // terminated
    pid_t worker = -1;
    bool worker_reaped = false;
    bool worker_status_known = false;  // false when someone else reaped it
    int worker_status = 0;
    std::vector<pid_t> groups;  // process groups to kill at terminate (worker, bootstraps)
    std::filesystem::path cgroup;  // its cgroup (leaves "worker" and "bootstrap"); empty: none
    int bootstraps_running = 0;
  };

  Node* find(const std::string& id);
  const Node* find(const std::string& id) const;
  Node& require(const std::string& id, const char* op);
  void reap_worker(Node& n, bool block);
  void stop_groups(std::vector<Node*>& nodes);
  void make_cgroups();  // provision(): the pool's and each node's, when cgroup v2 is usable
  // SIGKILL to what is left in a cgroup, until it is empty or kKillWait is over; reaps orphans.
  void empty_cgroup(const std::filesystem::path& dir, const Node& n);
  void reap_orphans(const std::vector<pid_t>& seen, const Node& n);
  void teardown_locked(const std::vector<Node*>& nodes, std::vector<std::string>& problems);

  LocalConfig config_;
  mutable std::mutex mu_;
  std::string pool_id_;
  std::filesystem::path pool_dir_;
  bool pool_dir_made_ = false;
  std::vector<std::unique_ptr<Node>> nodes_;  // stable addresses: bootstraps hold them unlocked
  std::unique_ptr<NetnsPool> net_;
  std::filesystem::path pool_cgroup_;  // empty: none (cgroup_why_ says why)
  std::string cgroup_why_;
};

}  // namespace skyforge::local
