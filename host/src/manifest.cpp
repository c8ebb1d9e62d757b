// Manifest and plugin.toml readers. Both documents go through the same TOML front end (toml11,
// syntax errors keep toml11's line:col) and the same schema helpers, which collect every problem
// with the position of the offending key or value before throwing one ManifestError. That is why
// parse_plugin_toml (declared in catalog.hpp) lives here; catalog.cpp only scans directories and
// checks manifests against the catalogue.
#include "manifest.hpp"

#include "catalog.hpp"

#include <skyforge/layer_schema.hpp>
#include <toml.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

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
// adjacent characters ("troch" -> "torch") each cost one.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> d((a.size() + 1) * (b.size() + 1));
  auto at = [&](size_t i, size_t j) -> size_t& { return d[i * (b.size() + 1) + j]; };
  for (size_t i = 0; i <= a.size(); ++i) at(i, 0) = i;
  for (size_t j = 0; j <= b.size(); ++j) at(0, j) = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      at(i, j) = std::min({at(i - 1, j) + 1, at(i, j - 1) + 1, at(i - 1, j - 1) + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        at(i, j) = std::min(at(i, j), at(i - 2, j - 2) + 1);
    }
  }
  return at(a.size(), b.size());
}
}  // namespace

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  // Allow roughly one typo per three characters, at least one, at most three.
  const size_t budget = std::clamp<size_t>(word.size() / 3, 1, 3);
  const std::string* best = nullptr;
  size_t best_d = budget + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = &c;
    }
  }
  if (!best || best_d == 0) return "";
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
// TOML front end and schema helpers

namespace {

using Value = toml::value;

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
using detail::did_you_mean;
using detail::join;

constexpr size_t kMaxDocumentBytes = 16u << 20;

std::string quote(std::string_view s) {
  constexpr size_t kMax = 60;
  std::string out = "\"";
  for (char ch : s.substr(0, kMax)) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[(ch >> 4) & 0xf];
      out += hex[ch & 0xf];
    } else {
      out += ch;
    }
  }
  if (s.size() > kMax) out += "...";
  return out + "\"";
}

std::string float_text(double d) {
  std::array<char, 64> buf{};
  auto res = std::to_chars(buf.data(), buf.data() + buf.size(), d);
  return std::string(buf.data(), res.ptr);
}

// toml11 3.7 reads integers with operator>>, which saturates silently on overflow. Re-read the
// literal from the source to tell a real INT64_MAX from an overflowing one.
std::optional<int64_t> checked_integer(const Value& v) {
  const auto loc = v.location();
  const std::string& line = loc.line_str();
  const size_t begin = loc.column() >= 1 ? loc.column() - 1 : 0;
  if (begin >= line.size() || loc.region() == 0) return v.as_integer();
  std::string token;
  for (char ch : line.substr(begin, loc.region()))
    if (ch != '_') token += ch;
  bool negative = false;
  if (!token.empty() && (token[0] == '+' || token[0] == '-')) {
    negative = token[0] == '-';
    token.erase(0, 1);
  }
  int base = 10;
  if (token.size() > 2 && token[0] == '0' && (token[1] == 'x' || token[1] == 'o' || token[1] == 'b')) {
    base = token[1] == 'x' ? 16 : token[1] == 'o' ? 8 : 2;
    token.erase(0, 2);
  }
  uint64_t magnitude = 0;
  auto res = std::from_chars(token.data(), token.data() + token.size(), magnitude, base);
  if (res.ec == std::errc::result_out_of_range) return std::nullopt;
  if (res.ec != std::errc() || res.ptr != token.data() + token.size()) return v.as_integer();
  constexpr uint64_t kMaxPos = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (!negative && magnitude > kMaxPos) return std::nullopt;
  if (negative && magnitude > kMaxPos + 1) return std::nullopt;
  return v.as_integer();
}

const char* type_noun(const Value& v) {
  switch (v.type()) {
    case toml::value_t::string: return "a string";
    case toml::value_t::integer: return "an integer";
    case toml::value_t::floating: return "a float";
    case toml::value_t::boolean: return "a boolean";
    case toml::value_t::array: return "an array";
    case toml::value_t::table: return "a table";
    case toml::value_t::offset_datetime: return "an offset date-time";
    case toml::value_t::local_datetime: return "a local date-time";
    case toml::value_t::local_date: return "a local date";
    case toml::value_t::local_time: return "a local time";
    default: return "nothing";
  }
}

