// skyforge/optimizer_schema.hpp — THE optimizer schema: every optimizer, its options with Keras'
// defaults and Keras' ranges, in one table (docs/compute-backends.md, "Optimizers", is its prose).
//
// Everything that handles optimizers reads it: the manifest's [train] table (host), the built-in
// train app, the Keras-style API (keras.hpp: SGD{}, Adam{}, AdamW{} and RMSprop{} take their defaults from here) and
// every compute backend (cpu, cuda, the template's). Adding an optimizer is one OptimizerDef here
// plus each backend's update rule.
//
// Options cross the plugin ABI as text (abi.h, sf_model_spec.optimizer_options), in the layer
// schema's canonical form (layer_schema.hpp: OptionDef, check()). parse_optimizer() turns a name
// and its text options into an OptimizerConfig, every option present, defaults filled in.
//
// Every optimizer also takes Keras' clipnorm and global_clipnorm (0: off; not both), and a
// learning-rate schedule in place of its learning_rate: the option learning_rate_schedule names
// the schedule (schedules(): Keras' CosineDecay, ExponentialDecay, PiecewiseConstantDecay), its
// arguments follow as learning_rate_schedule.<argument> (Keras' names; lists comma-separated),
// the keys [train.learning_rate_schedule] writes. skyforge/lr_schedule.hpp holds the formula.
//
// Header-only, C++20, no dependency beyond the standard library. Errors are OptimizerError (a
// std::invalid_argument), messages like
// "optimizer adam: option 'beta_1': expected a number in [0, 1), got '1'".
#pragma once

#include "layer_schema.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace skyforge::schema {

class OptimizerError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct OptimizerDef {
  std::string_view name;        // "adam": sf_model_spec.optimizer, [train] optimizer
  std::string_view keras_name;  // "Adam"
  std::span<const OptionDef> options;
  std::string_view doc;
};

// The optimizer an empty name means (Keras' compile() has none; skyforge's is Adam's).
inline constexpr std::string_view kDefaultOptimizer = "adam";

namespace detail {

constexpr OptionDef learning_rate(std::string_view fallback) {
  return {"learning_rate", OptionKind::real, fallback, {}, 0, kInf, true, false, {}, "step size"};
}
// Keras' gradient clipping, every optimizer's last two options; applied to the mean gradient
// before the update.
inline constexpr OptionDef kClipnorm{"clipnorm", OptionKind::real, "0", {}, 0, kInf, false, false, {},
                                     "each variable's gradient g becomes g * clipnorm / max(|g|, clipnorm); 0: off"};
inline constexpr OptionDef kGlobalClipnorm{"global_clipnorm", OptionKind::real, "0", {}, 0, kInf, false, false, {},
                                           "every gradient scaled by global_clipnorm / max(|all gradients|, global_clipnorm); 0: off"};

inline constexpr OptionDef kAdam[] = {
    learning_rate("0.001"),
    {"beta_1", OptionKind::real, "0.9", {}, 0, 1, false, true, {}, "decay of the first moment"},
    {"beta_2", OptionKind::real, "0.999", {}, 0, 1, false, true, {}, "decay of the second moment"},
    {"epsilon", OptionKind::real, "1e-07", {}, 0, kInf, true, false, {}, "added to the second moment's root"},
    kClipnorm, kGlobalClipnorm,
};
inline constexpr OptionDef kAdamW[] = {
    kAdam[0], kAdam[1], kAdam[2], kAdam[3],
    {"weight_decay", OptionKind::real, "0.004", {}, 0, kInf, false, false, {}, "decoupled decay: p -= p * weight_decay * lr before the Adam step"},
    kClipnorm, kGlobalClipnorm,
};
inline constexpr OptionDef kSgd[] = {
    learning_rate("0.01"),
    {"momentum", OptionKind::real, "0", {}, 0, 1, false, false, {}, "velocity = momentum * velocity - lr * g"},
    {"nesterov", OptionKind::boolean, "false", {}, 0, 0, false, false, {}, "Nesterov momentum"},
    kClipnorm, kGlobalClipnorm,
};
inline constexpr OptionDef kRmsprop[] = {
    learning_rate("0.001"),
    {"rho", OptionKind::real, "0.9", {}, 0, 1, false, false, {}, "decay of the mean square: v = rho * v + (1 - rho) * g^2"},
    {"momentum", OptionKind::real, "0", {}, 0, 1, false, false, {}, "m = momentum * m + lr * g / sqrt(v + epsilon); p -= m"},
    {"epsilon", OptionKind::real, "1e-07", {}, 0, kInf, true, false, {}, "added to the mean square under the root"},
    {"centered", OptionKind::boolean, "false", {}, 0, 0, false, false, {}, "divide by the variance (v - mean(g)^2), not v"},
    kClipnorm, kGlobalClipnorm,
};

// The schedules' arguments (piecewise_constant_decay's lists are not options of these kinds:
// ScheduleConfig reads them).
constexpr OptionDef initial_learning_rate() {
  return {"initial_learning_rate", OptionKind::real, {}, {}, 0, kInf, false, false, {}, "the rate at step 0"};
}
constexpr OptionDef decay_steps() {
  return {"decay_steps", OptionKind::real, {}, {}, 0, kInf, true, false, {}, "steps of the decay"};
}
inline constexpr OptionDef kCosineDecay[] = {
    initial_learning_rate(),
    decay_steps(),
    {"alpha", OptionKind::real, "0", {}, 0, 1, false, false, {}, "the last rate, as a fraction of the decay's first"},
    {"warmup_target", OptionKind::real, {}, "initial_learning_rate", 0, kInf, false, false, {}, "the rate the warmup ends at and the decay starts from"},
    {"warmup_steps", OptionKind::real, "0", {}, 0, kInf, false, false, {}, "steps of linear warmup before the decay (needs warmup_target)"},
};
inline constexpr OptionDef kExponentialDecay[] = {
    initial_learning_rate(),
    decay_steps(),
    {"decay_rate", OptionKind::real, {}, {}, 0, kInf, true, false, {}, "rate = initial_learning_rate * decay_rate ^ (step / decay_steps)"},
    {"staircase", OptionKind::boolean, "false", {}, 0, 0, false, false, {}, "step / decay_steps rounded down"},
};

}  // namespace detail

