// The EC2 half of the aws provider: the machines of one pool, made for it and gone after it
// (docs/providers.md, "aws"). The other half -- copying, bootstrap, workers -- is the ssh
// provider's, over SSH to the instances this makes (aws_provider.hpp).
//
// What a pool makes, all tagged skyforge:pool = <pool id>, skyforge:owner, and (instances)
// skyforge:expires, in the call that makes it (TagSpecifications, never a second call):
//   a key pair      skyforge-<pool id>, from a key made here with ssh-keygen (unless key_name)
//   a security group skyforge-<pool id>: SSH from ssh_cidr, everything between its members
//                    (unless security_group)
//   instances       RunInstances with MinCount = MaxCount = nodes (all or nothing), a
//                    ClientToken, InstanceInitiatedShutdownBehavior = terminate and user data
//                    that powers the machine off when its lease file goes stale (the dead-man
//                    switch, `ttl`)
// teardown() terminates the instances, waits until AWS says terminated, then deletes the group
// and the key pair; it is idempotent and safe after a partial create() or from another thread.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <skyforge/sdk.hpp>

#include "ec2_client.hpp"

namespace skyforge::aws {

struct AwsOptions {
  std::string region;   // empty: the environment's or the profile's
  std::string profile;  // empty: AWS_PROFILE, else "default"
  std::string image = "ubuntu-24.04";       // an AMI id, or a named default (named_images())
  std::vector<std::string> instance_types;  // tried in order when AWS has no capacity
  bool spot = false;
  std::string max_price;                // spot only; empty: up to the on-demand price
  std::vector<std::string> subnets;     // tried in order when AWS has no capacity; empty: the default VPC's
  std::string security_group;           // empty: one per pool
  std::string key_name;                 // empty: one per pool
  std::string identity_file;            // the private key of key_name
  std::chrono::seconds ttl{3600};       // dead-man switch: a lease file untouched this long powers it off
  std::vector<std::pair<std::string, std::string>> tags;  // extra tags on everything made
  bool use_private_ip = false;          // reach instances on their private addresses
  std::string ssh_user;                 // empty: the named image's, else "ubuntu"
  std::string ssh_cidr = "0.0.0.0/0";   // who may reach port 22 of a per-pool group
  int root_volume_gb = 0;               // 0: the image's size
  std::chrono::seconds provision_timeout{600};  // requested -> every instance running
  std::chrono::milliseconds poll_interval{2000};
  std::chrono::seconds teardown_timeout{900};   // teardown keeps retrying an API that is down this long
  std::chrono::seconds sweep_timeout{30};       // sweep() retries an API that fails (no answer, 5xx) this long, in all

