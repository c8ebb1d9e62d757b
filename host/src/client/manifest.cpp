// The job manifest's schema (job.toml, docs/manifest.md): [pool], [provider], [image],
// [[plugins]], [job]; [train] is in train_table.cpp. Documents are read through the TOML front end
// (toml_reader.hpp), which collects every problem with its position before throwing one
// ManifestError.
#include "manifest.hpp"

#include "outputs_keys.hpp"
#include "toml_reader.hpp"
#include "train_table.hpp"

// The [pool] accelerator format, one parser for the host's check and the plugins that read the
// spec: a pure data header, one of those the host may include (skyforge::abi, sdk/CMakeLists.txt).
#include <skyforge/accelerator.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>

namespace fs = std::filesystem;

namespace skyforge {

// ---------------------------------------------------------------------------------------------
// Public small pieces

std::string SourcePos::str() const {
  if (line <= 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column > 0 ? column : 1);
}

ManifestError::ManifestError(const std::string& problem) : std::runtime_error(problem), problems_{problem} {}
ManifestError::ManifestError(const char* problem) : ManifestError(std::string(problem)) {}
ManifestError::ManifestError(std::vector<std::string> problems)
    : std::runtime_error(detail::join(problems, "\n")), problems_(std::move(problems)) {}

const char* to_string(OutputPolicy policy) {
  switch (policy) {
    case OutputPolicy::All: return "all";
    case OutputPolicy::Head: return "head";
    case OutputPolicy::None: return "none";
  }
  return "all";
}

namespace detail {

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

namespace {
// Optimal string alignment distance: insertions, deletions, substitutions and transpositions of
// adjacent characters ("troch" -> "torch") each cost one. Only distances up to `limit` matter to
// a suggestion, so anything further is reported as limit + 1 without filling the table: the
// length difference is a lower bound, and so is the smallest entry of a finished row. An unknown
// key of 4,000 bytes costs a comparison, not 4,000 x |candidate| cells per candidate.
size_t edit_distance(std::string_view a, std::string_view b, size_t limit) {
  const size_t diff = a.size() > b.size() ? a.size() - b.size() : b.size() - a.size();
  if (diff > limit) return limit + 1;
  const size_t w = b.size() + 1;
  std::vector<size_t> d((a.size() + 1) * w);
  auto at = [&](size_t i, size_t j) -> size_t& { return d[i * w + j]; };
  for (size_t i = 0; i <= a.size(); ++i) at(i, 0) = i;
  for (size_t j = 0; j <= b.size(); ++j) at(0, j) = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t row_min = at(i, 0);
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      at(i, j) = std::min({at(i - 1, j) + 1, at(i, j - 1) + 1, at(i - 1, j - 1) + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        at(i, j) = std::min(at(i, j), at(i - 2, j - 2) + 1);
      row_min = std::min(row_min, at(i, j));
    }
    // A transposition reaches back two rows, so a row above the limit ends the search only
    // when the row before it was above the limit too.
    if (row_min > limit && i > 1) {
      size_t prev_min = at(i - 1, 0);
      for (size_t j = 1; j <= b.size(); ++j) prev_min = std::min(prev_min, at(i - 1, j));
      if (prev_min > limit) return limit + 1;
    }
  }
  return std::min(at(a.size(), b.size()), limit + 1);
}
}  // namespace

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  // Allow roughly one typo per three characters, at least one, at most three.
  const size_t budget = std::clamp<size_t>(word.size() / 3, 1, 3);
  const std::string* best = nullptr;
  size_t best_d = budget + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c, best_d - 1);
    if (d < best_d) {
      best_d = d;
      best = &c;
      if (d == 0) return "";  // the word is a candidate itself
    }
  }
  if (!best) return "";
  return " (did you mean '" + *best + "'?)";
}

bool valid_plugin_name(std::string_view name) {
  if (name.empty() || name.size() > 128 || name[0] == '.' || name[0] == '-') return false;
  return std::all_of(name.begin(), name.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '-' || ch == '.';
  });
}

