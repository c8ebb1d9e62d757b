// The Worker behind worker_main() (worker.hpp): one node's part of a job, its state and its
// methods, which live by concern in
//   worker.cpp           the job's sequence: join the pool, wait for the Job, run, report, leave;
//                        the host's frames; the worker's end (lost host, Shutdown deadline)
//   worker_job.cpp       the job through the plugins: their setup and hooks, the command, the
//                        native app's run() or a map job's task loop, the communicator
//   worker_progress.cpp  what the host hears besides results: status lines and Progress frames,
//                        and the provider's lease file
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "communicator.hpp"
#include "env.hpp"
#include "loader.hpp"
#include "output_pump.hpp"
#include "protocol.hpp"
#include "services.hpp"
#include "store.hpp"
#include "worker.hpp"

namespace skyforge {

class Worker {
 public:
  explicit Worker(const WorkerArgs& a)
      : args_(a), services_([this](int32_t level, const std::string& m) { on_log(level, m); }) {}

  int run();

 private:
  // worker.cpp
  void on_frame(msg::Type type, std::string&& payload);
  void on_close(const std::string& reason);
  void send_log(int stream, std::string text);
  bool wait_job();
  void dead_man(const std::string& reason);
  void arm_stop_deadline(const std::string& reason);  // io thread, on the host's Shutdown
  std::chrono::milliseconds stop_grace() const;
  void leave_async();
  [[noreturn]] void leave();
  void make_output_dir();   // SKYFORGE_OUTPUT_DIR
  void send_job_outputs();  // after the run's final Shutdown
  // worker_job.cpp
  EnvMap job_env() const;  // the environment the job's app or command sees
  void setup_plugins(EnvMap& env);
  msg::RunResult run_app(EnvMap& env);
  int run_command(const std::vector<std::string>& argv, const EnvMap& env);
  void run_tasks();
  // around_app_exit of every entered plugin, in reverse; the failures, in call order.
  std::vector<std::string> exit_hooks(bool ok);
  std::shared_ptr<const sf_communicator> make_communicator();
  // worker_progress.cpp
  void on_log(int32_t level, const std::string& m);  // a plugin's log line (Services)
  void renew_lease_file();
  void report_progress();  // msg::Progress every heartbeat interval, once there is a communicator or a status
  void send_progress();    // one msg::Progress now (io thread)
  void send_status_at(std::chrono::steady_clock::time_point due);  // a status held back, at `due` (io thread)

  WorkerArgs args_;
  boost::asio::io_context io_;
  std::thread io_thread_;
  std::shared_ptr<net::Connection> conn_;
  std::unique_ptr<net::StoreServer> store_server_;
  Services services_;
  std::unique_ptr<Loader> loader_;
  std::vector<std::unique_ptr<PluginInstance>> frameworks_;  // [[plugins]] but compute backends
  std::vector<std::unique_ptr<PluginInstance>> compute_backends_;  // creation order
  PluginInstance* selected_backend_ = nullptr;  // of compute_backends_: the job's compute.backend
  size_t entered_ = 0;
  std::unique_ptr<PluginInstance> app_;
  sf_instance_info info_{};

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<msg::Job> job_;
  std::deque<msg::TaskBatch> batches_;
  std::atomic<size_t> queued_{0};  // batches_.size(), readable without mu_
  std::atomic<uint64_t> failed_tasks_{0};  // map jobs: tasks on this node that failed
  bool shutdown_ = false;
  std::atomic<bool> finishing_{false};
  std::atomic<int32_t> min_log_level_{SF_LOG_INFO};  // plugin logs below this stay on the node (debug: -v)
  // SKYFORGE_LEASE_FILE (a provider's dead-man switch, e.g. aws): touched every few seconds
  // while this worker holds the host's lease, aged to the epoch the moment it loses it.
  std::string lease_file_;
  std::unique_ptr<boost::asio::steady_timer> lease_timer_;
  // The job's communicator, for report_progress() (set by make_communicator()).
  std::mutex comm_mu_;
  std::shared_ptr<GlooCommunicator> comm_;
  std::unique_ptr<boost::asio::steady_timer> progress_timer_;
  // The app's last status line (SF_LOG_STATUS): where it is ("epoch 3/6, step 412/900").
  std::mutex status_mu_;
  std::string status_;
  static constexpr std::chrono::milliseconds kStatusEvery{100};
  std::chrono::steady_clock::time_point status_sent_{};
  bool status_due_ = false;  // a status waits for send_status_at
  std::unique_ptr<boost::asio::steady_timer> status_timer_;
  // After the host's Shutdown: a command gets stop_grace() after SIGTERM, then SIGKILL; a
  // native app that has not returned by then is left behind (the process ends).
  std::unique_ptr<boost::asio::steady_timer> stop_timer_;
  std::atomic<bool> ending_{false};  // claimed by whichever ends the worker: its normal end, or leave()
  std::atomic<const char*> phase_{"the job's setup"};  // what the main thread is doing, for leave()'s message
  OutputWindow out_window_{msg::kOutputWindow};  // the host's flow control of the job's output (msg::OutputAck)
  OutputWindow files_window_{msg::kOutputsWindow};  // ... and of the job's files (msg::OutputsAck)
  std::atomic<bool> send_outputs_{false};  // the last Shutdown was the run's end, not a restart
};

}  // namespace skyforge
