// A node's job through its plugins (worker_impl.hpp): the environment it sees, the plugins'
// setup and around_app hooks, and the app itself: a command (through the frameworks' launcher
// hooks), a native app's run(), or a map job's task loop; and the pool communicator it may ask for.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <skyforge/config_keys.hpp>

#include "io_loop.hpp"
#include "last_words.hpp"
#include "lent.hpp"
#include "processes.hpp"
#include "worker_impl.hpp"

extern char** environ;

namespace skyforge {
namespace {

// A map slot spins this long for the next batch before it sleeps.
constexpr int kSpinUs = 50;

// A library path of the host's machine, as this node sees it: under SKYFORGE_STAGE_ROOT where
// the provider staged the host's files (abi.h, sf_pool_spec::stage_files), else as it is.
std::string staged_path(const std::string& path) {
  const char* root = std::getenv("SKYFORGE_STAGE_ROOT");
  if (!root || !*root || path.empty() || path[0] != '/') return path;
  std::string p = std::string(root) + path;
  std::error_code ec;
  return std::filesystem::exists(p, ec) ? p : path;
}

}  // namespace

EnvMap Worker::job_env() const {
  const msg::Job& job = *job_;
  EnvMap env = EnvMap::from_environ(environ);
  for (const auto& [k, v] : job.env) env.set(k, v);
  env.set("SKYFORGE_NODE", std::to_string(job.id.node));
  env.set("SKYFORGE_TOTAL_NODES", std::to_string(job.id.total_nodes));
  env.set("SKYFORGE_HEAD_ADDR", job.id.head_addr);
  env.set("SKYFORGE_POOL_ID", job.id.pool_id);
  env.set("SKYFORGE_WORK_DIR", args_.work_dir);
  env.set(skyforge::config::kOutputDirEnv, skyforge::config::output_dir_of(args_.work_dir));
  // The rest of instance_info(), for a command's runtime API (python/skyforge, docs/runtime-api.md).
  env.set("SKYFORGE_PRIVATE_IP", job.id.private_ip);
  env.set("SKYFORGE_LOCAL_RANK", std::to_string(job.id.local_rank));
  env.set("SKYFORGE_LOCAL_WORLD_SIZE", std::to_string(job.id.local_world_size));
  env.set("SKYFORGE_ACCELERATORS", std::to_string(job.id.accelerators));
  env.set("SKYFORGE_ACCELERATOR", job.id.accelerator);
  env.set("SKYFORGE_CONCURRENCY", std::to_string(job.id.concurrency));
  // The address this node reaches the client's machine at (what it connected to).
  env.set("SKYFORGE_CLIENT_ADDR", args_.host);
  if (!env.get("PYTHONUNBUFFERED")) env.set("PYTHONUNBUFFERED", "1");  // live output from Python
  // [image] pip packages are installed by the bootstrap script into the node's work dir.
  const std::string site = args_.work_dir + "/.skyforge/site";
  if (std::filesystem::is_directory(site)) {
    const char* old = env.get("PYTHONPATH");
    env.set("PYTHONPATH", old && *old ? site + ":" + old : site);
  }
  return env;
}

void Worker::setup_plugins(EnvMap& env) {
  const msg::Job& job = *job_;
  loader_ = std::make_unique<Loader>(services_.table());
  for (const auto& f : job.frameworks) {
    const LoadedPlugin& p = loader_->load(staged_path(f.library), f.name);
    if (p.kind == SF_KIND_COMPUTE_BACKEND) {
      // No around_app hooks: created with its options, lent to the app through the
      // compute_backend service, destroyed after the app.
      // (The loader refused it at load unless its compute hooks are all there.)
      compute_backends_.push_back(loader_->create(p, f.options));
      auto& b = compute_backends_.back();
      services_.add_compute_backend(p.name, b->hooks<sf_compute_hooks>(), b->self());
      if (auto sel = job.config.find(std::string(skyforge::config::keys::compute_backend.name));
          sel != job.config.end() && sel->second == p.name)
        selected_backend_ = b.get();
      continue;
    }
    frameworks_.push_back(loader_->create(p, f.options));
  }
  if (!job.app.name.empty()) {
    std::snprintf(g_app_name, sizeof g_app_name, "%s", job.app.name.c_str());
    const LoadedPlugin& p = loader_->load(staged_path(job.app.library), job.app.name, SF_KIND_APP);
    app_ = loader_->create(p, job.app.options);
  }
  info_ = *services_.instance();
  // Enter in manifest order; exit_hooks() leaves in reverse, failures included.
  for (auto& fw : frameworks_) {
    if (fw->plugin().kind != SF_KIND_FRAMEWORK) {
      ++entered_;
      continue;
    }
    ++entered_;
    sf_env e = env.c_view();
    fw->call_optional(&sf_framework_hooks::around_app_enter, "around_app_enter", &info_, &e);
  }
}

std::vector<std::string> Worker::exit_hooks(bool ok) {
  std::vector<std::string> errors;
  while (entered_ > 0) {
    auto& fw = frameworks_[--entered_];
    if (fw->plugin().kind != SF_KIND_FRAMEWORK) continue;
    try {
      fw->call_optional(&sf_framework_hooks::around_app_exit, "around_app_exit", &info_, ok ? SF_OK : SF_ERR);
    } catch (const std::exception& e) {
      errors.emplace_back(e.what());  // every exit hook still runs
    }
  }
  return errors;
}

int Worker::run_command(const std::vector<std::string>& argv_in, const EnvMap& env) {
  std::vector<std::string> argv = argv_in;
  for (auto& fw : frameworks_) {  // launcher hooks, manifest order
    if (fw->plugin().kind != SF_KIND_FRAMEWORK) continue;
    if (!fw->hooks<sf_framework_hooks>()->launcher) continue;
    std::vector<const char*> in;
    for (auto& a : argv) in.push_back(a.c_str());
    sf_argv cin{in.size(), in.data()};
    std::vector<std::string> out;
    sf_sink sink{&out, [](void* ctx, const char* d, size_t n) {
                   lent([&] { static_cast<std::vector<std::string>*>(ctx)->emplace_back(d, n); });
                 }};
    fw->call(&sf_framework_hooks::launcher, "launcher", &info_, &cin, sink);
    if (out.empty()) throw std::runtime_error("plugin '" + fw->plugin().name + "' launcher returned no command");
    argv = std::move(out);
  }
  return run_in_group(argv, env.entries(), info_.work_dir);
}

void Worker::run_tasks() {
  const uint32_t slots = std::max<uint32_t>(1, job_->id.concurrency);
  auto* h = app_->hooks<sf_app_hooks>();
  std::vector<std::thread> threads;
  for (uint32_t slot = 0; slot < slots; ++slot) {
    threads.emplace_back([this, slot, h] {
      Services::SlotScope in_slot(slot);  // instance_info() on this thread says `slot`
      t_slot = static_cast<int32_t>(slot);
      for (;;) {
        msg::TaskBatch batch;
        // A short spin before sleeping: the host usually answers a result with the next batch
        // within tens of microseconds, and a futex wake-up costs about as much again.
        for (auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinUs);
             queued_.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < until;)
          cpu_relax();
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return !batches_.empty() || shutdown_; });
          if (batches_.empty()) return;
          batch = std::move(batches_.front());
          batches_.pop_front();
          queued_.fetch_sub(1, std::memory_order_relaxed);
        }
        auto t0 = std::chrono::steady_clock::now();
        msg::TaskResults out;
        out.first = batch.first;
        out.results.reserve(batch.inputs.size());
        for (const auto& input : batch.inputs) {
          msg::TaskResult r;
          r.slot = slot;
          sf_sink sink = {&r.value, [](void* ctx, const char* d, size_t n) {
                            lent([&] { static_cast<std::string*>(ctx)->append(d, n); });
                          }};
          t_task = static_cast<int64_t>(batch.task(out.results.size()));
          sf_status st = h->task(app_->self(), input.data(), input.size(), slot, sink);
          t_task = -1;
          if (st != SF_OK) {
            failed_tasks_.fetch_add(1, std::memory_order_relaxed);
            r.ok = false;
            const char* m = app_->plugin().descriptor->last_error(app_->self());
            r.value = (m && *m) ? m : "task failed with status " + std::to_string(st);
          }
          out.results.push_back(std::move(r));
        }
        out.elapsed_ns = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
        conn_->send_msg(msg::Type::TaskResults, out);
      }
    });
  }
  for (auto& t : threads) t.join();
}