  // From the plugin's options (plugin.toml). Throws Error(SF_ERR_INVALID) naming the option.
  static AwsOptions from(const Options& options);
};

// "2h", "90m", "45s", "3600" (seconds). Throws std::invalid_argument.
std::chrono::seconds parse_duration(const std::string& text);

// The pool ids skyforge makes (host/src/client/run.cpp: net::random_hex(6)) are 12 lowercase hex
// digits, and the aws provider takes no other (create()). A skyforge:pool tag read back from the
// cloud -- where anyone with the account's credentials can write one -- is trusted only when it
// is one: sweep() leaves any other resource alone, and its value never becomes a path.
inline constexpr size_t kPoolIdLength = 12;
bool is_pool_id(const std::string& id);
// A tag value as a message shows it: quoted, control and non-ASCII bytes escaped, cut at 80.
std::string shown_tag(const std::string& value);

// A pool's local state (its private key, known_hosts): `state_root`/skyforge-aws-<pool id>.
std::filesystem::path pool_state_dir(const std::filesystem::path& state_root, const std::string& pool_id);

// The state roots, the one a new pool uses first: $XDG_RUNTIME_DIR when it is set to an absolute
// path (a directory of this user's alone, 0700), then $XDG_STATE_HOME/skyforge, else
// $HOME/.local/state/skyforge. Never /tmp: a pool's name is not secret, and another local user
// could make it there first. `skyforge sweep` looks in each. Throws Error when none of those
// variables is an absolute path.
std::vector<std::filesystem::path> state_roots(const std::function<std::string(const std::string&)>& env);
// The first of state_roots(), ready for a pool's directory: a $XDG_STATE_HOME/skyforge or
// ~/.local/state/skyforge root is made (its parents as usual, itself by make_private_dir).
std::filesystem::path make_state_root(const std::function<std::string(const std::string&)>& env);
// Makes `dir` this user's own directory, mode 0700, or refuses it: mkdir(2) of the last component
// alone (never through a symlink), then lstat(2). One already there is used only when it is a real
// directory (not a symlink), owned by this user (the effective uid) and exactly 0700, inside a
// parent that others cannot write to (or a sticky one, like /tmp); anything else throws Error
// naming the path, what it is (symlink target, owner, mode) and what was expected, and nothing
// under it or where it leads is touched.
void make_private_dir(const std::filesystem::path& dir);
// What `skyforge sweep` does with the local state of a pool it swept: removes
// pool_state_dir(state_root, pool_id) when it is a real directory directly inside the state root
// (canonical paths compared), and nothing else -- never a path outside the state root, never
// through a symlink. Returns "local state DIR: removed", or "" when there was none; a pool id
// that is not one, a symlink, or anything else that is not such a directory is left alone and
// said in *refused (the path and why). Throws nothing.
std::string remove_pool_state(const std::filesystem::path& state_root, const std::string& pool_id,
                              std::string* refused);

struct NamedImage {
  const char* name;       // "ubuntu-24.04"
  const char* owner;      // the publisher's account
  const char* pattern;    // DescribeImages name filter
  const char* ssh_user;
};
const std::vector<NamedImage>& named_images();

// The newest image (CreationDate) of `owner` whose name matches `pattern`, x86_64. Throws
// std::runtime_error naming the owner and pattern when there is none.
std::string newest_image(Ec2Client& ec2, const std::string& owner, const std::string& pattern);

struct InstanceView {
  std::string id;
  std::string state;        // pending, running, shutting-down, terminated, stopping, stopped
  std::string private_ip;
  std::string public_ip;
  std::string zone;
  std::string reason;       // stateReason/message
  std::string pool;         // tag skyforge:pool
  std::string expires;      // tag skyforge:expires
  std::string launch_index;
};
// Every instance `doc` (a DescribeInstances or RunInstances response) lists.
std::vector<InstanceView> instances_of(const pugi::xml_document& doc);

inline constexpr const char* kLeaseFile = "/run/skyforge/lease";
// The user data of a pool's instances: the dead-man switch (a shell script cloud-init runs as
// root at first boot). The node's worker keeps `lease_file` fresh while it holds the host's lease
// (SKYFORGE_LEASE_FILE) and ages it to the epoch when it loses it. The lease file (0600) and its
// directory (0700) belong to `user`, the login the workers run as; a lease that is not a regular
// file of that user's, writable by it alone, counts as stale. Checked every `check_every_s`
// seconds (tests run it for real with a shorter interval and a lease path of their own).
std::string dead_man_user_data(std::chrono::seconds ttl, const std::string& user,
                               const std::string& lease_file = kLeaseFile, int check_every_s = 5);
// A login name the user data may name: [A-Za-z0-9_][A-Za-z0-9._-]*, at most 32 characters.
bool is_login_name(const std::string& name);

class Ec2Pool {
 public:
  using Log = std::function<void(const std::string&)>;
  Ec2Pool(AwsOptions options, std::unique_ptr<Ec2Client> client, std::filesystem::path state_dir, Log log);
  ~Ec2Pool();

