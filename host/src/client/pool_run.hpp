// The pool run behind run_job() (run.hpp), as one object: its phases in order (run.cpp), what the
// io thread hands it — the workers' frames, their connections' ends, signals — and a map job's
// scheduling (run_events.cpp). Its rooms: the state they share (run_state.hpp, node_table.hpp),
// restarts and node replacement (recovery.hpp), the collective watchdog (watchdog.hpp), the
// terminal (run_output.hpp), a map job's task backend (task_driver.hpp).
#pragma once

#include <unistd.h>

#include <boost/asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "catalog.hpp"
#include "client_hooks.hpp"
#include "loader.hpp"
#include "manifest.hpp"
#include "outputs_receive.hpp"
#include "protocol.hpp"
#include "recovery.hpp"
#include "run.hpp"
#include "run_output.hpp"
#include "run_state.hpp"
#include "services.hpp"
#include "task_driver.hpp"

namespace skyforge {

class PoolRun final : private Recovery::Pool {
 public:
  PoolRun(const Manifest& m, const Catalog& c, const RunOptions& o);
  int run();  // the exit code

 private:
  using Clock = std::chrono::steady_clock;

  // phases (run.cpp)
  void load_plugins();
  void client_enter();  // the cluster and image, then the framework plugins' client hooks
  void provision();
  std::string worker_path() const;
  void bootstrap_nodes();
  std::string bootstrap_node(uint32_t node) override;  // "" or why it failed
  void start_workers();  // the control server, then a worker on every node
  void launch_worker(uint32_t node) override;
  void wait_joined();
  void send_jobs();
  void wait_ready();
  void rejoin() override {  // after a restart
    wait_joined();
    send_jobs();
    wait_ready();
  }
  void execute();
  void teardown();
  sf_status terminate_nodes();  // provider.terminate for every node made so far
  int report();
  const PluginInstance& provider() const override { return *provider_; }

  // the io thread's callbacks (run_events.cpp); `gen` is the worker generation the connection
  // belongs to (Recovery::generation)
  void on_authenticated(std::shared_ptr<net::Connection> c);
  void on_frame(uint32_t node, uint64_t gen, msg::Type t, std::string&& payload);
  void on_log(uint32_t node, msg::Log&& l, std::unique_lock<std::mutex>& lock);  // unlocks
  void on_closed(uint32_t node, uint64_t gen, const std::string& reason);
  void on_signal(int sig);
  // map scheduling (under mu)
  void dispatch(uint32_t node);
  void on_results(uint32_t node, msg::TaskResults&& r);

  const Manifest& m_;
  const Catalog& catalog_;
  RunOptions opt_;
  Printer printer_{::isatty(2) == 1};  // a live status line on a terminal
  RejectionLog rejections_{[this](const std::string& line) { printer_.err(line); }};
  Services services_;
  Loader loader_{services_.table()};
  std::unique_ptr<PluginInstance> provider_;
  std::vector<std::unique_ptr<PluginInstance>> frameworks_;
  ClientHooks client_hooks_{frameworks_};
  const LoadedPlugin* app_ = nullptr;
  sf_cluster cluster_{};
  std::string pool_id_ = net::random_hex(6);
  std::string secret_ = net::random_hex(32);
  std::vector<std::string> bootstrap_lines_;
  Image image_;
  std::string script_;  // the nodes' bootstrap script

  boost::asio::io_context io_;
  std::unique_ptr<net::Server> server_;
  std::string control_address_ = "127.0.0.1";

  RunState st_;
  bool provisioned_ = false;               // under st_.mu
  std::atomic<bool> provisioning_{false};  // provision() is running: a first signal cancels it
  int signal_exit_ = 0;
  Recovery recovery_{st_, m_, opt_.lease_ms, printer_, *this};

  // The job's files, as the nodes send them at the run's end (docs/manifest.md, "Getting files back").
  OutputsReceiver outputs_{outputs_dir(m_, opt_, pool_id_), m_.job.outputs_max_bytes, m_.pool.nodes,
                           [this](const std::string& line) { printer_.err(line); }};

  std::unique_ptr<PluginInstance> task_backend_;  // a map job's ([tasks] backend)
  std::optional<TaskDriver> tasks_;

  // --timings
  Clock::time_point t0_ = Clock::now();
  std::vector<std::pair<std::string, double>> phases_;
  void mark(const std::string& phase) {
    phases_.emplace_back(phase, std::chrono::duration<double, std::milli>(Clock::now() - t0_).count());
  }
};

}  // namespace skyforge
