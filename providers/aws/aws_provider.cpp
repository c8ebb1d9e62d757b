#include "aws_provider.hpp"

#include <skyforge/accelerator.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "offers.hpp"

namespace skyforge::aws {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Clears the live status line the waits below draw, however the scope ends.
struct StatusCleared {
  const Host& h;
  ~StatusCleared() { h.status(""); }
};

// Whether an SSH server answers on addr:22 with its banner within `wait`.
bool sshd_answers(const std::string& addr, std::chrono::milliseconds wait) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  if (::getaddrinfo(addr.c_str(), "22", &hints, &res) != 0 || !res) return false;
  int s = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  bool ok = false;
  if (s >= 0) {
    int rc = ::connect(s, res->ai_addr, res->ai_addrlen);
    pollfd p{s, POLLOUT, 0};
    if (rc == 0 || (errno == EINPROGRESS && ::poll(&p, 1, int(wait.count())) == 1)) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) {
        p = {s, POLLIN, 0};
        char buf[8] = {0};
        if (::poll(&p, 1, int(wait.count())) == 1 && ::recv(s, buf, 4, MSG_PEEK) == 4)
          ok = std::string(buf, 4) == "SSH-";
      }
    }
    ::close(s);
  }
  ::freeaddrinfo(res);
  return ok;
}

}  // namespace

AwsProvider::AwsProvider(const Context& ctx) : Provider(ctx), ctx_(ctx), opt_(AwsOptions::from(ctx.options)) {
  int64_t t = ctx.options.get_int("ssh_timeout", 300);
  if (t < 1 || t > 3600) throw Error("aws provider: option 'ssh_timeout': expected 1 to 3600 seconds", SF_ERR_INVALID);
  ssh_timeout_s_ = int(t);
  offers_file_ = ctx.options.get("offers_file", "");
  // The ssh half's options are checked now too (a bad remote_dir fails validate, not a paid run).
  ssh::SshConfig probe = ssh::SshConfig::from([&] {
    Options o = ctx.options;
    std::vector<sf_kv> kv;
    std::vector<std::pair<std::string, std::string>> all(o.all().begin(), o.all().end());
    all.emplace_back("hosts", "probe");
    for (const auto& [k, v] : all) kv.push_back(sf_kv{k.c_str(), v.c_str()});
    return Options(kv.data(), kv.size());
  }());
  (void)probe;
}

AwsProvider::~AwsProvider() {
  try {
    terminate({});
  } catch (...) {
  }
}

ssh::SshProvider& AwsProvider::ssh(const char* op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ssh_) throw Error(std::string("aws provider: ") + op + " before the pool was provisioned", SF_ERR);
  return *ssh_;
}

