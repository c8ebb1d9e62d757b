// The cpu engine's optimizers against Keras 3's own (keras_optimizers.py, the project's .venv with
// the jax backend): a few steps of each optimizer of the schema, with its Keras options, clipping
// and schedules, on the same weights and gradients, agree to ~1e-6; the schedules' rates
// (skyforge/lr_schedule.hpp) agree with Keras' at many steps. Skips, saying why, where the venv has
// no Keras.
#include "helpers.hpp"

#include <skyforge/lr_schedule_of.hpp>
#include <skyforge/optimizer_schema.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace skyforge::cpu;

namespace {

constexpr int kSteps = 4;
constexpr size_t kN = 8;  // the script's two variables, 3 + 5 weights

struct Case {
  const char* optimizer;
  std::vector<std::pair<std::string, std::string>> options;  // Keras' argument names and values
  std::string schedule = {};  // a learning_rate_schedule type, with its arguments
  std::vector<std::pair<std::string, std::string>> schedule_args = {};
};

const std::vector<Case> kCases = {
    {"adam", {{"learning_rate", "0.1"}}},
    {"adamw", {{"learning_rate", "0.1"}}},  // Keras' weight_decay default, 0.004
    {"adamw", {{"learning_rate", "0.05"}, {"weight_decay", "0.1"}, {"beta_1", "0.8"}}},
    {"sgd", {{"learning_rate", "0.1"}, {"momentum", "0.9"}, {"nesterov", "true"}}},
    {"rmsprop", {{"learning_rate", "0.01"}}},
    {"rmsprop", {{"learning_rate", "0.01"}, {"rho", "0.8"}, {"momentum", "0.9"}}},
    {"rmsprop", {{"learning_rate", "0.01"}, {"centered", "true"}}},
    {"rmsprop", {{"learning_rate", "0.01"}, {"momentum", "0.5"}, {"centered", "true"}, {"epsilon", "0.001"}}},
};

std::string shell_quote(const std::string& s) { return "'" + s + "'"; }

// The script's output for `args`, one row of numbers a line; empty with `why` set when it cannot
// run or gives other than `rows` rows.
std::vector<std::vector<double>> run_keras(const std::string& args, size_t rows_expected, std::string& why) {
  const std::string py = VENV_PYTHON;
  if (!std::filesystem::exists(py)) {
    why = "no " + py + " (.ci/setup-venv makes it)";
    return {};
  }
  const std::string cmd = "KERAS_BACKEND=jax " + py + " " + KERAS_OPTIMIZERS_PY + " " + args + " 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  char buf[4096];
  while (pipe && std::fgets(buf, sizeof buf, pipe.get())) out += buf;
  std::vector<std::vector<double>> rows;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    rows.emplace_back();
    for (double x; in >> x;) rows.back().push_back(x);
  }
  if (rows.size() != rows_expected) why = py + " cannot run Keras (" + cmd + ")";
  return rows;
}

// "CosineDecay initial_learning_rate=0.1,decay_steps=8" from schema-style schedule arguments; a
// list's commas become the script's ";".
using Args = std::vector<std::pair<std::string, std::string>>;
std::string keras_schedule(const std::string& type, const Args& args) {
  std::string out = std::string(skyforge::schema::find_schedule(type)->keras_name) + " ";
  for (auto [k, v] : args) {
    std::replace(v.begin(), v.end(), ',', ';');
    out += k + "=" + v + ",";
  }
  return out;
}

// Keras' weights after kSteps for every case, one row each.
std::vector<std::vector<double>> keras_weights(const std::vector<Case>& cases, std::string& why) {
  std::string args = std::to_string(kSteps);
  for (const Case& c : cases) {
    std::string arg = std::string(skyforge::schema::find_optimizer(c.optimizer)->keras_name) + " ";
    for (const auto& [k, v] : c.options) arg += k + "=" + v + ",";
    if (!c.schedule.empty()) arg += "|" + keras_schedule(c.schedule, c.schedule_args);
    args += " " + shell_quote(arg);
  }
  return run_keras(args, cases.size(), why);
}

// kSteps of every case on the script's problem, compared with Keras' weights.
void expect_keras_weights(const std::vector<Case>& cases) {
  std::string why;
  const auto want = keras_weights(cases, why);
  if (!why.empty()) GTEST_SKIP() << why;
  for (size_t c = 0; c < cases.size(); ++c) {
    std::vector<std::pair<std::string, std::string>> options = cases[c].options;
    if (!cases[c].schedule.empty()) {
      options.emplace_back("learning_rate_schedule", cases[c].schedule);
      for (const auto& [k, v] : cases[c].schedule_args) options.emplace_back("learning_rate_schedule." + k, v);
    }
    std::vector<sf_kv> kv;
    for (const auto& [k, v] : options) kv.push_back({k.c_str(), v.c_str()});
    Optimizer o(parse_optimizer(cases[c].optimizer, skyforge::Options(kv.data(), kv.size())), std::vector<size_t>{3, 5});
    std::vector<float> p(kN), g(kN);
    for (size_t i = 0; i < kN; ++i) p[i] = static_cast<float>(std::sin(i + 1.0));
    for (int t = 0; t < kSteps; ++t) {
      // The script's gradient, as a sum over 4 samples that the scale turns back into the mean.
      for (size_t i = 0; i < kN; ++i) g[i] = 4.f * static_cast<float>(std::cos(3.0 * i + t) * (t + 1) / 2);
      o.apply(p.data(), g.data(), 0.25f, static_cast<uint64_t>(t), Exec{1});
    }
    ASSERT_EQ(want[c].size(), kN);
    // Keras computes Adam's bias correction in float32, where 1 - beta_2 = 1 - 0.999f is off by
    // 1.3e-5 relative: its alpha is ~6e-6 relative off the exact one skyforge computes in double,
    // ~2e-6 after 4 steps of lr 0.1. Every other rule agrees to float rounding.
    const double tol = std::string(cases[c].optimizer).starts_with("adam") ? 4e-6 : 1e-6;
    for (size_t i = 0; i < kN; ++i)
      EXPECT_NEAR(p[i], want[c][i], tol * (1 + std::abs(want[c][i])))
          << cases[c].optimizer << " case " << c << " weight " << i;
  }
}

}  // namespace

