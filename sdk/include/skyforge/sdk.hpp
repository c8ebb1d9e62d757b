// skyforge SDK — header-only C++ layer over the C ABI in abi.h.
//
// A plugin is a class deriving from one of skyforge::Framework, skyforge::Provider or
// skyforge::App, constructible from a skyforge::Context, registered with one macro:
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

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

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

// The host's services, as lent to this plugin.
class Host {
 public:
  Host() = default;
  explicit Host(const sf_host_services* s) : s_(s) {}

  void log(int32_t level, const std::string& message) const {
    if (s_ && s_->log) s_->log(s_->ctx, level, message.c_str());
  }
  void info(const std::string& m) const { log(SF_LOG_INFO, m); }
  void warn(const std::string& m) const { log(SF_LOG_WARN, m); }

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
  const sf_host_services* raw() const { return s_; }

 private:
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
  // The runtime API of DESIGN.md §6, for convenience.
  InstanceInfo instance_info() const { return host().instance_info(); }
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

template <class P, class F>
sf_status guard(void* self, F&& f) noexcept {
  try {
    f(static_cast<Instance<P>*>(self)->plugin);
    return SF_OK;
  } catch (const Error& e) {
    t_last_error = e.what();
    return e.status() == SF_OK ? SF_ERR : e.status();
  } catch (const std::exception& e) {
    t_last_error = e.what();
    return SF_ERR;
  } catch (...) {
    t_last_error = "unknown exception";
    return SF_ERR;
  }
}

inline void write(sf_sink s, std::string_view v) {
  if (s.write) s.write(s.ctx, v.data(), v.size());
}

template <class P>
sf_status create(const sf_host_services* h, const sf_kv* opts, size_t n, void** self) noexcept {
  try {
    Context ctx{Host(h), Options(opts, n)};
    *self = new Instance<P>(ctx);
    return SF_OK;
  } catch (const Error& e) {
    t_last_error = e.what();
    return e.status() == SF_OK ? SF_ERR : e.status();
  } catch (const std::exception& e) {
    t_last_error = e.what();
    return SF_ERR;
  } catch (...) {
    t_last_error = "unknown exception in plugin constructor";
    return SF_ERR;
  }
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
        PoolSpec ps{spec->nodes, spec->concurrency, or_empty(spec->accelerator), or_empty(spec->pool_id)};
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
const void* hooks_for() {
  if constexpr (std::is_base_of_v<Framework, P>) return framework_hooks<P>();
  else if constexpr (std::is_base_of_v<Provider, P>) return provider_hooks<P>();
  else if constexpr (std::is_base_of_v<App, P>) return app_hooks<P>();
  else static_assert(std::is_base_of_v<Framework, P>, "a plugin derives from skyforge::Framework, Provider or App");
}

template <class P>
const sf_plugin_descriptor* entry(const sf_host_services* host, const char* name, const char* version,
                                  const char* description) noexcept {
  g_host = host;
  static const sf_plugin_descriptor d = [&] {
    sf_plugin_descriptor t{};
    t.struct_size = sizeof(sf_plugin_descriptor);
    t.abi_major = SKYFORGE_ABI_MAJOR;
    t.abi_minor = SKYFORGE_ABI_MINOR;
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
