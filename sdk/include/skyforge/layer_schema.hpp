// skyforge/layer_schema.hpp — THE layer schema: every layer type, its options (kind, default,
// range, choices) and its shape rule, in one table (docs/layers.md is its prose).
//
// Everything that handles layers reads it: the manifest check (host, `skyforge validate`), the
// built-in train app, the Keras-style API (keras.hpp) and every compute backend (cpu, cuda, a
// third party's). Adding a layer is one LayerDef here (its options and shape rule) plus each
// backend's kernels; nothing else.
//
// Options cross the plugin ABI as text (abi.h, sf_layer_spec). parse() turns a layer's text
// options into a LayerConfig: every option of the type present, defaults filled in, each as
// canonical text and as a typed value. Canonical text: integers in decimal, sizes "3" (square)
// or "3,5", numbers in the shortest form that reads back as the same double (std::to_chars),
// booleans "true"/"false", choices by their canonical name.
//
// Header-only, C++20, no dependency beyond the standard library, so that the host and any plugin
// can include it. Errors are LayerError (a std::invalid_argument), messages like
// "layer 3 (conv2d): option 'kernel_size': expected an integer >= 1 or a pair like 3,5, got 'x'".
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace skyforge::schema {

class LayerError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// ---- option kinds -------------------------------------------------------------------------------
enum class OptionKind {
  count,    // an integer in [1, 2^31-1]
  size2,    // a count, or a pair "height,width" of counts (Keras' kernel_size=(3, 5))
  real,     // a finite number within OptionDef's range
  boolean,  // true / false
  choice,   // one of OptionDef::choices
  integer,  // a signed integer in [-2^31, 2^31-1] (concatenate's axis, -1: the last)
  dims,     // a shape: counts separated by commas, one of them may be -1 (reshape's target_shape)
};

// A square size from one integer, or (height, width).
struct Size2 {
  uint32_t h = 1, w = 1;
  constexpr Size2() = default;
  constexpr Size2(uint32_t s) : h(s), w(s) {}  // NOLINT: implicit on purpose, Conv2D(32, 3)
  constexpr Size2(uint32_t height, uint32_t width) : h(height), w(width) {}
  std::string text() const { return h == w ? std::to_string(h) : std::to_string(h) + "," + std::to_string(w); }
  bool operator==(const Size2&) const = default;
};

struct OptionDef {
  std::string_view name;
  OptionKind kind;
  std::string_view fallback;      // the default's canonical text; empty: required or default_from
  std::string_view default_from;  // the default is this other option's value (pool strides)
  double lo = 0, hi = 0;          // real: the range; lo_open/hi_open exclude the bound
  bool lo_open = false, hi_open = false;
  std::string_view choices;  // choice: "linear|relu|softmax"; an entry "none=linear" is an alias
  std::string_view doc;

  bool required() const { return fallback.empty() && default_from.empty(); }
};

// The shape rule's answer for one layer.
struct Window {
  uint32_t out = 0;  // output size along one spatial axis
  uint32_t pad = 0;  // leading padding (TensorFlow's 'same': the extra one goes at the end)
};
struct LayerShape {
  std::vector<uint32_t> output;  // one sample's output shape
  uint64_t trainable = 0;        // parameters, as Keras counts them
  uint64_t non_trainable = 0;    // BatchNormalization's moving statistics
  Window rows{}, cols{};         // conv2d / pooling: the window geometry
  // The trainable tensors' sizes in the flat parameter layout's order (Keras' layer.weights:
  // a kernel, then its bias; gamma, then beta): what per-variable rules (clipnorm) run over.
  // They sum to `trainable`.
  std::vector<uint64_t> weights{};
};

class LayerConfig;
struct LayerDef {
  std::string_view type;        // "conv2d": the text in sf_layer_spec and [[train.layers]]
  std::string_view keras_name;  // "Conv2D": the summary's class name
  std::span<const OptionDef> options;
  // The shape rule of a layer of one input; nullptr for a merge layer (add, concatenate).
  LayerShape (*shape)(const LayerConfig&, const std::vector<uint32_t>& in);  // throws LayerError
  std::string_view doc;
  // A merge layer's shape rule, over its inputs in the order `inputs` names them (two or more).
  LayerShape (*merge)(const LayerConfig&, const std::vector<std::vector<uint32_t>>& in) = nullptr;
  bool takes_many() const { return merge != nullptr; }
};

// ---- text helpers -------------------------------------------------------------------------------
namespace detail {

inline std::string number_text(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

inline bool parse_integer(std::string_view v, int64_t& out) {
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return !v.empty() && ec == std::errc() && end == v.data() + v.size() && out >= INT32_MIN && out <= INT32_MAX;
}

inline std::string shape_text(const std::vector<uint32_t>& s) {
  std::string out = "(None";
  for (uint32_t d : s) out += ", " + std::to_string(d);
  return out + ")";
}

inline bool parse_count(std::string_view v, uint32_t& out) {
  uint64_t n = 0;
  if (v.empty() || v.size() > 10) return false;
  for (char c : v) {
    if (c < '0' || c > '9') return false;
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  if (n == 0 || n > 0x7fffffffULL) return false;
  out = static_cast<uint32_t>(n);
  return true;
}

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// Calls f(name, canonical) for each entry of "a|b|c=a".
template <class F>
void each_choice(std::string_view choices, F&& f) {
  while (!choices.empty()) {
    const size_t bar = choices.find('|');
    const std::string_view entry = choices.substr(0, bar);
    const size_t eq = entry.find('=');
    f(entry.substr(0, eq), eq == std::string_view::npos ? entry : entry.substr(eq + 1));
    choices = bar == std::string_view::npos ? std::string_view{} : choices.substr(bar + 1);
  }
}

// Why `name` cannot name a layer ("" when it can): names appear in messages, summaries and
// `inputs` lists, so they are short, printable and free of the list's comma.
inline std::string name_problem(std::string_view name) {
  if (name.empty()) return "a layer name must not be empty";
  if (name.size() > 128) return "a layer name is at most 128 characters";
  if (name == "input") return "'input' names the model's input; choose another name";
  for (char ch : name)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f || ch == ',' || ch == '\'' || ch == '"')
      return "a layer name may not hold control characters, commas or quotes: '" + std::string(name) + "'";
  return {};
}

inline std::string bound_text(const OptionDef& o) {
  if (std::isinf(o.hi)) return (o.lo_open ? "> " : ">= ") + number_text(o.lo);
  return "in " + std::string(o.lo_open ? "(" : "[") + number_text(o.lo) + ", " + number_text(o.hi) +
         (o.hi_open ? ")" : "]");
}

}  // namespace detail

// What an option accepts, in words: "an integer >= 1", "a number in [0, 1)", "one of ...".
inline std::string expectation(const OptionDef& o) {
  switch (o.kind) {
    case OptionKind::count: return "an integer between 1 and 2147483647";
    case OptionKind::size2: return "an integer between 1 and 2147483647, or a pair like 3,5";
    case OptionKind::real: return "a number " + detail::bound_text(o);
    case OptionKind::boolean: return "true or false";
    case OptionKind::integer: return "an integer";
    case OptionKind::dims: return "a shape like 7,7,16 (one entry may be -1)";
    case OptionKind::choice: {
      std::string list;
      detail::each_choice(o.choices, [&](std::string_view name, std::string_view canonical) {
        if (name == canonical) list += (list.empty() ? "" : ", ") + std::string(name);
      });
      return "one of " + list;
    }
  }
  return "a value";
}

// One option's text checked: its canonical text, or (ok == false) why it is refused.
struct Checked {
  bool ok = false;
  std::string canonical;  // when ok
  std::string error;      // when !ok: "expected ..., got '...'"
  double real = 0;        // real
  Size2 size{};           // count, size2
  bool flag = false;      // boolean
  int64_t integer = 0;    // integer
  std::vector<int64_t> dims;  // dims (-1: the entry the others leave)
};

inline Checked check(const OptionDef& o, std::string_view text) {
  Checked c;
  auto refuse = [&] {
    c.error = "expected " + expectation(o) + ", got '" + std::string(text) + "'";
    return c;
  };
  switch (o.kind) {
    case OptionKind::count: {
      uint32_t n = 0;
      if (!detail::parse_count(text, n)) return refuse();
      c.size = Size2(n);
      break;
    }
    case OptionKind::size2: {
      // "3", "3,5", and Python's spellings "(3, 5)", "[3, 5]", "(3,)".
      std::string_view s = detail::trim(text);
      if (s.size() >= 2 && ((s.front() == '(' && s.back() == ')') || (s.front() == '[' && s.back() == ']')))
        s = s.substr(1, s.size() - 2);
      const size_t comma = s.find(',');
      uint32_t h = 0, w = 0;
      if (comma == std::string_view::npos) {
        if (!detail::parse_count(detail::trim(s), h)) return refuse();
        w = h;
      } else {
        const std::string_view second = detail::trim(s.substr(comma + 1));
        if (!detail::parse_count(detail::trim(s.substr(0, comma)), h)) return refuse();
        if (second.empty())
          w = h;
        else if (!detail::parse_count(second, w))
          return refuse();
      }
      c.size = Size2(h, w);
      break;
    }
    case OptionKind::real: {
      // from_chars: the same text means the same number in every locale (strtod reads "0,5" in
      // a German one).
      double d = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(d)) return refuse();
      if (d < o.lo || (o.lo_open && d == o.lo) || d > o.hi || (o.hi_open && d == o.hi)) return refuse();
      c.real = d;
      break;
    }
    case OptionKind::boolean:
      if (text == "true" || text == "True" || text == "1")
        c.flag = true;
      else if (text == "false" || text == "False" || text == "0")
        c.flag = false;
      else
        return refuse();
      break;
    case OptionKind::integer:
      if (!detail::parse_integer(detail::trim(text), c.integer)) return refuse();
      c.ok = true;
      c.canonical = std::to_string(c.integer);
      return c;
    case OptionKind::dims: {
      // "7,7,16", and Python's spellings "(7, 7, 16)", "[49, 16]", "(784,)".
      std::string_view s = detail::trim(text);
      if (s.size() >= 2 && ((s.front() == '(' && s.back() == ')') || (s.front() == '[' && s.back() == ']')))
        s = s.substr(1, s.size() - 2);
      if (!s.empty() && s.back() == ',') s.remove_suffix(1);
      int wildcards = 0;
      while (true) {
        const size_t comma = s.find(',');
        const std::string_view item = detail::trim(s.substr(0, comma));
        uint32_t n = 0;
        if (item == "-1") {
          if (++wildcards > 1) return refuse();
          c.dims.push_back(-1);
        } else if (detail::parse_count(item, n)) {
          c.dims.push_back(n);
        } else {
          return refuse();
        }
        if (comma == std::string_view::npos) break;
        s = s.substr(comma + 1);
      }
      c.ok = true;
      for (int64_t d : c.dims) c.canonical += (c.canonical.empty() ? "" : ",") + std::to_string(d);
      return c;
    }
    case OptionKind::choice: {
      bool found = false;
      detail::each_choice(o.choices, [&](std::string_view name, std::string_view canonical) {
        if (!found && name == text) c.canonical = std::string(canonical), found = true;
      });
      if (!found) return refuse();
      c.ok = true;
      return c;
    }
  }
  c.ok = true;
  c.canonical = o.kind == OptionKind::real      ? detail::number_text(c.real)
                : o.kind == OptionKind::boolean ? (c.flag ? "true" : "false")
                                                : c.size.text();
  return c;
}

// ---- checked options ------------------------------------------------------------------------------
// Options checked against their definitions, every one present (defaults filled in), each as
// canonical text and typed: what a parsed layer (LayerConfig) and a parsed optimizer
// (optimizer_schema.hpp's OptimizerConfig) hold.
class OptionValues {
 public:
  uint32_t count(std::string_view option) const { return at(option, OptionKind::count).size.h; }
  Size2 size(std::string_view option) const { return at(option, OptionKind::size2).size; }
  double real(std::string_view option) const { return at(option, OptionKind::real).real; }
  bool flag(std::string_view option) const { return at(option, OptionKind::boolean).flag; }
  const std::string& choice(std::string_view option) const { return at(option, OptionKind::choice).canonical; }
  int64_t integer(std::string_view option) const { return at(option, OptionKind::integer).integer; }
  const std::vector<int64_t>& dims(std::string_view option) const { return at(option, OptionKind::dims).dims; }

  // Every option, canonical text, in the schema's order (what a backend receives).
  std::vector<std::pair<std::string, std::string>> options() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (size_t i = 0; i < values_.size(); ++i) out.emplace_back(defs_[i].name, values_[i].canonical);
    return out;
  }

  // How every message names the owner: "layer 3 (conv2d)", "optimizer adam".
  const std::string& where() const { return where_; }

 protected:
  OptionValues(std::span<const OptionDef> defs, std::string where)
      : defs_(defs), values_(defs.size()), where_(std::move(where)) {}

  // Checks (key, text) pairs against the definitions and fills in the defaults; fail(message)
  // throws. Unknown options are errors (a typo like unit=128 must not pass silently), reported
  // after the required ones; `extra(key, text)` takes a key the definitions do not hold first
  // (a layer's `name`) and says whether it did.
  template <class Pairs, class Fail, class Extra>
  void check_all(const Pairs& options, const Fail& fail, const Extra& extra) {
    std::vector<bool> given(defs_.size(), false);
    std::optional<std::string> unknown;
    for (const auto& [key, text] : options) {
      size_t i = 0;
      while (i < defs_.size() && defs_[i].name != key) ++i;
      if (i == defs_.size()) {
        if (!extra(key, text) && !unknown) unknown = key;
        continue;
      }
      Checked v = check(defs_[i], text);
      if (!v.ok) fail("option '" + std::string(key) + "': " + v.error);
      values_[i] = std::move(v);
      given[i] = true;
    }
    for (size_t i = 0; i < defs_.size(); ++i) {
      if (given[i]) continue;
      const OptionDef& o = defs_[i];
      if (o.required()) fail("option '" + std::string(o.name) + "' is required");
      if (o.default_from.empty()) {
        values_[i] = check(o, o.fallback);
        continue;
      }
      size_t j = 0;
      while (j < i && defs_[j].name != o.default_from) ++j;
      if (j == i) throw std::logic_error("schema: " + std::string(o.name) + " defaults to an option that is not before it");
      values_[i] = check(o, values_[j].canonical);
    }
    if (unknown) fail("unknown option '" + *unknown + "'");
  }

 private:
  const Checked& at(std::string_view option, OptionKind kind) const {
    for (size_t i = 0; i < values_.size(); ++i)
      if (defs_[i].name == option && defs_[i].kind == kind) return values_[i];
    // A backend asked for an option its owner does not have: a bug in the backend, not in input.
    throw std::logic_error(where_ + ": the schema has no option '" + std::string(option) + "' of that kind");
  }
  std::span<const OptionDef> defs_;
  std::vector<Checked> values_;  // parallel to defs_
  std::string where_;
};