TEST(KerasOptimizers, FewStepsMatchKerasItself) { expect_keras_weights(kCases); }

// Clipping on the script's two variables (their norms differ: clipnorm clips each alone) and
// schedules, with and without clipping, against Keras' optimizers built with them.
TEST(KerasOptimizers, ClippingAndSchedulesMatchKerasItself) {
  const Args cosine = {{"initial_learning_rate", "0.05"}, {"decay_steps", "3"}, {"warmup_target", "0.1"}, {"warmup_steps", "2"}};
  expect_keras_weights({
      {"sgd", {{"learning_rate", "0.1"}, {"clipnorm", "1.5"}}},
      {"sgd", {{"learning_rate", "0.1"}, {"momentum", "0.9"}, {"global_clipnorm", "1"}}},
      {"adam", {{"learning_rate", "0.1"}, {"clipnorm", "0.5"}}},
      {"adamw", {{"global_clipnorm", "0.7"}}, "cosine_decay", cosine},
      {"rmsprop", {{"clipnorm", "2"}}, "exponential_decay", {{"initial_learning_rate", "0.02"}, {"decay_steps", "2"}, {"decay_rate", "0.5"}}},
      {"sgd", {}, "piecewise_constant_decay", {{"boundaries", "1,2"}, {"values", "0.1,0.05,0.01"}}},
      {"adam", {}, "cosine_decay", {{"initial_learning_rate", "0.1"}, {"decay_steps", "3"}, {"alpha", "0.2"}}},
  });
}

// The schedules' rates at many steps (warmup, the decay, the end) against Keras' own float32
// rates: the same operations in the same order, so the same bits but for cosf/powf, which may
// round a last bit differently from XLA's.
TEST(KerasOptimizers, ScheduleRatesMatchKerasItself) {
  constexpr int kRates = 400;
  const std::vector<std::pair<std::string, Args>> schedules = {
      {"cosine_decay", {{"initial_learning_rate", "0.1"}, {"decay_steps", "250"}}},
      {"cosine_decay", {{"initial_learning_rate", "0.001"}, {"decay_steps", "300"}, {"alpha", "0.1"}}},
      {"cosine_decay", {{"initial_learning_rate", "0"}, {"decay_steps", "200"}, {"warmup_target", "0.003"}, {"warmup_steps", "50"}}},
      {"cosine_decay", {{"initial_learning_rate", "0.01"}, {"decay_steps", "7.5"}, {"alpha", "0.3"}, {"warmup_target", "0.1"}, {"warmup_steps", "333"}}},
      {"exponential_decay", {{"initial_learning_rate", "0.1"}, {"decay_steps", "30"}, {"decay_rate", "0.96"}}},
      {"exponential_decay", {{"initial_learning_rate", "0.5"}, {"decay_steps", "17"}, {"decay_rate", "0.7"}, {"staircase", "true"}}},
      {"piecewise_constant_decay", {{"boundaries", "0,100,101,250"}, {"values", "1,0.5,0.25,0.1,0.001"}}},
  };
  std::string args = "--rates " + std::to_string(kRates);
  for (const auto& [type, a] : schedules) args += " " + shell_quote(keras_schedule(type, a));
  std::string why;
  const auto want = run_keras(args, schedules.size(), why);
  if (!why.empty()) GTEST_SKIP() << why;
  int exact = 0, total = 0;
  for (size_t c = 0; c < schedules.size(); ++c) {
    Args options = {{"learning_rate_schedule", schedules[c].first}};
    for (const auto& [k, v] : schedules[c].second) options.emplace_back("learning_rate_schedule." + k, v);
    const skyforge::LrSchedule s = skyforge::schedule_of(skyforge::schema::parse_optimizer("sgd", options));
    ASSERT_EQ(want[c].size(), static_cast<size_t>(kRates));
    const float peak = static_cast<float>(*std::max_element(want[c].begin(), want[c].end()));
    for (int t = 0; t < kRates; ++t) {
      const float got = skyforge::learning_rate(s, static_cast<uint64_t>(t));
      const float keras = static_cast<float>(want[c][t]);
      exact += got == keras;
      ++total;
      // libm's cosf/powf and XLA's may round a last bit differently: a few float roundings of the
      // rate, or near the cosine's end, where 1 + cos(pi x) cancels, 2 of cos's (of the peak rate).
      EXPECT_LE(std::abs(got - keras), std::max(std::abs(keras) * 5e-7f, peak * 1.2e-7f))
          << schedules[c].first << " #" << c << " step " << t;
    }
  }
  // Most rates are Keras' bits exactly.
  RecordProperty("exact", exact);
  EXPECT_GE(exact, total * 3 / 4) << exact << " of " << total << " rates bit-identical to Keras'";
  std::printf("%d of %d rates bit-identical to Keras' (jit-compiled, jax on this CPU)\n", exact, total);
}
