#include "slurm_provider.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

namespace skyforge::slurm {

using namespace providers;
using Clock = std::chrono::steady_clock;

namespace {

Error invalid(const std::string& what) { return Error("slurm provider: " + what, SF_ERR_INVALID); }

// The batch script that holds the allocation. It runs on the job's first node: while the pool's
// node steps (named skyforge-node-*) live it waits; once they have all ended (teardown, or the
// workers left because this machine is gone and their lease ran out) — or none started within
// `start_s` — it removes the pool's directory on every node and ends, and with it the job.
std::string batch_script(const std::string& pool_dir_words, int start_s) {
  return "#!/bin/bash\nP=" + pool_dir_words + "\nstart=" + std::to_string(start_s) + "\n" +
         R"(seen=0; waited=0
while :; do
  n=$(squeue -h -s -j "$SLURM_JOB_ID" -o %j 2>/dev/null | grep -c '^skyforge-node-')
  if [ "$n" -gt 0 ]; then seen=1; elif [ $seen = 1 ] || [ $waited -ge $start ]; then break; fi
  sleep 1; waited=$((waited + 1))
done
srun --overlap --ntasks-per-node=1 -J skyforge-janitor rm -rf "$P"
)";
}

}  // namespace

std::string stage_dirs_program() {
  // mkdir without -p first: on a node-local stage_dir it is ours only if we made it; on a shared
  // one another node of the pool may have made it a moment ago, so the owner and mode decide.
  return R"sh(umask 077; P=$1; shift
mkdir -m 700 "$P" 2>/dev/null
if [ -L "$P" ] || [ ! -d "$P" ] || [ ! -O "$P" ] || [ "$(stat -c %a "$P")" != 700 ]; then
  echo "the pool's directory $P on $(hostname) is not this user's own 0700 directory (owner $(stat -c %U "$P" 2>/dev/null), mode $(stat -c %a "$P" 2>/dev/null)): another user may have made it first" >&2
  exit 1
fi
mkdir -p "$@")sh";
}

SlurmConfig SlurmConfig::from(const Options& o) {
  SlurmConfig c;
  c.partition = o.get("partition", "");
  c.time_limit = o.get("time_limit", "");
  c.account = o.get("account", "");
  c.qos = o.get("qos", "");
  c.constraint = o.get("constraint", "");
  c.gres = o.get("gres", "");
  c.extra_sbatch_args = o.get_list("extra_sbatch_args");
  for (const auto& a : c.extra_sbatch_args)
    if (a.empty() || a[0] != '-')
      throw invalid("option 'extra_sbatch_args': expected sbatch options such as \"--exclusive\", got \"" + a + "\"");
  if (!c.time_limit.empty() && !std::regex_match(c.time_limit, std::regex(R"((\d+-)?\d+(:\d+){0,2}|UNLIMITED|INFINITE)")))
    throw invalid("option 'time_limit': expected a Slurm time (\"30\", \"1:00:00\", \"2-12:00:00\"), got \"" +
                  c.time_limit + "\"");
  int64_t q = o.get_int("queue_timeout", 600);
  if (q < 1 || q > 7 * 24 * 3600) throw invalid("option 'queue_timeout': expected 1 to 604800 seconds, got " + std::to_string(q));
  c.queue_timeout_s = int(q);
  c.stage_dir = o.get("stage_dir", "/tmp");
  if (c.stage_dir.empty() || c.stage_dir[0] != '/')
    throw invalid("option 'stage_dir': expected an absolute directory on the nodes, got \"" + c.stage_dir + "\"");
  c.control_address = o.get("control_address", "");
  int64_t spare = o.get_int("spare_nodes", 0);
  if (spare < 0 || spare > 64) throw invalid("option 'spare_nodes': expected 0 to 64, got " + std::to_string(spare));
  c.spare_nodes = uint32_t(spare);
  return c;
}

