// `skyforge run`: provision a pool through the provider, bootstrap it, start a worker per
// node, run the job, stream output, gather results and always tear the pool down.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "bootstrap_script.hpp"  // bootstrap_script(), still part of this interface
#include "catalog.hpp"
#include "manifest.hpp"

namespace skyforge {

struct RunOptions {
  std::string worker_path;      // skyforge-worker; default: beside this executable
  int join_timeout_ms = 60000;  // bootstrap done -> every worker connected and ready
  int lease_ms = 4000;          // a node silent this long is declared lost
  int heartbeat_ms = 400;
  bool verbose = false;
  bool quiet_results = false;   // do not print per-task results (benchmarks)
  int pipeline = 2;              // map: batches in flight per slot
  bool timings = false;         // print phase timings and map batch round trips on stderr
  bool resume = false;          // --resume: the job is told to go on from its last checkpoint (job.resume)
  std::string outputs_dir;      // --outputs DIR: where the job's files go, over [job] outputs_dir
  // --env NAME: variables of this process's environment added to every node's job environment
  // (as [image] env, never written anywhere: a secret passes by name, not on a command line).
  std::map<std::string, std::string> env;
  // Sees each chunk of node output (stream 1 stdout, 2 stderr, 3 worker log) before the output
  // policy; returning true consumes it (nothing is printed). `skyforge env` captures with it.
  std::function<bool(uint32_t node, int stream, const std::string& text)> output_filter;
};

// Exit codes of `skyforge run`.
constexpr int kExitOk = 0;
constexpr int kExitJobFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInterrupted = 130;

// Runs a validated manifest. Returns the process exit code.
int run_job(const Manifest& manifest, const Catalog& catalog, const RunOptions& options);

}  // namespace skyforge
