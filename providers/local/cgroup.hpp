// cgroup v2 containment of a local pool's nodes (docs/providers.md, "local"): each node's
// processes (its worker, its bootstrap scripts and everything they start, `setsid` or not) live
// in a cgroup of their own, which the node's teardown kills as one (`cgroup.kill`) and removes.
//
// The cgroups are made under the host's own cgroup, on the cgroup2 mount (/sys/fs/cgroup, or
// /sys/fs/cgroup/unified on a hybrid system): pool `skyforge-<pool>-<host pid>`, in it a cgroup
// per node, in that one leaf for the worker and one for bootstraps. Processes live only in leaves
// and no controller is enabled, so the "no internal processes" rule never applies.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace skyforge::local::cgroup {

// Where this process may make cgroups: its own cgroup's directory on the cgroup2 mount. Empty,
// with `why`, when containment is off (SKYFORGE_CGROUP=off), there is no cgroup2 mount, or the
// directory (or its cgroup.procs) is not writable by this process.
std::filesystem::path usable_base(std::string& why);

// mkdir, 0755. Throws std::runtime_error naming the path.
void make(const std::filesystem::path& dir);

// The pids in `dir` and every cgroup under it.
std::vector<pid_t> procs(const std::filesystem::path& dir);

// Whether any process is left in `dir` or under it (cgroup.events "populated"); false when the
// cgroup is gone.
bool populated(const std::filesystem::path& dir);

// SIGKILL to every process in `dir` and under it: `cgroup.kill` (Linux 5.14+), else each pid of
// cgroup.procs, recursively (call again until populated() is false: a process may fork meanwhile).
void kill(const std::filesystem::path& dir);

// `sig` to every process in `dir` and under it, once.
void signal(const std::filesystem::path& dir, int sig);

// rmdir of `dir` and every cgroup under it, deepest first. "" or what could not be removed.
std::string remove(const std::filesystem::path& dir);

}  // namespace skyforge::local::cgroup
