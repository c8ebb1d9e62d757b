// skyforge SDK — header-only C++ layer over the C ABI in abi.h.
//
// A plugin is a class deriving from one of skyforge::Framework, skyforge::Provider,
// skyforge::App, skyforge::ComputeBackend or skyforge::TaskBackend, constructible from a skyforge::Context, registered with one macro:
//
//     class Hello : public skyforge::App {
//      public:
//       using App::App;
//       std::string run() override { return "hi from node " + std::to_string(host().instance_info().node); }
//     };
//     SKYFORGE_PLUGIN(Hello, "hello", "1.0.0", "says hi")
//
// Only the hooks a class overrides are published; the rest stay NULL in the C table. Every
// hook is wrapped in try/catch: exceptions become an sf_status plus a message.
#pragma once

#include <skyforge/abi.h>

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <skyforge/config_keys.hpp>
#include <skyforge/data.hpp>

namespace skyforge {

// An error with a status for the ABI. Throw it from a hook to pick the status.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, sf_status status = SF_ERR) : std::runtime_error(what), status_(status) {}
  sf_status status() const noexcept { return status_; }

 private:
  sf_status status_;
};

namespace detail {
inline void append_to_string(void* ctx, const char* data, size_t size) {
  static_cast<std::string*>(ctx)->append(data, size);
}
inline sf_sink string_sink(std::string& s) { return sf_sink{&s, &append_to_string}; }
inline const char* or_empty(const char* s) { return s ? s : ""; }
}  // namespace detail

// Plugin options from the manifest, already validated against plugin.toml by the host.
// Values arrive in canonical text form (strings raw, integers decimal, booleans true/false).
class Options {
 public:
  Options() = default;
  Options(const sf_kv* kv, size_t n) {
    for (size_t i = 0; i < n; ++i) values_[detail::or_empty(kv[i].key)] = detail::or_empty(kv[i].value);
  }
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  std::string get(const std::string& key, const std::string& fallback = "") const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : it->second;
  }
  int64_t get_int(const std::string& key, int64_t fallback) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    try {
      return std::stoll(it->second);
    } catch (const std::exception&) {
      throw Error("option '" + key + "': expected an integer, got '" + it->second + "'", SF_ERR_INVALID);
    }
  }
  bool get_bool(const std::string& key, bool fallback) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    if (it->second == "true") return true;
    if (it->second == "false") return false;
    throw Error("option '" + key + "': expected true or false, got '" + it->second + "'", SF_ERR_INVALID);
  }
  // A string_array option (plugin.toml type = "string_array"): its elements, in manifest order;
  // empty when absent or given as [].
  std::vector<std::string> get_list(const std::string& key) const {
    std::vector<std::string> out;
    auto it = values_.find(key);
    if (it == values_.end() || it->second.empty()) return out;
    size_t start = 0;
    for (size_t nl; (nl = it->second.find('\n', start)) != std::string::npos; start = nl + 1)
      out.push_back(it->second.substr(start, nl - start));
    out.push_back(it->second.substr(start));
    return out;
  }
  const std::map<std::string, std::string>& all() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
};

struct InstanceInfo {
  uint32_t node = 0;
  uint32_t total_nodes = 1;
  bool is_head = true;
  std::string head_addr;
  std::string private_ip;
  uint32_t local_rank = 0;
  uint32_t local_world_size = 1;
  uint32_t accelerators = 0;
  std::string accelerator;
  uint32_t concurrency = 1;
  uint32_t slot = 0;
  std::string pool_id;
  std::string store_addr;
  std::string work_dir;
  std::string output_dir;  // SKYFORGE_OUTPUT_DIR: what is in it when the job ends comes back to the client

  static InstanceInfo from_c(const sf_instance_info& c) {
    InstanceInfo i;
    i.node = c.node;
    i.total_nodes = c.total_nodes;
    i.is_head = c.is_head != 0;
    i.head_addr = detail::or_empty(c.head_addr);
    i.private_ip = detail::or_empty(c.private_ip);
    i.local_rank = c.local_rank;
    i.local_world_size = c.local_world_size;
    i.accelerators = c.accelerators;
    i.accelerator = detail::or_empty(c.accelerator);
    i.concurrency = c.concurrency;
    i.slot = c.slot;
    i.pool_id = detail::or_empty(c.pool_id);
    i.store_addr = detail::or_empty(c.store_addr);
    i.work_dir = detail::or_empty(c.work_dir);
    if (!i.work_dir.empty()) i.output_dir = config::output_dir_of(i.work_dir);
    return i;
  }
};

struct Cluster {
  uint32_t total_nodes = 1;
  uint32_t concurrency = 1;
  std::string accelerator;
  std::string provider;
  std::string pool_id;

  static Cluster from_c(const sf_cluster& c) {
    return Cluster{c.total_nodes, c.concurrency, detail::or_empty(c.accelerator), detail::or_empty(c.provider),
                   detail::or_empty(c.pool_id)};
  }
};

// The pool's process group (rank = node), over the host's sf_communicator (Gloo on CPU).
// Every call is collective. Throws Error on failure.
class Communicator {
 public:
  Communicator() = default;
  explicit Communicator(const sf_communicator* c) : c_(c) {}
  explicit operator bool() const { return c_ != nullptr; }
  uint32_t rank() const { return c_ ? c_->rank : 0; }
  uint32_t size() const { return c_ ? c_->size : 1; }
  const sf_communicator* raw() const { return c_; }