// "an integer (42)", "a string (\"x\")", "an array".
std::string describe(const Value& v) {
  std::string out = type_noun(v);
  switch (v.type()) {
    case toml::value_t::string: return out + " (" + quote(v.as_string().str) + ")";
    case toml::value_t::integer: {
      auto i = checked_integer(v);
      return out + " (" + (i ? std::to_string(*i) : std::string("out of range")) + ")";
    }
    case toml::value_t::floating: return out + " (" + float_text(v.as_floating()) + ")";
    case toml::value_t::boolean: return out + (v.as_boolean() ? " (true)" : " (false)");
    default: return out;
  }
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

// "[error] toml::parse_x: message\n --> f\n | ...\n |   ^--- hint" -> "message (hint)".
std::string summarise_toml_error(const std::string& what) {
  std::istringstream in(what);
  std::string line, head, hint;
  std::getline(in, head);
  if (head.rfind("[error] ", 0) == 0) head.erase(0, 8);
  if (head.rfind("toml::", 0) == 0) {
    if (auto colon = head.find(": "); colon != std::string::npos) head.erase(0, colon + 2);
  }
  // toml11 marks the first occurrence first; the last mark is the one at the error.
  while (std::getline(in, line)) {
    auto bar = line.find('|');
    if (bar == std::string::npos) continue;
    auto mark = line.find_first_of("^~", bar);
    if (mark == std::string::npos) continue;
    auto text = line.find_first_not_of("^~- ", mark);
    if (text != std::string::npos) hint = line.substr(text);
  }
  while (!head.empty() && (head.back() == '.' || head.back() == ' ')) head.pop_back();
  return hint.empty() ? head : head + " (" + hint + ")";
}

// toml11 parses arrays and inline tables recursively; refuse absurd nesting before it can
// exhaust the stack (manifests are fuzzed). Strings and comments are skipped, so brackets inside
// them do not count.
void check_nesting(const std::string& text, const std::string& display_name) {
  constexpr int kMaxDepth = 64;
  int depth = 0, line = 1, col = 1;
  size_t i = 0;
  auto advance = [&](size_t n) {
    for (size_t k = 0; k < n && i < text.size(); ++k, ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
  };
  while (i < text.size()) {
    const char c = text[i];
    if (c == '#') {
      while (i < text.size() && text[i] != '\n') advance(1);
    } else if (c == '"' || c == '\'') {
      const bool basic = c == '"';
      const bool multi = text.compare(i, 3, std::string(3, c)) == 0;
      advance(multi ? 3 : 1);
      while (i < text.size()) {
        if (basic && text[i] == '\\') {
          advance(2);
        } else if (multi ? text.compare(i, 3, std::string(3, c)) == 0 : text[i] == c) {
          advance(multi ? 3 : 1);
          break;
        } else if (!multi && text[i] == '\n') {
          break;  // unterminated: toml11 reports it
        } else {
          advance(1);
        }
      }
    } else {
      if (c == '[' || c == '{') {
        if (++depth > kMaxDepth)
          throw ManifestError(SourcePos{display_name, line, col}.str() + ": arrays and inline tables nested deeper than " +
                              std::to_string(kMaxDepth) + " levels");
      } else if ((c == ']' || c == '}') && depth > 0) {
        --depth;
      }
      advance(1);
    }
  }
}

Value parse_toml(const std::string& text, const std::string& display_name) {
  if (text.size() > kMaxDocumentBytes)
    throw ManifestError(display_name + ": larger than " + std::to_string(kMaxDocumentBytes >> 20) + " MiB");
  check_nesting(text, display_name);
  std::istringstream in(text);
  try {
    return toml::parse(in, display_name);
  } catch (const toml::syntax_error& e) {
    SourcePos p{display_name, static_cast<int>(e.location().line()), static_cast<int>(e.location().column())};
    throw ManifestError({p.str() + ": TOML syntax error: " + summarise_toml_error(e.what())});
  } catch (const toml::exception& e) {
    SourcePos p{display_name, static_cast<int>(e.location().line()), static_cast<int>(e.location().column())};
    throw ManifestError({p.str() + ": TOML error: " + summarise_toml_error(e.what())});
  } catch (const std::exception& e) {
    throw ManifestError({display_name + ":1:1: TOML error: " + summarise_toml_error(e.what())});
  }
}

std::string read_document(const std::string& path, const char* what) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw ManifestError({path + ": cannot read " + what + ": is a directory"});
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ManifestError({path + ": cannot read " + what + ": " + std::strerror(errno)});
  std::string text;
  std::array<char, 65536> buf;
  while (in.read(buf.data(), buf.size()) || in.gcount() > 0) {
    text.append(buf.data(), static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxDocumentBytes)
      throw ManifestError({path + ": cannot read " + what + ": larger than " +
                           std::to_string(kMaxDocumentBytes >> 20) + " MiB"});
  }
  if (in.bad()) throw ManifestError({path + ": cannot read " + what + ": " + std::strerror(errno)});
  return text;
}

// Options of a plugin use, in the order written (toml11 tables are unordered).
struct OptionEntry {
  std::string name;
  Scalar value;
  SourcePos pos;
};

std::vector<OptionEntry> read_options(Reader& r, const Value& table, const std::string& where,
                                      const std::vector<std::string>& skip) {
  std::vector<OptionEntry> out;
  for (const auto& [key, value] : table.as_table()) {
    if (std::find(skip.begin(), skip.end(), key) != skip.end()) continue;
    auto s = r.scalar(value, where + " " + key);
    if (s) out.push_back({key, std::move(*s), r.pos(value)});
  }
  std::stable_sort(out.begin(), out.end(), [](const OptionEntry& a, const OptionEntry& b) {
    return std::tie(a.pos.line, a.pos.column, a.name) < std::tie(b.pos.line, b.pos.column, b.name);
  });
  return out;
}

bool valid_env_name(const std::string& s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
  });
}

