// Faulty training runs, shared by the fault tests of every provider (label `faults`): the main
// job's MLP with a checkpoint schedule and [job] max_restarts, waiting for a checkpoint, and
// finding a node's worker process to kill (docs/training.md, "Surviving a lost node").
#pragma once

#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <regex>
#include <string>
#include <thread>

#include "process.hpp"
#include "provider_e2e.hpp"

namespace skyforge::test {

// The main job's MLP on 2 nodes of `pool` (a [pool] table and what follows it), `epochs` short
// epochs, a checkpoint every `checkpoint_every`; history and checkpoints under `out`.
inline std::string faulty_training(const std::string& pool, int max_restarts, const std::filesystem::path& out,
                                   int epochs, const std::string& checkpoint_every = "\"epoch\"") {
  return pool + "\n[job]\nmax_restarts = " + std::to_string(max_restarts) +
         "\n\n[[plugins]]\nname = \"keras\"\nbackend = \"cpu\"\nseed = 42\n\n"
         "[train]\ndataset = \"fashion-mnist\"\noptimizer = \"adam\"\nlearning_rate = 1e-3\nbatch_size = 64\nthreads = 1\n"
         "epochs = " + std::to_string(epochs) + "\nsteps_per_epoch = 900\nevaluate = false\n"
         "history = \"" + (out / "history.csv").string() + "\"\ncheckpoint = \"" + (out / "ckpt").string() +
         "\"\ncheckpoint_every = " + checkpoint_every + "\n"
         "\n[[train.layers]]\ntype = \"flatten\"\n\n[[train.layers]]\ntype = \"dense\"\nunits = 128\nactivation = \"relu\"\n\n"
         "[[train.layers]]\ntype = \"dense\"\nunits = 10\n";
}

// The uninterrupted run a faulty one is compared with: the same training (4 epochs) on 2 local
// nodes, history under `ref`.
inline std::string local_reference(const std::filesystem::path& ref) {
  return faulty_training("[pool]\nprovider = \"local\"\nnodes = 2\n", 0, ref, 4);
}

// Waits until `latest` names the checkpoint of `epoch` or a later one (the training is then
// past it). `latest` is the commit point: write_checkpoint renames ckpt-<epoch>.bin into place
// and then `latest`, and a worker that dies between the two (its host SIGKILLed: the worker
// goes the moment its connection drops) leaves a run that resumes from the checkpoint before.
inline bool wait_checkpoint(const std::filesystem::path& out, int epoch, double timeout_s = 120) {
  const std::filesystem::path latest = out / "ckpt" / "latest";
  for (auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
       std::chrono::steady_clock::now() < until;) {
    unsigned named = 0;  // ckpt-<E>.bin or, mid-epoch, ckpt-<E>-<steps>.bin: E epochs done
    if (std::sscanf(read_text(latest).c_str(), "ckpt-%u", &named) == 1 && named >= static_cast<unsigned>(epoch))
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

// The worker process of `node` among the processes working under `dir` (its argv has "--node N").
inline pid_t worker_of(const std::filesystem::path& dir, int node) {
  for (pid_t p : processes_under(dir)) {
    if (comm_of(p) != "skyforge-worker") continue;
    const std::string args = read_text("/proc/" + std::to_string(p) + "/cmdline");
    if (args.find(std::string("--node") + '\0' + std::to_string(node) + '\0') != std::string::npos) return p;
  }
  return 0;
}

// SIGKILLs the worker of `node` among the processes working under `dir`.
inline void kill_worker_of(const std::filesystem::path& dir, int node) {
  const pid_t w = worker_of(dir, node);
  ASSERT_GT(w, 0) << "no worker of node " << node << " under " << dir;
  ASSERT_EQ(::kill(w, SIGKILL), 0);
}

// The faulty run `o` (history under `out`) ended as the uninterrupted run `reference` (history
// under `ref`): the same weights on both nodes, to the bit, and the same history.
inline void expect_ends_as(const Output& reference, const std::filesystem::path& ref, const Output& o,
                           const std::filesystem::path& out) {
  const std::string weights = json_field(reference.out, 0, "weights_fnv1a64");
  ASSERT_FALSE(weights.empty()) << reference.out;
  EXPECT_EQ(json_field(o.out, 0, "weights_fnv1a64"), weights) << o.out;
  EXPECT_EQ(json_field(o.out, 1, "weights_fnv1a64"), weights) << o.out;
  EXPECT_EQ(read_text(out / "history.csv"), read_text(ref / "history.csv"));
}

// Prints what the host said of node 1's replacement at restart 1/1, and the figures in it.
inline void print_replacement(const std::string& err) {
  std::smatch m;
  for (const char* say : {"cannot take a worker .*"})
    if (std::regex_search(err, m, std::regex(std::string("restart 1/1: node 1 ") + say))) std::cerr << "[ said ] " << m[0] << "\n";
  for (const char* figure : {"restart 1/1: node 1 replaced: .*", "restart 1/1: every node ready again in \\d+ ms"})
    if (std::regex_search(err, m, std::regex(figure))) std::cerr << "[ figure ] " << m[0] << "\n";
}

}  // namespace skyforge::test
