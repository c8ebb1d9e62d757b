// Plugin catalogue: search-path scanning and manifest-vs-catalogue validation. plugin.toml itself
// is read by parse_plugin_toml in plugin_toml.cpp, through the TOML front end (toml_reader.hpp).
#include "catalog.hpp"
#include "self_exe.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <system_error>
#include <tuple>

#ifndef SKYFORGE_PLUGIN_SUBDIR
#define SKYFORGE_PLUGIN_SUBDIR "lib/skyforge/plugins"
#endif

namespace fs = std::filesystem;

namespace skyforge {

namespace {

std::vector<std::string> normalise_unique(const std::vector<std::string>& dirs) {
  std::vector<std::string> out;
  for (const auto& d : dirs) {
    if (d.empty()) continue;
    std::string n = detail::normalise_path(d);
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(std::move(n));
  }
  return out;
}

// plugin.toml files of one search directory: <dir>/plugin.toml first, then
// <dir>/<subdir>/plugin.toml in name order (so precedence inside a directory is deterministic).
std::vector<std::string> plugin_files(const std::string& dir, std::vector<std::string>& problems) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  if (fs::is_regular_file(fs::path(dir) / "plugin.toml", ec)) out.push_back((fs::path(dir) / "plugin.toml").string());
  std::vector<std::string> subdirs;
  fs::directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  if (ec) {
    problems.push_back(dir + ": cannot list plugin directory: " + ec.message());
    return out;
  }
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) {
      problems.push_back(dir + ": cannot list plugin directory: " + ec.message());
      break;
    }
    std::error_code ec2;
    if (!it->is_directory(ec2)) continue;
    fs::path candidate = it->path() / "plugin.toml";
    if (fs::is_regular_file(candidate, ec2)) subdirs.push_back(candidate.string());
  }
  std::sort(subdirs.begin(), subdirs.end());
  out.insert(out.end(), subdirs.begin(), subdirs.end());
  return out;
}

}  // namespace

Catalog::Catalog(std::vector<std::string> search_dirs) : search_dirs_(normalise_unique(search_dirs)) {
  for (const auto& dir : search_dirs_) {
    std::map<std::string, std::string> in_this_dir;  // name -> plugin.toml
    for (const auto& file : plugin_files(dir, problems_)) {
      PluginInfo info;
      try {
        info = parse_plugin_toml(file);
      } catch (const ManifestError& e) {
        problems_.insert(problems_.end(), e.problems().begin(), e.problems().end());
        continue;
      }
      if (auto it = in_this_dir.find(info.name); it != in_this_dir.end()) {
        problems_.push_back(info.name_pos.str() + ": plugin name '" + info.name + "' is also claimed by " + it->second +
                            " in the same search directory " + dir + "; using " + it->second);
        continue;
      }
      in_this_dir.emplace(info.name, info.manifest_path);
      if (find(info.name)) continue;  // shadowed by an earlier search directory
      plugins_.push_back(std::move(info));
    }
  }
}

