// skyforge-worker: runs on every node. Connects back to the host, proves the pool secret,
// receives its job, loads the same plugins, enters around_app hooks in manifest order, runs
// the app (native, command or task loop), exits the hooks in reverse order, reports, and
// leaves. It holds a lease on the host: no frame from the host for lease_ms and it kills
// what it started, removes its work directory and exits (dead-man switch).
#pragma once

#include <cstdint>
#include <string>

namespace skyforge {

struct WorkerArgs {
  std::string host;
  uint16_t port = 0;
  uint32_t node = 0;
  std::string address;     // this node's address (the head binds its store there)
  std::string secret;      // from $SKYFORGE_POOL_SECRET, never argv
  std::string work_dir;    // defaults to the current directory
  bool remove_work_dir = false;  // on a dead-man exit, remove work_dir (nobody else will)
  int lease_ms = 5000;
  int heartbeat_ms = 500;
};

// Returns the process exit code.
int worker_main(const WorkerArgs& args);

}  // namespace skyforge