std::vector<std::string> sbatch_args(const SlurmConfig& c, uint32_t nodes, const std::string& pool_id,
                                     const std::string& batch_script) {
  std::vector<std::string> a = {"--parsable", "--job-name=skyforge-" + pool_id,
                                "--nodes=" + std::to_string(nodes + c.spare_nodes), "--ntasks-per-node=1",
                                "--output=/dev/null", "--error=/dev/null"};
  if (c.spare_nodes > 0) a.push_back("--no-kill");  // a node that fails leaves the job running on the others
  auto opt = [&](const char* flag, const std::string& v) {
    if (!v.empty()) a.push_back(std::string(flag) + "=" + v);
  };
  opt("--partition", c.partition);
  opt("--time", c.time_limit);
  opt("--account", c.account);
  opt("--qos", c.qos);
  opt("--constraint", c.constraint);
  opt("--gres", c.gres);
  a.insert(a.end(), c.extra_sbatch_args.begin(), c.extra_sbatch_args.end());
  a.push_back("--wrap=" + batch_script);
  return a;
}

std::map<std::string, std::string> node_addresses(const std::string& out) {
  std::map<std::string, std::string> m;
  std::regex name(R"((?:^|\s)NodeName=(\S+))"), addr(R"((?:^|\s)NodeAddr=(\S+))");
  for (const auto& line : lines_of(out)) {
    std::smatch n, a;
    if (std::regex_search(line, n, name) && std::regex_search(line, a, addr)) m[n[1]] = a[1];
  }
  return m;
}

SlurmProvider::SlurmProvider(const Context& ctx)
    : SessionProvider(ctx, "slurm provider"), config_(SlurmConfig::from(ctx.options)) {
  for (const char* tool : {"sbatch", "squeue", "scontrol", "srun", "sbcast", "scancel"})
    if (providers::find_program(tool).empty())
      throw Error(std::string("slurm provider: no `") + tool + "` on PATH (Debian: slurm-client)", SF_ERR_UNSUPPORTED);
}

SlurmProvider::~SlurmProvider() {
  try {
    terminate({});
  } catch (...) {
  }
}

std::string SlurmProvider::job_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return job_;
}

std::string SlurmProvider::where(const Node& n) const { return "slurm provider: " + n.id + " (" + n.name + ")"; }

std::string SlurmProvider::pool_dir() const { return config_.stage_dir + "/skyforge-" + pool_id_; }

CommandResult SlurmProvider::slurm(const std::string& tool, const std::vector<std::string>& args,
                                   std::chrono::milliseconds timeout) const {
  std::vector<std::string> argv = {tool};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandOptions o;
  o.timeout = timeout;
  CommandResult r = providers::run_command(argv, o);
  if (r.timed_out) r.err += tool + " did not answer within " + std::to_string(timeout.count() / 1000) + " s";
  return r;
}

