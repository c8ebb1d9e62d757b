// The TOML front end (toml_reader.hpp).
#include "toml_reader.hpp"

#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

namespace fs = std::filesystem;

namespace skyforge::toml_in {

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

namespace {

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

// The length of the well-formed UTF-8 sequence at text[i] (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0.
size_t utf8_sequence(const std::string& text, size_t i) {
  const auto b = [&](size_t k) { return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0u; };
  const unsigned c = b(0);
  auto cont = [&](size_t k) { return (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return b(1) >= lo && b(1) <= hi && cont(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return b(1) >= lo && b(1) <= hi && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

// What toml11 would choke on, refused before it runs (manifests are fuzzed): bytes that are not
// UTF-8 (TOML requires it, and toml11 3.7 reads past its buffer while reporting a bad sequence
// in a string: found by tests/fuzz/fuzz_manifest), nesting deep enough to exhaust its recursive
// parser's stack (strings and comments are skipped, so brackets inside them do not count), and
// lines long enough for its per-value copy of the line to go quadratic.
void check_shape(const std::string& text, const std::string& display_name) {
  {
    int line = 1, col = 1;
    for (size_t i = 0; i < text.size();) {
      const size_t n = utf8_sequence(text, i);
      if (n == 0) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(text[i]));
        throw ManifestError(SourcePos{display_name, line, col}.str() + ": not UTF-8 (byte " + hex +
                            "): a manifest is UTF-8 text");
      }
      if (text[i] == '\n') line++, col = 1;
      else col += static_cast<int>(n);  // columns count bytes, as below
      i += n;
    }
  }
  constexpr int kMaxDepth = 64;
  int depth = 0, line = 1, col = 1;
  size_t i = 0;
  auto line_too_long = [&]() {
    return ManifestError(SourcePos{display_name, line, 1}.str() + ": a line of " + std::to_string(col - 1) +
                         " bytes; a manifest's lines are at most " + std::to_string(kMaxLineBytes) +
                         " bytes (the TOML parser's time grows with the square of a line's length): put an "
                         "array's elements on lines of their own");
  };
  auto advance = [&](size_t n) {
    for (size_t k = 0; k < n && i < text.size(); ++k, ++i) {
      if (text[i] == '\n') {
        if (size_t(col - 1) > kMaxLineBytes) throw line_too_long();
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
  if (size_t(col - 1) > kMaxLineBytes) throw line_too_long();  // the last line, without a newline
}

}  // namespace

Value parse_toml(const std::string& text, const std::string& display_name) {
  if (text.size() > kMaxDocumentBytes)
    throw ManifestError(display_name + ": larger than " + std::to_string(kMaxDocumentBytes >> 20) + " MiB");
  check_shape(text, display_name);
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

}  // namespace skyforge::toml_in