std::string normalise_path(const std::string& path, const std::string& base) {
  fs::path p(path);
  if (p.is_relative()) {
    fs::path b = base.empty() ? fs::current_path() : fs::path(base);
    p = b / p;
  }
  p = p.lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// job.toml

namespace {

using namespace toml_in;

bool valid_env_name(const std::string& s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
  });
}

bool has_control_char(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f; });
}

const std::vector<std::string> kTopKeys = {"pool", "provider", "image", "plugins", "job", "tasks", "train", "search"};
const std::vector<std::string> kPoolKeys = {"provider", "nodes", "concurrency", "accelerator"};
const std::vector<std::string> kImageKeys = {"apt", "pip", "env", "files"};
const std::vector<std::string> kFileKeys = {"source", "target"};
const std::vector<std::string> kJobKeys = {"app",     "command",     "mode",    "tasks",       "inputs", "batch", "stdout",
                                           "stderr",  "timeout",     "plugin_path", "options", "max_restarts",
                                           "collective_timeout", "outputs", "outputs_dir", "outputs_max_bytes"};

void read_pool(Reader& r, const Value& t, PoolSpecM& pool) {
  r.check_keys(t, kPoolKeys, "[pool]");
  pool.provider_pos = r.pos(t);
  if (const Value* v = Reader::find(t, "provider")) {
    pool.provider_pos = r.pos(*v);
    if (auto s = r.string_value(*v, "[pool] provider", true)) {
      if (detail::valid_plugin_name(*s))
        pool.provider = *s;
      else
        r.error(r.pos(*v), "[pool] provider: " + quote(*s) + " is not a valid plugin name (letters, digits, '_', '-', '.')");
    }
  }
  constexpr uint64_t kU32 = std::numeric_limits<uint32_t>::max();
  if (auto n = r.integer(t, "nodes", "[pool]", 1, kU32)) {
    pool.nodes = static_cast<uint32_t>(*n);
    pool.nodes_pos = r.pos(*Reader::find(t, "nodes"));  // the provider's max_nodes is checked in validate_against
  }
  if (auto n = r.integer(t, "concurrency", "[pool]", 1, kMaxConcurrency)) pool.concurrency = static_cast<uint32_t>(*n);
  if (auto s = r.string(t, "accelerator", "[pool]")) {
    const SourcePos at = r.pos(*Reader::find(t, "accelerator"));
    if (has_control_char(*s)) {
      r.error(at, "[pool] accelerator: must not contain control characters");
    } else {
      try {
        pool.accelerator_count = parse_accelerator(*s).count;
        pool.accelerator = *s;
      } catch (const std::invalid_argument& e) {
        r.error(at, std::string("[pool] ") + e.what() +
                        " (expected NAME, NAME:COUNT per node or NAME(mig=PROFILE), e.g. \"A100:2\")");
      }
    }
  }
}

