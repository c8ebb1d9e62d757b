// Job manifest (job.toml): parsing and schema validation (docs/manifest.md is the reference).
//
// Two steps, so that `skyforge validate` and the fuzzer can run the first without a plugin
// catalogue:
//   1. load_manifest / parse_manifest: TOML syntax + the fixed schema ([pool], [provider],
//      [image], [[plugins]], [job], [tasks]). Plugin options are kept as canonical text with their TOML
//      type, to be checked in step 2.
//   2. validate_against (catalog.hpp): every named plugin exists with the right kind, plugin
//      options match their plugin.toml schema, defaults are filled in.
// Both steps collect every problem they find and throw one ManifestError listing all of them,
// one per line, each as "file:line:col: message".
#pragma once

#include "job_mode.hpp"

#include <skyforge/config_keys.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace skyforge {

struct SourcePos {
  std::string file;
  int line = 0;    // 1-based; 0 = unknown
  int column = 0;  // 1-based; 0 = unknown
  std::string str() const;  // "file:line:col" ("file" alone when the line is unknown)
};

class ManifestError : public std::runtime_error {
 public:
  // One problem.
  explicit ManifestError(const std::string& problem);
  explicit ManifestError(const char* problem);
  // what() is the problems joined by '\n'.
  explicit ManifestError(std::vector<std::string> problems);
  // One entry per problem ("file:line:col: message").
  const std::vector<std::string>& problems() const noexcept { return problems_; }

 private:
  std::vector<std::string> problems_;
};

// Option name -> canonical text: strings raw, integers in decimal, floats as std::to_chars
// writes them (shortest round-trip form), booleans "true"/"false". Order: as written.
using OptionList = std::vector<std::pair<std::string, std::string>>;

// Plugin option types, as plugin.toml names them.
inline constexpr std::string_view kOptionTypes[] = {"string", "integer", "float", "boolean", "string_array"};
// A string_array option crosses the plugin ABI as text like every option: its elements joined by
// '\n' (so an element may not hold one); the SDK's Options::get_list splits it again.
inline constexpr char kListSeparator = '\n';

struct PluginUse {
  std::string name;
  OptionList options;
  SourcePos pos;                          // the `name = "..."` value (the [[plugins]] header if absent)
  std::vector<SourcePos> option_pos;      // parallel to options: each value's position
  std::vector<std::string> option_types;  // parallel to options: "string"|"integer"|"float"|"boolean"
};

struct FileCopy {
  std::string source;  // absolute, normalised
  std::string target;  // relative to the node's work directory, normalised, no ".."
  SourcePos pos;       // the `source` value
};

struct Image {
  std::vector<std::string> apt, pip;
  std::map<std::string, std::string> env;
  std::vector<FileCopy> files;
};

// What a manifest may ask for at most, whatever the provider (each checked at its line): a
// worker runs a thread per slot, and the host keeps each task's result until the job ends.
inline constexpr uint64_t kMaxConcurrency = 1024;
inline constexpr uint64_t kMaxTasks = 10'000'000;

struct PoolSpecM {
  std::string provider = "local";
  uint32_t nodes = 1;
  SourcePos nodes_pos;  // the `nodes` value; empty when defaulted
  uint32_t concurrency = 1;
  std::string accelerator;         // the spec as written (skyforge/accelerator.hpp)
  uint32_t accelerator_count = 0;  // accelerators per node it asks for (0: none)
  OptionList provider_options;                     // the [provider] table
  std::vector<SourcePos> provider_option_pos;      // parallel to provider_options
  std::vector<std::string> provider_option_types;  // parallel to provider_options
  SourcePos provider_pos;  // the `provider` value; the [pool] header or file:1:1 when defaulted
};

enum class OutputPolicy { All, Head, None };
const char* to_string(OutputPolicy policy);  // "all" | "head" | "none"

