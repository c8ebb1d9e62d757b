// The cpu backend's optimizers: the [train] optimizer's options checked against the optimizer
// schema (skyforge/optimizer_schema.hpp) and Keras' update rules over the flat parameter buffer.
#include "cpu_ops.hpp"

#include <skyforge/kernels/optimizer.hpp>
#include <skyforge/optimizer_schema.hpp>

#include <cmath>

namespace skyforge::cpu {

namespace {
[[noreturn]] void invalid(const std::string& m) { throw Error(m, SF_ERR_INVALID); }
}  // namespace

namespace gk = skyforge::kernels;

OptimizerConfig parse_optimizer(const std::string& name, const Options& o) {
  try {
    const schema::OptimizerConfig s = schema::parse_optimizer(name, o.all());
    OptimizerConfig c;
    c.name = std::string(s.name());
    c.learning_rate = s.real("learning_rate");
    if (c.name == "sgd") {
      c.momentum = s.real("momentum");
      c.nesterov = s.flag("nesterov");
    } else if (c.name == "rmsprop") {
      c.rho = s.real("rho");
      c.momentum = s.real("momentum");
      c.epsilon = s.real("epsilon");
      c.centered = s.flag("centered");
    } else {
      c.beta_1 = s.real("beta_1");
      c.beta_2 = s.real("beta_2");
      c.epsilon = s.real("epsilon");
      if (c.name == "adamw") c.weight_decay = s.real("weight_decay");
    }
    return c;
  } catch (const schema::OptimizerError& e) {
    invalid(e.what());
  }
}

Optimizer::Optimizer(OptimizerConfig cfg, size_t n) : cfg_(std::move(cfg)), n_(n) {
  slots_.assign(schema::slots_per_parameter(cfg_.name, cfg_.momentum, cfg_.centered) * n, 0.f);
}

void Optimizer::apply(float* p, const float* g, float scale, uint64_t iteration, const Exec& ex) {
  const size_t n = n_;
  const float lr = static_cast<float>(cfg_.learning_rate);
  if (cfg_.name == "sgd") {
    if (slots_.empty()) {
      k::for_range(n, ex, [&](size_t b, size_t e) {
#pragma omp simd
        for (size_t i = b; i < e; ++i) p[i] -= lr * (g[i] * scale);
      });
      return;
    }
    // Keras: m = momentum * m - lr * g; p += nesterov ? momentum * m - lr * g : m
    const float mom = static_cast<float>(cfg_.momentum);
    float* m = slots_.data();
    if (cfg_.nesterov) {
      k::for_range(n, ex, [&](size_t b, size_t e) {
#pragma omp simd
        for (size_t i = b; i < e; ++i) {
          const float gi = g[i] * scale;
          m[i] = m[i] * mom - lr * gi;
          p[i] += m[i] * mom - lr * gi;
        }
      });
    } else {
      k::for_range(n, ex, [&](size_t b, size_t e) {
#pragma omp simd
        for (size_t i = b; i < e; ++i) {
          m[i] = m[i] * mom - lr * (g[i] * scale);
          p[i] += m[i];
        }
      });
    }
    return;
  }
  if (cfg_.name == "rmsprop") {
    // The kernels' rule (skyforge/kernels/optimizer.hpp), the cuda engine's: slots as
    // schema::slots_per_parameter lays them out (mean square, [momentum], [mean gradient]).
    const gk::RmspropRule rule{lr, static_cast<float>(cfg_.rho), static_cast<float>(1.0 - cfg_.rho),
                               static_cast<float>(cfg_.momentum), static_cast<float>(cfg_.epsilon), scale,
                               cfg_.centered};
    float* ms = slots_.data();
    float* mom = cfg_.momentum > 0 ? ms + n : nullptr;
    float* avg = cfg_.centered ? ms + (mom ? 2 : 1) * n : nullptr;
    k::for_range(n, ex, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) rule(p[i], g[i], ms + i, mom ? mom + i : nullptr, avg ? avg + i : nullptr);
    });
    return;
  }
  if (cfg_.weight_decay != 0.0) {  // AdamW: Keras decays the parameters before the Adam step
    const float wd = static_cast<float>(cfg_.weight_decay);
    k::for_range(n, ex, [&](size_t b, size_t e) {
#pragma omp simd
      for (size_t i = b; i < e; ++i) gk::decoupled_decay(p[i], wd, lr);
    });
  }
  // Keras Adam: t = iterations + 1; alpha = lr * sqrt(1 - b2^t) / (1 - b1^t);
  // m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2); p -= alpha * m / (sqrt(v) + eps)
  const double t = static_cast<double>(iteration + 1);
  const float alpha = static_cast<float>(cfg_.learning_rate * std::sqrt(1.0 - std::pow(cfg_.beta_2, t)) /
                                         (1.0 - std::pow(cfg_.beta_1, t)));
  const float b1c = static_cast<float>(1.0 - cfg_.beta_1), b2c = static_cast<float>(1.0 - cfg_.beta_2);
  const float eps = static_cast<float>(cfg_.epsilon);
  float* m = slots_.data();
  float* v = slots_.data() + n;
  if (const simd::Kernels* sk = simd::kernels()) {
    k::for_range(n, ex, [&](size_t b, size_t e) { sk->adam(e - b, p + b, g + b, m + b, v + b, scale, b1c, b2c, alpha, eps); });
    return;
  }
  k::for_range(n, ex, [&](size_t b, size_t e) {
#pragma omp simd
    for (size_t i = b; i < e; ++i) {
      const float gi = g[i] * scale;
      m[i] += (gi - m[i]) * b1c;
      v[i] += (gi * gi - v[i]) * b2c;
      p[i] -= alpha * m[i] / (std::sqrt(v[i]) + eps);
    }
  });
}

}  // namespace skyforge::cpu