// ---- a parsed layer -------------------------------------------------------------------------------
class LayerConfig : public OptionValues {
 public:
  LayerConfig(const LayerDef& def, size_t index)
      : OptionValues(def.options, "layer " + std::to_string(index) + " (" + std::string(def.type) + ")"),
        def_(&def),
        index_(index) {}

  const LayerDef& def() const { return *def_; }
  std::string_view type() const { return def_->type; }
  size_t index() const { return index_; }
  const std::string& name() const { return name_; }  // the optional `name` option; "" when absent
  // The optional `inputs` option: the names of the layers (or "input", the model's input) whose
  // outputs this layer takes, in order; empty: the previous layer's (the model's input for the
  // first). Resolved by graph() below.
  const std::vector<std::string>& inputs() const { return inputs_; }

  // Every option, canonical text, in the schema's order, then `name` and `inputs` ("a,b") when given.
  std::vector<std::pair<std::string, std::string>> options() const {
    auto out = OptionValues::options();
    if (!name_.empty()) out.emplace_back("name", name_);
    if (!inputs_.empty()) out.emplace_back("inputs", inputs_text());
    return out;
  }
  std::string inputs_text() const {
    std::string t;
    for (const auto& n : inputs_) t += (t.empty() ? "" : ",") + n;
    return t;
  }

