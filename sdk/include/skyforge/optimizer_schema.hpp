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
// Header-only, C++20, no dependency beyond the standard library. Errors are OptimizerError (a
// std::invalid_argument), messages like
// "optimizer adam: option 'beta_1': expected a number in [0, 1), got '1'".
#pragma once

#include "layer_schema.hpp"

#include <span>
#include <string>
#include <string_view>

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

inline constexpr OptionDef kAdam[] = {
    learning_rate("0.001"),
    {"beta_1", OptionKind::real, "0.9", {}, 0, 1, false, true, {}, "decay of the first moment"},
    {"beta_2", OptionKind::real, "0.999", {}, 0, 1, false, true, {}, "decay of the second moment"},
    {"epsilon", OptionKind::real, "1e-07", {}, 0, kInf, true, false, {}, "added to the second moment's root"},
};
inline constexpr OptionDef kAdamW[] = {
    kAdam[0], kAdam[1], kAdam[2], kAdam[3],
    {"weight_decay", OptionKind::real, "0.004", {}, 0, kInf, false, false, {}, "decoupled decay: p -= p * weight_decay * lr before the Adam step"},
};
inline constexpr OptionDef kSgd[] = {
    learning_rate("0.01"),
    {"momentum", OptionKind::real, "0", {}, 0, 1, false, false, {}, "velocity = momentum * velocity - lr * g"},
    {"nesterov", OptionKind::boolean, "false", {}, 0, 0, false, false, {}, "Nesterov momentum"},
};
inline constexpr OptionDef kRmsprop[] = {
    learning_rate("0.001"),
    {"rho", OptionKind::real, "0.9", {}, 0, 1, false, false, {}, "decay of the mean square: v = rho * v + (1 - rho) * g^2"},
    {"momentum", OptionKind::real, "0", {}, 0, 1, false, false, {}, "m = momentum * m + lr * g / sqrt(v + epsilon); p -= m"},
    {"epsilon", OptionKind::real, "1e-07", {}, 0, kInf, true, false, {}, "added to the mean square under the root"},
    {"centered", OptionKind::boolean, "false", {}, 0, 0, false, false, {}, "divide by the variance (v - mean(g)^2), not v"},
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

// A parsed optimizer: its definition and every option, typed and as canonical text.
class OptimizerConfig : public OptionValues {
 public:
  explicit OptimizerConfig(const OptimizerDef& def) : OptionValues(def.options, "optimizer " + std::string(def.name)), def_(&def) {}
  const OptimizerDef& def() const { return *def_; }
  std::string_view name() const { return def_->name; }
  [[noreturn]] void fail(const std::string& message) const { throw OptimizerError(where() + ": " + message); }

 private:
  template <class Pairs>
  friend OptimizerConfig parse_optimizer(std::string_view, const Pairs&);
  const OptimizerDef* def_;
};

// Checks an optimizer's text options (any range of (key, text) pairs) against the schema and
// fills in Keras' defaults. An empty name is kDefaultOptimizer. An unknown optimizer, an option it
// does not have or a value outside its range is refused, naming the optimizer and the option.
template <class Pairs>
OptimizerConfig parse_optimizer(std::string_view name, const Pairs& options) {
  if (name.empty()) name = kDefaultOptimizer;
  const OptimizerDef* def = find_optimizer(name);
  if (!def) throw OptimizerError("unknown optimizer '" + std::string(name) + "' (known: " + optimizer_names() + ")");
  OptimizerConfig c(*def);
  c.check_all(options, [&](const std::string& message) { c.fail(message); }, [](const auto&, const auto&) { return false; });
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
