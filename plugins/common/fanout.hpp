// Several processes per node, for every framework plugin (pure: no I/O, no SDK).
//
// A framework's `launcher` hook may only rewrite the command's argv; the environment of the
// command is fixed in around_app_enter. So "nproc processes per node" is a tiny POSIX-sh
// launcher put in front of the command (fanout_argv), driven by three variables the plugins
// export in around_app_enter:
//
//   SKYFORGE_FANOUT_NPROC    how many copies of the command to start (>= 1)
//   SKYFORGE_FANOUT_ADD      names of integer variables to which the copy's index i is added
//                            (torch: "RANK LOCAL_RANK ROLE_RANK", jax: "JAX_PROCESS_ID")
//   SKYFORGE_FANOUT_DEVICES  optional, space-separated: copy i gets the i-th word (modulo the
//                            count) as CUDA_VISIBLE_DEVICES (the mig plugin fills it)
//
// Every copy also gets SKYFORGE_LOCAL_PROC=i. The copies share the node's stdout/stderr. The
// launcher exits with the status of the first copy that fails, after sending SIGTERM to the
// others, or 0 once every copy succeeded — the same contract as torchrun. Copies still running
// 30 s after that SIGTERM are SIGKILLed with the launcher itself (the command then dies of
// signal 9). Stopping uses `kill 0`, so it happens only when the launcher leads its own process
// group, as the worker starts every command; elsewhere a failure waits for the others.
// Wrapping is idempotent: two plugins asking for it produce one launcher, and the count is read
// when the launcher starts, so every plugin agrees on one number.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace skyforge::fw {

inline constexpr const char* kFanoutName = "skyforge-fanout";  // $0 of the launcher
inline constexpr const char* kFanoutNproc = "SKYFORGE_FANOUT_NPROC";
inline constexpr const char* kFanoutAdd = "SKYFORGE_FANOUT_ADD";
inline constexpr const char* kFanoutDevices = "SKYFORGE_FANOUT_DEVICES";

// The launcher's POSIX sh source.
const std::string& fanout_script();

// True when argv already is the launcher.
bool is_fanout(const std::vector<std::string>& argv);

// {"sh", "-c", fanout_script(), "skyforge-fanout", argv...}; argv itself when already wrapped.
std::vector<std::string> fanout_argv(std::vector<std::string> argv);

// The command the launcher (or a plugin) would run, without a launcher around it.
std::vector<std::string> unwrap_fanout(const std::vector<std::string>& argv);

// torchrun, `python -m torch.distributed.run` or `python -m torch.distributed.launch`: a
// launcher that starts nproc_per_node processes itself (from PET_NPROC_PER_NODE).
bool is_torchrun(const std::vector<std::string>& argv);

// `accelerate launch ...` (or `python -m accelerate.commands.launch ...`).
bool is_accelerate_launch(const std::vector<std::string>& argv);

// Space-separated word lists (SKYFORGE_FANOUT_ADD): `list` plus each of `words` not in it.
std::string add_words(std::string_view list, const std::vector<std::string>& words);
std::vector<std::string> split_words(std::string_view list);

}  // namespace skyforge::fw