  // How messages name the layer: "layer 3 (conv2d)", "layer 3 (conv2d 'b1_conv1')".
  std::string label() const {
    return name_.empty() ? where() : where().substr(0, where().size() - 1) + " '" + name_ + "')";
  }
  [[noreturn]] void fail(const std::string& message) const { throw LayerError(label() + ": " + message); }

  // The shape rule: output shape, parameter counts, window geometry; refuses a shape the layer
  // cannot take ("expects an input of rank 3 ...", "window 5 is larger than ...").
  LayerShape infer(const std::vector<uint32_t>& in) const {
    if (def_->takes_many()) fail("takes two or more inputs: name them with inputs = [\"a\", \"b\"]");
    check_input(in);
    return checked(def_->shape(*this, in));
  }
  // The same for a layer given several inputs (one-input layers take exactly one).
  LayerShape infer_inputs(const std::vector<std::vector<uint32_t>>& in) const {
    if (!def_->takes_many()) {
      if (in.size() != 1) fail("takes one input, " + std::to_string(in.size()) + " named");
      return infer(in[0]);
    }
    if (in.size() < 2) fail("takes two or more inputs, " + std::to_string(in.size()) + " named");
    for (const auto& s : in) check_input(s);
    return checked(def_->merge(*this, in));
  }