void read_image(Reader& r, const Value& t, const std::string& dir, Image& image) {
  r.check_keys(t, kImageKeys, "[image]");
  // Package names end up in bootstrap scripts: no option injection, no line breaks.
  auto apt_check = [](const std::string& s, size_t) -> std::string {
    if (s.empty()) return "expected a package name, got an empty string";
    if (s[0] == '-') return "package " + quote(s) + " must not start with '-'";
    for (char ch : s)
      if (!(std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("+.:=~_-*", ch)))
        return "package " + quote(s) + " contains '" + std::string(1, ch) + "' (a Debian package name, optionally =version or :arch)";
    return "";
  };
  auto pip_check = [](const std::string& s, size_t) -> std::string {
    if (s.empty()) return "expected a requirement, got an empty string";
    if (s[0] == '-') return "requirement " + quote(s) + " must not start with '-' (pip options are not accepted)";
    if (has_control_char(s)) return "requirement " + quote(s) + " must not contain control characters";
    return "";
  };
  if (auto a = r.string_array(t, "apt", "[image]", false, apt_check)) image.apt = std::move(*a);
  if (auto a = r.string_array(t, "pip", "[image]", false, pip_check)) image.pip = std::move(*a);

  if (const Value* env = Reader::find(t, "env")) {
    if (!env->is_table()) {
      r.expected(*env, "[image] env", "a table of strings");
    } else {
      for (const auto& [key, value] : env->as_table()) {
        if (!valid_env_name(key)) {
          r.error(r.key_pos(value, key), "[image] env: " + quote(key) +
                                             " is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)");
          continue;
        }
        if (auto s = r.string_value(value, "[image] env." + key, false)) image.env[key] = *s;
      }
    }
  }

  if (const Value* files = Reader::find(t, "files")) {
    if (!files->is_array()) {
      r.expected(*files, "[image] files", "an array of tables { source = \"...\", target = \"...\" }");
      return;
    }
    const auto& arr = files->as_array();
    for (size_t i = 0; i < arr.size(); ++i) {
      const std::string where = "[image] files[" + std::to_string(i) + "]";
      const Value& f = arr[i];
      if (!f.is_table()) {
        r.expected(f, where, "a table { source = \"...\", target = \"...\" }");
        continue;
      }
      r.check_keys(f, kFileKeys, where);
      auto source = r.string(f, "source", where, true);
      auto target = r.string(f, "target", where, true);
      bool ok = source && target;
      if (!Reader::find(f, "source")) {
        r.error(r.pos(f), where + ": missing 'source' (a path relative to the manifest's directory)");
        ok = false;
      }
      if (!Reader::find(f, "target")) {
        r.error(r.pos(f), where + ": missing 'target' (a path relative to the node's work directory)");
        ok = false;
      }
      if (target) {
        fs::path tp(*target);
        const SourcePos tpos = r.pos(*Reader::find(f, "target"));
        bool dotdot = false;
        for (const auto& part : tp) dotdot = dotdot || part == "..";
        if (tp.is_absolute()) {
          r.error(tpos, where + " target: expected a path relative to the node's work directory, got " + quote(*target));
          ok = false;
        } else if (dotdot) {
          r.error(tpos, where + " target: must not contain '..', got " + quote(*target));
          ok = false;
        } else if (tp.lexically_normal().filename().empty() && tp.lexically_normal().parent_path().empty()) {
          r.error(tpos, where + " target: names no file, got " + quote(*target));
          ok = false;
        }
      }
      if (!ok) continue;
      FileCopy copy;
      copy.source = detail::normalise_path(*source, dir);
      std::string norm = fs::path(*target).lexically_normal().string();
      while (norm.size() > 1 && norm.back() == '/') norm.pop_back();
      copy.target = norm;
      copy.pos = r.pos(*Reader::find(f, "source"));
      image.files.push_back(std::move(copy));
    }
  }
}

void read_plugins(Reader& r, const Value& v, std::vector<PluginUse>& plugins) {
  if (!v.is_array()) {
    r.expected(v, "plugins", "an array of tables ([[plugins]])");
    return;
  }
  const auto& arr = v.as_array();
  for (size_t i = 0; i < arr.size(); ++i) {
    const Value& t = arr[i];
    const std::string where = "[[plugins]] #" + std::to_string(i + 1);
    if (!t.is_table()) {
      r.expected(t, where, "a table with 'name' and the plugin's options");
      continue;
    }
    PluginUse use;
    use.pos = r.pos(t);
    const Value* name = Reader::find(t, "name");
    if (!name) {
      r.error(r.pos(t), where + ": missing 'name' (the framework plugin to use)");
      continue;
    }
    use.pos = r.pos(*name);
    auto s = r.string_value(*name, "[[plugins]] name", true);
    if (!s) continue;
    if (!detail::valid_plugin_name(*s)) {
      r.error(r.pos(*name), "[[plugins]] name: " + quote(*s) + " is not a valid plugin name (letters, digits, '_', '-', '.')");
      continue;
    }
    use.name = *s;
    for (auto& o : read_options(r, t, "[[plugins]] " + use.name, {"name"})) {
      use.options.emplace_back(o.name, std::move(o.value.text));
      use.option_types.push_back(std::move(o.value.type));
      use.option_pos.push_back(std::move(o.pos));
    }
    plugins.push_back(std::move(use));
  }
}