void AwsProvider::wait_for_sshd(const std::vector<InstanceView>& instances, uint32_t first_node) {
  const auto start = Clock::now();
  std::vector<bool> up(instances.size(), false);
  for (;;) {
    if (cancelled_) throw Error("aws provider: provisioning cancelled", SF_ERR);
    bool all = true;
    for (size_t i = 0; i < instances.size(); ++i) {
      if (up[i]) continue;
      if (sshd_answers(pool_->address_of(instances[i]), std::chrono::milliseconds(2000))) {
        up[i] = true;
        host().info("aws: node " + std::to_string(first_node + i) + " " + instances[i].id + ": ssh up (" +
                    std::to_string(std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count()) +
                    " s)");
      } else {
        all = false;
      }
    }
    if (all) return;
    {
      std::string waiting;
      size_t n_up = 0;
      for (size_t i = 0; i < instances.size(); ++i)
        if (up[i]) ++n_up;
        else waiting += (waiting.empty() ? "" : ", ") + std::to_string(first_node + i);
      host().status("aws [" +
                    std::to_string(std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count()) +
                    " s]: ssh up on " + std::to_string(n_up) + "/" + std::to_string(instances.size()) +
                    " nodes (waiting for node " + waiting + ")");
    }
    if (Clock::now() - start > std::chrono::seconds(ssh_timeout_s_)) {
      std::string missing;
      for (size_t i = 0; i < instances.size(); ++i)
        if (!up[i]) missing += (missing.empty() ? "" : ", ") + std::to_string(first_node + i) + " (" + instances[i].id + " at " +
                               pool_->address_of(instances[i]) + ")";
      throw Error("aws provider: no SSH server answered within " + std::to_string(ssh_timeout_s_) +
                      " s (ssh_timeout) on node(s) " + missing +
                      (opt_.use_private_ip ? "" : "; inside a VPC without public addresses set use_private_ip = true"),
                  SF_ERR);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

std::unique_ptr<Ec2Client> AwsProvider::make_client(ClientOptions copt) {
  ResolvedAws aws;
  try {
    aws = resolve_aws(process_env(), opt_.profile, opt_.region);
  } catch (const std::runtime_error& e) {
    throw Error(std::string("aws provider: ") + e.what(), SF_ERR_INVALID);
  }
  host().info("aws: " + aws.region + " at " + aws.endpoint + ", credentials from " + aws.credentials.source);
  copt.on_retry = [h = host()](const std::string& line) { h.info(line); };
  return std::make_unique<Ec2Client>(aws, copt);
}

void AwsProvider::cancel() {
  cancelled_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (pool_) pool_->cancel();
}

std::vector<std::string> AwsProvider::reconcile(bool terminate) {
  // Bounded: an API that does not answer is tried for sweep_timeout, not teardown_timeout, and
  // no single request outlasts it.
  ClientOptions copt;
  copt.timeout = std::min<std::chrono::milliseconds>(copt.timeout, opt_.sweep_timeout);
  copt.connect_timeout = std::min<std::chrono::milliseconds>(copt.connect_timeout, opt_.sweep_timeout);
  Ec2Pool any(opt_, make_client(copt), fs::path(), [h = host()](const std::string& l) { h.info(l); });
  std::set<std::string> pools;
  std::vector<std::string> warnings;
  auto report = any.sweep(terminate, std::chrono::system_clock::now(), &pools, &warnings);
  for (const auto& w : warnings) host().warn("aws: sweep: " + w);
  // A killed host's local state of those pools (their private key, known_hosts) goes too; only
  // a real directory inside the state root, never what a symlink or a crafted tag points at.
  // Each state root a run may have used (state_roots(): the runtime directory when the session
  // had one, else the state home), so a pool made from a cron job is found from a login too.
  std::vector<fs::path> roots;
  try {
    roots = state_roots(process_env());
  } catch (const std::exception& e) {
    host().warn(std::string("aws: sweep: no local state looked for: ") + e.what());
  }
  for (const auto& pool : pools) {
    for (const auto& root : roots) {
      std::string refused;
      const std::string removed = remove_pool_state(root, pool, &refused);
      if (!removed.empty()) report.push_back(removed);
      if (!refused.empty()) host().warn("aws: sweep: local state of pool " + pool + " not removed: " + refused);
    }
  }
  return report;
}

std::string AwsProvider::offers_path() const { return offers_file_.empty() ? default_offers_path() : offers_file_; }

std::string AwsProvider::offers_region() const {
  if (!opt_.region.empty()) return opt_.region;
  auto env = process_env();
  return !env("AWS_REGION").empty() ? env("AWS_REGION") : env("AWS_DEFAULT_REGION");
}

std::string AwsProvider::offers(const std::string& accelerator) {
  std::vector<Offer> all;
  try {
    all = load_offers(offers_path());
  } catch (const std::runtime_error& e) {
    throw Error(e.what(), SF_ERR_INVALID);
  }
  AcceleratorSpec spec;
  try {
    spec = parse_accelerator(accelerator);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what(), SF_ERR_INVALID);
  }
  const std::string region = offers_region();
  auto fit = offers_for(all, spec.name, spec.count, region, opt_.spot);
  std::string out = format_offers(fit);
  out += std::to_string(fit.size()) + " offer(s)" + (spec.name.empty() ? "" : " for " + accelerator) +
         (region.empty() ? " in every region listed" : " in " + region) + ", by " +
         (opt_.spot ? "spot" : "on-demand") + " price; prices from " + offers_path() +
         " (its header says their source and date)\n";
  return out;
}

Provisioned AwsProvider::provision(const PoolSpec& spec) {
  requested_ = Clock::now();
  if (opt_.instance_types.empty() && !spec.accelerator.empty()) {
    // [pool] accelerator without an instance type: the cheapest types that fit, in price order
    // (the first, then the next ones when AWS has no capacity).
    const AcceleratorSpec acc = parse_accelerator(spec.accelerator);
    std::vector<Offer> all;
    try {
      all = load_offers(offers_path());
    } catch (const std::runtime_error& e) {
      throw Error(std::string("aws provider: ") + e.what(), SF_ERR_INVALID);
    }
    const std::string region = offers_region();
    auto fit = offers_for(all, acc.name, acc.count, region, opt_.spot);
    if (fit.empty())
      throw Error("aws provider: no instance type with " + spec.accelerator + " per instance" +
                      (region.empty() ? "" : " in " + region) + " in " + offers_path() +
                      " (see `skyforge offers --provider aws`; or set [provider] instance_type)",
                  SF_ERR_INVALID);
    for (size_t i = 0; i < fit.size() && i < 3; ++i) opt_.instance_types.push_back(fit[i].instance_type);
    char price[32];
    std::snprintf(price, sizeof price, "%.4f", *(opt_.spot ? fit[0].spot_price : fit[0].price));
    host().info("aws: accelerator " + spec.accelerator + " -> " + fit[0].instance_type + " at $" + price + "/h (" +
                (opt_.spot ? "spot" : "on-demand") + ", the cheapest that fits" +
                (region.empty() ? "" : " in " + region) + ")");
  }
  auto client = make_client();
  if (!is_pool_id(spec.pool_id))
    throw Error("aws provider: pool id " + shown_tag(spec.pool_id) + ": expected " + std::to_string(kPoolIdLength) +
                    " lowercase hex digits, as skyforge makes them",
                SF_ERR_INVALID);
  const fs::path state = pool_state_dir(make_state_root(process_env()), spec.pool_id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool_ = std::make_unique<Ec2Pool>(opt_, std::move(client), state, [h = host()](const std::string& l) { h.info(l); });
    pool_->set_status([h = host()](const std::string& l) { h.status(l); });
    if (cancelled_) pool_->cancel();
  }
  const StatusCleared clear_status{host()};
  auto instances = pool_->create(spec.pool_id, spec.nodes);
  wait_for_sshd(instances);

  ssh::SshConfig cfg = ssh::SshConfig::from([&] {
    std::vector<std::pair<std::string, std::string>> all(ctx_.options.all().begin(), ctx_.options.all().end());
    std::string hosts;
    for (const auto& i : instances) hosts += (hosts.empty() ? "" : "\n") + pool_->address_of(i);
    all.emplace_back("hosts", hosts);
    std::vector<sf_kv> kv;
    for (const auto& [k, v] : all) kv.push_back(sf_kv{k.c_str(), v.c_str()});
    return Options(kv.data(), kv.size());
  }());
  cfg.user = pool_->ssh_user();
  cfg.identity_file = pool_->identity_file();
  cfg.slots_per_host = 1;
  // Each instance is new: its host key is recorded on first contact in the pool's own file
  // (never the user's known_hosts), and a changed key within the pool is still refused.
  cfg.known_hosts_file = known_hosts_ = (state / "known_hosts").string();
  cfg.strict_host_keys = "accept-new";
  {
    std::lock_guard<std::mutex> lock(mu_);
    ssh_ = std::make_unique<ssh::SshProvider>(ctx_, cfg);
  }
  Provisioned out = ssh_->provision(spec);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < out.nodes.size() && i < instances.size(); ++i) instance_of_[out.nodes[i].id] = instances[i].id;
  return out;
}

std::string AwsProvider::replace_node(const std::string& node_id) {
  Ec2Pool* pool;
  ssh::SshProvider* s;
  std::string old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool = pool_.get();
    s = ssh_.get();
    if (auto it = instance_of_.find(node_id); it != instance_of_.end()) old = it->second;
  }
  if (!pool || !s || old.empty()) throw Error("aws provider: replace_node: unknown node " + node_id, SF_ERR_INVALID);
  host().info("aws: " + node_id + " " + old + " is gone; launching another in its place");
  try {
    pool->teardown({old});  // for good: a machine that comes back must not hold a second node-N
  } catch (const std::exception& e) {
    host().warn(std::string("aws: ") + e.what());
  }
  const StatusCleared clear_status{host()};
  const uint32_t index = uint32_t(std::strtoul(node_id.c_str() + node_id.find('-') + 1, nullptr, 10));
  const auto made = pool->add(1, index);
  wait_for_sshd(made, index);
  // EC2 may give the new instance the lost one's private address: its new host key must not be
  // refused as a changed one.
  const std::string address = pool->address_of(made[0]);
  providers::run_command({"ssh-keygen", "-q", "-f", known_hosts_, "-R", address});
  s->add_host(address);
  const std::string moved_to = s->replace_node(node_id);
  std::lock_guard<std::mutex> lock(mu_);
  instance_of_[node_id] = made[0].id;
  return moved_to;
}