 private:
  friend LayerConfig parse(std::string_view, const std::vector<std::pair<std::string, std::string>>&, size_t);
  void check_input(const std::vector<uint32_t>& in) const {
    for (uint32_t d : in)
      if (d == 0) fail("input shape " + detail::shape_text(in) + " is empty");
    if (in.empty()) fail("needs an input");
  }
  LayerShape checked(LayerShape s) const {
    for (uint32_t d : s.output)
      if (d == 0) fail("output shape " + detail::shape_text(s.output) + " is empty");
    uint64_t sum = 0;
    for (uint64_t w : s.weights) sum += w;
    if (sum != s.trainable) throw std::logic_error(label() + ": the schema's weights do not add up to its parameters");
    return s;
  }
  const LayerDef* def_;
  size_t index_;
  std::string name_;
  std::vector<std::string> inputs_;
};

// ---- shape rules ------------------------------------------------------------------------------------
namespace detail {

inline void need_rank(const LayerConfig& c, const std::vector<uint32_t>& in, size_t rank, const char* form) {
  if (in.size() != rank)
    c.fail("expects an input of rank " + std::to_string(rank) + " " + form + ", got " + shape_text(in));
}

// One spatial axis of a window (convolution or pooling), TensorFlow's rules.
inline Window window(const LayerConfig& c, uint32_t in, uint32_t k, uint32_t stride, bool same, const char* axis) {
  Window w;
  if (same) {
    w.out = (in + stride - 1) / stride;
    const int64_t total = int64_t{w.out - 1} * stride + k - in;
    w.pad = static_cast<uint32_t>(std::max<int64_t>(total, 0) / 2);
  } else {
    if (k > in)
      c.fail("window " + std::to_string(k) + " is larger than the input's " + axis + " " + std::to_string(in) +
             " with padding 'valid'");
    w.out = (in - k) / stride + 1;
  }
  return w;
}

inline uint64_t bias(const LayerConfig& c, uint64_t units) { return c.flag("use_bias") ? units : 0; }

inline LayerShape same_shape(const LayerConfig&, const std::vector<uint32_t>& in) { return LayerShape{in}; }

inline LayerShape dense_shape(const LayerConfig& c, const std::vector<uint32_t>& in) {
  LayerShape s{in};
  const uint32_t units = c.count("units");
  s.output.back() = units;
  s.weights = {uint64_t{in.back()} * units};
  if (c.flag("use_bias")) s.weights.push_back(units);
  s.trainable = uint64_t{in.back()} * units + bias(c, units);
  return s;
}

// A window of `size_option` moved by `strides` over (height, width, channels): conv2d and
// max_pooling2d. Fills rows/cols and the output's spatial size, `channels` deep.
inline LayerShape windowed(const LayerConfig& c, const std::vector<uint32_t>& in, const char* size_option,
                           uint32_t channels) {
  need_rank(c, in, 3, "(height, width, channels)");
  const Size2 k = c.size(size_option), st = c.size("strides");
  const bool same = c.choice("padding") == "same";
  LayerShape s;
  s.rows = window(c, in[0], k.h, st.h, same, "height");
  s.cols = window(c, in[1], k.w, st.w, same, "width");
  s.output = {s.rows.out, s.cols.out, channels};
  return s;
}

inline LayerShape conv2d_shape(const LayerConfig& c, const std::vector<uint32_t>& in) {
  const uint32_t filters = c.count("filters");
  LayerShape s = windowed(c, in, "kernel_size", filters);
  const Size2 k = c.size("kernel_size");
  s.weights = {uint64_t{k.h} * k.w * in[2] * filters};
  if (c.flag("use_bias")) s.weights.push_back(filters);
  s.trainable = uint64_t{k.h} * k.w * in[2] * filters + bias(c, filters);
  return s;
}

inline LayerShape max_pooling2d_shape(const LayerConfig& c, const std::vector<uint32_t>& in) {
  return windowed(c, in, "pool_size", in.size() == 3 ? in[2] : 0);
}

inline LayerShape global_average_pooling2d_shape(const LayerConfig& c, const std::vector<uint32_t>& in) {
  need_rank(c, in, 3, "(height, width, channels)");
  return LayerShape{{in[2]}};
}

inline LayerShape average_pooling2d_shape(const LayerConfig& c, const std::vector<uint32_t>& in) {
  return windowed(c, in, "pool_size", in.size() == 3 ? in[2] : 0);
}

inline LayerShape global_average_pooling1d_shape(const LayerConfig& c, const std::vector<uint32_t>& in) {
  need_rank(c, in, 2, "(steps, features)");
  return LayerShape{{in[1]}};
}

inline uint64_t product(const std::vector<uint32_t>& s) {
  uint64_t n = 1;
  for (uint32_t d : s) n *= d;
  return n;
}

// Keras' Reshape: the same elements in a new shape; one -1 entry takes what the others leave.
inline LayerShape reshape_shape(const LayerConfig& c, const std::vector<uint32_t>& in) {
  const uint64_t total = product(in);
  uint64_t known = 1;  // the product of the given entries, never above total (no wrap-around)
  for (int64_t d : c.dims("target_shape")) {
    if (d < 0) continue;
    if (known > total / static_cast<uint64_t>(d))
      c.fail("target_shape holds more values than the input " + shape_text(in) + " (" + std::to_string(total) + ")");
    known *= static_cast<uint64_t>(d);
  }
  LayerShape s;
  for (int64_t d : c.dims("target_shape")) {
    if (d >= 0) {
      s.output.push_back(static_cast<uint32_t>(d));
      continue;
    }
    if (total % known != 0)
      c.fail("cannot reshape " + shape_text(in) + " (" + std::to_string(total) + " values) with a -1 entry: " +
             std::to_string(total) + " is not a multiple of " + std::to_string(known));
    s.output.push_back(static_cast<uint32_t>(total / known));
  }
  if (product(s.output) != total)
    c.fail("target_shape " + shape_text(s.output) + " holds " + std::to_string(product(s.output)) +
           " values, the input " + shape_text(in) + " holds " + std::to_string(total));
  return s;
}

inline LayerShape layer_normalization_shape(const LayerConfig& c, const std::vector<uint32_t>& in) {
  LayerShape s{in};
  const uint64_t features = in.back();
  if (c.flag("scale")) s.weights.push_back(features);
  if (c.flag("center")) s.weights.push_back(features);
  s.trainable = (c.flag("scale") ? features : 0) + (c.flag("center") ? features : 0);
  return s;
}

// Self-attention over (sequence, features): Keras' MultiHeadAttention(query=x, value=x). Its
// weights in Keras' order: query kernel (features, heads, key_dim) and bias (heads, key_dim),
// key kernel and bias (the same shapes), value kernel (features, heads, value_dim) and bias
// (heads, value_dim), output kernel (heads, value_dim, features) and bias (features).
inline LayerShape multi_head_attention_shape(const LayerConfig& c, const std::vector<uint32_t>& in) {
  need_rank(c, in, 2, "(sequence, features)");
  const uint64_t d = in[1], h = c.count("num_heads"), kd = c.count("key_dim"), vd = c.count("value_dim");
  const bool b = c.flag("use_bias");
  LayerShape s{in};
  auto add = [&](uint64_t kernel, uint64_t bias_size) {
    s.weights.push_back(kernel);
    if (b) s.weights.push_back(bias_size);
  };
  add(d * h * kd, h * kd);
  add(d * h * kd, h * kd);
  add(d * h * vd, h * vd);
  add(h * vd * d, d);
  for (uint64_t w : s.weights) s.trainable += w;
  return s;
}

// Keras' Embedding: each input value (an integer in [0, input_dim), carried as a float) becomes
// its row of the (input_dim, output_dim) table.
inline LayerShape embedding_shape(const LayerConfig& c, const std::vector<uint32_t>& in) {
  LayerShape s{in};
  s.output.push_back(c.count("output_dim"));
  s.weights = {uint64_t{c.count("input_dim")} * c.count("output_dim")};
  s.trainable = s.weights[0];
  return s;
}

// keras_hub's PositionEmbedding: a learned (sequence_length, features) table whose first
// `sequence` rows are the output, the same for every sample (the input gives only the shape;
// add it to the input with an `add` layer).
inline LayerShape position_embedding_shape(const LayerConfig& c, const std::vector<uint32_t>& in) {
  need_rank(c, in, 2, "(sequence, features)");
  const uint32_t length = c.count("sequence_length");
  if (in[0] > length)
    c.fail("the input's sequence " + std::to_string(in[0]) + " is longer than sequence_length " + std::to_string(length));
  LayerShape s{in};
  s.weights = {uint64_t{length} * in[1]};
  s.trainable = s.weights[0];
  return s;
}

// add: inputs of one shape, summed.
inline LayerShape add_shape(const LayerConfig& c, const std::vector<std::vector<uint32_t>>& in) {
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i] != in[0])
      c.fail("inputs must have one shape: input 1 is " + shape_text(in[0]) + ", input " + std::to_string(i + 1) +
             " is " + shape_text(in[i]));
  return LayerShape{in[0]};
}