  template <class T>
  void allreduce(T* data, size_t count, sf_reduce_op op = SF_REDUCE_SUM) const {
    if (size() <= 1 || count == 0) return;
    check(c_->allreduce(c_->ctx, data, count, dtype<T>(), op), "allreduce");
  }
  template <class T>
  void allreduce(std::vector<T>& v, sf_reduce_op op = SF_REDUCE_SUM) const { allreduce(v.data(), v.size(), op); }
  void broadcast(void* data, size_t bytes, uint32_t root = 0) const {
    if (size() <= 1 || bytes == 0) return;
    check(c_->broadcast(c_->ctx, data, bytes, root), "broadcast");
  }
  // Every rank's `bytes` bytes, in rank order.
  std::string allgather(std::string_view mine) const {
    if (size() <= 1) return std::string(mine);
    std::string out(mine.size() * size(), '\0');
    check(c_->allgather(c_->ctx, mine.data(), mine.size(), out.data()), "allgather");
    return out;
  }
  void barrier() const {
    if (size() > 1) check(c_->barrier(c_->ctx), "barrier");
  }
  // out (size() * bytes) = rank 0's `in`, then rank 1's, ...
  void allgather(const void* in, size_t bytes, void* out) const {
    if (size() <= 1) {
      if (bytes) std::memcpy(out, in, bytes);
      return;
    }
    check(c_->allgather(c_->ctx, in, bytes, out), "allgather");
  }

  template <class T>
  static constexpr sf_dtype dtype() {
    if constexpr (std::is_same_v<T, float>) return SF_DTYPE_F32;
    else if constexpr (std::is_same_v<T, double>) return SF_DTYPE_F64;
    else if constexpr (std::is_same_v<T, int32_t>) return SF_DTYPE_I32;
    else if constexpr (std::is_same_v<T, int64_t>) return SF_DTYPE_I64;
    else static_assert(std::is_same_v<T, float>, "allreduce: float, double, int32_t or int64_t");
  }

 private:
  void check(sf_status st, const char* what) const {
    if (st == SF_OK) return;
    const char* m = c_->last_error ? c_->last_error(c_->ctx) : nullptr;
    throw Error(std::string("communicator ") + what + ": " + (m && *m ? m : "failed"), st);
  }
  const sf_communicator* c_ = nullptr;
};

// The host's services, as lent to this plugin.
class Host {
 public:
  Host() = default;
  explicit Host(const sf_host_services* s) : s_(s) {}

  void log(int32_t level, const std::string& message) const {
    if (s_ && s_->log) s_->log(s_->ctx, level, message.c_str());
  }
  // Levels: debug is shown only with `skyforge run -v`; info, warn and error always.
  void debug(const std::string& m) const { log(SF_LOG_DEBUG, m); }
  void info(const std::string& m) const { log(SF_LOG_INFO, m); }
  void warn(const std::string& m) const { log(SF_LOG_WARN, m); }
  // A transient status line (ABI 1.6; not sent to an older host, which would print every one).
  void status(const std::string& m) const {
    if (s_ && (s_->abi_major > 1 || s_->abi_minor >= 6)) log(SF_LOG_STATUS, m);
  }

  // This node's identity. Throws on the client, where no pool exists yet.
  InstanceInfo instance_info() const {
    const sf_instance_info* i = (s_ && s_->instance_info) ? s_->instance_info(s_->ctx) : nullptr;
    if (!i) throw Error("instance_info() is only available on a node", SF_ERR_UNSUPPORTED);
    return InstanceInfo::from_c(*i);
  }
  bool on_node() const { return s_ && s_->instance_info && s_->instance_info(s_->ctx) != nullptr; }

  void kv_set(const std::string& key, std::string_view value) const {
    check(s_ && s_->kv_set ? s_->kv_set(s_->ctx, key.c_str(), value.data(), value.size()) : SF_ERR_UNSUPPORTED,
          "kv_set(" + key + ")");
  }
  // Waits up to timeout_ms for `key`; throws Error(SF_ERR_TIMEOUT) when it does not appear.
  std::string kv_get(const std::string& key, int64_t timeout_ms = 30000) const {
    std::string out;
    check(s_ && s_->kv_get ? s_->kv_get(s_->ctx, key.c_str(), timeout_ms, detail::string_sink(out))
                           : SF_ERR_UNSUPPORTED,
          "kv_get(" + key + ")");
    return out;
  }
  // One random seed for the whole pool (RNG synchronised from the head): the head draws it and
  // publishes it under `key` in the pool's store, every other node waits for it (timeout_ms).
  uint64_t shared_seed(const InstanceInfo& info, const std::string& key, int64_t timeout_ms = 120000) const {
    if (info.is_head) {
      std::random_device rd;
      const uint64_t s = (static_cast<uint64_t>(rd()) << 32 | rd()) & 0x7fffffffffffffffULL;
      if (info.total_nodes > 1) kv_set(key, std::to_string(s));
      return s;
    }
    return std::stoull(kv_get(key, timeout_ms));
  }
  int64_t kv_add(const std::string& key, int64_t delta) const {
    int64_t result = 0;
    check(s_ && s_->kv_add ? s_->kv_add(s_->ctx, key.c_str(), delta, &result) : SF_ERR_UNSUPPORTED,
          "kv_add(" + key + ")");
    return result;
  }
  std::optional<std::string> config(const std::string& key) const {
    const char* v = (s_ && s_->config) ? s_->config(s_->ctx, key.c_str()) : nullptr;
    if (!v) return std::nullopt;
    return std::string(v);
  }
  // A declared key (skyforge/config_keys.hpp), typed: its value, else its default, else nothing.
  // Throws config::ConfigError (SF_ERR_INVALID) for a value not of the key's type.
  template <class T>
  std::optional<T> config(const config::Key<T>& key) const {
    return key.find([this](const std::string& k) { return config(k); });
  }
  // The pool's communicator (ABI 1.1 hosts, on a node). Throws when there is none.
  Communicator communicator() const {
    if (!has_v11()) throw Error("communicator() needs a host with ABI 1.1", SF_ERR_UNSUPPORTED);
    const sf_communicator* c = s_->communicator(s_->ctx);
    if (!c) check(SF_ERR_UNSUPPORTED, "communicator()");
    return Communicator(c);
  }
  // A compute backend loaded on this node: the manifest's selection for an empty name.
  std::pair<const sf_compute_hooks*, void*> compute_backend(const std::string& name = "") const {
    if (!has_v11()) throw Error("compute_backend() needs a host with ABI 1.1", SF_ERR_UNSUPPORTED);
    const sf_compute_hooks* hooks = nullptr;
    void* self = nullptr;
    check(s_->compute_backend(s_->ctx, name.c_str(), &hooks, &self),
          "compute_backend(" + (name.empty() ? std::string("selected") : name) + ")");
    return {hooks, self};
  }
  const sf_host_services* raw() const { return s_; }