inline std::span<const OptimizerDef> optimizers() {
  static constexpr OptimizerDef defs[] = {
      {"adam", "Adam", detail::kAdam, "Adam (Kingma and Ba), Keras' bias correction"},
      {"adamw", "AdamW", detail::kAdamW, "Adam with decoupled weight decay (Loshchilov and Hutter), as Keras applies it"},
      {"sgd", "SGD", detail::kSgd, "gradient descent, with momentum and Nesterov's variant"},
      {"rmsprop", "RMSprop", detail::kRmsprop, "RMSprop (Hinton), Keras' rule: optional momentum and centering"},
  };
  return defs;
}

inline const OptimizerDef* find_optimizer(std::string_view name) {
  for (const OptimizerDef& d : optimizers())
    if (d.name == name) return &d;
  return nullptr;
}

// "adam, adamw, sgd, rmsprop": for messages.
inline std::string optimizer_names() {
  std::string out;
  for (const OptimizerDef& d : optimizers()) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

// ---- learning-rate schedules ----------------------------------------------------------------------
struct ScheduleDef {
  std::string_view name;        // "cosine_decay": [train.learning_rate_schedule] type
  std::string_view keras_name;  // "CosineDecay"
  std::span<const OptionDef> options;
  bool lists;  // piecewise_constant_decay: boundaries and values, comma-separated
  std::string_view doc;
};

// The option naming the schedule, and the prefix of its arguments' keys.
inline constexpr std::string_view kScheduleOption = "learning_rate_schedule";
inline std::string schedule_key(std::string_view argument) { return std::string(kScheduleOption) + "." + std::string(argument); }

// piecewise_constant_decay's boundaries, at most (lr_schedule.hpp's kMaxScheduleBoundaries).
inline constexpr size_t kMaxBoundaries = 32;

inline std::span<const ScheduleDef> schedules() {
  static constexpr ScheduleDef defs[] = {
      {"cosine_decay", "CosineDecay", detail::kCosineDecay, false,
       "half a cosine from the start rate to alpha times it over decay_steps, after an optional linear warmup"},
      {"exponential_decay", "ExponentialDecay", detail::kExponentialDecay, false,
       "initial_learning_rate * decay_rate ^ (step / decay_steps)"},
      {"piecewise_constant_decay", "PiecewiseConstantDecay", {}, true,
       "values[i] between boundaries[i - 1] (exclusive) and boundaries[i] (inclusive)"},
  };
  return defs;
}

inline const ScheduleDef* find_schedule(std::string_view name) {
  for (const ScheduleDef& d : schedules())
    if (d.name == name) return &d;
  return nullptr;
}

inline std::string schedule_names() {
  std::string out;
  for (const ScheduleDef& d : schedules()) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

// A parsed schedule: its arguments, typed and as canonical text.
class ScheduleConfig : public OptionValues {
 public:
  explicit ScheduleConfig(const ScheduleDef& def)
      : OptionValues(def.options, std::string(kScheduleOption) + " " + std::string(def.name)), def_(&def) {}
  const ScheduleDef& def() const { return *def_; }
  std::string_view name() const { return def_->name; }
  // piecewise_constant_decay: boundaries (integers >= 0, increasing) and one value more.
  const std::vector<int64_t>& boundaries() const { return boundaries_; }
  const std::vector<double>& values() const { return values_; }
  // Every argument as (key, canonical text): the text options an optimizer receives.
  std::vector<std::pair<std::string, std::string>> options() const {
    std::vector<std::pair<std::string, std::string>> out = {{std::string(kScheduleOption), std::string(name())}};
    for (const auto& [k, v] : OptionValues::options()) out.emplace_back(schedule_key(k), v);
    if (def_->lists) {
      std::string b, v;
      for (int64_t x : boundaries_) b += (b.empty() ? "" : ",") + std::to_string(x);
      for (double x : values_) v += (v.empty() ? "" : ",") + detail::number_text(x);
      out.emplace_back(schedule_key("boundaries"), b);
      out.emplace_back(schedule_key("values"), v);
    }
    return out;
  }
  [[noreturn]] void fail(const std::string& message) const { throw OptimizerError(where() + ": " + message); }

 private:
  template <class Pairs>
  friend ScheduleConfig parse_schedule(std::string_view, const Pairs&);
  // A comma-separated list of numbers ("" when none), or nullopt.
  static std::optional<std::vector<double>> numbers(std::string_view text) {
    std::vector<double> out;
    for (size_t b = 0; b <= text.size() && !text.empty();) {
      const size_t e = std::min(text.find(',', b), text.size());
      double d = 0;
      const auto r = std::from_chars(text.data() + b, text.data() + e, d);
      if (b == e || r.ec != std::errc() || r.ptr != text.data() + e || !std::isfinite(d)) return std::nullopt;
      out.push_back(d);
      b = e + 1;
    }
    return out;
  }
  const ScheduleDef* def_;
  std::vector<int64_t> boundaries_;
  std::vector<double> values_;
};

// Checks a schedule's arguments ((argument, text) pairs, no prefix) as Keras' constructor would,
// and a little more: warmup_steps without warmup_target (Keras ignores them) and
// piecewise_constant_decay's boundaries out of order are refused.
template <class Pairs>
ScheduleConfig parse_schedule(std::string_view name, const Pairs& arguments) {
  const ScheduleDef* def = find_schedule(name);
  if (!def) throw OptimizerError(std::string(kScheduleOption) + ": unknown schedule '" + std::string(name) + "' (known: " + schedule_names() + ")");
  ScheduleConfig c(*def);
  std::optional<std::string> boundaries, values;
  c.check_all(arguments, [&](const std::string& message) { c.fail(message); }, [&](const auto& key, const auto& text) {
    if (def->lists && key == "boundaries") boundaries = std::string(text);
    else if (def->lists && key == "values") values = std::string(text);
    else return false;
    return true;
  });
  bool warmup_target = false;
  for (const auto& [key, text] : arguments) warmup_target = warmup_target || std::string_view(key) == "warmup_target";
  if (find_option(*def, "warmup_steps") && c.real("warmup_steps") > 0 && !warmup_target)
    c.fail("warmup_steps needs warmup_target (the rate the warmup ends at)");
  if (!def->lists) return c;
  if (!boundaries || !values) c.fail("needs boundaries and values (one value more than boundaries)");
  const auto b = ScheduleConfig::numbers(*boundaries);
  const auto v = ScheduleConfig::numbers(*values);
  if (!b || b->empty()) c.fail("boundaries: expected steps (integers >= 0) separated by commas, got '" + *boundaries + "'");
  if (!v) c.fail("values: expected numbers separated by commas, got '" + *values + "'");
  if (b->size() > kMaxBoundaries) c.fail("boundaries: at most " + std::to_string(kMaxBoundaries) + ", got " + std::to_string(b->size()));
  for (size_t i = 0; i < b->size(); ++i) {
    const double x = (*b)[i];
    if (x < 0 || x != std::floor(x) || x > 9.0e15)
      c.fail("boundaries: expected steps (integers >= 0), got " + detail::number_text(x));
    if (i && x <= (*b)[i - 1]) c.fail("boundaries: expected increasing steps, got " + *boundaries);
    c.boundaries_.push_back(static_cast<int64_t>(x));
  }
  if (v->size() != b->size() + 1)
    c.fail("values: expected one more than boundaries (" + std::to_string(b->size() + 1) + "), got " + std::to_string(v->size()));
  for (double x : *v)
    if (x < 0) c.fail("values: expected rates >= 0, got " + detail::number_text(x));
  c.values_ = *v;
  return c;
}

// A parsed optimizer: its definition and every option, typed and as canonical text, and its
// learning-rate schedule when it has one.
class OptimizerConfig : public OptionValues {
 public:
  explicit OptimizerConfig(const OptimizerDef& def) : OptionValues(def.options, "optimizer " + std::string(def.name)), def_(&def) {}
  const OptimizerDef& def() const { return *def_; }
  std::string_view name() const { return def_->name; }
  // The schedule that replaces learning_rate, if any.
  const std::optional<ScheduleConfig>& schedule() const { return schedule_; }
  [[noreturn]] void fail(const std::string& message) const { throw OptimizerError(where() + ": " + message); }

 private:
  template <class Pairs>
  friend OptimizerConfig parse_optimizer(std::string_view, const Pairs&);
  const OptimizerDef* def_;
  std::optional<ScheduleConfig> schedule_;
};

// Checks an optimizer's text options (any range of (key, text) pairs) against the schema and
// fills in Keras' defaults. An empty name is kDefaultOptimizer. An unknown optimizer, an option it
// does not have or a value outside its range is refused, naming the optimizer and the option;
// so are clipnorm and global_clipnorm together, and learning_rate beside a schedule.
template <class Pairs>
OptimizerConfig parse_optimizer(std::string_view name, const Pairs& options) {
  if (name.empty()) name = kDefaultOptimizer;
  const OptimizerDef* def = find_optimizer(name);
  if (!def) throw OptimizerError("unknown optimizer '" + std::string(name) + "' (known: " + optimizer_names() + ")");
  OptimizerConfig c(*def);
  std::optional<std::string> schedule;
  std::vector<std::pair<std::string, std::string>> arguments;
  bool learning_rate = false;
  const std::string prefix = schedule_key("");
  c.check_all(options, [&](const std::string& message) { c.fail(message); }, [&](const auto& key, const auto& text) {
    const std::string_view k(key);
    if (k == kScheduleOption) schedule = std::string(text);
    else if (k.starts_with(prefix)) arguments.emplace_back(k.substr(prefix.size()), text);
    else return false;
    return true;
  });
  for (const auto& [key, text] : options) learning_rate = learning_rate || std::string_view(key) == "learning_rate";
  if (schedule) {
    if (learning_rate) c.fail("learning_rate and learning_rate_schedule: give one (the schedule is the learning rate)");
    try {
      c.schedule_ = parse_schedule(*schedule, arguments);
    } catch (const OptimizerError& e) {
      c.fail(e.what());
    }
  } else if (!arguments.empty()) {
    c.fail("option '" + prefix + arguments.front().first + "' without learning_rate_schedule (its type)");
  }
  if (c.real("clipnorm") > 0 && c.real("global_clipnorm") > 0)
    c.fail("clipnorm and global_clipnorm: give one (Keras takes one of them)");
  return c;
}

// Per-parameter slots the optimizer keeps, in the order every backend lays them out (and a
// state carries them): adam, adamw: m, v; sgd: velocity when momentum > 0; rmsprop: velocity,
// then momentum when momentum > 0, then the mean gradient when centered (Keras' order).
inline unsigned slots_per_parameter(std::string_view optimizer, double momentum, bool centered) {
  if (optimizer == "adam" || optimizer == "adamw") return 2u;
  if (optimizer == "sgd") return momentum > 0 ? 1u : 0u;
  return 1u + (momentum > 0 ? 1u : 0u) + (centered ? 1u : 0u);
}
inline unsigned slots_per_parameter(const OptimizerConfig& c) {
  const bool has_momentum = find_option(c.def(), "momentum") != nullptr;
  return slots_per_parameter(c.name(), has_momentum ? c.real("momentum") : 0.0, c.name() == "rmsprop" && c.flag("centered"));
}

// An option's default, typed: keras.hpp's optimizers. Throws std::logic_error for an
// optimizer or option the schema does not have.
inline double default_real(std::string_view optimizer, std::string_view option) {
  const OptimizerDef* def = find_optimizer(optimizer);
  const OptionDef* o = def ? find_option(*def, option) : nullptr;
  if (!o || o->kind != OptionKind::real)
    throw std::logic_error("optimizer schema: no number option '" + std::string(option) + "' of " + std::string(optimizer));
  return check(*o, o->fallback).real;
}

}  // namespace skyforge::schema