// concatenate along `axis` (Keras counts the batch axis as 0: -1 and rank are the last axis);
// every other axis must agree.
inline LayerShape concatenate_shape(const LayerConfig& c, const std::vector<std::vector<uint32_t>>& in) {
  const int64_t rank = static_cast<int64_t>(in[0].size());
  int64_t axis = c.integer("axis");
  if (axis < 0) axis += rank + 1;
  if (axis < 1 || axis > rank)
    c.fail("axis " + std::to_string(c.integer("axis")) + " is outside the inputs' axes (1 to " + std::to_string(rank) +
           ", or -1 to -" + std::to_string(rank) + "; 0 is the batch)");
  const size_t a = static_cast<size_t>(axis - 1);
  LayerShape s{in[0]};
  for (size_t i = 1; i < in.size(); ++i) {
    bool agree = in[i].size() == in[0].size();
    for (size_t j = 0; agree && j < in[0].size(); ++j) agree = j == a || in[i][j] == in[0][j];
    if (!agree)
      c.fail("input " + std::to_string(i + 1) + " " + shape_text(in[i]) + " does not match input 1 " +
             shape_text(in[0]) + " on every axis but " + std::to_string(c.integer("axis")));
    if (uint64_t{s.output[a]} + in[i][a] > 0x7fffffffULL)
      c.fail("the joined axis would hold more than 2147483647 values");
    s.output[a] += in[i][a];
  }
  return s;
}

inline LayerShape flatten_shape(const LayerConfig&, const std::vector<uint32_t>& in) {
  uint64_t n = 1;
  for (uint32_t d : in) n *= d;
  return LayerShape{{static_cast<uint32_t>(n)}};
}

inline LayerShape batch_normalization_shape(const LayerConfig& c, const std::vector<uint32_t>& in) {
  LayerShape s{in};
  const uint64_t channels = in.back();
  s.trainable = (c.flag("center") ? channels : 0) + (c.flag("scale") ? channels : 0);
  if (c.flag("scale")) s.weights.push_back(channels);
  if (c.flag("center")) s.weights.push_back(channels);
  s.non_trainable = 2 * channels;  // moving mean and variance
  return s;
}

// ---- the options -------------------------------------------------------------------------------------
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::string_view kActivations = "linear|relu|softmax|gelu|tanh|sigmoid|none=linear";
constexpr std::string_view kPaddings = "valid|same";

constexpr OptionDef use_bias{"use_bias", OptionKind::boolean, "true", {}, 0, 0, false, false, {}, "add a bias vector"};
constexpr OptionDef activation{"activation", OptionKind::choice, "linear", {}, 0, 0, false, false, kActivations,
                               "applied to the output (none = linear)"};