 private:
  bool has_v11() const {
    return s_ && s_->struct_size >= offsetof(sf_host_services, compute_backend) + sizeof(s_->compute_backend) &&
           s_->communicator && s_->compute_backend;
  }
  void check(sf_status st, const std::string& what) const {
    if (st == SF_OK) return;
    const char* msg = (s_ && s_->last_error) ? s_->last_error(s_->ctx) : nullptr;
    throw Error(what + ": " + (msg && *msg ? msg : "host service unavailable"), st);
  }
  const sf_host_services* s_ = nullptr;
};

// What a plugin's constructor receives.
struct Context {
  Host host;
  Options options;
};

class PluginBase {
 public:
  explicit PluginBase(const Context& ctx) : ctx_(ctx) {}
  virtual ~PluginBase() = default;
  const Host& host() const { return ctx_.host; }
  const Options& options() const { return ctx_.options; }

 private:
  Context ctx_;
};

// ---- framework plugins -------------------------------------------------------------------
class ImageEditor {
 public:
  explicit ImageEditor(const sf_image_editor* e) : e_(e) {}
  void add_apt(const std::string& p) const { e_->add_apt(e_->ctx, p.c_str()); }
  void add_pip(const std::string& r) const { e_->add_pip(e_->ctx, r.c_str()); }
  void set_env(const std::string& k, const std::string& v) const { e_->set_env(e_->ctx, k.c_str(), v.c_str()); }
  void add_file(const std::string& src, const std::string& dst) const {
    e_->add_file(e_->ctx, src.c_str(), dst.c_str());
  }

 private:
  const sf_image_editor* e_;
};

class Env {
 public:
  explicit Env(const sf_env* e) : e_(e) {}
  void set(const std::string& k, const std::string& v) const { e_->set(e_->ctx, k.c_str(), v.c_str()); }
  std::optional<std::string> get(const std::string& k) const {
    const char* v = e_->get(e_->ctx, k.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  }

 private:
  const sf_env* e_;
};

class Framework : public PluginBase {
 public:
  static constexpr sf_kind kind = SF_KIND_FRAMEWORK;
  using PluginBase::PluginBase;
  // client
  virtual void transform_image(const Cluster&, const ImageEditor&) {}
  virtual std::vector<std::string> bootstrap(const Cluster&) { return {}; }
  virtual void around_client_enter(const Cluster&) {}
  virtual void around_client_exit(const Cluster&, bool /*ok*/) {}
  // node
  virtual void around_app_enter(const InstanceInfo&, const Env&) {}
  virtual void around_app_exit(const InstanceInfo&, bool /*ok*/) {}
  virtual std::vector<std::string> launcher(const InstanceInfo&, std::vector<std::string> argv) { return argv; }
};

// ---- providers ---------------------------------------------------------------------------
struct PoolSpec {
  uint32_t nodes = 1;
  uint32_t concurrency = 1;
  std::string accelerator;
  std::string pool_id;
  // ABI 1.4: the local files every node needs at the same absolute path (abi.h, sf_pool_spec);
  // empty from an older host.
  std::vector<std::string> stage_files;
};

struct ProvisionedNode {
  std::string id;       // provider's handle for the node
  std::string address;  // the node's address as other nodes see it
};

struct Provisioned {
  std::vector<ProvisionedNode> nodes;
  std::string control_address;  // where nodes reach this client; empty: 127.0.0.1
};

class Provider : public PluginBase {
 public:
  static constexpr sf_kind kind = SF_KIND_PROVIDER;
  using PluginBase::PluginBase;
  using LineFn = void (*)(void*, const char*, size_t);
  virtual Provisioned provision(const PoolSpec& spec) = 0;
  // Runs `script` on the node; `log` receives its output.
  virtual void bootstrap(const std::string& node_id, const std::string& script, sf_sink log) = 0;
  virtual void start_worker(const std::string& node_id, const std::vector<std::string>& argv,
                            const std::map<std::string, std::string>& env) = 0;
  virtual void terminate(const std::vector<std::string>& node_ids) = 0;
  // 1 alive, 0 gone, -1 unknown
  virtual int worker_alive(const std::string& /*node_id*/) { return -1; }
  // How the node's worker ended (ABI 1.2; a host of 1.1 never asks): 1 with `out` filled once it
  // has ended, 0 while it runs, -1 unknown. Must not block.
  struct WorkerExit {
    int exit_code = 0;       // -1 when a signal ended it
    int signal = 0;          // 0 when it exited
    std::string last_words;  // the last line of the worker's stderr, when kept
  };
  virtual int worker_exit(const std::string& /*node_id*/, WorkerExit& /*out*/) { return -1; }
  // ABI 1.6: a provision() running on another thread should stop waiting and throw. Must not
  // block; called from the host's signal thread.
  virtual void cancel() {}
  // ABI 1.6: `skyforge sweep`: what this provider left behind for pools that are gone, found by
  // its own marks; torn down when `terminate`. One line per thing found.
  virtual std::vector<std::string> reconcile(bool /*terminate*/) {
    throw Error("this provider cannot find what it left behind", SF_ERR_UNSUPPORTED);
  }
  // ABI 1.6: `skyforge offers`: the machine types that fit `accelerator` ("" for all), cheapest
  // first, as a text table.
  virtual std::string offers(const std::string& /*accelerator*/) {
    throw Error("this provider lists no offers", SF_ERR_UNSUPPORTED);
  }
  // ABI 1.7: the node's machine is gone; give the node another one under the same id and return
  // its address (bootstrap and start_worker follow). Throw SF_ERR_UNSUPPORTED without spare room.
  virtual std::string replace_node(const std::string& /*node_id*/) {
    throw Error("this provider cannot replace a node", SF_ERR_UNSUPPORTED);
  }
};

// ---- native apps -------------------------------------------------------------------------
class App : public PluginBase {
 public:
  static constexpr sf_kind kind = SF_KIND_APP;
  using PluginBase::PluginBase;
  // broadcast / single mode: the result is shown by the host
  virtual std::string run() { throw Error("this app has no run()", SF_ERR_UNSUPPORTED); }
  // map mode: one task
  virtual std::string task(std::string_view /*input*/, uint32_t /*slot*/) {
    throw Error("this app has no task()", SF_ERR_UNSUPPORTED);
  }
  // The runtime API of docs/runtime-api.md, for convenience.
  InstanceInfo instance_info() const { return host().instance_info(); }
};

// ---- compute backends (docs/compute-backends.md) -------------------------------------------------------
struct LayerSpec {
  std::string type;  // "dense", "conv2d", ... (abi.h, sf_layer_spec)
  Options options;
};

struct ModelSpec {
  std::vector<uint32_t> input_shape;  // one sample, e.g. {28, 28, 1}
  std::vector<LayerSpec> layers;
  std::string optimizer = "adam";
  Options optimizer_options;
  std::string loss = "sparse_categorical_crossentropy";
  uint64_t seed = 0;
  uint32_t threads = 0;