std::vector<std::string> Catalog::default_search_dirs(const std::vector<std::string>& manifest_plugin_path) {
  std::vector<std::string> dirs = manifest_plugin_path;
  if (const char* env = std::getenv("SKYFORGE_PLUGIN_PATH")) {
    std::string_view rest(env);
    while (true) {
      auto colon = rest.find(':');
      std::string entry(rest.substr(0, colon));
      if (!entry.empty()) dirs.push_back(entry);
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  if (std::string exe_dir = self_exe_dir(); !exe_dir.empty())
    dirs.push_back((fs::path(exe_dir) / ".." / SKYFORGE_PLUGIN_SUBDIR).string());
  return normalise_unique(dirs);
}

const PluginInfo* Catalog::find(const std::string& name) const {
  for (const auto& p : plugins_)
    if (p.name == name) return &p;
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// validate_against

namespace {

struct Problems {
  std::vector<std::pair<SourcePos, std::string>> items;
  void add(const SourcePos& p, std::string msg) { items.emplace_back(p, std::move(msg)); }
  void throw_if_any() {
    if (items.empty()) return;
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
      return std::tie(a.first.line, a.first.column) < std::tie(b.first.line, b.first.column);
    });
    std::vector<std::string> lines;
    for (const auto& [pos, msg] : items) lines.push_back(pos.str() + ": " + msg);
    throw ManifestError(std::move(lines));
  }
};

std::string article(const std::string& word) {
  return (!word.empty() && std::string_view("aeiou").find(word[0]) != std::string_view::npos ? "an " : "a ") + word;
}

std::vector<std::string> names_of_kind(const Catalog& c, const std::vector<std::string>& kinds) {
  std::vector<std::string> out;
  for (const auto& p : c.plugins())
    if (std::find(kinds.begin(), kinds.end(), p.kind) != kinds.end()) out.push_back(p.name);
  return out;
}

// The plugin named `name` with one of `kinds`, or nullptr after recording why not.
const PluginInfo* resolve(const Catalog& c, const std::string& name, const std::vector<std::string>& kinds,
                          const std::string& label, const SourcePos& pos, const std::string& hint, Problems& out) {
  const PluginInfo* p = c.find(name);
  if (!p) {
    std::string msg = label + ": no plugin named '" + name + "' (searched: " +
                      (c.search_dirs().empty() ? std::string("no directories") : detail::join(c.search_dirs(), ", ")) + ")";
    msg += detail::did_you_mean(name, names_of_kind(c, kinds));
    if (!c.problems().empty())
      msg += "; " + std::to_string(c.problems().size()) + " plugin.toml problem(s) in the search path, see `skyforge plugins" +
             (pos.file.empty() ? std::string() : " " + pos.file) + "`";
    out.add(pos, std::move(msg));
    return nullptr;
  }
  if (std::find(kinds.begin(), kinds.end(), p->kind) == kinds.end()) {
    std::vector<std::string> quoted;
    for (const auto& k : kinds) quoted.push_back(k);
    out.add(pos, label + ": plugin '" + name + "' (" + p->manifest_path + ") is " + article(p->kind) +
                     " plugin, expected " + detail::join(quoted, " or ") + hint);
    return nullptr;
  }
  return p;
}

// Checks `options` (parallel pos/types) against `plugin`'s schema, coerces integer->float, then
// appends defaults for absent options.
void check_options(const Catalog& c, const PluginInfo& plugin, const std::string& label, const SourcePos& use_pos,
                   OptionList& options, std::vector<SourcePos>& option_pos, std::vector<std::string>& option_types,
                   Problems& out) {
  std::vector<std::string> known;
  for (const auto& o : plugin.options) known.push_back(o.name);
  // Tolerate callers that filled options without the parallel vectors.
  option_pos.resize(options.size(), use_pos);
  option_types.resize(options.size(), "string");

  for (size_t i = 0; i < options.size(); ++i) {
    const auto& [name, text] = options[i];
    const OptionSchema* schema = plugin.option(name);
    if (!schema) {
      out.add(option_pos[i], label + ": unknown option '" + name + "' for plugin '" + plugin.name + "' " +
                                 (known.empty() ? std::string("(it takes no options)")
                                                : "(known: " + detail::join(known, ", ") + ")") +
                                 detail::did_you_mean(name, known));
      continue;
    }
    const std::string& given = option_types[i];
    std::string canonical = text;
    if (schema->type == "float" && given == "integer") {
      // Integers are valid floats; store the float's canonical text.
      char* end = nullptr;
      double d = std::strtod(text.c_str(), &end);
      char buf[64];
      auto res = std::to_chars(buf, buf + sizeof buf, d);
      canonical.assign(buf, res.ptr);
      option_types[i] = "float";
    } else if (schema->type != given) {
      std::string shown = given == "string" ? "\"" + text + "\"" : text;
      if (given == "string_array") {  // the elements as the manifest wrote them: ["a", "b"]
        shown = "[\"";
        for (char ch : text) shown += ch == kListSeparator ? std::string("\", \"") : std::string(1, ch);
        shown += "\"]";
      }
      out.add(option_pos[i], label + " " + name + ": expected " + article(schema->type) + ", got " + article(given) +
                                 " (" + shown + ")");
      continue;
    }
    const bool is_choice =
        std::find(schema->choices.begin(), schema->choices.end(), canonical) != schema->choices.end();
    if (!schema->plugin_kind.empty() && !is_choice) {
      const std::string hint =
          schema->choices.empty() ? "" : " (or one of: " + detail::join(schema->choices, ", ") + ")";
      if (resolve(c, canonical, {schema->plugin_kind}, label + " " + name, option_pos[i], hint, out))
        options[i].second = std::move(canonical);
      continue;
    }
    if (!schema->choices.empty() && !is_choice) {
      out.add(option_pos[i], label + " " + name + ": '" + canonical + "' is not one of: " +
                                 detail::join(schema->choices, ", ") +
                                 (schema->type == "string" ? detail::did_you_mean(canonical, schema->choices) : ""));
      continue;
    }
    options[i].second = std::move(canonical);
  }
  for (const auto& schema : plugin.options) {
    bool present = std::any_of(options.begin(), options.end(), [&](const auto& o) { return o.first == schema.name; });
    if (present) continue;
    if (schema.required) {
      std::string what = schema.type + (schema.description.empty() ? "" : ": " + schema.description);
      out.add(use_pos, label + ": missing required option '" + schema.name + "' of plugin '" + plugin.name + "' (" +
                           what + ")");
    } else if (schema.default_value) {
      options.emplace_back(schema.name, *schema.default_value);
      option_pos.push_back(use_pos);
      option_types.push_back(schema.type);
    }
  }
}

}  // namespace

void validate_against(Manifest& m, const Catalog& c) {
  Problems out;

  if (const PluginInfo* p = resolve(c, m.pool.provider, {"provider"}, "[pool] provider", m.pool.provider_pos,
                                    " (framework plugins go in [[plugins]])", out)) {
    check_options(c, *p, "[provider]", m.pool.provider_pos, m.pool.provider_options, m.pool.provider_option_pos,
                  m.pool.provider_option_types, out);
    const uint64_t most = p->max_nodes ? p->max_nodes : kDefaultMaxNodes;
    if (m.pool.nodes > most)
      out.add(m.pool.nodes_pos.line ? m.pool.nodes_pos : m.pool.provider_pos,
              "[pool] nodes: the '" + p->name + "' provider makes at most " + std::to_string(most) + " nodes, got " +
                  std::to_string(m.pool.nodes) + (p->max_nodes ? " (max_nodes in " + p->manifest_path + ")" : ""));
  }

  if (!m.job.app.empty())
    if (const PluginInfo* p = resolve(c, m.job.app, {"app"}, "[job] app", m.job.app_pos, "", out))
      check_options(c, *p, "[job.options]", m.job.options_pos.line ? m.job.options_pos : m.job.app_pos,
                    m.job.app_options, m.job.app_option_pos, m.job.app_option_types, out);

  if (m.job.mode == JobMode::map)
    if (const PluginInfo* p = resolve(c, m.job.task_backend, {"task_backend"}, "[tasks] backend", m.job.task_backend_pos,
                                      "", out))
      check_options(c, *p, "[tasks]", m.job.task_backend_pos, m.job.task_options, m.job.task_option_pos,
                    m.job.task_option_types, out);

  std::map<std::string, SourcePos> seen;
  for (auto& use : m.plugins) {
    const std::string label = "[[plugins]] " + use.name;
    if (auto [it, fresh] = seen.emplace(use.name, use.pos); !fresh) {
      out.add(use.pos, "[[plugins]] name: plugin '" + use.name + "' is listed twice (first at " + it->second.str() + ")");
      continue;
    }
    const PluginInfo* p = resolve(c, use.name, {"framework", "compute_backend"}, "[[plugins]] name", use.pos,
                                  " (a task backend is named in [tasks] backend)", out);
    if (p) check_options(c, *p, label, use.pos, use.options, use.option_pos, use.option_types, out);
  }

  // Ordering rules from plugin.toml `after`.
  for (size_t i = 0; i < m.plugins.size(); ++i) {
    const PluginInfo* p = c.find(m.plugins[i].name);
    if (!p) continue;
    for (const auto& before : p->after)
      for (size_t j = i + 1; j < m.plugins.size(); ++j)
        if (m.plugins[j].name == before)
          out.add(m.plugins[i].pos, "[[plugins]] " + p->name + ": must come after '" + before + "' (listed at " +
                                        m.plugins[j].pos.str() + "); move it below");
  }

  if (m.train.present) {
    bool named = false;
    for (const auto& use : m.plugins) {
      const PluginInfo* p = c.find(use.name);
      named = named || (p && p->kind == "compute_backend");
      for (const PluginInfo* ref : referenced_plugins(use, c)) named = named || ref->kind == "compute_backend";
    }
    const PluginInfo* cpu = c.find("cpu");
    if (!named && !(cpu && cpu->kind == "compute_backend"))
      out.add(m.train.pos, "[train]: needs a compute backend, and none is named and the default 'cpu' is not "
                           "installed (add [[plugins]] name = \"keras\" with backend = \"<a compute_backend>\")");
  }

  for (const auto& f : m.image.files) {
    std::error_code ec;
    if (!fs::exists(f.source, ec))
      out.add(f.pos, "[image] files source: " + f.source + " does not exist");
  }
  out.throw_if_any();
}

namespace {
// Calls fn(plugin, option index) for each option of `use` that names a plugin (see
// referenced_plugins).
template <class F>
void for_each_reference(const PluginUse& use, const Catalog& c, F&& fn) {
  const PluginInfo* p = c.find(use.name);
  if (!p) return;
  for (size_t i = 0; i < use.options.size(); ++i) {
    const auto& [name, value] = use.options[i];
    const OptionSchema* schema = p->option(name);
    if (!schema || schema->plugin_kind.empty()) continue;
    if (std::find(schema->choices.begin(), schema->choices.end(), value) != schema->choices.end()) continue;
    if (const PluginInfo* q = c.find(value); q && q->kind == schema->plugin_kind) fn(q, i);
  }
}
}  // namespace

std::vector<const PluginInfo*> referenced_plugins(const PluginUse& use, const Catalog& c) {
  std::vector<const PluginInfo*> out;
  for_each_reference(use, c, [&](const PluginInfo* q, size_t) { out.push_back(q); });
  return out;
}

SelectedBackend selected_compute_backend(const Manifest& m, const Catalog& c) {
  SelectedBackend out;
  for (const auto& use : m.plugins)
    for_each_reference(use, c, [&](const PluginInfo* q, size_t i) {
      if (q->kind != "compute_backend") return;
      out.plugin = q;
      out.pos = i < use.option_pos.size() ? use.option_pos[i] : use.pos;
    });
  if (!out.plugin && m.train.present)
    if (const PluginInfo* cpu = c.find("cpu"); cpu && cpu->kind == "compute_backend") {
      out.plugin = cpu;
      out.pos = m.train.pos;
    }
  return out;
}

}  // namespace skyforge
