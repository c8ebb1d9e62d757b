// [job] max_restarts: what the pool run does instead of failing when a node is lost. Every worker
// starts again on its node (same ranks, a new rendezvous store and communicator, the job sent
// again with job.restart = K so that a train job resumes from its last checkpoint), and a node
// whose machine is gone gets another from its provider (ABI 1.7 replace_node). A node whose app
// failed is held for a moment first: a peer's loss makes the others' collectives fail too, and
// that loss may not have been seen yet. Not for map jobs (their task backend decides).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loader.hpp"
#include "manifest.hpp"
#include "run_output.hpp"
#include "run_state.hpp"

namespace skyforge {

class Recovery {
 public:
  using Clock = std::chrono::steady_clock;

  // What a restart asks of the pool run: its provider, and the phases it runs again. Called
  // without the run's mutex; the phases throw when they fail.
  class Pool {
   public:
    virtual const PluginInstance& provider() const = 0;
    virtual std::string bootstrap_node(uint32_t node) = 0;  // "" or why it failed
    virtual void launch_worker(uint32_t node) = 0;          // PluginError as the provider said
    virtual void rejoin() = 0;  // every worker joined, sent its job and ready again

   protected:
    ~Pool() = default;
  };

  // All outlive the recovery. `lease_ms`: the control connections' lease.
  Recovery(RunState& state, const Manifest& m, int lease_ms, Printer& printer, Pool& pool)
      : state_(state), m_(m), lease_ms_(lease_ms), printer_(printer), pool_(pool) {}

  // Under the run's mutex:
  // The workers' generation: a restart starts a new one, and what the old connections still
  // say is ignored.
  uint64_t generation() const { return generation_; }
  uint32_t restarts_used() const { return restarts_used_; }
  bool stopping() const { return stopping_; }  // the workers were told to stop: their connections end
  // A node's app failed with `why`: the run fails, or the failure is held while a restart may come.
  void app_failed(const std::string& why);
  // A node was lost (`lost` says how): a restart is asked for, or the run fails, said at once.
  void node_lost(const std::string& lost);
  bool restart_asked() const { return restart_.has_value(); }
  bool held_failure_due(Clock::time_point now) const { return held_ && now - held_->at >= kHoldFailure; }
  void fail_held();  // the run ends: a held failure is its verdict

  // Without the run's mutex: every worker stops (the lost one is gone already) and a new one
  // starts on every node, on another machine where its own is gone. The nodes themselves stay.
  // Throws when a worker does not stop or cannot start again.
  void restart();

 private:
  bool can_restart() const;
  // Node `node`'s machine is gone: the provider gives it another, which is bootstrapped and gets
  // its worker. Throws when it cannot.
  void replace_node(uint32_t node, uint32_t restart, const std::string& why);
  // Waits until every worker is gone: its connection closed, and (where the provider can tell)
  // its process ended. Returns the nodes whose workers are out of reach, to be replaced; nothing
  // when the run failed meanwhile.
  std::optional<std::vector<uint32_t>> wait_stopped(uint32_t restart, Clock::time_point since);
  std::string label(uint32_t restart) const;  // "restart K/N"

  RunState& state_;
  const Manifest& m_;
  int lease_ms_;
  Printer& printer_;
  Pool& pool_;

  uint64_t generation_ = 0;
  uint32_t restarts_used_ = 0;
  bool stopping_ = false;
  std::optional<std::string> restart_;  // why: the first loss since the last restart
  struct HeldFailure {
    std::string why;
    Clock::time_point at;
  };
  std::optional<HeldFailure> held_;
  static constexpr std::chrono::milliseconds kHoldFailure{2000};
};

}  // namespace skyforge