  static ModelSpec from_c(const sf_model_spec& c) {
    ModelSpec m;
    m.input_shape.assign(c.input_shape, c.input_shape + c.input_rank);
    for (size_t i = 0; i < c.n_layers; ++i)
      m.layers.push_back({detail::or_empty(c.layers[i].type), Options(c.layers[i].options, c.layers[i].n_options)});
    m.optimizer = detail::or_empty(c.optimizer);
    m.optimizer_options = Options(c.optimizer_options, c.n_optimizer_options);
    m.loss = detail::or_empty(c.loss);
    m.seed = c.seed;
    m.threads = c.threads;
    return m;
  }
};

struct StepResult {
  double loss = 0;
  uint64_t correct = 0;
  uint64_t samples = 0;
};

// One model being trained; made by ComputeBackend::create_engine. Semantics: abi.h,
// sf_compute_hooks.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual StepResult train_step(const float* x, const int32_t* y, uint32_t batch) = 0;
  virtual StepResult eval_step(const float* x, const int32_t* y, uint32_t batch) = 0;
  virtual void predict(const float* x, uint32_t batch, float* logits) = 0;
  virtual uint64_t param_count() const = 0;
  virtual void get_params(float* out, uint64_t count) const = 0;
  virtual void set_params(const float* in, uint64_t count) = 0;
  virtual std::string state_dict() const = 0;
  virtual void load_state(std::string_view bytes) = 0;
  // Bound data (ABI 1.8; abi.h, sf_compute_hooks::bind_data): an engine that keeps datasets
  // overrides all five. The defaults say it keeps none, and the caller passes samples instead.
  virtual uint64_t bind_data(const float*, const int32_t*, uint64_t) {
    throw Error("this engine keeps no bound data", SF_ERR_UNSUPPORTED);
  }
  virtual void release_data(uint64_t data) { throw unknown_data(data); }
  // deferred: the result goes to the pending sums (take_results); the return value is unused.
  virtual StepResult train_step_indexed(uint64_t data, const uint64_t*, uint32_t, bool) { throw unknown_data(data); }
  virtual StepResult eval_step_indexed(uint64_t data, const uint64_t*, uint32_t, bool) { throw unknown_data(data); }
  virtual StepResult take_results() { return {}; }
  // ABI 1.9 (abi.h, sf_compute_hooks::step_batches): every rank's batch for the next indexed
  // step, from a schedule every rank shares (checked by the glue: one per rank, none 0). An
  // engine that captures steps as graphs chooses the step's graph from it; the default ignores it.
  virtual void step_batches(std::span<const uint32_t>) {}
  std::string last_error;  // the C glue keeps the engine's last failure here

 protected:
  static Error unknown_data(uint64_t data) {
    return Error("no bound data set " + std::to_string(data) + " on this engine (bind_data first)", SF_ERR_INVALID);
  }
};

class ComputeBackend : public PluginBase {
 public:
  static constexpr sf_kind kind = SF_KIND_COMPUTE_BACKEND;
  using PluginBase::PluginBase;
  // comm is NULL or size 1 for one replica.
  virtual std::unique_ptr<Engine> create_engine(const ModelSpec& spec, const Communicator& comm) = 0;
  // Whether an engine can run in this process (abi.h, sf_compute_hooks::probe; ABI 1.3): return
  // when it can, throw skyforge::Error(why, SF_ERR_UNSUPPORTED) naming what is missing. Cheap,
  // side-effect free, thread-safe. Not overridden: the hook is absent (the host assumes yes).
  virtual void probe() {}
};

