// plugin.toml: the schema of a plugin's description file (docs/plugins.md), read through the same
// TOML front end as manifests (toml_reader.hpp). Declared in catalog.hpp.
#include "catalog.hpp"
#include "toml_reader.hpp"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <optional>

namespace fs = std::filesystem;

namespace skyforge {

namespace {

using namespace toml_in;

const std::vector<std::string> kPluginKeys = {"name",        "kind",    "library", "abi",      "version",
                                              "description", "options", "after",   "max_nodes"};
const std::vector<std::string> kOptionKeys = {"type", "default", "choices", "required", "description", "plugin"};

// Canonical text of `v` as an option of `type`, or nullopt (an integer is accepted for a float).
std::optional<std::string> typed_text(const Value& v, const std::string& type) {
  if (type == "string" && v.is_string()) return v.as_string().str;
  if (type == "integer" && v.is_integer()) {
    if (auto i = checked_integer(v)) return std::to_string(*i);
    return std::nullopt;
  }
  if (type == "float" && v.is_floating()) return float_text(v.as_floating());
  if (type == "float" && v.is_integer()) {
    if (auto i = checked_integer(v)) return float_text(static_cast<double>(*i));
    return std::nullopt;
  }
  if (type == "boolean" && v.is_boolean()) return std::string(v.as_boolean() ? "true" : "false");
  if (type == "string_array" && v.is_array()) return join_string_array(v, [](size_t, const Value&) {});
  return std::nullopt;
}

std::string a_type(const std::string& type) { return (type == "integer" ? "an " : "a ") + type; }

std::optional<OptionSchema> read_option_schema(Reader& r, const std::string& name, const Value& t) {
  const std::string where = "[options." + name + "]";
  if (!t.is_table()) {
    r.expected(t, "options." + name, "a table (type, default, choices, required, description)");
    return std::nullopt;
  }
  r.check_keys(t, kOptionKeys, where);
  OptionSchema o;
  o.name = name;
  bool ok = true;
  const Value* type = Reader::find(t, "type");
  std::vector<std::string> types(std::begin(kOptionTypes), std::end(kOptionTypes));
  if (!type) {
    r.error(r.pos(t), where + ": missing 'type' (one of " + join(types, ", ") + ")");
    return std::nullopt;
  }
  if (!type->is_string() || std::find(types.begin(), types.end(), type->as_string().str) == types.end()) {
    r.expected(*type, where + " type", "one of " + join(types, ", "));
    return std::nullopt;
  }
  o.type = type->as_string().str;
  if (const Value* v = Reader::find(t, "choices"); v && o.type == "string_array") {
    r.error(r.key_pos(*v, "choices"), where + " choices: a string_array option takes no choices");
    ok = false;
  } else if (v) {
    if (!v->is_array() || v->as_array().empty()) {
      r.expected(*v, where + " choices", "a non-empty array of " + o.type + " values");
      ok = false;
    } else {
      for (size_t i = 0; i < v->as_array().size(); ++i) {
        const Value& c = v->as_array()[i];
        auto text = typed_text(c, o.type);
        if (!text) {
          r.expected(c, where + " choices[" + std::to_string(i) + "]", a_type(o.type));
          ok = false;
        } else {
          o.choices.push_back(*text);
        }
      }
    }
  }
  if (const Value* v = Reader::find(t, "default")) {
    auto text = typed_text(*v, o.type);
    if (!text) {
      r.expected(*v, where + " default", a_type(o.type) + " (the option's type)");
      ok = false;
    } else if (!o.choices.empty() && !Reader::find(t, "plugin") &&
               std::find(o.choices.begin(), o.choices.end(), *text) == o.choices.end()) {
      r.error(r.pos(*v), where + " default: " + quote(*text) + " is not one of the choices (" + join(o.choices, ", ") + ")");
      ok = false;
    } else {
      o.default_value = *text;
    }
  }
  if (auto req = r.boolean(t, "required", where)) o.required = *req;
  if (o.required && Reader::find(t, "default")) {
    r.error(r.key_pos(*Reader::find(t, "required"), "required"), where + ": a required option cannot have a default");
    ok = false;
  }
  if (auto d = r.string(t, "description", where)) o.description = *d;
  if (const Value* v = Reader::find(t, "plugin")) {
    std::vector<std::string> kinds(std::begin(kPluginKinds), std::end(kPluginKinds));
    if (o.type != "string") {
      r.error(r.pos(*v), where + " plugin: only a string option can name a plugin");
      ok = false;
    } else if (v->is_string() && std::find(kinds.begin(), kinds.end(), v->as_string().str) != kinds.end()) {
      o.plugin_kind = v->as_string().str;
    } else {
      r.expected(*v, where + " plugin", "a plugin kind (" + join(kinds, ", ") + ")");
      ok = false;
    }
  }
  if (!ok) return std::nullopt;
  return o;
}

}  // namespace

PluginInfo parse_plugin_toml(const std::string& path_in) {
  const std::string path = detail::normalise_path(path_in);
  const Value root = parse_toml(read_document(path, "plugin.toml"), path);
  Reader r(path);
  r.check_keys(root, kPluginKeys, "plugin.toml");
  PluginInfo info;
  info.manifest_path = path;
  info.name_pos = r.start();
  const std::string dir = fs::path(path).parent_path().string();

  auto required = [&](const char* key, const char* what) -> const Value* {
    const Value* v = Reader::find(root, key);
    if (!v) r.error(r.start(), std::string("missing '") + key + "' (" + what + ")");
    return v;
  };
  if (const Value* v = required("name", "the plugin's name")) {
    info.name_pos = r.pos(*v);
    if (auto s = r.string_value(*v, "name", true)) {
      if (detail::valid_plugin_name(*s))
        info.name = *s;
      else
        r.error(r.pos(*v), "name: " + quote(*s) + " is not a valid plugin name (letters, digits, '_', '-', '.')");
    }
  }
  if (const Value* v = required("kind", "framework, provider, app, task_backend or compute_backend")) {
    std::vector<std::string> kinds(std::begin(kPluginKinds), std::end(kPluginKinds));
    if (v->is_string() && std::find(kinds.begin(), kinds.end(), v->as_string().str) != kinds.end())
      info.kind = v->as_string().str;
    else
      r.expected(*v, "kind", "one of " + join(kinds, ", ") +
                                 (v->is_string() ? did_you_mean(v->as_string().str, kinds) : std::string()));
  }
  if (const Value* v = required("library", "the shared library, relative to plugin.toml")) {
    if (auto s = r.string_value(*v, "library", true)) info.library = detail::normalise_path(*s, dir);
  }
  if (const Value* v = required("abi", "the plugin ABI version as \"major.minor\"")) {
    bool ok = false;
    if (v->is_string()) {
      const std::string& s = v->as_string().str;
      auto dot = s.find('.');
      unsigned major = 0, minor = 0;
      if (dot != std::string::npos && dot > 0 && dot + 1 < s.size()) {
        auto a = std::from_chars(s.data(), s.data() + dot, major);
        auto b = std::from_chars(s.data() + dot + 1, s.data() + s.size(), minor);
        ok = a.ec == std::errc() && a.ptr == s.data() + dot && b.ec == std::errc() && b.ptr == s.data() + s.size() &&
             major <= 0xffff && minor <= 0xffff;
      }
      if (ok) {
        info.abi_major = static_cast<int>(major);
        info.abi_minor = static_cast<int>(minor);
      }
    }
    if (!ok) r.expected(*v, "abi", "a version string \"major.minor\" such as \"1.0\"");
  }
  if (auto s = r.string(root, "version", "")) info.version = *s;
  if (auto n = r.integer(root, "max_nodes", "", 1, 1'000'000)) {
    if (info.kind != "provider") r.error(r.pos(*Reader::find(root, "max_nodes")), "max_nodes: only a provider has it");
    info.max_nodes = *n;
  }
  if (auto s = r.string(root, "description", "")) info.description = *s;
  if (auto a = r.string_array(root, "after", "", false, [](const std::string& s, size_t) {
        return detail::valid_plugin_name(s) ? std::string() : "expected a plugin name, got " + quote(s);
      }))
    info.after = std::move(*a);

  if (const Value* opts = Reader::find(root, "options")) {
    if (!opts->is_table()) {
      r.expected(*opts, "options", "a table of [options.<name>] tables");
    } else {
      std::vector<std::pair<SourcePos, OptionSchema>> found;
      for (const auto& [name, t] : opts->as_table()) {
        if (!detail::valid_plugin_name(name)) {
          r.error(r.key_pos(t, name), "options: " + quote(name) + " is not a valid option name (letters, digits, '_', '-', '.')");
          continue;
        }
        if (auto o = read_option_schema(r, name, t)) found.emplace_back(r.pos(t), std::move(*o));
      }
      std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
        return std::tie(a.first.line, a.first.column, a.second.name) < std::tie(b.first.line, b.first.column, b.second.name);
      });
      for (auto& [p, o] : found) info.options.push_back(std::move(o));
    }
  }
  r.throw_if_failed();
  return info;
}

const OptionSchema* PluginInfo::option(const std::string& option_name) const {
  for (const auto& o : options)
    if (o.name == option_name) return &o;
  return nullptr;
}

}  // namespace skyforge
