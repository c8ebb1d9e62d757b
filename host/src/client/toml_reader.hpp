// The TOML front end that both documents (job.toml, plugin.toml) go through: toml11, with
// syntax errors kept at line:col and limits on size and nesting (both documents are fuzzed), and
// Reader, which checks values against a schema and collects every problem with the position of
// the offending key or value before throwing one ManifestError. The schemas themselves live in
// manifest.cpp (job.toml), train_table.cpp ([train]) and plugin_toml.cpp (plugin.toml).
#pragma once

#include "manifest.hpp"

#include <toml.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace skyforge::toml_in {

using Value = toml::value;
using detail::did_you_mean;
using detail::join;

// toml11 3.7 costs ~2 us per value plus, per value, the length of the line it sits on (it copies
// the line for comments and error context): a 200k-string array on one line took 52 s. Within
// these limits any document parses in about a second (docs/manifest.md, "Limits").
inline constexpr size_t kMaxDocumentBytes = 1u << 20;
inline constexpr size_t kMaxLineBytes = 4096;

// A string for a message: quoted, escaped, cut at 60 characters.
std::string quote(std::string_view s);
// The shortest text that reads back as `d`.
std::string float_text(double d);
// toml11 3.7 reads integers with operator>>, which saturates silently on overflow. Re-reads the
// literal from the source to tell a real INT64_MAX from an overflowing one (nullopt).
std::optional<int64_t> checked_integer(const Value& v);
// "an integer", "a string", ...
const char* type_noun(const Value& v);
// "an integer (42)", "a string (\"x\")", "an array".
std::string describe(const Value& v);

// A string_array option's canonical text: its elements joined by kListSeparator. Each element
// must be a non-empty string without one; bad(i, element) is called for each that is not, and
// then there is no text.
template <class Bad>
std::optional<std::string> join_string_array(const Value& v, Bad&& bad) {
  std::string joined;
  bool ok = true;
  for (size_t i = 0; i < v.as_array().size(); ++i) {
    const Value& e = v.as_array()[i];
    if (!e.is_string() || e.as_string().str.empty() || e.as_string().str.find(kListSeparator) != std::string::npos) {
      bad(i, e);
      ok = false;
      continue;
    }
    if (i > 0) joined += kListSeparator;
    joined += e.as_string().str;
  }
  if (!ok) return std::nullopt;
  return joined;
}

struct Problem {
  SourcePos pos;
  std::string message;
};

