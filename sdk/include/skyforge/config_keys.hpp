// skyforge/config_keys.hpp — every configuration key a job carries across the plugin ABI
// (abi.h: sf_host_services.config, a dotted key to text), with its type and its default, and the
// formats of the values that have one: the [search] task input and the newline lists.
//
// The host writes the keys (from the manifest and the run: job.*, pool.*, train.*, search.*,
// compute.backend), plugins read them: typed, through Key<T>::find/get over any lookup
// `(const std::string& key) -> std::optional<std::string>` — the SDK's Host::config(key) does it
// (sdk.hpp), the host's config map another. docs/plugins.md lists the keys for plugin authors.
//
// A key's default is written once, here: the host fills it in (the [train] table writes every
// [train] default) and a reader that finds the key absent gets the same value.
//
// Header-only, C++20, no dependency beyond the standard library, so that the host and any plugin
// can include it. Errors are ConfigError (a std::invalid_argument), messages like
// "config train.batch_size: expected an integer >= 0, got 'x'".
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace skyforge::config {

class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// ---- value texts -----------------------------------------------------------------------------------
// A newline list ("search.params", "search.param_grid.<name>"): the items, in order.
inline std::string join_lines(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "\n" : "") + items[i];
  return out;
}
inline std::vector<std::string> split_lines(std::string_view text) {
  std::vector<std::string> out;
  for (size_t b = 0; b <= text.size() && !text.empty();) {
    const size_t e = std::min(text.find('\n', b), text.size());
    out.emplace_back(text.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

namespace detail {

[[noreturn]] inline void refuse(std::string_view key, const char* expected, std::string_view text) {
  throw ConfigError("config " + std::string(key) + ": expected " + expected + ", got '" + std::string(text) + "'");
}

template <class T>
T decode(std::string_view key, std::string_view text) {
  if constexpr (std::is_same_v<T, std::string>) {
    return std::string(text);
  } else if constexpr (std::is_same_v<T, bool>) {
    if (text == "true") return true;
    if (text == "false") return false;
    refuse(key, "true or false", text);
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) refuse(key, "an integer >= 0", text);
    return n;
  } else if constexpr (std::is_same_v<T, double>) {
    double d = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(d))
      refuse(key, "a number", text);
    return d;
  } else {
    static_assert(std::is_same_v<T, std::vector<std::string>>, "a key's type: text, bool, uint64_t, double or a list");
    return split_lines(text);
  }
}

}  // namespace detail

// ---- a key ---------------------------------------------------------------------------------------------
template <class T>
struct Key {
  std::string_view name;      // "train.batch_size"
  std::string_view fallback;  // the default's text; empty: none (an absent key is absent)
  std::string_view doc;

  // The value, else the default, else nothing. Throws ConfigError for a value not of type T.
  template <class Lookup>
  std::optional<T> find(const Lookup& config) const {
    std::optional<std::string> text = config(std::string(name));
    if (!text && fallback.empty()) return std::nullopt;
    return detail::decode<T>(name, text ? std::string_view(*text) : fallback);
  }
  // The value, else the default; a key with neither is an error (the job did not set it).
  template <class Lookup>
  T get(const Lookup& config) const {
    if (std::optional<T> v = find(config)) return *v;
    throw ConfigError("config " + std::string(name) + " is missing (" + std::string(doc) + ")");
  }
};

// ---- the keys --------------------------------------------------------------------------------------------
namespace keys {

// The job (host: plugin_resolution.cpp, run.cpp).
inline constexpr Key<std::string> job_kind{"job.kind", {}, "command, app or train: what the job runs"};
inline constexpr Key<std::string> job_mode{"job.mode", {}, "broadcast, single or map"};
inline constexpr Key<std::string> job_app{"job.app", {}, "the native app's name; absent for a command"};
inline constexpr Key<std::string> job_manifest{"job.manifest", {}, "the manifest's path on the client"};
inline constexpr Key<double> job_timeout{"job.timeout", {}, "[job] timeout in seconds, when set"};
inline constexpr Key<double> job_collective_timeout{"job.collective_timeout", {},
                                                    "seconds a collective waits for a peer; collective_timeout_s()"};
inline constexpr Key<bool> job_resume{"job.resume", "false", "skyforge run --resume"};
inline constexpr Key<uint64_t> job_restart{"job.restart", {}, "restarts after a lost node so far, when any"};
inline constexpr Key<bool> log_verbose{"log.verbose", {}, "skyforge run -v"};
// The job's files (the worker reads them; docs/manifest.md, "Getting files back").
inline constexpr Key<std::vector<std::string>> job_outputs{"job.outputs", {},
                                                           "[job] outputs: globs of the working directory's files to send back"};
inline constexpr Key<uint64_t> job_outputs_max_bytes{"job.outputs_max_bytes", "1073741824",
                                                     "[job] outputs_max_bytes: what one node sends back at most"};

// The pool ([pool]).
inline constexpr Key<std::string> pool_provider{"pool.provider", {}, "[pool] provider"};
inline constexpr Key<uint64_t> pool_nodes{"pool.nodes", {}, "[pool] nodes"};
inline constexpr Key<uint64_t> pool_concurrency{"pool.concurrency", {}, "[pool] concurrency"};

// On nodes: the compute backend the job selected (cpu, cuda, ...).
inline constexpr Key<std::string> compute_backend{"compute.backend", {}, "the selected compute backend"};

// The built-in train job: the [train] table as the host checked it (train_table.cpp writes every
// default below; docs/training.md). Optimizer options have no default here: theirs are the
// optimizer's, in optimizer_schema.hpp.
inline constexpr Key<std::string> train_dataset{"train.dataset", "fashion-mnist", "[train] dataset"};
inline constexpr Key<std::string> train_data_dir{"train.data_dir", {}, "[train] data_dir, the host's default /usr/share/datasets/<dataset>"};
inline constexpr Key<uint64_t> train_layers{"train.layers", {}, "the number of [[train.layers]]"};
inline constexpr Key<std::string> train_optimizer{"train.optimizer", "adam", "[train] optimizer"};
inline constexpr Key<std::string> train_learning_rate{"train.learning_rate", {}, "[train] learning_rate, as text"};
inline constexpr Key<std::string> train_momentum{"train.momentum", {}, "[train] momentum, as text"};
inline constexpr Key<std::string> train_nesterov{"train.nesterov", {}, "[train] nesterov (sgd), as text"};
inline constexpr Key<std::string> train_weight_decay{"train.weight_decay", {}, "[train] weight_decay (adamw), as text"};
inline constexpr Key<std::string> train_rho{"train.rho", {}, "[train] rho (rmsprop), as text"};
inline constexpr Key<std::string> train_centered{"train.centered", {}, "[train] centered (rmsprop), as text"};
inline constexpr Key<std::string> train_clipnorm{"train.clipnorm", {}, "[train] clipnorm, as text; 0: off"};
inline constexpr Key<std::string> train_global_clipnorm{"train.global_clipnorm", {}, "[train] global_clipnorm, as text; 0: off"};
// [train.learning_rate_schedule]: its type here, each argument under train_schedule_argument.
inline constexpr Key<std::string> train_learning_rate_schedule{"train.learning_rate_schedule", {}, "[train.learning_rate_schedule] type; absent: none"};
inline constexpr Key<std::string> train_loss{"train.loss", "sparse_categorical_crossentropy", "[train] loss"};
inline constexpr Key<std::string> train_metrics{"train.metrics", "accuracy", "[train] metrics, comma-separated"};
inline constexpr Key<uint64_t> train_epochs{"train.epochs", "1", "[train] epochs"};
inline constexpr Key<uint64_t> train_batch_size{"train.batch_size", "32", "[train] batch_size, the global batch"};
inline constexpr Key<uint64_t> train_steps_per_epoch{"train.steps_per_epoch", {}, "[train] steps_per_epoch; absent: all"};
inline constexpr Key<bool> train_shuffle{"train.shuffle", "true", "[train] shuffle"};
inline constexpr Key<uint64_t> train_seed{"train.seed", {}, "[train] seed; absent: the pool's"};
inline constexpr Key<std::string> train_history{"train.history", {}, "[train] history, a CSV path"};
inline constexpr Key<std::string> train_tensorboard{"train.tensorboard", {}, "[train] tensorboard, a directory"};
inline constexpr Key<std::string> train_checkpoint{"train.checkpoint", {}, "[train] checkpoint, a directory"};
inline constexpr Key<std::string> train_checkpoint_every{"train.checkpoint_every", "epoch",
                                                         "[train] checkpoint_every: epoch or a number of steps"};
inline constexpr Key<bool> train_resume{"train.resume", "false", "[train] resume"};
inline constexpr Key<uint64_t> train_threads{"train.threads", {}, "[train] threads; absent: all cores (a search's fit: 1)"};
inline constexpr Key<bool> train_evaluate{"train.evaluate", "true", "[train] evaluate"};
// The config key of a [train] key or a grid-search name ("layers.1.units" -> "train.layers.1.units"),
// and back.
inline std::string train_key(std::string_view field) { return "train." + std::string(field); }
inline std::string_view train_field(std::string_view key) { return key.substr(std::string_view("train.").size()); }
// "train.learning_rate_schedule.decay_steps": an argument of [train.learning_rate_schedule], as text
// (lists comma-separated).
inline std::string train_schedule_argument(std::string_view argument) {
  return std::string(train_learning_rate_schedule.name) + "." + std::string(argument);
}
// A layer's option: "train.layers.<i>.<option>" (and "train.layers.<i>.type"), canonical text.
inline std::string train_layer(uint64_t index, std::string_view option) {
  return train_key("layers." + std::to_string(index) + "." + std::string(option));
}

// A grid search ([search], docs/training.md): read by the sklearn task backend and the train app.
inline constexpr Key<uint64_t> search_cv{"search.cv", "5", "[search] cv, the folds"};
inline constexpr Key<uint64_t> search_seed{"search.seed", "0", "[search] seed, of the folds' split"};
inline constexpr Key<std::string> search_csv{"search.csv", {}, "[search] csv, where cv_results go"};
inline constexpr Key<std::vector<std::string>> search_params{"search.params", {}, "the grid's names, sorted"};
// A grid name's values as the [train] table holds them, a newline list.
inline std::string search_param_grid(std::string_view name) { return "search.param_grid." + std::string(name); }

}  // namespace keys

// ---- the [search] task input ---------------------------------------------------------------------------
// One fit of a grid search: a candidate's values on one fold, "fold=K;name=value;..." (a name is
// a [train] key or "layers.<i>.<option>"; a value its canonical text).
struct SearchTask {
  uint64_t fold = 0;
  std::vector<std::pair<std::string, std::string>> values;  // in the grid's order
};

inline std::string search_task_input(const SearchTask& t) {
  std::string out = "fold=" + std::to_string(t.fold);
  for (const auto& [name, value] : t.values) out += ";" + name + "=" + value;
  return out;
}

inline SearchTask parse_search_task(std::string_view input) {
  auto bad = [&](const char* why) {
    return ConfigError(std::string("a grid-search task ") + why + " ('fold=K;name=value;...'), got '" +
                       std::string(input) + "'");
  };
  SearchTask t;
  bool fold = false;
  for (size_t b = 0; b <= input.size();) {
    const size_t e = std::min(input.find(';', b), input.size());
    const std::string_view item = input.substr(b, e - b);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) throw bad("is a list of name=value");
    const std::string_view name = item.substr(0, eq), value = item.substr(eq + 1);
    if (name == "fold") {
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), t.fold);
      if (value.empty() || ec != std::errc() || end != value.data() + value.size()) throw bad("names its fold by number");
      fold = true;
    } else {
      t.values.emplace_back(name, value);
    }
    b = e + 1;
  }
  if (!fold) throw bad("names its fold");
  return t;
}