Provisioned SlurmProvider::provision(const PoolSpec& spec) {
  pool_id_ = spec.pool_id;
  stage_files_ = spec.stage_files;
  CommandResult r = slurm("sbatch", sbatch_args(config_, spec.nodes, pool_id_, batch_script(shell_quote(pool_dir()), 600)));
  const std::string job = r.status == 0 ? providers::last_line(r.out) : "";
  // No job id: what sbatch said first ("sbatch: error: ..." before its usage hints).
  if (job.empty() || job.find_first_not_of("0123456789;") != std::string::npos)
    throw Error("slurm provider: sbatch refused the job: " + first_line(r.err.empty() ? r.out : r.err),
                r.status == 0 ? SF_ERR : SF_ERR_INVALID);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = job.substr(0, job.find(';'));  // "id;cluster" on a federation
  }
  host().info("slurm: job " + job_ + " submitted (" + std::to_string(spec.nodes) + " nodes" +
              (config_.spare_nodes ? " + " + std::to_string(config_.spare_nodes) + " spare" : "") + ")");

  // Until it runs: its state shown when it changes, cancelled at queue_timeout.
  const auto deadline = Clock::now() + std::chrono::seconds(config_.queue_timeout_s);
  std::string shown, nodelist;
  for (;;) {
    CommandResult q = slurm("squeue", {"-h", "-j", job_, "-o", "%T|%r|%N"});
    auto fields = lines_of(q.out);
    std::string state, reason;
    if (!fields.empty()) {
      std::istringstream f(fields[0]);
      std::getline(f, state, '|');
      std::getline(f, reason, '|');
      std::getline(f, nodelist, '|');
    }
    if (state == "RUNNING") break;
    if (q.status == 0 && (fields.empty() || (state != "PENDING" && state != "CONFIGURING")))
      throw Error("slurm provider: job " + job_ + " ended before it ran" + (state.empty() ? "" : " (" + state + ")"));
    if (state + reason != shown) {
      shown = state + reason;
      host().info("slurm: job " + job_ + " " + state + (reason.empty() || reason == "None" ? "" : " (" + reason + ")"));
    }
    if (Clock::now() >= deadline)
      throw Error("slurm provider: job " + job_ + " still " + (state.empty() ? "queued" : state) +
                  (reason.empty() ? "" : " (" + reason + ")") + " after queue_timeout = " +
                  std::to_string(config_.queue_timeout_s) + " s; it was cancelled");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Its nodes, in the order Slurm lists them, and their addresses.
  CommandResult hn = slurm("scontrol", {"show", "hostnames", nodelist});
  auto names = lines_of(hn.out);
  names.erase(std::remove(names.begin(), names.end(), ""), names.end());
  if (hn.status != 0 || names.size() != spec.nodes + config_.spare_nodes)
    throw Error("slurm provider: job " + job_ + " runs on '" + nodelist + "', expected " +
                std::to_string(spec.nodes + config_.spare_nodes) + " nodes");
  std::string joined;
  for (const auto& n : names) joined += (joined.empty() ? "" : ",") + n;
  auto addrs = node_addresses(slurm("scontrol", {"-o", "show", "node", joined}).out);
  Provisioned out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t i = 0; i < spec.nodes; ++i) {
      Node& n = add_node_locked(i);
      n.name = names[i];
      n.address = addrs.count(names[i]) ? addrs[names[i]] : names[i];
      out.nodes.push_back({n.id, n.address});
    }
    for (size_t i = spec.nodes; i < names.size(); ++i)
      spares_.emplace_back(names[i], addrs.count(names[i]) ? addrs[names[i]] : names[i]);
  }
  host().info("slurm: job " + job_ + " running on " + nodelist);
  out.control_address = config_.control_address;
  if (out.control_address.empty()) out.control_address = providers::route_source(nodes_[0]->address);
  if (out.control_address.empty())
    throw Error("slurm provider: no route from this machine to " + nodes_[0]->address + " (node " + names[0] +
                "); set `control_address` to the address the nodes reach this machine at");
  return out;
}

void SlurmProvider::stage() {
  // The directories first (one step on every node), then each file with sbcast.
  std::set<std::string> dirs;
  for (const auto& f : stage_files_) dirs.insert(pool_dir() + "/stage" + std::filesystem::path(f).parent_path().string());
  std::vector<std::string> args = {"--jobid=" + job_, "--overlap", "--ntasks-per-node=1", "-J", "skyforge-stage",
                                   "sh", "-c", stage_dirs_program(), "sh", pool_dir()};
  args.insert(args.end(), dirs.begin(), dirs.end());
  CommandResult r = slurm("srun", args);
  if (r.status != 0) throw Error("slurm provider: making the pool's directory on the nodes failed: " + last_line(r.err));
  for (const auto& f : stage_files_) {
    r = slurm("sbcast", {"--jobid=" + job_, "-f", "-p", f, pool_dir() + "/stage" + f}, std::chrono::minutes(10));
    if (r.status != 0) throw Error("slurm provider: sbcast of " + f + " failed: " + last_line(r.err));
  }
}

std::string SlurmProvider::replace_node(const std::string& node_id) {
  Node& old = require(node_id, "replace_node");
  std::pair<std::string, std::string> spare;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (spares_.empty())
      throw Error("slurm provider: " + node_id + "'s Slurm node (" + old.name + ", job " + job_ +
                      ") is gone, and the allocation has no spare node left: set [provider] spare_nodes = 1 or more "
                      "to have a lost one replaced",
                  SF_ERR_UNSUPPORTED);
    spare = spares_.front();
    spares_.erase(spares_.begin());
  }
  old.session.stop(std::chrono::milliseconds(2000));
  host().info("slurm: " + node_id + " moves from " + old.name + " to the spare node " + spare.first + " of job " + job_);
  std::lock_guard<std::mutex> lock(mu_);
  lost_names_.push_back(old.name);
  Node& n = replace_node_locked(old);
  n.name = spare.first;
  n.address = spare.second;
  return spare.second;
}