// A scalar plugin option: its canonical text and type name.
struct Scalar {
  std::string text;
  std::string type;
};

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  const std::string& file() const { return file_; }
  SourcePos start() const { return {file_, 1, 1}; }

  SourcePos pos(const Value& v) const {
    const auto loc = v.location();
    return {file_, static_cast<int>(loc.line()), static_cast<int>(loc.column())};
  }

  // toml11 keeps no location for keys: find the key on its value's line, left of the value.
  // Falls back to the value's position (for tables opened by a [header], that is the header).
  SourcePos key_pos(const Value& v, const std::string& key) const {
    SourcePos p = pos(v);
    const auto loc = v.location();
    const std::string& line = loc.line_str();
    const size_t value_col = loc.column() >= 1 ? loc.column() - 1 : 0;
    if (key.empty() || value_col > line.size()) return p;
    const size_t at = line.substr(0, value_col).rfind(key);
    if (at == std::string::npos) return p;
    size_t col = at;
    if (col > 0 && (line[col - 1] == '"' || line[col - 1] == '\'')) --col;
    p.column = static_cast<int>(col) + 1;
    return p;
  }

  void error(SourcePos p, std::string message) { problems_.push_back({std::move(p), std::move(message)}); }
  bool failed() const { return !problems_.empty(); }
  const std::vector<Problem>& problems() const { return problems_; }

  // Throws every problem, ordered by position, when there is any.
  void throw_if_failed() {
    if (problems_.empty()) return;
    std::stable_sort(problems_.begin(), problems_.end(), [](const Problem& a, const Problem& b) {
      return std::tie(a.pos.line, a.pos.column) < std::tie(b.pos.line, b.pos.column);
    });
    std::vector<std::string> lines;
    lines.reserve(problems_.size());
    for (const auto& pr : problems_) lines.push_back(pr.pos.str() + ": " + pr.message);
    throw ManifestError(std::move(lines));
  }

  // Keys of `table` not in `known` are errors ("unknown key 'k' in [where] (known: ...)").
  void check_keys(const Value& table, const std::vector<std::string>& known, const std::string& where) {
    for (const auto& [key, value] : table.as_table()) {
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      error(key_pos(value, key),
            "unknown key '" + key + "' in " + where + " (known: " + join(known, ", ") + ")" +
                did_you_mean(key, known));
    }
  }

  // "[pool] nodes"; just the key for top-level keys.
  static std::string label(const std::string& where, const std::string& key) {
    return where.empty() ? key : where + " " + key;
  }

  static const Value* find(const Value& table, const std::string& key) {
    const auto& t = table.as_table();
    auto it = t.find(key);
    return it == t.end() ? nullptr : &it->second;
  }

  void expected(const Value& v, const std::string& label, const std::string& what) {
    error(pos(v), label + ": expected " + what + ", got " + describe(v));
  }

  std::optional<std::string> string(const Value& table, const std::string& key, const std::string& where,
                                    bool non_empty = false) {
    const Value* v = find(table, key);
    if (!v) return std::nullopt;
    return string_value(*v, label(where, key), non_empty);
  }

  std::optional<std::string> string_value(const Value& v, const std::string& label, bool non_empty) {
    if (!v.is_string()) {
      expected(v, label, non_empty ? "a non-empty string" : "a string");
      return std::nullopt;
    }
    const std::string& s = v.as_string().str;
    if (non_empty && s.empty()) {
      expected(v, label, "a non-empty string");
      return std::nullopt;
    }
    if (s.find('\0') != std::string::npos) {
      error(pos(v), label + ": must not contain a NUL character");
      return std::nullopt;
    }
    return s;
  }

  // Integer in [min, max]. Messages: "expected an integer >= 1, got 0".
  std::optional<uint64_t> integer(const Value& table, const std::string& key, const std::string& where,
                                  uint64_t min, uint64_t max) {
    const Value* v = find(table, key);
    if (!v) return std::nullopt;
    const std::string label = Reader::label(where, key);
    const std::string want = "an integer >= " + std::to_string(min);
    if (!v->is_integer()) {
      expected(*v, label, want);
      return std::nullopt;
    }
    auto i = checked_integer(*v);
    if (!i) {
      error(pos(*v), label + ": expected " + want + ", got an integer out of the 64-bit range");
      return std::nullopt;
    }
    if (*i < 0 || static_cast<uint64_t>(*i) < min) {
      error(pos(*v), label + ": expected " + want + ", got " + std::to_string(*i));
      return std::nullopt;
    }
    if (static_cast<uint64_t>(*i) > max) {
      error(pos(*v), label + ": expected an integer between " + std::to_string(min) + " and " + std::to_string(max) +
                         ", got " + std::to_string(*i));
      return std::nullopt;
    }
    return static_cast<uint64_t>(*i);
  }

  std::optional<bool> boolean(const Value& table, const std::string& key, const std::string& where) {
    const Value* v = find(table, key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) {
      expected(*v, label(where, key), "a boolean");
      return std::nullopt;
    }
    return v->as_boolean();
  }

  // Array of strings; element problems are reported at the element ("[image] apt[2]: ...").
  // `check` may reject an element by returning a message. Returns nullopt when anything is wrong.
  template <class Check>
  std::optional<std::vector<std::string>> string_array(const Value& table, const std::string& key,
                                                       const std::string& where, bool non_empty, Check check) {
    const Value* v = find(table, key);
    if (!v) return std::nullopt;
    const std::string label = Reader::label(where, key);
    if (!v->is_array()) {
      expected(*v, label, non_empty ? "a non-empty array of strings" : "an array of strings");
      return std::nullopt;
    }
    const auto& arr = v->as_array();
    if (non_empty && arr.empty()) {
      error(pos(*v), label + ": expected a non-empty array of strings, got an empty array");
      return std::nullopt;
    }
    std::vector<std::string> out;
    bool ok = true;
    for (size_t i = 0; i < arr.size(); ++i) {
      const std::string elabel = label + "[" + std::to_string(i) + "]";
      auto s = string_value(arr[i], elabel, false);
      if (!s) {
        ok = false;
        continue;
      }
      if (std::string why = check(*s, i); !why.empty()) {
        error(pos(arr[i]), elabel + ": " + why);
        ok = false;
        continue;
      }
      out.push_back(std::move(*s));
    }
    if (!ok) return std::nullopt;
    return out;
  }

  std::optional<std::vector<std::string>> string_array(const Value& table, const std::string& key,
                                                       const std::string& where, bool non_empty) {
    return string_array(table, key, where, non_empty, [](const std::string&, size_t) { return std::string(); });
  }

  // A plugin option value: a string, integer, float or boolean.
  std::optional<Scalar> scalar(const Value& v, const std::string& label) {
    switch (v.type()) {
      case toml::value_t::string: {
        auto s = string_value(v, label, false);
        if (!s) return std::nullopt;
        return Scalar{*s, "string"};
      }
      case toml::value_t::integer: {
        auto i = checked_integer(v);
        if (!i) {
          error(pos(v), label + ": integer out of the 64-bit range");
          return std::nullopt;
        }
        return Scalar{std::to_string(*i), "integer"};
      }
      case toml::value_t::floating: return Scalar{float_text(v.as_floating()), "float"};
      case toml::value_t::boolean: return Scalar{v.as_boolean() ? "true" : "false", "boolean"};
      case toml::value_t::array: {
        auto joined = join_string_array(v, [&](size_t i, const Value& e) {
          const std::string where = label + "[" + std::to_string(i) + "]";
          if (!e.is_string()) expected(e, where, "a string (an array option holds strings)");
          else error(pos(e), where + ": an element of an array option must be a non-empty string without a newline");
        });
        if (!joined) return std::nullopt;
        return Scalar{*joined, "string_array"};
      }
      default:
        expected(v, label, "a string, integer, float, boolean or array of strings");
        return std::nullopt;
    }
  }

 private:
  std::string file_;
  std::vector<Problem> problems_;
};

// Parses a document's text; throws ManifestError with the position of a syntax error.
Value parse_toml(const std::string& text, const std::string& display_name);
// Reads a whole file (at most kMaxDocumentBytes); `what` names it in errors ("manifest").
std::string read_document(const std::string& path, const char* what);

// Options of a plugin use, in the order written (toml11 tables are unordered).
struct OptionEntry {
  std::string name;
  Scalar value;
  SourcePos pos;
};
std::vector<OptionEntry> read_options(Reader& r, const Value& table, const std::string& where,
                                      const std::vector<std::string>& skip);

}  // namespace skyforge::toml_in