// ---- the node's output directory ---------------------------------------------------------------------
// Every node's job finds an empty directory of its own here (the worker makes it; its path is in
// the job's environment and in the SDK's InstanceInfo::output_dir): what it holds when the job
// ends comes back to the client, under <outputs>/node-<N>/ (docs/manifest.md, "Getting files back").
inline constexpr const char* kOutputDirEnv = "SKYFORGE_OUTPUT_DIR";
inline std::string output_dir_of(std::string_view work_dir) { return std::string(work_dir) + "/.skyforge/outputs"; }

// ---- the collective timeout ------------------------------------------------------------------------------
inline constexpr const char* kCollectiveTimeoutEnv = "SKYFORGE_COLLECTIVE_TIMEOUT";

// Seconds a collective waits for a peer (the pool's communicator and a backend's own, e.g. NCCL):
// job.collective_timeout's value, else the environment's SKYFORGE_COLLECTIVE_TIMEOUT, else 300.
// Throws ConfigError for a value that is not a positive number of seconds (at most 1e7).
inline double collective_timeout_s(const char* config_value, const char* env_value) {
  const bool from_config = config_value && *config_value;
  const char* v = from_config ? config_value : env_value && *env_value ? env_value : nullptr;
  if (!v) return 300;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end || !(s > 0) || !std::isfinite(s) || s > 1e7)
    throw ConfigError(std::string(from_config ? keys::job_collective_timeout.name : kCollectiveTimeoutEnv) + " = '" + v +
                      "': expected a positive number of seconds");
  return s;
}

}  // namespace skyforge::config