struct JobSpec {
  std::string app;  // native app plugin; exactly one of app / command is set
  SourcePos app_pos;
  std::vector<std::string> command;
  JobMode mode = JobMode::broadcast;
  uint64_t tasks = 0;              // map: inputs are "0".."tasks-1" when has_tasks
  std::vector<std::string> inputs; // map: explicit inputs when !has_tasks
  bool has_tasks = false;
  // map: the task backend ([tasks] backend, default "joblib") and its options (the rest of
  // [tasks]), checked against its plugin.toml like [provider]'s.
  std::string task_backend = "joblib";
  SourcePos task_backend_pos;  // the `backend` value; the [tasks] header, else the mode, when defaulted
  OptionList task_options;
  std::vector<SourcePos> task_option_pos;
  std::vector<std::string> task_option_types;
  OutputPolicy stdout_policy = OutputPolicy::All, stderr_policy = OutputPolicy::All;
  double timeout_s = 0;  // 0 = none
  // How often a lost node's job starts again on every node (a broadcast or single job: every
  // worker restarts, the same ranks; a train job resumes from its last checkpoint). 0: a lost
  // node fails the run.
  uint32_t max_restarts = 0;
  // The host's collective watchdog: a node inside collective #N this long while another never
  // entered it stops the run, naming the laggard (docs/architecture.md, "Collective watchdog").
  double collective_timeout_s = 60;
  bool collective_timeout_given = false;
  std::vector<std::string> plugin_path;  // absolute, normalised
  // The job's files (docs/manifest.md, "Getting files back"): globs of the working directory's
  // files sent back besides SKYFORGE_OUTPUT_DIR's, where they go (absolute; empty: a fresh
  // directory per run), and what one node sends at most.
  std::vector<std::string> outputs;
  std::string outputs_dir;
  uint64_t outputs_max_bytes = config::keys::job_outputs_max_bytes.get(
      [](const std::string&) -> std::optional<std::string> { return std::nullopt; });
  // [job.options]: the app's options, checked against its plugin.toml (defaults added).
  OptionList app_options;
  std::vector<SourcePos> app_option_pos;
  std::vector<std::string> app_option_types;
  SourcePos options_pos;
};

// The [train] table (built-in `train` job, docs/training.md): a Keras-like model, its data and its
// schedule. Checked here against the layer catalogue; carried to the nodes as flat config keys
// ("train.epochs", "train.layers.0.type", ...) that the `train` app reads.
struct TrainSpec {
  bool present = false;
  SourcePos pos;  // the [train] header
  std::vector<std::pair<std::string, std::string>> config;  // "train.<key>" -> canonical text
};

// The [search] table (a grid search of the built-in train job, docs/training.md): the grid's
// values as the [train] table would hold them, carried as flat config keys ("search.cv",
// "search.params", "search.param_grid.<name>", ...) that the `sklearn` task backend and the
// `train` app read.
struct SearchSpec {
  bool present = false;
  SourcePos pos;  // the [search] header
  std::vector<std::pair<std::string, std::string>> config;  // "search.<key>" -> canonical text
};

struct Manifest {
  std::string path;  // absolute, normalised
  std::string dir;   // directory of path: relative paths in the manifest resolve against it
  PoolSpecM pool;
  Image image;
  std::vector<PluginUse> plugins;  // manifest order
  JobSpec job;
  TrainSpec train;
  SearchSpec search;
};

// Reads and parses a manifest file. Messages name the file as `path` was given.
// Throws ManifestError (unreadable file, TOML syntax error, or every schema problem found).
Manifest load_manifest(const std::string& path);

// Same, from text. `display_name` is used in messages and, made absolute against the current
// directory, as Manifest::path (so relative paths resolve against its directory).
Manifest parse_manifest(const std::string& text, const std::string& display_name);

// Small helpers shared by the manifest and catalogue code; not part of the stable surface.
namespace detail {
std::string join(const std::vector<std::string>& items, std::string_view sep);
// " (did you mean 'x'?)" for the closest candidate within a small edit distance, else "".
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);
// Plugin, provider and app names: [A-Za-z0-9_.-]+, not starting with '.' or '-'.
bool valid_plugin_name(std::string_view name);
// Absolute and lexically normal, without a trailing separator; relative paths against `base`
// (the current directory when empty).
std::string normalise_path(const std::string& path, const std::string& base = "");
}  // namespace detail

}  // namespace skyforge