constexpr OptionDef padding{"padding", OptionKind::choice, "valid", {}, 0, 0, false, false, kPaddings,
                            "'same' pads like TensorFlow (the extra row/column at the bottom/right)"};

inline constexpr OptionDef kDense[] = {
    {"units", OptionKind::count, {}, {}, 0, 0, false, false, {}, "output features (last axis)"},
    activation,
    use_bias,
};
inline constexpr OptionDef kConv2D[] = {
    {"filters", OptionKind::count, {}, {}, 0, 0, false, false, {}, "output channels"},
    {"kernel_size", OptionKind::size2, {}, {}, 0, 0, false, false, {}, "window, 3 or 3,5"},
    {"strides", OptionKind::size2, "1", {}, 0, 0, false, false, {}, "step of the window"},
    padding,
    use_bias,
    activation,
};
inline constexpr OptionDef kBatchNormalization[] = {
    {"momentum", OptionKind::real, "0.99", {}, 0, 1, false, false, {}, "moving = moving*momentum + batch*(1-momentum)"},
    {"epsilon", OptionKind::real, "0.001", {}, 0, kInf, true, false, {}, "added to the variance"},
    {"center", OptionKind::boolean, "true", {}, 0, 0, false, false, {}, "learn an offset (beta)"},
    {"scale", OptionKind::boolean, "true", {}, 0, 0, false, false, {}, "learn a scale (gamma)"},
    {"synchronized", OptionKind::boolean, "false", {}, 0, 0, false, false, {},
     "statistics over the global batch of every replica (data parallel)"},
};
inline constexpr OptionDef kLayerNormalization[] = {
    {"epsilon", OptionKind::real, "0.001", {}, 0, kInf, true, false, {}, "added to the variance"},
    {"center", OptionKind::boolean, "true", {}, 0, 0, false, false, {}, "learn an offset (beta)"},
    {"scale", OptionKind::boolean, "true", {}, 0, 0, false, false, {}, "learn a scale (gamma)"},
};
inline constexpr OptionDef kMultiHeadAttention[] = {
    {"num_heads", OptionKind::count, {}, {}, 0, 0, false, false, {}, "attention heads"},
    {"key_dim", OptionKind::count, {}, {}, 0, 0, false, false, {}, "size of each head's query and key"},
    {"value_dim", OptionKind::count, {}, "key_dim", 0, 0, false, false, {}, "size of each head's value (default: key_dim)"},
    {"dropout", OptionKind::real, "0", {}, 0, 1, false, true, {}, "dropout on the attention weights, training only"},
    use_bias,
};
inline constexpr OptionDef kEmbedding[] = {
    {"input_dim", OptionKind::count, {}, {}, 0, 0, false, false, {}, "vocabulary size: inputs are integers in [0, input_dim)"},
    {"output_dim", OptionKind::count, {}, {}, 0, 0, false, false, {}, "size of each embedding vector"},
};
inline constexpr OptionDef kPositionEmbedding[] = {
    {"sequence_length", OptionKind::count, {}, {}, 0, 0, false, false, {}, "longest sequence the table covers"},
};
inline constexpr OptionDef kReshape[] = {
    {"target_shape", OptionKind::dims, {}, {}, 0, 0, false, false, {}, "one sample's new shape, e.g. 49,16 (one -1 allowed)"},
};
inline constexpr OptionDef kConcatenate[] = {
    {"axis", OptionKind::integer, "-1", {}, 0, 0, false, false, {}, "the axis joined (-1: the last; 0 is the batch)"},
};
inline constexpr OptionDef kGelu[] = {
    {"approximate", OptionKind::boolean, "false", {}, 0, 0, false, false, {}, "the tanh approximation instead of erf"},
};
inline constexpr OptionDef kDropout[] = {
    {"rate", OptionKind::real, {}, {}, 0, 1, false, true, {}, "fraction of inputs zeroed in training"},
};
inline constexpr OptionDef kMaxPooling2D[] = {
    {"pool_size", OptionKind::size2, "2", {}, 0, 0, false, false, {}, "window, 2 or 2,3"},
    {"strides", OptionKind::size2, {}, "pool_size", 0, 0, false, false, {}, "step of the window (default: pool_size)"},
    padding,
};

}  // namespace detail

// ---- the catalogue --------------------------------------------------------------------------------------
// The name a layer's `inputs` gives the model's input.
inline constexpr std::string_view kModelInputName = "input";
inline std::span<const LayerDef> catalogue() {
  using namespace detail;
  static constexpr LayerDef defs[] = {
      {"dense", "Dense", kDense, dense_shape, "fully connected on the last axis (a rank-3 input is a batch of rows)"},
      {"conv2d", "Conv2D", kConv2D, conv2d_shape, "2-D convolution over (height, width, channels)"},
      {"batch_normalization", "BatchNormalization", kBatchNormalization, batch_normalization_shape,
       "normalises the last axis"},
      {"relu", "ReLU", {}, same_shape, "max(x, 0)"},
      {"softmax", "Softmax", {}, same_shape, "softmax over the last axis"},
      {"dropout", "Dropout", kDropout, same_shape, "inverted dropout, training only"},
      {"flatten", "Flatten", {}, flatten_shape, "one axis"},
      {"global_average_pooling2d", "GlobalAveragePooling2D", {}, global_average_pooling2d_shape,
       "(height, width, channels) -> (channels)"},
      {"max_pooling2d", "MaxPooling2D", kMaxPooling2D, max_pooling2d_shape, "maximum over each window"},
      {"average_pooling2d", "AveragePooling2D", kMaxPooling2D, average_pooling2d_shape,
       "mean over each window (with 'same', of the window's positions inside the input)"},
      {"global_average_pooling1d", "GlobalAveragePooling1D", {}, global_average_pooling1d_shape,
       "(steps, features) -> (features)"},
      {"reshape", "Reshape", kReshape, reshape_shape, "the same values in another shape"},
      {"layer_normalization", "LayerNormalization", kLayerNormalization, layer_normalization_shape,
       "normalises each sample's last axis"},
      {"multi_head_attention", "MultiHeadAttention", kMultiHeadAttention, multi_head_attention_shape,
       "self-attention over (sequence, features)"},
      {"embedding", "Embedding", kEmbedding, embedding_shape, "integer indices -> learned vectors"},
      {"position_embedding", "PositionEmbedding", kPositionEmbedding, position_embedding_shape,
       "a learned vector per position (keras_hub): add it to its input"},
      {"gelu", "Activation", kGelu, same_shape, "x * Phi(x), Keras' gelu"},
      {"tanh", "Activation", {}, same_shape, "tanh(x)"},
      {"sigmoid", "Activation", {}, same_shape, "1 / (1 + exp(-x))"},
      {"add", "Add", {}, nullptr, "sums inputs of one shape", add_shape},
      {"concatenate", "Concatenate", kConcatenate, nullptr, "joins inputs along an axis", concatenate_shape},
  };
  return defs;
}

