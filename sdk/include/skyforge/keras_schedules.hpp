// skyforge/keras_schedules.hpp — the Keras-style API's learning-rate schedules
// (keras.optimizers.schedules: CosineDecay, ExponentialDecay, PiecewiseConstantDecay) and what
// every optimizer of keras.hpp shares with them: a learning_rate that is a number or a schedule,
// and the options text of both and of clipnorm / global_clipnorm (optimizer_schema.hpp's keys).
//
//   K::AdamW opt{.learning_rate = K::CosineDecay{.initial_learning_rate = 0, .decay_steps = 1000,
//                                                .warmup_target = 1e-3, .warmup_steps = 100},
//                .global_clipnorm = 1.0};
//
// Keras' argument names and defaults; the optimizer schema checks the values at compile().
#pragma once

#include <skyforge/keras_callbacks.hpp>
#include <skyforge/optimizer_schema.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace skyforge::keras {

struct CosineDecay {
  double initial_learning_rate = 0;
  double decay_steps = 0;
  double alpha = 0;
  std::optional<double> warmup_target{};  // none: no warmup (Keras' None)
  double warmup_steps = 0;
};
struct ExponentialDecay {
  double initial_learning_rate = 0;
  double decay_steps = 0;
  double decay_rate = 0;
  bool staircase = false;
};
struct PiecewiseConstantDecay {
  std::vector<int64_t> boundaries;
  std::vector<double> values;  // one more than boundaries
};
using LearningRateSchedule = std::variant<CosineDecay, ExponentialDecay, PiecewiseConstantDecay>;

// An optimizer's learning_rate, as Keras takes it: a number or a schedule.
class LearningRate {
 public:
  LearningRate(double value) : value_(value) {}  // NOLINT: implicit, K::SGD{0.1}
  LearningRate(CosineDecay s) : schedule_(std::move(s)) {}  // NOLINT
  LearningRate(ExponentialDecay s) : schedule_(std::move(s)) {}  // NOLINT
  LearningRate(PiecewiseConstantDecay s) : schedule_(std::move(s)) {}  // NOLINT
  const std::optional<LearningRateSchedule>& schedule() const { return schedule_; }
  double value() const { return value_; }  // without a schedule
  friend bool operator==(const LearningRate& a, double b) { return !a.schedule_ && a.value_ == b; }

  // The optimizer options of this learning rate: learning_rate, or learning_rate_schedule and
  // its arguments (optimizer_schema.hpp).
  std::vector<std::pair<std::string, std::string>> options() const {
    auto num = [](double v) { return format_double(v); };
    if (!schedule_) return {{"learning_rate", num(value_)}};
    std::vector<std::pair<std::string, std::string>> out;
    auto put = [&](std::string_view k, std::string v) { out.emplace_back(schema::schedule_key(k), std::move(v)); };
    if (const auto* c = std::get_if<CosineDecay>(&*schedule_)) {
      out.emplace_back(schema::kScheduleOption, "cosine_decay");
      put("initial_learning_rate", num(c->initial_learning_rate));
      put("decay_steps", num(c->decay_steps));
      put("alpha", num(c->alpha));
      if (c->warmup_target) put("warmup_target", num(*c->warmup_target));
      put("warmup_steps", num(c->warmup_steps));
    } else if (const auto* e = std::get_if<ExponentialDecay>(&*schedule_)) {
      out.emplace_back(schema::kScheduleOption, "exponential_decay");
      put("initial_learning_rate", num(e->initial_learning_rate));
      put("decay_steps", num(e->decay_steps));
      put("decay_rate", num(e->decay_rate));
      put("staircase", e->staircase ? "true" : "false");
    } else {
      const auto& p = std::get<PiecewiseConstantDecay>(*schedule_);
      std::string b, v;
      for (int64_t x : p.boundaries) b += (b.empty() ? "" : ",") + std::to_string(x);
      for (double x : p.values) v += (v.empty() ? "" : ",") + num(x);
      out.emplace_back(schema::kScheduleOption, "piecewise_constant_decay");
      put("boundaries", b);
      put("values", v);
    }
    return out;
  }

  // The learning rate an optimizer config holds (its learning_rate, or its schedule): what the
  // train app builds its optimizer from.
  static LearningRate of(const schema::OptimizerConfig& c) {
    if (!c.schedule()) return c.real("learning_rate");
    const schema::ScheduleConfig& s = *c.schedule();
    if (s.name() == "piecewise_constant_decay") return PiecewiseConstantDecay{s.boundaries(), s.values()};
    if (s.name() == "exponential_decay")
      return ExponentialDecay{s.real("initial_learning_rate"), s.real("decay_steps"), s.real("decay_rate"), s.flag("staircase")};
    return CosineDecay{s.real("initial_learning_rate"), s.real("decay_steps"), s.real("alpha"), s.real("warmup_target"),
                       s.real("warmup_steps")};
  }

 private:
  double value_ = 0;
  std::optional<LearningRateSchedule> schedule_;
};

namespace detail {
// An optimizer's learning rate in front of its own options, then the clipping norms it sets
// (a norm left at 0 stays out: the options of an optimizer without clipping are as before).
template <class O>
std::vector<std::pair<std::string, std::string>> common_options(const O& o,
                                                                std::vector<std::pair<std::string, std::string>> own) {
  std::vector<std::pair<std::string, std::string>> out = o.learning_rate.options();
  out.insert(out.end(), own.begin(), own.end());
  if (o.clipnorm != 0) out.emplace_back("clipnorm", format_double(o.clipnorm));
  if (o.global_clipnorm != 0) out.emplace_back("global_clipnorm", format_double(o.global_clipnorm));
  return out;
}
}  // namespace detail

}  // namespace skyforge::keras