void AwsProvider::bootstrap(const std::string& node_id, const std::string& script, sf_sink log) {
  ssh("bootstrap").bootstrap(node_id, script, log);
  std::string instance;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = instance_of_.find(node_id); it != instance_of_.end()) instance = it->second;
  }
  host().info("aws: " + node_id + " " + instance + ": bootstrapped (" +
              std::to_string(std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - requested_).count()) +
              " s)");
}

void AwsProvider::start_worker(const std::string& node_id, const std::vector<std::string>& argv,
                               const std::map<std::string, std::string>& env) {
  auto with_lease = env;
  with_lease["SKYFORGE_LEASE_FILE"] = kLeaseFile;  // the dead-man switch's (ec2_pool.hpp)
  ssh("start_worker").start_worker(node_id, argv, with_lease);
}

int AwsProvider::worker_alive(const std::string& node_id) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!ssh_) return -1;
  auto* s = ssh_.get();
  lock.unlock();
  return s->worker_alive(node_id);
}

int AwsProvider::worker_exit(const std::string& node_id, WorkerExit& out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!ssh_) return -1;
  auto* s = ssh_.get();
  lock.unlock();
  return s->worker_exit(node_id, out);
}

void AwsProvider::terminate(const std::vector<std::string>& node_ids) {
  ssh::SshProvider* s;
  Ec2Pool* pool;
  std::vector<std::string> instances;
  bool everything;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = ssh_.get();
    pool = pool_.get();
    everything = node_ids.empty() || node_ids.size() >= instance_of_.size();
    for (const auto& id : node_ids)
      if (auto it = instance_of_.find(id); it != instance_of_.end()) instances.push_back(it->second);
  }
  if (!pool) return;
  if (everything) pool->cancel();  // a provision still waiting stops now
  std::string ssh_error;
  if (s) {
    // Stop the workers and remove their directories while the machines are still there; the
    // machines go next whatever happens here.
    try {
      s->terminate(node_ids);
    } catch (const std::exception& e) {
      ssh_error = e.what();
    }
  }
  pool->teardown(everything ? std::vector<std::string>{} : instances);
  if (!ssh_error.empty()) host().warn("aws: " + ssh_error + " (the instances are terminated all the same)");
}

}  // namespace skyforge::aws