// [tasks]: the map job's task backend and, in the rest of the table, its options.
void read_tasks(Reader& r, const Value& t, JobSpec& job, bool searching) {
  if (job.mode != JobMode::map) {
    r.error(r.pos(t), std::string("[tasks]: only a map job has a task backend ([job] mode = \"map\"; mode is \"") +
                          mode_name(job.mode) + "\")");
    return;
  }
  job.task_backend_pos = r.pos(t);
  if (const Value* b = Reader::find(t, "backend")) {
    job.task_backend_pos = r.pos(*b);
    if (auto s = r.string_value(*b, "[tasks] backend", true)) {
      if (searching && *s != "sklearn")
        r.error(r.pos(*b), "[tasks] backend: a [search] job's fits are spread by the \"sklearn\" task backend (its "
                           "task format is the search's); got " + quote(*s) + ": remove the key or set it to \"sklearn\"");
      else if (detail::valid_plugin_name(*s))
        job.task_backend = *s;
      else
        r.error(r.pos(*b), "[tasks] backend: " + quote(*s) + " is not a valid plugin name (letters, digits, '_', '-', '.')");
    }
  }
  for (auto& o : read_options(r, t, "[tasks]", {"backend"})) {
    job.task_options.emplace_back(o.name, std::move(o.value.text));
    job.task_option_types.push_back(std::move(o.value.type));
    job.task_option_pos.push_back(std::move(o.pos));
  }
}

std::optional<OutputPolicy> read_policy(Reader& r, const Value& t, const std::string& key) {
  const Value* v = Reader::find(t, key);
  if (!v) return std::nullopt;
  if (v->is_string()) {
    const std::string& s = v->as_string().str;
    if (s == "all") return OutputPolicy::All;
    if (s == "head") return OutputPolicy::Head;
    if (s == "none") return OutputPolicy::None;
  }
  r.expected(*v, "[job] " + key, "one of \"all\", \"head\", \"none\"");
  return std::nullopt;
}

