// The cpu backend's optimizers: the [train] optimizer's options checked against the optimizer
// schema (skyforge/optimizer_schema.hpp), Keras' gradient clipping and update rules over the flat
// parameter buffer, at the learning rate of the schedule (skyforge/lr_schedule.hpp).
#include "cpu_ops.hpp"

#include <skyforge/kernels/clip.hpp>
#include <skyforge/kernels/optimizer.hpp>
#include <skyforge/lr_schedule_of.hpp>
#include <skyforge/optimizer_schema.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

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
    c.schedule = schedule_of(s);
    c.clipnorm = s.real("clipnorm");
    c.global_clipnorm = s.real("global_clipnorm");
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

Optimizer::Optimizer(OptimizerConfig cfg, std::vector<size_t> variables)
    : cfg_(std::move(cfg)), variables_(std::move(variables)), n_(std::accumulate(variables_.begin(), variables_.end(), size_t{0})) {
  slots_.assign(schema::slots_per_parameter(cfg_.name, cfg_.momentum, cfg_.centered) * n_, 0.f);
}

namespace {
// Sum of x[i]^2 over [0, n) in double as the kernels sum a clipped variable (clip.hpp): blocks
// of kClipBlock in order, each summed in order, so the bits are the same for every thread count
// (replicas with different cores stay identical) and the cuda engine's.
double sum_squares(const float* x, size_t n, const Exec& ex) {
  constexpr size_t kBlock = gk::kClipBlock;
  std::vector<double> part((n + kBlock - 1) / kBlock, 0.0);
  k::for_range(part.size(), ex, [&](size_t b, size_t e) {
    for (size_t j = b; j < e; ++j) part[j] = gk::block_sum_squares(x + j * kBlock, std::min(n - j * kBlock, kBlock));
  });
  return std::accumulate(part.begin(), part.end(), 0.0);
}
}  // namespace

// Keras' _clip_gradients on the mean gradient, in float as Keras computes it (the norms in double):
// clipnorm: g = g * clipnorm / max(|g|, clipnorm) per variable; global_clipnorm:
// g = g * (global_clipnorm * min(1 / |all|, 1 / global_clipnorm)) (clip.hpp's factors).
void Optimizer::clip(float* g, float scale, const Exec& ex) const {
  k::for_range(n_, ex, [&](size_t b, size_t e) {
#pragma omp simd
    for (size_t i = b; i < e; ++i) g[i] *= scale;
  });
  std::vector<double> squares;
  for (size_t v = 0, at = 0; v < variables_.size(); at += variables_[v++]) squares.push_back(sum_squares(g + at, variables_[v], ex));
  if (cfg_.clipnorm > 0) {
    const float c = static_cast<float>(cfg_.clipnorm);
    for (size_t v = 0, at = 0; v < variables_.size(); at += variables_[v++]) {
      const float over = gk::clipnorm_bound(squares[v], c);
      float* gv = g + at;
      k::for_range(variables_[v], ex, [&](size_t b, size_t e) {
#pragma omp simd
        for (size_t i = b; i < e; ++i) gv[i] = gv[i] * c / over;
      });
    }
    return;
  }
  const float s = gk::global_clip_scale(std::accumulate(squares.begin(), squares.end(), 0.0), cfg_.global_clipnorm);
  k::for_range(n_, ex, [&](size_t b, size_t e) {
#pragma omp simd
    for (size_t i = b; i < e; ++i) g[i] *= s;
  });
}

void Optimizer::apply(float* p, float* g, float scale, uint64_t iteration, const Exec& ex) {
  const size_t n = n_;
  if (cfg_.clipnorm > 0 || cfg_.global_clipnorm > 0) {
    clip(g, scale, ex);
    scale = 1.f;  // g is the mean now
  }
  const float lr = learning_rate(cfg_.schedule, iteration);
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
  const float alpha = static_cast<float>(learning_rate_wide(cfg_.schedule, iteration) *
                                         std::sqrt(1.0 - std::pow(cfg_.beta_2, t)) / (1.0 - std::pow(cfg_.beta_1, t)));
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