inline const LayerDef* find(std::string_view type) {
  for (const LayerDef& d : catalogue())
    if (d.type == type) return &d;
  return nullptr;
}

// What every backend checks of a whole model besides its layers (LayerConfig::infer checks
// those): an input shape with no zero dimension, at least one layer, the one loss there is
// ("" means it). Throws LayerError.
inline void check_model(const std::vector<uint32_t>& input_shape, size_t layers, std::string_view loss) {
  bool empty = input_shape.empty();
  for (uint32_t d : input_shape) empty = empty || d == 0;
  if (empty) throw LayerError("model input_shape " + detail::shape_text(input_shape) + " is empty or has a zero dimension");
  if (layers == 0) throw LayerError("the model has no layers");
  if (!loss.empty() && loss != "sparse_categorical_crossentropy")
    throw LayerError("unknown loss '" + std::string(loss) + "' (known: sparse_categorical_crossentropy, from logits)");
}

// The classes of a model whose last layer (index `last`, of `type`) outputs `output`: it must be
// (classes,) for sparse_categorical_crossentropy. Throws LayerError naming the layer.
inline uint32_t classes_of(const std::vector<uint32_t>& output, size_t last, std::string_view type) {
  if (output.size() != 1)
    throw LayerError("layer " + std::to_string(last) + " (" + std::string(type) + "): the model's output " +
                     detail::shape_text(output) +
                     " must be (classes,) for sparse_categorical_crossentropy; add flatten or global_average_pooling2d");
  return output[0];
}

// The first item where two ';'-separated texts (spec or architecture texts) differ: its index
// and the two items ("<none>" past a text's end); nothing when they are equal.
struct ItemDifference {
  size_t index = 0;
  std::string first, second;
};
inline std::optional<ItemDifference> first_difference(std::string_view a, std::string_view b) {
  auto items = [](std::string_view s) {
    std::vector<std::string_view> v;
    for (size_t start = 0; start <= s.size();) {
      const size_t p = std::min(s.find(';', start), s.size());
      v.push_back(s.substr(start, p - start));
      start = p + 1;
    }
    return v;
  };
  const auto x = items(a), y = items(b);
  for (size_t i = 0; i < std::max(x.size(), y.size()); ++i) {
    const std::string_view p = i < x.size() ? x[i] : "<none>", q = i < y.size() ? y[i] : "<none>";
    if (p != q) return ItemDifference{i, std::string(p), std::string(q)};
  }
  return std::nullopt;
}

inline std::vector<std::string> type_names() {
  std::vector<std::string> out;
  for (const LayerDef& d : catalogue()) out.emplace_back(d.type);
  return out;
}

// An option's definition in a LayerDef (or optimizer_schema.hpp's OptimizerDef); nullptr when absent.
template <class Def>
const OptionDef* find_option(const Def& def, std::string_view name) {
  for (const OptionDef& o : def.options)
    if (o.name == name) return &o;
  return nullptr;
}

// Checks a layer's text options against the schema and fills in the defaults. `index` names the
// layer in messages. Unknown options are errors; `name` and `inputs` ("a,b") are accepted on
// every layer.
inline LayerConfig parse(std::string_view type, const std::vector<std::pair<std::string, std::string>>& options,
                         size_t index) {
  const LayerDef* def = find(type);
  if (!def) {
    std::string known;
    for (const auto& n : type_names()) known += (known.empty() ? "" : ", ") + n;
    throw LayerError("layer " + std::to_string(index) + " (" + std::string(type) + "): unknown layer type '" +
                     std::string(type) + "' (known: " + known + ")");
  }
  LayerConfig c(*def, index);
  c.check_all(
      options, [&](const std::string& message) { c.fail(message); },
      [&](const std::string& key, const std::string& text) {
        if (key == "name") {
          if (const std::string why = detail::name_problem(text); !why.empty()) c.fail("option 'name': " + why);
          c.name_ = text;
          return true;
        }
        if (key != "inputs") return false;
        c.inputs_.clear();
        for (size_t start = 0; start <= text.size();) {
          const size_t comma = std::min(text.find(',', start), text.size());
          const std::string item(detail::trim(std::string_view(text).substr(start, comma - start)));
          if (item != kModelInputName)
            if (const std::string why = detail::name_problem(item); !why.empty()) c.fail("option 'inputs': " + why);
          c.inputs_.push_back(item);
          start = comma + 1;
        }
        return true;
      });
  return c;
}