  // Makes what the pool needs and `n` instances, and waits until each is running with the
  // address it will be reached at. Throws Error naming what failed; whatever was made is
  // recorded first, so teardown() finds it.
  std::vector<InstanceView> create(const std::string& pool_id, uint32_t n);
  // `n` more instances for the pool create() made (a lost one's replacement: nodes first_node
  // on), launched and waited for as there, with the same key, group, tags and dead-man switch.
  std::vector<InstanceView> add(uint32_t n, uint32_t first_node);
  // Terminates `ids` (every instance of the pool when empty) and waits for `terminated`; with
  // every instance, also the per-pool group and key pair. Idempotent; callable from any thread,
  // while create() runs included (create() then stops waiting and throws).
  void teardown(const std::vector<std::string>& ids = {});
  // create() stops waiting and throws "cancelled" (a first Ctrl-C).
  void cancel();
  // `skyforge sweep`: every instance, security group and key pair in the region tagged
  // skyforge:pool whose skyforge:expires has passed (groups and key pairs: only once no live
  // instance of their pool is left), terminated and deleted when `terminate`. One line each.
  // Not for a pool this object made: any Ec2Pool (with a client for the region) will do.
  // `swept_pools`: the pools whose key pair it deleted (their local state can go too).
  // A resource whose skyforge:pool tag is not a pool id (is_pool_id) is left alone and said in
  // `warnings` (the resource, the tag, why; without it, in the log). An API that fails (no
  // answer, 5xx, throttling) is tried again for up to sweep_timeout in all, then sweep throws an
  // Error saying what it tried, how often, and the last failure.
  std::vector<std::string> sweep(bool terminate, std::chrono::system_clock::time_point now,
                                 std::set<std::string>* swept_pools = nullptr,
                                 std::vector<std::string>* warnings = nullptr);

  // A transient one-line status while waiting ("aws [12 s]: node 0 running, node 1 pending"):
  // the host shows it live on a terminal (SF_LOG_STATUS).
  void set_status(Log status) { status_ = std::move(status); }
  const AwsOptions& options() const { return opt_; }
  Ec2Client& client() { return *ec2_; }
  std::string identity_file() const;  // the per-pool key, or options().identity_file
  std::string ssh_user() const;
  std::string address_of(const InstanceView& i) const;  // public or private, as use_private_ip says
  std::vector<std::string> instance_ids() const;

 private:
  void check_cancelled() const;
  void make_key_pair();
  void make_security_group();
  std::vector<InstanceView> run_instances(uint32_t n);
  std::vector<InstanceView> describe_pool_instances(bool persistent = false);  // by tag, not terminated
  pugi::xml_document persist(const std::string& action, const QueryParams& params);
  // sweep()'s calls: transient failures tried again, a second apart and more, until `give_up`.
  pugi::xml_document persist_until(const std::string& action, const QueryParams& params,
                                   std::chrono::steady_clock::time_point started,
                                   std::chrono::steady_clock::time_point give_up);
  // `ids[i]` is node first_node + i (for what it shows).
  std::vector<InstanceView> wait_running(const std::vector<std::string>& ids, uint32_t first_node = 0);
  void wait_terminated(const std::vector<std::string>& ids);
  QueryParams tag_spec(int index, const std::string& resource_type, bool with_expiry) const;
  std::string resolve_image();

  AwsOptions opt_;
  std::unique_ptr<Ec2Client> ec2_;
  std::filesystem::path state_dir_;
  bool state_dir_ours_ = false;  // made or checked by make_private_dir: only then removed at teardown
  Log log_;
  Log status_;
  std::string pool_id_;
  std::string owner_;
  std::string image_id_, ssh_user_;
  std::string vpc_id_;

  mutable std::mutex mu_;  // what exists, for teardown from any thread
  std::vector<std::string> instances_;
  std::string made_group_id_, made_key_name_;
  int launches_ = 0;  // RunInstances calls that made instances: each asks with its own ClientToken
  bool run_sent_ = false;  // a RunInstances went out: instances may exist that we never heard of
  std::atomic<bool> cancelled_{false};
  std::mutex teardown_mu_;  // one teardown at a time
  std::timed_mutex run_mu_;  // held while a RunInstances is in flight
};

}  // namespace skyforge::aws