msg::RunResult Worker::run_app(EnvMap& env) {
  msg::RunResult result;
  result.node = args_.node;
  const msg::Job& job = *job_;
  if (!job.command.empty()) {
    phase_ = "the command";
    result.exit_code = run_command(job.command, env);
    result.ok = result.exit_code == 0;
    if (!result.ok)
      result.error = result.exit_code < 0 ? "command killed by signal " + std::to_string(-result.exit_code)
                                          : "command exited with status " + std::to_string(result.exit_code);
    return result;
  }
  if (job.mode == JobMode::map) {
    phase_ = "the tasks";
    run_tasks();
    return result;
  }
  if (job.mode == JobMode::single && job.id.node != 0) return result;  // only the head runs it
  if (!app_->hooks<sf_app_hooks>()->run) throw std::runtime_error("app '" + app_->plugin().name + "' has no run() hook");
  sf_sink sink = {&result.value,
                  [](void* ctx, const char* d, size_t n) { lent([&] { static_cast<std::string*>(ctx)->append(d, n); }); }};
  t_in_run = true;
  phase_ = "run()";
  app_->call(&sf_app_hooks::run, "run", sink);
  t_in_run = false;
  return result;
}

// The pool's communicator (rank = node), built on the first communicator() call. The rendezvous
// is collective: it waits up to the collective timeout for every node to call it too.
std::shared_ptr<const sf_communicator> Worker::make_communicator() {
  const msg::Job& job = *job_;
  if (job.mode == JobMode::single && job.command.empty() && job.id.total_nodes > 1)
    throw std::runtime_error("communicator() needs the app running on every node, but with mode = \"single\" only "
                             "the head runs it (use mode = \"broadcast\")");
  GlooCommunicator::Options o;
  o.rank = job.id.node;
  o.size = job.id.total_nodes;
  o.address = job.id.private_ip.empty() ? args_.address : job.id.private_ip;
  o.prefix = "gloo/0/";  // one communicator per pool (job); the store lives as long as the pool
  auto cfg = job.config.find(std::string(skyforge::config::keys::job_collective_timeout.name));
  auto env = job.env.find(skyforge::config::kCollectiveTimeoutEnv);
  const char* env_value = env != job.env.end() ? env->second.c_str() : std::getenv(skyforge::config::kCollectiveTimeoutEnv);
  o.timeout = GlooCommunicator::parse_timeout(cfg != job.config.end() ? cfg->second.c_str() : nullptr, env_value);
  net::StoreClient* store = services_.store();
  if (!store) throw std::runtime_error("the rendezvous store is not connected");
  auto comm = std::make_shared<GlooCommunicator>(*store, o);
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    comm_ = comm;
  }
  const sf_communicator* table = comm->table();
  return std::shared_ptr<const sf_communicator>(std::move(comm), table);
}

}  // namespace skyforge
