// The `jax` framework plugin: JAX_COORDINATOR_ADDRESS (the head's address and a port the head
// finds free when the pool starts, published through the pool's store), JAX_NUM_PROCESSES,
// JAX_PROCESS_ID and JAX_LOCAL_DEVICE_COUNT on every node, plus a sitecustomize hook on
// PYTHONPATH so that `jax.distributed.initialize()` needs no arguments (jax_env.hpp).
#include <skyforge/sdk.hpp>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <skyforge/accelerator.hpp>
#include "devices.hpp"
#include "export_env.hpp"
#include "fanout.hpp"
#include "jax_env.hpp"
#include "rendezvous.hpp"

namespace {

namespace sj = skyforge::jax;
namespace fw = skyforge::fw;

class Jax : public skyforge::Framework {
 public:
  explicit Jax(const skyforge::Context& ctx) : Framework(ctx) {
    rendezvous_ = fw::rendezvous_options(options(), "jax", "coordinator_port");
    nproc_option_ = options().get_int("nproc_per_node", 1);
    if (nproc_option_ < 0 || nproc_option_ > 65536)
      throw skyforge::Error("jax: nproc_per_node: expected 0 (one per local device) or a count, got " +
                                std::to_string(nproc_option_),
                            SF_ERR_INVALID);
    int64_t cpu = options().get_int("cpu_devices", 0);
    if (cpu < 0 || cpu > 4096)
      throw skyforge::Error("jax: cpu_devices: expected 0 (JAX's default) or a count, got " + std::to_string(cpu),
                            SF_ERR_INVALID);
    cpu_devices_ = uint32_t(cpu);
    python_hook_ = options().get_bool("python_hook", true);
  }

  void around_app_enter(const skyforge::InstanceInfo& info, const skyforge::Env& env) override {
    if (info.head_addr.empty()) throw skyforge::Error("jax: the pool has no head address");
    const uint32_t devices = fw::local_devices(info, env);
    nproc_ = nproc_option_ > 0 ? uint32_t(nproc_option_) : (devices > 0 ? devices : 1);
    sj::Settings s;
    s.coordinator_host = info.head_addr;
    s.coordinator_port = fw::head_port(host(), info, "jax/" + info.pool_id + "/coordinator_port", rendezvous_, "jax",
                                       "the coordinator port (or set the coordinator_port option)");
    s.local_devices = devices;
    s.cpu_devices = cpu_devices_;
    s.per_process_devices = env.get(fw::kFanoutDevices).has_value();
    s.pythonpath = env.get("PYTHONPATH").value_or("");
    if (python_hook_) s.hook_dir = write_hook(info);
    sj::EnvList vars;
    try {
      vars = sj::environment(fw::placement(info, nproc_), s);
    } catch (const std::invalid_argument& e) {
      throw skyforge::Error(std::string("jax: ") + e.what(), SF_ERR_INVALID);
    }
    fw::export_environment(env, vars);
  }

  std::vector<std::string> launcher(const skyforge::InstanceInfo&, std::vector<std::string> argv) override {
    if (nproc_ <= 1) return argv;
    return fw::fanout_argv(std::move(argv));
  }

 private:
  // <work_dir>/.skyforge/jax/sitecustomize.py; the work dir goes with the node.
  std::string write_hook(const skyforge::InstanceInfo& info) const {
    namespace fs = std::filesystem;
    fs::path dir = fs::path(info.work_dir.empty() ? fs::current_path() : fs::path(info.work_dir)) / ".skyforge" / "jax";
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw skyforge::Error("jax: cannot create " + dir.string() + ": " + ec.message());
    std::ofstream f(dir / "sitecustomize.py", std::ios::trunc);
    f << sj::sitecustomize_source();
    f.close();
    if (!f) throw skyforge::Error("jax: cannot write " + (dir / "sitecustomize.py").string());
    return dir.string();
  }

  fw::RendezvousOptions rendezvous_;
  int64_t nproc_option_ = 1;
  uint32_t cpu_devices_ = 0;
  bool python_hook_ = true;
  uint32_t nproc_ = 1;
};

}  // namespace

SKYFORGE_PLUGIN(Jax, "jax", "0.1.0",
                "JAX multi-process environment: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID")