bool has_control_char(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f; });
}

const std::vector<std::string> kTopKeys = {"pool", "provider", "image", "plugins", "job", "train"};
const std::vector<std::string> kPoolKeys = {"provider", "nodes", "concurrency", "accelerator"};
const std::vector<std::string> kImageKeys = {"apt", "pip", "env", "files"};
const std::vector<std::string> kFileKeys = {"source", "target"};
const std::vector<std::string> kJobKeys = {"app",    "command", "mode",   "tasks",   "inputs",
                                           "batch",  "stdout",  "stderr", "timeout", "plugin_path", "options"};

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
  if (auto n = r.integer(t, "nodes", "[pool]", 1, kU32)) pool.nodes = static_cast<uint32_t>(*n);
  if (auto n = r.integer(t, "concurrency", "[pool]", 1, kU32)) pool.concurrency = static_cast<uint32_t>(*n);
  if (auto s = r.string(t, "accelerator", "[pool]")) {
    if (has_control_char(*s))
      r.error(r.pos(*Reader::find(t, "accelerator")), "[pool] accelerator: must not contain control characters");
    else
      pool.accelerator = *s;
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
  const Value* batch = Reader::find(t, "batch");
  if (job.mode == JobMode::map) {
    if (command && !app)
      r.error(r.pos(*mode), "[job] mode: \"map\" needs 'app' (a native app exporting a task function); a command cannot be mapped");
    if (tasks && inputs)
      r.error(r.key_pos(*inputs, "inputs"),
              "[job]: 'tasks' and 'inputs' are mutually exclusive (tasks is set at " + r.pos(*tasks).str() + ")");
    else if (!tasks && !inputs)
      r.error(r.pos(*mode), "[job] mode: \"map\" needs 'tasks' (a count) or 'inputs' (an array of strings)");
    if (auto n = r.integer(t, "tasks", "[job]", 1, std::numeric_limits<int64_t>::max())) {
      job.tasks = *n;
      job.has_tasks = true;
    }
    if (auto in = r.string_array(t, "inputs", "[job]", true)) job.inputs = std::move(*in);
    if (auto b = r.integer(t, "batch", "[job]", 0, std::numeric_limits<uint32_t>::max()))
      job.batch = static_cast<uint32_t>(*b);
  } else if (mode_known) {
    for (auto [key, v] : {std::pair{"tasks", tasks}, std::pair{"inputs", inputs}, std::pair{"batch", batch}}) {
      if (v)
        r.error(r.key_pos(*v, key), std::string("[job] ") + key + ": only allowed with mode = \"map\" (mode is \"" +
                                        mode_name(job.mode) + "\")");
    }
  }

  if (auto p = read_policy(r, t, "stdout")) job.stdout_policy = *p;
  if (auto p = read_policy(r, t, "stderr")) job.stderr_policy = *p;

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
}


// ---- [train] ---------------------------------------------------------------------------------
// Kinds of the [train] table's own numbers. Layers are checked against the SDK's layer schema
// (skyforge/layer_schema.hpp), the one catalogue the train app and every backend read too.
enum class Want { PosInt, Rate, PosFloat };

