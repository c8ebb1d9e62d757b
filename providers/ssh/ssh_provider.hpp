// The `ssh` provider: a pool on hosts the user already has, reached with the user's own OpenSSH
// client (so ~/.ssh/config, agents and jump hosts work), one multiplexed connection per host
// (ControlMaster). See docs/providers.md for what it leaves on a host and how it is cleaned up.
//
// On this machine: one private directory, $TMPDIR/skyforge-ssh-XXXXXX (mkdtemp: 0700, ours), holds
// the masters' control sockets h<i>; a socket is used only when it, and that directory, pass
// check_control_socket(). The directory goes at teardown, and with a helper process (which waits
// on a pipe from this one) when this process dies any other way.
//
// On each host, under remote_dir (default ~/.skyforge; all of it 0700, made under umask 077):
//   store/<sha256>-<mode>          the host's files, content-addressed: kept between runs, so a
//                                  second run copies nothing that is already there
//   pools/<pool_id>/node-<i>/      node i's work directory: .stage/ (the host's files under their
//                                  absolute paths, links into store/), bootstrap.sh, *.pid;
//                                  removed by the worker when it leaves and by terminate
//
// The class is usable without the plugin glue (tests drive it directly); plugin.cpp registers it.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <skyforge/sdk.hpp>

#include "session_provider.hpp"
#include "spawn.hpp"

namespace skyforge::ssh {

// One entry of `hosts`: "[user@]host[:port]", with "[v6 address]:port" for IPv6.
struct HostSpec {
  std::string text;  // as written
  std::string user;  // empty: the `user` option, else ssh's own choice
  std::string host;
  int port = 0;      // 0: ssh's own choice (~/.ssh/config, else 22)
};
// Throws Error(SF_ERR_INVALID) naming the entry and what was expected.
HostSpec parse_host(const std::string& text);

struct SshConfig {
  std::vector<HostSpec> hosts;
  std::string user;
  std::string identity_file;
  std::string ssh_config;        // -F: a client configuration used instead of ~/.ssh/config
  std::string known_hosts_file;  // UserKnownHostsFile
  uint32_t slots_per_host = 1;
  std::string remote_dir = "~/.skyforge";
  std::string control_address;
  std::string strict_host_keys = "yes";  // "yes" | "accept-new"
  int connect_timeout_s = 15;

  // From the plugin's options. Throws Error(SF_ERR_INVALID) naming the option.
  static SshConfig from(const Options& options);
};

// A remote path as shell words for the remote user's shell: "~/x" and relative paths are under
// "$HOME", others are quoted as they are.
std::string remote_path_words(const std::string& path);

// A ControlMaster socket may be used only when this says so. `path` must be a unix socket (lstat:
// never a link to one) owned by `uid` with no group or other permission bits, in a directory
// (lstat too) owned by `uid` with mode 0700. exists = false and no problem: the directory is fine
// and nothing is at `path` yet. A problem names the path and what was found.
struct ControlSocketCheck {
  bool exists = false;
  std::string problem;  // "" when the socket (or its absence) may be trusted
};
ControlSocketCheck check_control_socket(const std::string& path, uid_t uid);

// A new private directory for control sockets under `parent` ("skyforge-ssh-XXXXXX", mkdtemp),
// checked as check_control_socket checks one. Throws Error naming it.
std::string make_control_dir(const std::string& parent);

// What a host runs, as `uname -m` and glibc report it.
struct Platform {
  std::string machine;  // "x86_64"
  std::string glibc;    // "2.36"
};
Platform local_platform();
// "" when skyforge built on `here` runs on `there`; otherwise why not, with both named.
std::string platform_mismatch(const Platform& here, const Platform& there);

// A host of the pool and its ControlMaster connection.
struct SshHost {
  size_t index = 0;  // in `hosts`
  HostSpec spec;
  std::string control_path;
  pid_t master = -1;
  std::string address;  // the host's address, as it saw this connection arrive
  std::set<std::string> missing;  // store keys it lacked when checked
  std::mutex stage_mu;
  bool staged = false;
  bool lost = false;  // a node of it was replaced: it takes no other
};

// A node: a slot of a host.
struct SshNode : providers::SessionNode {
  SshHost* host = nullptr;
};

class SshProvider : public providers::SessionProvider<SshNode> {
 public:
  explicit SshProvider(const Context& ctx);
  // With a configuration made by another provider (aws: the instances it made).
  SshProvider(const Context& ctx, SshConfig config);
  ~SshProvider() override;

  Provisioned provision(const PoolSpec& spec) override;
  void bootstrap(const std::string& node_id, const std::string& script, sf_sink log) override;
  // Empty list: everything this instance made.
  void terminate(const std::vector<std::string>& node_ids) override;
  // Node `node_id`'s host is gone: the node moves, under the same id, to a host in `hosts` with a
  // free slot (one already in the pool, else the first listed one not used yet), connected and
  // checked as in provision(). Returns its address; bootstrap and start_worker follow.
  std::string replace_node(const std::string& node_id) override;
  // One more host for `hosts` (aws: a replacement instance), for replace_node to move a node to.
  void add_host(const std::string& text);

  // ---- introspection (tests, diagnostics) ----
  const SshConfig& config() const { return config_; }
  std::string node_dir_words(const std::string& node_id) const;  // the remote work directory, as shell words
  size_t files_copied() const;  // files sent to the hosts' stores by this instance

 private:
  struct StageFile {
    std::string path;  // absolute, on this machine
    std::string key;   // <sha256>-<mode>: its name in the hosts' stores
    unsigned mode = 0644;
  };
  using Host = SshHost;
  using Node = SshNode;

  std::string where(const Node& n) const override;
  std::string session_lost(const Node& n) const override;

  std::vector<std::string> ssh_args(const Host& h, bool master) const;
  // Runs `script` on the host with `sh -s` (its text on stdin). Throws Error naming the host.
  std::string remote_sh(const Host& h, const std::string& script, const std::string& what) const;
  void start_master(Host& h);
  void check_host(Host& h, const Platform& here);
  void stage_host(Host& h);
  std::string describe(const Host& h) const;
  std::string cleanup_script(const std::vector<const Node*>& nodes) const;
  std::string pool_words() const;
  std::string control_path(size_t host_index) const;  // in control_dir_
  void ensure_control_dir();
  // Throws Error naming the host when its control socket is there but not to be trusted.
  void require_safe_socket(const Host& h) const;
  void remove_control_dir();

  SshConfig config_;
  std::string ssh_;  // the ssh program
  std::string pool_id_;
  std::vector<StageFile> stage_;
  std::vector<std::unique_ptr<Host>> hosts_;  // under mu_, as nodes_
  size_t copied_ = 0;
  std::string control_dir_;  // "" until the first master
  providers::Fd cleaner_;    // the write end of the pipe the directory's cleaner waits on
  pid_t cleaner_pid_ = -1;
};

}  // namespace skyforge::ssh