void read_job(Reader& r, const Value& t, const std::string& dir, JobSpec& job, bool has_train) {
  r.check_keys(t, kJobKeys, "[job]");
  const Value* app = Reader::find(t, "app");
  const Value* command = Reader::find(t, "command");
  if (app) {
    job.app_pos = r.pos(*app);
    if (auto s = r.string_value(*app, "[job] app", true)) {
      if (detail::valid_plugin_name(*s))
        job.app = *s;
      else
        r.error(r.pos(*app), "[job] app: " + quote(*s) + " is not a valid plugin name (letters, digits, '_', '-', '.')");
    }
  }
  if (command) {
    auto first_check = [](const std::string& s, size_t i) -> std::string {
      return i == 0 && s.empty() ? "the program must not be an empty string" : "";
    };
    if (auto c = r.string_array(t, "command", "[job]", true, first_check)) job.command = std::move(*c);
  }
  if (has_train && (app || command)) {
    const Value* v = app ? app : command;
    r.error(r.key_pos(*v, app ? "app" : "command"),
            std::string("[job] ") + (app ? "app" : "command") + ": not allowed with a [train] table (the job is the built-in train)");
  } else if (app && command) {
    r.error(r.key_pos(*command, "command"),
            "[job]: 'app' and 'command' are mutually exclusive (app is set at " + r.pos(*app).str() + ")");
  } else if (!app && !command && !has_train) {
    r.error(r.pos(t), "[job]: expected exactly one of 'app' (a native app plugin) or 'command' (an array: program and arguments)");
  }

  if (const Value* opts = Reader::find(t, "options")) {
    job.options_pos = r.pos(*opts);
    if (!opts->is_table()) {
      r.expected(*opts, "[job] options", "a table of the app's options ([job.options])");
    } else if (!app) {
      r.error(r.key_pos(*opts, "options"), "[job] options: only a native app ('app') takes options");
    } else {
      for (auto& o : read_options(r, *opts, "[job.options]", {})) {
        job.app_options.emplace_back(o.name, std::move(o.value.text));
        job.app_option_types.push_back(std::move(o.value.type));
        job.app_option_pos.push_back(std::move(o.pos));
      }
    }
  }

  const Value* mode = Reader::find(t, "mode");
  if (mode && has_train) {
    r.error(r.key_pos(*mode, "mode"), "[job] mode: not allowed with a [train] table (train runs once on every node)");
    mode = nullptr;
  } else if (mode) {
    if (auto parsed = mode->is_string() ? parse_mode(mode->as_string().str) : std::nullopt) {
      job.mode = *parsed;
    } else {
      r.expected(*mode, "[job] mode", "one of \"broadcast\", \"single\", \"map\"");
      mode = nullptr;  // unknown mode: do not judge the map-only keys against it
    }
  }
  const bool mode_known = mode || !Reader::find(t, "mode");
  const Value* tasks = Reader::find(t, "tasks");
  const Value* inputs = Reader::find(t, "inputs");
  if (const Value* batch = Reader::find(t, "batch"))
    r.error(r.key_pos(*batch, "batch"), "[job] batch: a map job's batching is its task backend's: write it as "
                                        "[tasks] batch_size = " + (batch->is_integer() ? std::to_string(batch->as_integer()) : std::string("N")) +
                                        " (0 = automatic)");
  if (job.mode == JobMode::map) {
    if (command && !app)
      r.error(r.pos(*mode), "[job] mode: \"map\" needs 'app' (a native app exporting a task function); a command cannot be mapped");
    if (tasks && inputs)
      r.error(r.key_pos(*inputs, "inputs"),
              "[job]: 'tasks' and 'inputs' are mutually exclusive (tasks is set at " + r.pos(*tasks).str() + ")");
    else if (!tasks && !inputs)
      r.error(r.pos(*mode), "[job] mode: \"map\" needs 'tasks' (a count) or 'inputs' (an array of strings)");
    if (auto n = r.integer(t, "tasks", "[job]", 1, kMaxTasks)) {
      job.tasks = *n;
      job.has_tasks = true;
    }
    if (auto in = r.string_array(t, "inputs", "[job]", true)) job.inputs = std::move(*in);
    job.task_backend_pos = r.pos(*mode);
  } else if (mode_known) {
    for (auto [key, v] : {std::pair{"tasks", tasks}, std::pair{"inputs", inputs}}) {
      if (v)
        r.error(r.key_pos(*v, key), std::string("[job] ") + key + ": only allowed with mode = \"map\" (mode is \"" +
                                        mode_name(job.mode) + "\")");
    }
  }

  if (auto p = read_policy(r, t, "stdout")) job.stdout_policy = *p;
  if (auto p = read_policy(r, t, "stderr")) job.stderr_policy = *p;

  if (auto n = r.integer(t, "max_restarts", "[job]", 0, 100)) {
    job.max_restarts = static_cast<uint32_t>(*n);
    if (job.mode == JobMode::map && *n > 0)
      r.error(r.pos(*Reader::find(t, "max_restarts")),
              "[job] max_restarts: a map job survives a lost node through [tasks] retries = N (its tasks run again "
              "on the other nodes), not by restarting");
  }

  if (const Value* v = Reader::find(t, "collective_timeout")) {
    const std::optional<int64_t> i = v->is_integer() ? checked_integer(*v) : std::nullopt;
    const double seconds = i ? static_cast<double>(*i) : v->is_floating() ? v->as_floating() : -1;
    if (std::isfinite(seconds) && seconds >= 0.1 && seconds <= 86400)
      job.collective_timeout_s = seconds, job.collective_timeout_given = true;
    else
      r.expected(*v, "[job] collective_timeout", "a number of seconds from 0.1 to 86400");
  }

  if (const Value* v = Reader::find(t, "timeout")) {
    double seconds = -1;
    if (v->is_integer()) {
      auto i = checked_integer(*v);
      seconds = i ? static_cast<double>(*i) : -1;
    } else if (v->is_floating()) {
      seconds = v->as_floating();
    }
    if ((v->is_integer() || v->is_floating()) && std::isfinite(seconds) && seconds >= 0)
      job.timeout_s = seconds;
    else
      r.expected(*v, "[job] timeout", "a number of seconds >= 0 (0 = no timeout)");
  }

  if (auto paths = r.string_array(t, "plugin_path", "[job]", false, [](const std::string& s, size_t) {
        return s.empty() ? std::string("expected a directory, got an empty string") : std::string();
      })) {
    for (const auto& p : *paths) job.plugin_path.push_back(detail::normalise_path(p, dir));
  }
  read_outputs(r, t, dir, job);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Manifest

Manifest parse_manifest(const std::string& text, const std::string& display_name) {
  const Value root = parse_toml(text, display_name);
  Reader r(display_name);
  Manifest m;
  m.path = detail::normalise_path(display_name);
  m.dir = fs::path(m.path).parent_path().string();
  m.pool.provider_pos = r.start();

  const auto& top = root.as_table();
  for (const auto& [key, value] : top) {
    if (std::find(kTopKeys.begin(), kTopKeys.end(), key) != kTopKeys.end()) continue;
    if (value.is_table())
      r.error(r.key_pos(value, key), "unknown table [" + key + "] (known: " + join(kTopKeys, ", ") + ")" +
                                         did_you_mean(key, kTopKeys));
    else
      r.error(r.key_pos(value, key), "unknown key '" + key + "' at top level (known tables: " + join(kTopKeys, ", ") +
                                         ")" + did_you_mean(key, kTopKeys));
  }
  auto table = [&](const char* key) -> const Value* {
    const Value* v = Reader::find(root, key);
    if (v && !v->is_table()) {
      r.expected(*v, key, std::string("a table ([") + key + "])");
      return nullptr;
    }
    return v;
  };

  if (const Value* pool = table("pool")) read_pool(r, *pool, m.pool);
  if (const Value* provider = table("provider")) {
    for (auto& o : read_options(r, *provider, "[provider]", {})) {
      m.pool.provider_options.emplace_back(o.name, std::move(o.value.text));
      m.pool.provider_option_types.push_back(std::move(o.value.type));
      m.pool.provider_option_pos.push_back(std::move(o.pos));
    }
  }
  if (const Value* image = table("image")) read_image(r, *image, m.dir, m.image);
  if (const Value* plugins = Reader::find(root, "plugins")) read_plugins(r, *plugins, m.plugins);
  const Value* train = table("train");
  if (train) read_train(r, *train, m.dir, m.train);
  if (const Value* job = table("job"))
    read_job(r, *job, m.dir, m.job, train != nullptr);
  else if (!Reader::find(root, "job") && !train)
    r.error(r.start(), "missing [job] table: a manifest needs [job] with 'app' or 'command', or a [train] table");
  const Value* search = table("search");
  if (train) {
    // The built-in `train` job is the `train` app (plugins/train), run once on every node; with
    // [search], its fits are a map job's tasks, spread by the `sklearn` task backend.
    m.job.app = "train";
    m.job.app_pos = m.train.pos;
    m.job.mode = search ? JobMode::map : JobMode::broadcast;
    if (search) {
      m.job.task_backend = "sklearn";
      m.job.task_backend_pos = r.pos(*search);
      read_search(r, *search, *train, m.dir, m.search);
    }
  } else if (search) {
    r.error(r.pos(*search), "[search]: a grid search needs a [train] table (it searches the built-in train job)");
  }
  if (const Value* tasks = table("tasks")) read_tasks(r, *tasks, m.job, train && search);

  r.throw_if_failed();
  return m;
}

Manifest load_manifest(const std::string& path) {
  return parse_manifest(read_document(path, "manifest"), path);
}

}  // namespace skyforge