// Canonical text of a [train] number, or (nullopt) an error reported.
std::optional<std::string> want_text(Reader& r, const Value& v, Want w, const std::string& label) {
  auto bad = [&](const char* what) {
    r.expected(v, label, what);
    return std::nullopt;
  };
  switch (w) {
    case Want::PosInt: {
      auto i = v.is_integer() ? checked_integer(v) : std::nullopt;
      if (i && (*i < 1 || *i > std::numeric_limits<int32_t>::max())) {
        r.error(r.pos(v), label + ": expected an integer between 1 and 2147483647, got " + std::to_string(*i));
        return std::nullopt;
      }
      if (!i) return bad("an integer >= 1");
      return std::to_string(*i);
    }
    case Want::Rate:
    case Want::PosFloat: {
      double d = v.is_floating() ? v.as_floating() : v.is_integer() ? static_cast<double>(v.as_integer()) : NAN;
      if (!std::isfinite(d)) return bad("a number");
      if (w == Want::Rate && (d < 0 || d >= 1)) return bad("a number in [0, 1)");
      if (w == Want::PosFloat && d <= 0) return bad("a number > 0");
      return float_text(d);
    }
  }
  return std::nullopt;
}

// One layer option: the TOML value as the schema's text, checked by the schema; nullopt when
// refused (reported at the value).
std::optional<std::string> layer_option_text(Reader& r, const Value& v, const schema::OptionDef& o,
                                             const std::string& label) {
  std::optional<std::string> text;
  switch (o.kind) {
    case schema::OptionKind::count:
      if (auto i = v.is_integer() ? checked_integer(v) : std::nullopt) text = std::to_string(*i);
      break;
    case schema::OptionKind::size2:
      if (auto i = v.is_integer() ? checked_integer(v) : std::nullopt) {
        text = std::to_string(*i);
      } else if (v.is_array() && v.as_array().size() == 2 && v.as_array()[0].is_integer() &&
                 v.as_array()[1].is_integer()) {  // kernel_size = [3, 5]
        auto h = checked_integer(v.as_array()[0]), w = checked_integer(v.as_array()[1]);
        if (h && w) text = std::to_string(*h) + "," + std::to_string(*w);
      }
      break;
    case schema::OptionKind::real:
      if (v.is_floating() || v.is_integer())
        text = float_text(v.is_floating() ? v.as_floating() : static_cast<double>(v.as_integer()));
      break;
    case schema::OptionKind::boolean:
      if (v.is_boolean()) text = v.as_boolean() ? "true" : "false";
      break;
    case schema::OptionKind::choice:
      if (v.is_string()) text = v.as_string().str;
      break;
  }
  if (!text) {
    r.expected(v, label, schema::expectation(o));
    return std::nullopt;
  }
  const schema::Checked c = schema::check(o, *text);
  if (c.ok) return c.canonical;
  std::string hint;
  if (o.kind == schema::OptionKind::choice) {
    std::vector<std::string> names;
    schema::detail::each_choice(o.choices, [&](std::string_view n, std::string_view) { names.emplace_back(n); });
    hint = did_you_mean(*text, names);
  }
  r.error(r.pos(v), label + ": expected " + schema::expectation(o) + ", got " +
                        (o.kind == schema::OptionKind::choice ? quote(*text) : *text) + hint);
  return std::nullopt;
}

const std::vector<std::string> kTrainKeys = {"dataset", "data_dir", "layers", "optimizer", "learning_rate", "momentum",
                                             "loss", "metrics", "epochs", "batch_size", "steps_per_epoch", "shuffle", "seed",
                                             "history", "tensorboard", "checkpoint", "resume", "threads", "evaluate"};

