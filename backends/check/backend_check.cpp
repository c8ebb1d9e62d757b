// The suite's run: loads the backend under test (and the reference) from the plugin catalogue,
// runs every check on it and prints a line per check and the tally.
#include "backend_check.hpp"

#include <skyforge/keras.hpp>
#include <skyforge/layer_schema.hpp>

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <vector>
#include <ostream>

#include "catalog.hpp"
#include "checks.hpp"
#include "engine.hpp"
#include "loader.hpp"
#include "models.hpp"
#include "services.hpp"

namespace skyforge::backend_check {
namespace {

struct Tally {
  int passed = 0, skipped = 0, failed = 0;
};

void run_check(std::ostream& out, Tally& t, const std::string& name, const std::function<std::string()>& fn) {
  try {
    const std::string what = fn();
    out << "PASS  " << name << ": " << what << "\n";
    ++t.passed;
  } catch (const Skip& s) {
    out << "SKIP  " << name << ": " << s.what() << "\n";
    ++t.skipped;
  } catch (const std::exception& e) {
    out << "FAIL  " << name << ": " << e.what() << "\n";
    ++t.failed;
  }
  out.flush();
}

}  // namespace

int run(const Options& o, std::ostream& out, std::ostream& err) {
  Catalog catalog(Catalog::default_search_dirs(o.plugin_path));
  Services services([&](int32_t level, const std::string& m) {
    if (level >= SF_LOG_WARN) err << o.program << ": " << m << "\n";
  });
  Loader loader(services.table());
  struct Loaded {
    std::unique_ptr<PluginInstance> instance;
    keras::Backend backend;
  };
  auto load = [&](const std::string& name, const Kv& given, const std::string& role) -> std::optional<Loaded> {
    const PluginInfo* info = catalog.find(name);
    if (!info || info->kind != "compute_backend") {
      err << o.program << ": no compute backend named '" << name << "' (see `skyforge plugins`)\n";
      return std::nullopt;
    }
    Kv options = given;
    for (const auto& opt : info->options)
      if (opt.default_value && std::none_of(options.begin(), options.end(), [&](auto& kv) { return kv.first == opt.name; }))
        options.emplace_back(opt.name, *opt.default_value);
    try {
      Loaded l;
      l.instance = loader.create(loader.load(info->library, info->name, SF_KIND_COMPUTE_BACKEND,
                                             std::make_pair(info->abi_major, info->abi_minor)),
                                 options);
      l.instance->call_optional(&sf_compute_hooks::probe, "probe");
      l.backend = keras::Backend(l.instance->hooks<sf_compute_hooks>(), l.instance->self());
      out << role << name << " " << info->version << " (" << info->library << ", ABI " << info->abi_major << "."
          << info->abi_minor << ")\n";
      return l;
    } catch (const std::exception& e) {
      err << o.program << ": compute backend '" << name << "' cannot run here: " << e.what() << "\n";
      return std::nullopt;
    }
  };
  auto subject = load(o.backend, o.options, o.program + ": ");
  if (!subject) return 2;
  std::optional<Loaded> reference;
  if (!o.against.empty() && o.against != o.backend) {
    reference = load(o.against, {}, "  reference: ");
    if (!reference) return 2;
  }

  Tally t;
  const keras::Backend b = subject->backend;
  const keras::Backend* ref = reference ? &reference->backend : nullptr;
  auto check_harness = [&](const std::string& name, const Harness& h) {
    run_check(out, t, name, [&] { return harness(b, h, ref, o.against); });
  };
  for (const schema::LayerDef& def : schema::catalogue()) {
    const std::string type(def.type);
    const std::vector<Harness> hs = harnesses(type);
    if (hs.empty())
      run_check(out, t, "layer " + type, []() -> std::string {
        throw Failure("the suite has no model for this layer of the schema (backends/check/models.cpp)");
      });
    for (const Harness& h : hs) check_harness("layer " + type + (h.variant.empty() ? "" : " (" + h.variant + ")"), h);
  }
  for (const Harness& h : graph_blocks()) check_harness("model " + h.variant, h);
  run_check(out, t, "data parallel", [&] { return data_parallel(b); });
  run_check(out, t, "synchronized batch_normalization", [&] { return synchronized_batchnorm(b); });
  run_check(out, t, "state", [&] { return state(b); });
  run_check(out, t, "bad input", [&] { return bad_input(b); });
  run_check(out, t, "bound data", [&] { return bound_data(b); });
  for (const schema::OptimizerDef& def : schema::optimizers()) {
    const std::string name(def.name);
    run_check(out, t, "optimizer " + name, [&] { return optimizer(b, name, ref, o.against); });
  }
  if (reference) {
    run_check(out, t, "agrees with " + o.against, [&] { return agreement(b, reference->backend, o.against); });
    run_check(out, t, "checkpoint with " + o.against, [&] { return checkpoint(b, reference->backend, o.against); });
  }
  if (t.passed == 0) {  // a backend that refuses every model has not shown anything
    out << "FAIL  the backend refused every model of the suite: nothing was checked\n";
    ++t.failed;
  }
  out << t.passed << " passed, " << t.skipped << " skipped, " << t.failed << " failed\n";
  return t.failed ? 1 : 0;
}

}  // namespace skyforge::backend_check