// ---- task backends (docs/plugins.md; ABI 1.5) -------------------------------------------
// A map job's policy: which tasks, which node gets which in what batches, what a failure or a
// lost node means, what the run prints at the end (abi.h, sf_task_hooks). Runs in the client,
// one call at a time; no hook may block.
struct TaskJob {
  uint32_t nodes = 0;
  uint32_t slots_per_node = 1;  // [pool] concurrency
  uint32_t pipeline = 1;        // a node holds at most slots_per_node * pipeline batches (the host's bound)
  uint64_t n_tasks = 0;
  std::string app;
};

struct TaskOutcome {
  uint64_t task = 0;
  uint32_t node = 0;
  uint32_t slot = 0;
  bool ok = true;
  std::string_view value;  // the result, or the error message; valid during the call only
};

// The answers the host hands a hook: a view of its own array (no copy), valid during the call.
class TaskOutcomes {
 public:
  TaskOutcomes(const sf_task_outcome* o, size_t n) : o_(o), n_(n) {}
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  TaskOutcome operator[](size_t i) const {
    const sf_task_outcome& c = o_[i];
    return TaskOutcome{c.task, c.node, c.slot, c.ok != 0, std::string_view(c.value ? c.value : "", c.size)};
  }
  TaskOutcome front() const { return (*this)[0]; }
  class iterator {
   public:
    using value_type = TaskOutcome;
    using difference_type = std::ptrdiff_t;
    iterator(const TaskOutcomes* v, size_t i) : v_(v), i_(i) {}
    TaskOutcome operator*() const { return (*v_)[i_]; }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const iterator& o) const { return i_ != o.i_; }
    bool operator==(const iterator& o) const { return i_ == o.i_; }

   private:
    const TaskOutcomes* v_;
    size_t i_;
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, n_}; }

 private:
  const sf_task_outcome* o_;
  size_t n_;
};

enum class TasksState : int32_t { running = SF_TASKS_RUNNING, done = SF_TASKS_DONE, failed = SF_TASKS_FAILED };

class TaskBackend : public PluginBase {
 public:
  static constexpr sf_kind kind = SF_KIND_TASK_BACKEND;
  using PluginBase::PluginBase;
  // The job's task inputs when this backend makes them, in index order; empty: the manifest's
  // (`manifest_inputs`). Not overridden: the hook is absent.
  virtual std::vector<std::string> plan(const std::vector<std::string>& /*manifest_inputs*/) { return {}; }
  virtual void begin(const TaskJob& job) = 0;
  // The next batch for `node` (at most `cap` task indices); empty: nothing for it now.
  virtual std::vector<uint64_t> next_batch(uint32_t node, size_t cap) = 0;
  // One batch's answers, in the order handed out, and the node's time on the batch.
  virtual void completed(uint32_t node, const TaskOutcomes& outcomes, uint64_t elapsed_ns) = 0;
  // The node is gone with the tasks it held: hand them out again or fail.
  virtual void node_lost(uint32_t node) = 0;
  // running / done / failed (then `why` says which task, where, and what happened).
  virtual TasksState state(std::string& why) = 0;
  // What the run prints after a job that ended done, a line each; not overridden: the hook is
  // absent and the run prints `[task I] => result` per task.
  virtual std::vector<std::string> report(const TaskOutcomes& /*results*/) { return {}; }
};