void read_train(Reader& r, const Value& t, const std::string& dir, TrainSpec& train) {
  r.check_keys(t, kTrainKeys, "[train]");
  train.present = true;
  train.pos = r.pos(t);
  auto put = [&](const std::string& key, std::string value) { train.config.emplace_back("train." + key, std::move(value)); };
  auto choice = [&](const char* key, std::vector<std::string> allowed, const char* fallback) {
    std::string value = fallback;
    if (const Value* v = Reader::find(t, key)) {
      if (v->is_string() && std::find(allowed.begin(), allowed.end(), v->as_string().str) != allowed.end())
        value = v->as_string().str;
      else
        r.expected(*v, std::string("[train] ") + key, "one of " + join(allowed, ", ") +
                                                          (v->is_string() ? did_you_mean(v->as_string().str, allowed) : ""));
    }
    put(key, value);
  };
  auto number = [&](const char* key, Want w, const char* fallback) {
    const Value* v = Reader::find(t, key);
    if (!v) return put(key, fallback);
    if (auto s = want_text(r, *v, w, std::string("[train] ") + key)) put(key, *s);
  };
  auto path = [&](const char* key) {
    if (auto s = r.string(t, key, "[train]", true)) put(key, detail::normalise_path(*s, dir));
  };

  choice("dataset", {"fashion-mnist", "mnist"}, "fashion-mnist");
  if (auto s = r.string(t, "data_dir", "[train]", true)) put("data_dir", detail::normalise_path(*s, dir));
  choice("optimizer", {"adam", "sgd"}, "adam");
  number("learning_rate", Want::PosFloat, "0.001");
  number("momentum", Want::Rate, "0");
  choice("loss", {"sparse_categorical_crossentropy"}, "sparse_categorical_crossentropy");
  if (auto m = r.string_array(t, "metrics", "[train]", false, [](const std::string& s, size_t) {
        return s == "accuracy" ? std::string() : "expected \"accuracy\", got " + quote(s);
      }))
    put("metrics", join(*m, ","));
  number("epochs", Want::PosInt, "1");
  number("batch_size", Want::PosInt, "32");
  if (const Value* v = Reader::find(t, "steps_per_epoch"))
    if (auto n = want_text(r, *v, Want::PosInt, "[train] steps_per_epoch")) put("steps_per_epoch", *n);
  if (auto n = r.integer(t, "seed", "[train]", 0, std::numeric_limits<int64_t>::max())) put("seed", std::to_string(*n));
  if (auto b = r.boolean(t, "shuffle", "[train]")) put("shuffle", *b ? "true" : "false");
  if (auto b = r.boolean(t, "resume", "[train]")) put("resume", *b ? "true" : "false");
  if (auto b = r.boolean(t, "evaluate", "[train]")) put("evaluate", *b ? "true" : "false");
  if (auto n = r.integer(t, "threads", "[train]", 0, 4096)) put("threads", std::to_string(*n));
  path("history");
  path("tensorboard");
  path("checkpoint");
  if (const Value* v = Reader::find(t, "resume"); v && v->is_boolean() && v->as_boolean() && !Reader::find(t, "checkpoint"))
    r.error(r.key_pos(*v, "resume"), "[train] resume: needs 'checkpoint' (the directory to resume from)");

  const Value* layers = Reader::find(t, "layers");
  if (!layers || !layers->is_array() || layers->as_array().empty()) {
    if (layers)
      r.expected(*layers, "[train] layers", "a non-empty array of tables ([[train.layers]] with 'type')");
    else
      r.error(r.pos(t), "[train]: missing 'layers' (one [[train.layers]] table per layer, each with 'type')");
    return;
  }
  const std::vector<std::string> types = schema::type_names();
  const auto& arr = layers->as_array();
  put("layers", std::to_string(arr.size()));
  for (size_t i = 0; i < arr.size(); ++i) {
    const Value& l = arr[i];
    const std::string where = "[[train.layers]] #" + std::to_string(i + 1);
    if (!l.is_table()) {
      r.expected(l, where, "a table with 'type' and the layer's options");
      continue;
    }
    const Value* type = Reader::find(l, "type");
    if (!type) {
      r.error(r.pos(l), where + ": missing 'type' (one of " + join(types, ", ") + ")");
      continue;
    }
    const schema::LayerDef* def = type->is_string() ? schema::find(type->as_string().str) : nullptr;
    if (!def) {
      r.expected(*type, where + " type",
                 "one of " + join(types, ", ") + (type->is_string() ? did_you_mean(type->as_string().str, types) : ""));
      continue;
    }
    const std::string name(def->type);
    const std::string prefix = "layers." + std::to_string(i) + ".";
    put(prefix + "type", name);
    std::vector<std::string> known = {"type"};
    for (const auto& o : def->options) known.emplace_back(o.name);
    r.check_keys(l, known, where + " (" + name + ")");
    for (const auto& o : def->options) {
      const std::string key(o.name);
      if (const Value* v = Reader::find(l, key)) {
        if (auto text = layer_option_text(r, *v, o, where + " " + key)) put(prefix + key, *text);
      } else if (o.required()) {
        r.error(r.pos(*type), where + " (" + name + "): missing '" + key + "'");
      }
    }
  }
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
  if (train) {
    // The built-in `train` job is the `train` app (plugins/train), run once on every node.
    m.job.app = "train";
    m.job.app_pos = m.train.pos;
    m.job.mode = JobMode::broadcast;
  }

  r.throw_if_failed();
  return m;
}

Manifest load_manifest(const std::string& path) {
  return parse_manifest(read_document(path, "manifest"), path);
}

// ---------------------------------------------------------------------------------------------
// plugin.toml

namespace {

const std::vector<std::string> kPluginKeys = {"name",    "kind",        "library", "abi",
                                              "version", "description", "options", "after"};
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