// ---- the model graph ------------------------------------------------------------------------------
// Layers in the order they are listed, each taking the outputs its `inputs` name (another
// layer's `name`, or "input": the model's input), else the previous layer's (the first: the
// model's input), so a list without names is the Sequential model it always was. The last layer
// listed is the model's output; every other layer must feed some layer. Layers run in a
// topological order: the listing order wherever it is one (a layer may name one listed later).
struct Graph {
  static constexpr size_t kInput = SIZE_MAX;  // "the model's input" among a layer's inputs
  std::vector<std::vector<size_t>> inputs;    // per layer (listing index): producers, in order
  std::vector<std::vector<size_t>> consumers; // per layer: the layers taking its output (with repeats)
  std::vector<size_t> order;                  // listing indices in the order the layers run
  std::vector<std::vector<std::vector<uint32_t>>> in_shapes;  // per layer, per input
  std::vector<LayerShape> shapes;             // per layer
  size_t output = 0;                          // the last layer listed

  // Every layer takes the previous one, in listing order: the Sequential models of old.
  bool sequential() const {
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].size() != 1 || inputs[i][0] != (i == 0 ? kInput : i - 1)) return false;
    return true;
  }
  // Where layer `i` runs in `order`.
  size_t position(size_t i) const { return static_cast<size_t>(std::find(order.begin(), order.end(), i) - order.begin()); }
};

// Resolves names, orders the layers and infers every shape. Throws LayerError naming the layer:
// an unknown or repeated name, a cycle, an unused layer, shapes that do not fit.
inline Graph graph(const std::vector<uint32_t>& input_shape, const std::vector<LayerConfig>& layers) {
  Graph g;
  const size_t n = layers.size();
  g.inputs.resize(n);
  g.consumers.resize(n);
  g.in_shapes.resize(n);
  g.shapes.resize(n);
  if (n == 0) return g;
  g.output = n - 1;
  for (size_t i = 0; i < n; ++i) {
    if (layers[i].name().empty()) continue;
    for (size_t j = 0; j < i; ++j)
      if (layers[j].name() == layers[i].name())
        layers[i].fail("the name '" + layers[i].name() + "' is also " + layers[j].label() + "'s");
  }
  for (size_t i = 0; i < n; ++i) {
    const LayerConfig& l = layers[i];
    if (l.inputs().empty()) {
      g.inputs[i] = {i == 0 ? Graph::kInput : i - 1};
      continue;
    }
    for (const std::string& name : l.inputs()) {
      if (name == kModelInputName) {
        g.inputs[i].push_back(Graph::kInput);
        continue;
      }
      size_t j = 0;
      while (j < n && layers[j].name() != name) ++j;
      if (j == n) {
        std::string known;
        for (const LayerConfig& k : layers)
          if (!k.name().empty()) known += (known.empty() ? "" : ", ") + k.name();
        l.fail("input '" + name + "' names no layer (named layers: " + (known.empty() ? "none" : known) +
               "; the model's input is '" + std::string(kModelInputName) + "')");
      }
      if (j == i) l.fail("names itself as its input");
      g.inputs[i].push_back(j);
    }
  }
  for (size_t i = 0; i < n; ++i)
    for (size_t j : g.inputs[i])
      if (j != Graph::kInput) g.consumers[j].push_back(i);
  for (size_t i = 0; i + 1 < n; ++i)
    if (g.consumers[i].empty())
      layers[i].fail("its output feeds no layer and it is not the model's output (the last layer listed); name it in "
                     "a later layer's inputs or remove it");
  // Kahn's algorithm, always taking the lowest listing index ready: the listing order when it is
  // a topological one.
  std::vector<size_t> waiting(n, 0);
  for (size_t i = 0; i < n; ++i)
    for (size_t j : g.inputs[i]) waiting[i] += j != Graph::kInput;
  std::vector<bool> done(n, false);
  for (size_t step = 0; step < n; ++step) {
    size_t next = n;
    for (size_t i = 0; i < n && next == n; ++i)
      if (!done[i] && waiting[i] == 0) next = i;
    if (next == n) {
      std::string cycle;
      for (size_t i = 0; i < n; ++i)
        if (!done[i]) cycle += (cycle.empty() ? "" : ", ") + layers[i].label();
      layers[static_cast<size_t>(std::find(done.begin(), done.end(), false) - done.begin())].fail(
          "the inputs form a cycle among " + cycle);
    }
    done[next] = true;
    g.order.push_back(next);
    for (size_t c : g.consumers[next]) --waiting[c];
  }
  for (size_t i : g.order) {
    for (size_t j : g.inputs[i]) g.in_shapes[i].push_back(j == Graph::kInput ? input_shape : g.shapes[j].output);
    g.shapes[i] = layers[i].infer_inputs(g.in_shapes[i]);
  }
  return g;
}

// The text two engines compare to know they hold the same model (skyforge/engine_state.hpp):
// the input shape, then per layer its type, input and output shapes and every option in
// canonical form (a layer's `name` aside: renaming changes no model), then the optimizer:
//   input(None, 28, 28, 1);flatten(None, 28, 28, 1)->(None, 784);dense(None, 784)->(None, 128)/units=128/...;adam
// A model graph adds, after a layer's type, where its inputs come from by their positions in
// the run order ("<0,3", "in" for the model's input); a Sequential model's text has none.
inline std::string architecture_text(const std::vector<uint32_t>& input, const std::vector<LayerConfig>& layers,
                                     std::string_view optimizer) {
  std::string t = "input" + detail::shape_text(input);
  const Graph g = graph(input, layers);
  const bool sequential = g.sequential();
  for (size_t i : g.order) {
    const LayerConfig& c = layers[i];
    t += ";" + std::string(c.type());
    if (!sequential) {
      t += "<";
      for (size_t k = 0; k < g.inputs[i].size(); ++k)
        t += (k ? "," : "") + (g.inputs[i][k] == Graph::kInput ? std::string("in") : std::to_string(g.position(g.inputs[i][k])));
    }
    for (const auto& s : g.in_shapes[i]) t += detail::shape_text(s);
    t += "->" + detail::shape_text(g.shapes[i].output);
    for (const auto& [key, value] : c.options())
      if (key != "name" && key != "inputs") t += "/" + key + "=" + value;
  }
  return t + ";" + std::string(optimizer);
}

}  // namespace skyforge::schema
