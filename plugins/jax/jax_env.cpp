#include "jax_env.hpp"

#include <limits>
#include <stdexcept>

#include "address.hpp"

namespace skyforge::jax {


namespace {
void check(const Placement& p) {
  fw::check_placement(p);
  if (uint64_t(p.nodes) * p.nproc_per_node > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("JAX_NUM_PROCESSES overflows");
}

bool device_ids_per_process(const Placement& p, const Settings& s) {
  return p.nproc_per_node > 1 && s.local_devices > 0 && !s.per_process_devices;
}
}  // namespace

EnvList environment(const Placement& p, const Settings& s) {
  check(p);
  auto n = [](uint64_t v) { return std::to_string(v); };
  const uint32_t nproc = p.nproc_per_node;
  // Devices one process sees: all of the node's, or one each when the node runs one process per
  // device; on CPU, JAX_NUM_CPU_DEVICES (JAX's default is one CPU device).
  uint32_t per_process = s.local_devices > 0 ? (nproc > 1 ? 1 : s.local_devices) : (s.cpu_devices ? s.cpu_devices : 1);
  EnvList env = {
      {"JAX_COORDINATOR_ADDRESS", fw::host_port(s.coordinator_host, s.coordinator_port)},
      {"JAX_NUM_PROCESSES", n(uint64_t(p.nodes) * nproc)},
      {"JAX_PROCESS_ID", n(uint64_t(p.node) * nproc)},
      {"JAX_LOCAL_DEVICE_COUNT", n(per_process)},
  };
  if (s.local_devices == 0 && s.cpu_devices > 0) env.emplace_back("JAX_NUM_CPU_DEVICES", n(s.cpu_devices));
  if (device_ids_per_process(p, s)) env.emplace_back("JAX_LOCAL_DEVICE_IDS", n(uint64_t(p.machine_slot) * nproc));
  if (!s.hook_dir.empty())
    env.emplace_back("PYTHONPATH", s.pythonpath.empty() ? s.hook_dir : s.hook_dir + ":" + s.pythonpath);
  if (nproc > 1) {
    std::string add;
    for (const auto& v : fanout_variables(p, s)) add += (add.empty() ? "" : " ") + v;
    env.emplace_back("SKYFORGE_FANOUT_NPROC", n(nproc));
    env.emplace_back("SKYFORGE_FANOUT_ADD", add);
  }
  return env;
}

std::vector<std::string> fanout_variables(const Placement& p, const Settings& s) {
  std::vector<std::string> v = {"JAX_PROCESS_ID"};
  if (device_ids_per_process(p, s)) v.push_back("JAX_LOCAL_DEVICE_IDS");
  return v;
}

const std::string& sitecustomize_source() {
  static const std::string s = R"PY(# Written by skyforge's `jax` framework plugin. It makes a bare `jax.distributed.initialize()`
# find this pool: when jax's cluster-detection module is imported, it registers a ClusterEnv
# that reads JAX_NUM_PROCESSES and JAX_PROCESS_ID (JAX itself reads JAX_COORDINATOR_ADDRESS).
# It imports nothing else and does nothing until jax is imported; then it runs the
# sitecustomize it shadows, if there is one.
import os as _os
import sys as _sys


def _skyforge_register(clusters):
    class SkyforgeCluster(clusters.ClusterEnv):
        name = "skyforge"

        @classmethod
        def is_env_present(cls):
            return all(k in _os.environ for k in
                       ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"))

        @classmethod
        def get_coordinator_address(cls, timeout_secs=None, override_coordinator_port=None):
            address = _os.environ["JAX_COORDINATOR_ADDRESS"]
            if override_coordinator_port:
                address = address.rsplit(":", 1)[0] + ":" + str(override_coordinator_port)
            return address

        @classmethod
        def get_process_count(cls):
            return int(_os.environ["JAX_NUM_PROCESSES"])

        @classmethod
        def get_process_id(cls):
            return int(_os.environ["JAX_PROCESS_ID"])

        @classmethod
        def get_local_process_id(cls):
            return None  # the plugin sets JAX_LOCAL_DEVICE_IDS itself when it should

    # Checked before Slurm, Open MPI, ...: inside a skyforge pool its values are the truth.
    types = clusters.ClusterEnv._cluster_types
    if SkyforgeCluster in types:
        types.remove(SkyforgeCluster)
        types.insert(0, SkyforgeCluster)


class _SkyforgeJaxFinder:
    _target = "jax._src.clusters"

    def find_spec(self, name, path=None, target=None):
        if name != self._target:
            return None
        import importlib.util
        _sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            _sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            try:
                _skyforge_register(module)
            except Exception as e:  # never break `import jax`
                print("skyforge: cannot register the jax cluster environment: %r" % (e,), file=_sys.stderr)
            finally:
                loader.exec_module = original
                if self in _sys.meta_path:
                    _sys.meta_path.remove(self)

        loader.exec_module = exec_module
        return spec


if _os.environ.get("JAX_NUM_PROCESSES") is not None:
    _sys.meta_path.insert(0, _SkyforgeJaxFinder())


def _skyforge_chain():
    # Run the sitecustomize this one shadows (e.g. the distribution's), if any.
    import importlib.machinery
    import importlib.util
    here = _os.path.dirname(_os.path.abspath(__file__))
    rest = [p for p in _sys.path if p and _os.path.abspath(p) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    _skyforge_chain()
except Exception:
    pass
)PY";
  return s;
}

}  // namespace skyforge::jax