// ---- the C glue -------------------------------------------------------------------------
namespace detail {

// Message of the last failed call on this thread; returned by last_error.
inline thread_local std::string t_last_error;
inline const sf_host_services* g_host = nullptr;

template <class P>
struct Instance {
  explicit Instance(const Context& c) : plugin(c) {}
  P plugin;
};

// The one place a C++ exception becomes an sf_status: runs f(), and on an exception stores its
// message in `error` and returns its status (skyforge::Error's, else SF_ERR). Every hook the SDK
// publishes goes through it, so no exception ever reaches the host.
template <class F>
sf_status translate(std::string& error, F&& f) noexcept {
  try {
    f();
    return SF_OK;
  } catch (const Error& e) {
    error = e.what();
    return e.status() == SF_OK ? SF_ERR : e.status();
  } catch (const std::invalid_argument& e) {  // bad input, e.g. the layer schema's LayerError
    error = e.what();
    return SF_ERR_INVALID;
  } catch (const std::exception& e) {
    error = e.what();
    return SF_ERR;
  } catch (...) {
    error = "unknown exception";
    return SF_ERR;
  }
}

template <class P, class F>
sf_status guard(void* self, F&& f) noexcept {
  return translate(t_last_error, [&] { f(static_cast<Instance<P>*>(self)->plugin); });
}

inline void write(sf_sink s, std::string_view v) {
  if (s.write) s.write(s.ctx, v.data(), v.size());
}

inline void fill(sf_step_result* out, const StepResult& r) {
  out->struct_size = sizeof(sf_step_result);
  out->loss = r.loss;
  out->correct = r.correct;
  out->samples = r.samples;
}

// Like guard(), for an engine: its failures are kept on the engine (engine_last_error).
template <class F>
sf_status engine_guard(void* engine, F&& f) noexcept {
  Engine& e = *static_cast<Engine*>(engine);
  return translate(e.last_error, [&] { f(e); });
}

template <class P>
sf_status create(const sf_host_services* h, const sf_kv* opts, size_t n, void** self) noexcept {
  return translate(t_last_error, [&] {
    Context ctx{Host(h), Options(opts, n)};
    *self = new Instance<P>(ctx);
  });
}
template <class P>
void destroy(void* self) noexcept {
  try {
    delete static_cast<Instance<P>*>(self);
  } catch (...) {
  }
}
inline const char* last_error(void*) noexcept { return t_last_error.c_str(); }

// True when P overrides Base::member (the member pointer's class type changes).
#define SKYFORGE_OVERRIDES(P, Base, member) (!std::is_same_v<decltype(&P::member), decltype(&Base::member)>)

template <class P>
const sf_framework_hooks* framework_hooks() {
  static const sf_framework_hooks h = [] {
    sf_framework_hooks t{};
    t.struct_size = sizeof(sf_framework_hooks);
    if constexpr (SKYFORGE_OVERRIDES(P, Framework, transform_image))
      t.transform_image = [](void* s, const sf_cluster* c, const sf_image_editor* e) noexcept {
        return guard<P>(s, [&](P& p) { p.transform_image(Cluster::from_c(*c), ImageEditor(e)); });
      };
    if constexpr (SKYFORGE_OVERRIDES(P, Framework, bootstrap))
      t.bootstrap = [](void* s, const sf_cluster* c, sf_sink out) noexcept {
        return guard<P>(s, [&](P& p) {
          for (const auto& line : p.bootstrap(Cluster::from_c(*c))) write(out, line);
        });
      };
    if constexpr (SKYFORGE_OVERRIDES(P, Framework, around_client_enter))
      t.around_client_enter = [](void* s, const sf_cluster* c) noexcept {
        return guard<P>(s, [&](P& p) { p.around_client_enter(Cluster::from_c(*c)); });
      };
    if constexpr (SKYFORGE_OVERRIDES(P, Framework, around_client_exit))
      t.around_client_exit = [](void* s, const sf_cluster* c, sf_status st) noexcept {
        return guard<P>(s, [&](P& p) { p.around_client_exit(Cluster::from_c(*c), st == SF_OK); });
      };
    if constexpr (SKYFORGE_OVERRIDES(P, Framework, around_app_enter))
      t.around_app_enter = [](void* s, const sf_instance_info* i, const sf_env* e) noexcept {
        return guard<P>(s, [&](P& p) { p.around_app_enter(InstanceInfo::from_c(*i), Env(e)); });
      };
    if constexpr (SKYFORGE_OVERRIDES(P, Framework, around_app_exit))
      t.around_app_exit = [](void* s, const sf_instance_info* i, sf_status st) noexcept {
        return guard<P>(s, [&](P& p) { p.around_app_exit(InstanceInfo::from_c(*i), st == SF_OK); });
      };
    if constexpr (SKYFORGE_OVERRIDES(P, Framework, launcher))
      t.launcher = [](void* s, const sf_instance_info* i, const sf_argv* in, sf_sink out) noexcept {
        return guard<P>(s, [&](P& p) {
          std::vector<std::string> argv(in->argv, in->argv + in->argc);
          for (const auto& a : p.launcher(InstanceInfo::from_c(*i), std::move(argv))) write(out, a);
        });
      };
    return t;
  }();
  return &h;
}

template <class P>
const sf_provider_hooks* provider_hooks() {
  static const sf_provider_hooks h = [] {
    sf_provider_hooks t{};
    t.struct_size = sizeof(sf_provider_hooks);
    t.provision = [](void* s, const sf_pool_spec* spec, const sf_node_sink* out) noexcept {
      return guard<P>(s, [&](P& p) {
        PoolSpec ps{spec->nodes, spec->concurrency, or_empty(spec->accelerator), or_empty(spec->pool_id), {}};
        if (spec->struct_size >= offsetof(sf_pool_spec, n_stage_files) + sizeof spec->n_stage_files)
          for (size_t i = 0; i < spec->n_stage_files; ++i) ps.stage_files.push_back(or_empty(spec->stage_files[i]));
        Provisioned r = p.provision(ps);
        for (const auto& n : r.nodes) out->add_node(out->ctx, n.id.c_str(), n.address.c_str());
        if (!r.control_address.empty()) out->set_control_address(out->ctx, r.control_address.c_str());
      });
    };
    t.bootstrap = [](void* s, const char* node, const char* script, sf_sink log) noexcept {
      return guard<P>(s, [&](P& p) { p.bootstrap(node, script, log); });
    };
    t.start_worker = [](void* s, const char* node, const sf_argv* cmd, const sf_kv* env, size_t n) noexcept {
      return guard<P>(s, [&](P& p) {
        std::vector<std::string> argv(cmd->argv, cmd->argv + cmd->argc);
        std::map<std::string, std::string> e;
        for (size_t i = 0; i < n; ++i) e[or_empty(env[i].key)] = or_empty(env[i].value);
        p.start_worker(node, argv, e);
      });
    };
    t.terminate = [](void* s, const char* const* ids, size_t n) noexcept {
      return guard<P>(s, [&](P& p) { p.terminate(std::vector<std::string>(ids, ids + n)); });
    };
    if constexpr (SKYFORGE_OVERRIDES(P, Provider, worker_alive))
      t.worker_alive = [](void* s, const char* node) noexcept -> int32_t {
        int32_t r = -1;
        if (guard<P>(s, [&](P& p) { r = p.worker_alive(node); }) != SF_OK) return -1;
        return r;
      };
    if constexpr (SKYFORGE_OVERRIDES(P, Provider, worker_exit))
      t.worker_exit = [](void* s, const char* node, sf_worker_exit* out) noexcept -> int32_t {
        int32_t r = -1;
        Provider::WorkerExit e;
        if (guard<P>(s, [&](P& p) { r = p.worker_exit(node, e); }) != SF_OK || r != 1) return r == 1 ? -1 : r;
        out->exit_code = e.exit_code;
        out->signal = e.signal;
        const size_t n = std::min(e.last_words.size(), sizeof out->last_words - 1);
        std::memcpy(out->last_words, e.last_words.data(), n);
        out->last_words[n] = '\0';
        return 1;
      };
    if constexpr (SKYFORGE_OVERRIDES(P, Provider, cancel))
      t.cancel = [](void* s) noexcept { (void)guard<P>(s, [&](P& p) { p.cancel(); }); };
    if constexpr (SKYFORGE_OVERRIDES(P, Provider, reconcile))
      t.reconcile = [](void* s, int32_t terminate, sf_sink report) noexcept {
        return guard<P>(s, [&](P& p) {
          for (const auto& line : p.reconcile(terminate != 0)) write(report, line + "\n");
        });
      };
    if constexpr (SKYFORGE_OVERRIDES(P, Provider, offers))
      t.offers = [](void* s, const char* accelerator, sf_sink out) noexcept {
        return guard<P>(s, [&](P& p) { write(out, p.offers(or_empty(accelerator))); });
      };
    if constexpr (SKYFORGE_OVERRIDES(P, Provider, replace_node))
      t.replace_node = [](void* s, const char* node, sf_sink address) noexcept {
        return guard<P>(s, [&](P& p) { write(address, p.replace_node(or_empty(node))); });
      };
    return t;
  }();
  return &h;
}

template <class P>
const sf_app_hooks* app_hooks() {
  static const sf_app_hooks h = [] {
    sf_app_hooks t{};
    t.struct_size = sizeof(sf_app_hooks);
    if constexpr (SKYFORGE_OVERRIDES(P, App, run))
      t.run = [](void* s, sf_sink out) noexcept { return guard<P>(s, [&](P& p) { write(out, p.run()); }); };
    if constexpr (SKYFORGE_OVERRIDES(P, App, task))
      t.task = [](void* s, const char* in, size_t n, uint32_t slot, sf_sink out) noexcept {
        return guard<P>(s, [&](P& p) { write(out, p.task(std::string_view(in, n), slot)); });
      };
    return t;
  }();
  return &h;
}

template <class P>
const sf_compute_hooks* compute_hooks() {
  static const sf_compute_hooks h = [] {
    sf_compute_hooks t{};
    t.struct_size = sizeof(sf_compute_hooks);
    t.engine_create = [](void* s, const sf_model_spec* spec, const sf_communicator* comm, void** engine) noexcept {
      return guard<P>(s, [&](P& p) {
        *engine = p.create_engine(ModelSpec::from_c(*spec), Communicator(comm)).release();
      });
    };
    t.engine_destroy = [](void*, void* engine) noexcept { delete static_cast<Engine*>(engine); };
    t.engine_last_error = [](void*, void* engine) noexcept -> const char* {
      return engine ? static_cast<Engine*>(engine)->last_error.c_str() : t_last_error.c_str();
    };
    t.train_step = [](void*, void* e, const float* x, const int32_t* y, uint32_t b, sf_step_result* out) noexcept {
      return engine_guard(e, [&](Engine& en) { fill(out, en.train_step(x, y, b)); });
    };
    t.eval_step = [](void*, void* e, const float* x, const int32_t* y, uint32_t b, sf_step_result* out) noexcept {
      return engine_guard(e, [&](Engine& en) { fill(out, en.eval_step(x, y, b)); });
    };
    t.predict = [](void*, void* e, const float* x, uint32_t b, float* logits) noexcept {
      return engine_guard(e, [&](Engine& en) { en.predict(x, b, logits); });
    };
    t.param_count = [](void*, void* e, uint64_t* n) noexcept {
      return engine_guard(e, [&](Engine& en) { *n = en.param_count(); });
    };
    t.get_params = [](void*, void* e, float* out, uint64_t n) noexcept {
      return engine_guard(e, [&](Engine& en) { en.get_params(out, n); });
    };
    t.set_params = [](void*, void* e, const float* in, uint64_t n) noexcept {
      return engine_guard(e, [&](Engine& en) { en.set_params(in, n); });
    };
    t.state_dict = [](void*, void* e, sf_sink out) noexcept {
      return engine_guard(e, [&](Engine& en) { write(out, en.state_dict()); });
    };
    t.load_state = [](void*, void* e, const char* data, size_t n) noexcept {
      return engine_guard(e, [&](Engine& en) { en.load_state(std::string_view(data, n)); });
    };
    if constexpr (SKYFORGE_OVERRIDES(P, ComputeBackend, probe))
      t.probe = [](void* s) noexcept { return guard<P>(s, [&](P& p) { p.probe(); }); };
    // Bound data: every SDK engine has the hooks; one that keeps no data answers bind_data with
    // SF_ERR_UNSUPPORTED (Engine's defaults), which callers take as "pass samples".
    t.bind_data = [](void*, void* e, const float* x, const int32_t* y, uint64_t n, uint64_t* data) noexcept {
      return engine_guard(e, [&](Engine& en) { *data = en.bind_data(x, y, n); });
    };
    t.release_data = [](void*, void* e, uint64_t data) noexcept {
      return engine_guard(e, [&](Engine& en) { en.release_data(data); });
    };
    t.train_step_indexed = [](void*, void* e, uint64_t data, const uint64_t* idx, uint32_t b,
                              sf_step_result* out) noexcept {
      return engine_guard(e, [&](Engine& en) {
        const StepResult r = en.train_step_indexed(data, idx, b, out == nullptr);
        if (out) fill(out, r);
      });
    };
    t.eval_step_indexed = [](void*, void* e, uint64_t data, const uint64_t* idx, uint32_t b,
                             sf_step_result* out) noexcept {
      return engine_guard(e, [&](Engine& en) {
        const StepResult r = en.eval_step_indexed(data, idx, b, out == nullptr);
        if (out) fill(out, r);
      });
    };
    t.take_results = [](void*, void* e, sf_step_result* out) noexcept {
      return engine_guard(e, [&](Engine& en) { fill(out, en.take_results()); });
    };
    t.step_batches = [](void*, void* e, const uint32_t* batches, uint32_t ranks) noexcept {
      return engine_guard(e, [&](Engine& en) {
        if (!batches || ranks == 0) throw Error("step_batches: no batches", SF_ERR_INVALID);
        const std::span<const uint32_t> all(batches, ranks);
        for (uint32_t r = 0; r < ranks; ++r)
          if (all[r] == 0) throw Error("step_batches: rank " + std::to_string(r) + "'s batch is 0", SF_ERR_INVALID);
        en.step_batches(all);
      });
    };
    return t;
  }();
  return &h;
}

template <class P>
const sf_task_hooks* task_hooks() {
  static const sf_task_hooks h = [] {
    sf_task_hooks t{};
    t.struct_size = sizeof(sf_task_hooks);
    if constexpr (SKYFORGE_OVERRIDES(P, TaskBackend, plan))
      t.plan = [](void* s, const char* const* in, size_t n, sf_sink out) noexcept {
        return guard<P>(s, [&](P& p) {
          std::vector<std::string> given;
          given.reserve(n);
          for (size_t i = 0; i < n; ++i) given.emplace_back(or_empty(in[i]));
          for (const auto& input : p.plan(given)) write(out, input);
        });
      };
    t.begin = [](void* s, const sf_task_job* j) noexcept {
      return guard<P>(s, [&](P& p) {
        p.begin(TaskJob{j->nodes, j->slots_per_node, j->pipeline, j->n_tasks, or_empty(j->app)});
      });
    };
    t.next_batch = [](void* s, uint32_t node, uint64_t* tasks, size_t cap, size_t* n) noexcept {
      *n = 0;
      return guard<P>(s, [&](P& p) {
        std::vector<uint64_t> b = p.next_batch(node, cap);
        if (b.size() > cap) throw Error("next_batch: a batch of " + std::to_string(b.size()) + " tasks, at most " +
                                        std::to_string(cap) + " allowed");
        std::copy(b.begin(), b.end(), tasks);
        *n = b.size();
      });
    };
    t.completed = [](void* s, uint32_t node, const sf_task_outcome* o, size_t n, uint64_t ns) noexcept {
      return guard<P>(s, [&](P& p) { p.completed(node, TaskOutcomes(o, n), ns); });
    };
    t.node_lost = [](void* s, uint32_t node) noexcept { return guard<P>(s, [&](P& p) { p.node_lost(node); }); };
    t.state = [](void* s, sf_sink why) noexcept -> int32_t {
      std::string w;
      TasksState st = TasksState::failed;
      if (guard<P>(s, [&](P& p) { st = p.state(w); }) != SF_OK) w = "state: " + t_last_error;
      if (st == TasksState::failed) write(why, w);
      return static_cast<int32_t>(st);
    };
    if constexpr (SKYFORGE_OVERRIDES(P, TaskBackend, report))
      t.report = [](void* s, const sf_task_outcome* r, size_t n, sf_sink out) noexcept {
        return guard<P>(s, [&](P& p) {
          for (const auto& line : p.report(TaskOutcomes(r, n))) write(out, line);
        });
      };
    return t;
  }();
  return &h;
}

template <class P>
const void* hooks_for() {
  if constexpr (std::is_base_of_v<Framework, P>) return framework_hooks<P>();
  else if constexpr (std::is_base_of_v<Provider, P>) return provider_hooks<P>();
  else if constexpr (std::is_base_of_v<App, P>) return app_hooks<P>();
  else if constexpr (std::is_base_of_v<ComputeBackend, P>) return compute_hooks<P>();
  else if constexpr (std::is_base_of_v<TaskBackend, P>) return task_hooks<P>();
  else static_assert(std::is_base_of_v<Framework, P>,
                     "a plugin derives from skyforge::Framework, Provider, App, ComputeBackend or TaskBackend");
}

// The ABI minor a plugin requires (docs/plugins.md): skyforge_add_plugin() defines
// SKYFORGE_PLUGIN_ABI_MINOR from plugin.toml's `abi`; built some other way, the minor of the
// header it was compiled against. Compute backends exist from 1.1 on.
#ifndef SKYFORGE_PLUGIN_ABI_MINOR
#define SKYFORGE_PLUGIN_ABI_MINOR SKYFORGE_ABI_MINOR
#endif
static_assert(SKYFORGE_PLUGIN_ABI_MINOR <= SKYFORGE_ABI_MINOR,
              "plugin.toml asks for a newer plugin ABI than this SDK's abi.h provides");

template <class P>
const sf_plugin_descriptor* entry(const sf_host_services* host, const char* name, const char* version,
                                  const char* description) noexcept {
  g_host = host;
  static const sf_plugin_descriptor d = [&] {
    sf_plugin_descriptor t{};
    t.struct_size = sizeof(sf_plugin_descriptor);
    t.abi_major = SKYFORGE_ABI_MAJOR;
    // A kind exists from the minor that brought it (compute backends 1.1, task backends' hooks 1.5).
    constexpr uint16_t kind_minor = P::kind == SF_KIND_COMPUTE_BACKEND ? 1 : P::kind == SF_KIND_TASK_BACKEND ? 5 : 0;
    t.abi_minor = SKYFORGE_PLUGIN_ABI_MINOR < kind_minor ? kind_minor : SKYFORGE_PLUGIN_ABI_MINOR;
    t.kind = P::kind;
    t.name = name;
    t.version = version;
    t.description = description;
    t.create = &create<P>;
    t.destroy = &destroy<P>;
    t.last_error = &last_error;
    t.hooks = hooks_for<P>();
    return t;
  }();
  return &d;
}

}  // namespace detail
}  // namespace skyforge

// Registers Class as this .so's plugin. Exactly one per shared library.
#define SKYFORGE_PLUGIN(Class, Name, Version, Description)                                            \
  extern "C" SKYFORGE_EXPORT const sf_plugin_descriptor* skyforge_plugin_entry(                       \
      const sf_host_services* host, uint16_t, uint16_t) {                                              \
    return ::skyforge::detail::entry<Class>(host, Name, Version, Description);                        \
  }