void SlurmProvider::bootstrap(const std::string& node_id, const std::string& script, sf_sink log) {
  Node& n = require(node_id, "bootstrap");
  {
    std::lock_guard<std::mutex> lock(stage_mu_);  // the first node's bootstrap stages for all
    if (!staged_) {
      stage();
      staged_ = true;
    }
  }
  const std::string marker = providers::session_marker();
  const std::string agent = providers::agent_script(shell_quote(pool_dir() + "/" + node_id),
                                                    shell_quote(pool_dir() + "/stage"), marker);
  // srun runs bash directly: no login shell to pay for.
  const std::vector<std::string> argv = {"srun", "--jobid=" + job_, "--overlap", "--nodes=1", "--ntasks=1",
                                         "--nodelist=" + n.name, "-J", "skyforge-" + node_id, "--quiet",
                                         "bash", "--norc", "--noprofile", "-c", agent};
  try {
    n.session.start(spawner_, argv);
  } catch (const std::runtime_error& e) {
    throw Error("slurm provider: " + std::string(e.what()));
  }
  std::string tail;
  auto status = n.session.run_bootstrap(providers::bootstrap_file(script), marker,
                                        [&](std::string_view line) { log.write(log.ctx, line.data(), line.size()); }, tail);
  if (!status)
    throw Error("slurm provider: " + node_id + " (" + n.name + ", job " + job_ + "): its job step ended (exit status " +
                std::to_string(n.session.exit_status().value_or(-1)) + ")" + (tail.empty() ? "" : ": " + tail));
  if (*status != 0)
    throw Error("slurm provider: " + node_id + " (" + n.name + ")'s bootstrap exited with status " +
                std::to_string(*status) + (tail.empty() ? "" : ": " + tail));
}

void SlurmProvider::cancel_job(std::vector<std::string>& problems) {
  std::string job, exclude;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = job_;
    for (const auto& n : lost_names_) exclude += (exclude.empty() ? "" : ",") + n;
  }
  if (job.empty()) return;
  // The nodes' processes and the pool's directory, in one last step (the batch script would do
  // the directory too, but it ends with the job cancelled here).
  const std::string p = shell_quote(pool_dir());
  std::vector<std::string> args = {"--jobid=" + job, "--overlap", "--ntasks-per-node=1", "-J", "skyforge-cleanup"};
  if (!exclude.empty()) args.push_back("--exclude=" + exclude);  // nodes that are gone would hold the step up
  args.insert(args.end(), {"bash", "--norc", "-c",
                 "for f in " + p + "/node-*/*.pid; do [ -f \"$f\" ] && kill -KILL -- -\"$(cat \"$f\")\" 2>/dev/null; done; "
                 "rm -rf " + p + "; true"});
  slurm("srun", args, std::chrono::seconds(20));
  CommandResult r = slurm("scancel", {job});
  if (r.status != 0) {
    problems.push_back("scancel " + job + " failed: " + last_line(r.err) + " — cancel it by hand");
    return;
  }
  // Gone from the queue (or at least no longer running) before we say so.
  for (int i = 0; i < 100; ++i) {
    CommandResult q = slurm("squeue", {"-h", "-j", job, "-o", "%T"});
    if (q.status != 0 || last_line(q.out).empty() || last_line(q.out) == "COMPLETED" || last_line(q.out) == "CANCELLED")
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::lock_guard<std::mutex> lock(mu_);
  job_.clear();
}

void SlurmProvider::terminate(const std::vector<std::string>& node_ids) {
  std::vector<Node*> doomed;
  bool all_gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    doomed = take_nodes_locked(node_ids);
    all_gone = all_gone_locked();
  }
  // Each node's step: its input closed (the agent stops the worker), then srun itself.
  std::vector<std::future<void>> stops;
  for (Node* n : doomed)
    stops.push_back(std::async(std::launch::async, [n] { n->session.stop(std::chrono::milliseconds(6000)); }));
  for (auto& s : stops) s.get();
  std::vector<std::string> problems;
  if (all_gone) cancel_job(problems);
  if (!problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    throw Error("slurm provider: " + all);
  }
}

}  // namespace skyforge::slurm
