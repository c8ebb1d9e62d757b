// Multi-tensor Adam, AdamW, SGD (momentum, Nesterov, plain) and RMSprop (plain, momentum, centered): one launch over many tensors equals a
// per-tensor double-precision reference of the Keras rules after several steps, and equals
// launching tensor by tensor bit for bit.
#include "reference.hpp"

#include <skyforge/kernels/optimizer.hpp>

#include <gtest/gtest.h>

#include <stdexcept>

namespace sk = skyforge::kernels;

namespace {

struct Model {
  std::vector<std::vector<float>> p, g, s0, s1, s2;
  std::vector<sk::OptimTensor> tensors() {
    std::vector<sk::OptimTensor> t;
    for (size_t i = 0; i < p.size(); ++i)
      t.push_back({p[i].data(), g[i].data(), s0[i].data(), s1[i].data(), p[i].size(), s2[i].data()});
    return t;
  }
};

// Sizes include empty tensors and, with `many`, more tensors than one launch takes.
Model make_model(bool many, uint32_t seed) {
  std::vector<size_t> sizes = {7, 0, 300, 1, 64, 4097};
  if (many)
    for (size_t i = 0; i < 2 * sk::kMaxTensorsPerLaunch + 3; ++i) sizes.push_back(1 + (i * 37) % 50);
  Model m;
  for (size_t i = 0; i < sizes.size(); ++i) {
    m.p.push_back(kref::randn(sizes[i], seed + static_cast<uint32_t>(i)));
    m.g.push_back(std::vector<float>(sizes[i]));
    m.s0.push_back(std::vector<float>(sizes[i], 0.f));
    m.s1.push_back(std::vector<float>(sizes[i], 0.f));
    m.s2.push_back(std::vector<float>(sizes[i], 0.f));
  }
  return m;
}

// In place: the tensors' grad pointers stay valid.
void new_gradients(Model& m, uint32_t step) {
  for (size_t i = 0; i < m.g.size(); ++i) {
    const auto g = kref::randn(m.g[i].size(), 1000 * step + static_cast<uint32_t>(i));
    std::copy(g.begin(), g.end(), m.g[i].begin());
  }
}

constexpr int kSteps = 5;
constexpr float kScale = 0.25f;  // a gradient sum over 4 samples

// Adam, and AdamW: Keras decays the parameter (p -= p * weight_decay * lr) before the Adam step.
TEST(MultiTensorAdam, MatchesPerTensorReference) {
  for (const double weight_decay : {0.0, 0.05})
  for (bool many : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "weight_decay " << weight_decay << " many " << many);
    Model m = make_model(many, 1);
    const sk::AdamConfig cfg{0.01, 0.8, 0.95, 1e-7, weight_decay};
    std::vector<std::vector<double>> p, mo, v;
    for (auto& t : m.p) {
      p.push_back(kref::to_double(t));
      mo.push_back(std::vector<double>(t.size(), 0.0));
      v.push_back(std::vector<double>(t.size(), 0.0));
    }
    for (int step = 0; step < kSteps; ++step) {
      new_gradients(m, static_cast<uint32_t>(step));
      auto t = m.tensors();
      sk::adam_update(t.data(), t.size(), cfg, static_cast<uint64_t>(step), kScale);
      const double n = step + 1;
      const double alpha = cfg.learning_rate * std::sqrt(1 - std::pow(cfg.beta_2, n)) / (1 - std::pow(cfg.beta_1, n));
      for (size_t k = 0; k < p.size(); ++k)
        for (size_t j = 0; j < p[k].size(); ++j) {
          const double g = static_cast<double>(m.g[k][j]) * kScale;
          p[k][j] -= p[k][j] * weight_decay * cfg.learning_rate;
          mo[k][j] += (g - mo[k][j]) * (1 - cfg.beta_1);
          v[k][j] += (g * g - v[k][j]) * (1 - cfg.beta_2);
          p[k][j] -= alpha * mo[k][j] / (std::sqrt(v[k][j]) + cfg.epsilon);
        }
    }
    for (size_t k = 0; k < p.size(); ++k)
      for (size_t j = 0; j < p[k].size(); ++j) {
        ASSERT_NEAR(m.p[k][j], p[k][j], 2e-6 * (1 + std::abs(p[k][j]))) << "tensor " << k << " element " << j;
        ASSERT_NEAR(m.s0[k][j], mo[k][j], 1e-6) << "m, tensor " << k;
        ASSERT_NEAR(m.s1[k][j], v[k][j], 1e-6 * (1 + v[k][j])) << "v, tensor " << k;
      }
  }
}

struct SgdCase {
  double momentum;
  bool nesterov;
};

void sgd_case(const SgdCase& c, bool many) {
  Model m = make_model(many, 2);
  const sk::SgdConfig cfg{0.05, c.momentum, c.nesterov};
  std::vector<std::vector<double>> p, vel;
  for (auto& t : m.p) {
    p.push_back(kref::to_double(t));
    vel.push_back(std::vector<double>(t.size(), 0.0));
  }
  auto t = m.tensors();
  if (c.momentum == 0.0)
    for (auto& x : t) x.slot0 = x.slot1 = nullptr;  // plain SGD keeps no slots
  for (int step = 0; step < kSteps; ++step) {
    new_gradients(m, static_cast<uint32_t>(step));
    sk::sgd_update(t.data(), t.size(), cfg, kScale);
    for (size_t k = 0; k < p.size(); ++k)
      for (size_t j = 0; j < p[k].size(); ++j) {
        const double g = static_cast<double>(m.g[k][j]) * kScale;
        if (c.momentum == 0.0) {
          p[k][j] -= cfg.learning_rate * g;
          continue;
        }
        vel[k][j] = c.momentum * vel[k][j] - cfg.learning_rate * g;
        p[k][j] += c.nesterov ? c.momentum * vel[k][j] - cfg.learning_rate * g : vel[k][j];
      }
  }
  for (size_t k = 0; k < p.size(); ++k)
    for (size_t j = 0; j < p[k].size(); ++j) {
      ASSERT_NEAR(m.p[k][j], p[k][j], 1e-6 * (1 + std::abs(p[k][j]))) << "tensor " << k << " element " << j;
      if (c.momentum != 0.0) {
        ASSERT_NEAR(m.s0[k][j], vel[k][j], 1e-6) << "velocity, tensor " << k;
      }
    }
}

// Plain, momentum and Nesterov.
TEST(MultiTensorSgd, MatchesPerTensorReference) {
  for (const SgdCase c : {SgdCase{0.0, false}, SgdCase{0.9, false}, SgdCase{0.9, true}})
    for (bool many : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "momentum " << c.momentum << " nesterov " << c.nesterov << " many " << many);
      sgd_case(c, many);
      if (HasFatalFailure()) return;
    }
}

struct RmspropCase {
  double momentum;
  bool centered;
};

// Keras' RMSprop: v = rho v + (1 - rho) g^2; centered: a = rho a + (1 - rho) g, d = v - a^2 + eps,
// else d = v + eps; step = lr g / sqrt(d); momentum: m = momentum m + step, p -= m; else p -= step.
void rmsprop_case(const RmspropCase& c, bool many) {
  Model m = make_model(many, 4);
  const sk::RmspropConfig cfg{0.01, 0.8, c.momentum, 1e-7, c.centered};
  std::vector<std::vector<double>> p, v, mo, a;
  for (auto& t : m.p) {
    p.push_back(kref::to_double(t));
    v.push_back(std::vector<double>(t.size(), 0.0));
    mo.push_back(v.back());
    a.push_back(v.back());
  }
  auto t = m.tensors();
  for (auto& x : t) {  // only the slots the options use
    if (c.momentum == 0.0) x.slot1 = nullptr;
    if (!c.centered) x.slot2 = nullptr;
  }
  for (int step = 0; step < kSteps; ++step) {
    new_gradients(m, static_cast<uint32_t>(step));
    sk::rmsprop_update(t.data(), t.size(), cfg, kScale);
    for (size_t k = 0; k < p.size(); ++k)
      for (size_t j = 0; j < p[k].size(); ++j) {
        const double g = static_cast<double>(m.g[k][j]) * kScale;
        v[k][j] = cfg.rho * v[k][j] + (1 - cfg.rho) * g * g;
        double d = v[k][j] + cfg.epsilon;
        if (c.centered) {
          a[k][j] = cfg.rho * a[k][j] + (1 - cfg.rho) * g;
          d = v[k][j] - a[k][j] * a[k][j] + cfg.epsilon;
        }
        const double inc = cfg.learning_rate * g / std::sqrt(d);
        if (c.momentum > 0) {
          mo[k][j] = c.momentum * mo[k][j] + inc;
          p[k][j] -= mo[k][j];
        } else {
          p[k][j] -= inc;
        }
      }
  }
  for (size_t k = 0; k < p.size(); ++k)
    for (size_t j = 0; j < p[k].size(); ++j) {
      ASSERT_NEAR(m.p[k][j], p[k][j], 2e-5 * (1 + std::abs(p[k][j]))) << "tensor " << k << " element " << j;
      ASSERT_NEAR(m.s0[k][j], v[k][j], 1e-6 * (1 + v[k][j])) << "mean square, tensor " << k;
      if (c.centered) {
        ASSERT_NEAR(m.s2[k][j], a[k][j], 1e-6) << "mean gradient, tensor " << k;
      }
    }
}

TEST(MultiTensorRmsprop, MatchesPerTensorReference) {
  for (const RmspropCase c : {RmspropCase{0.0, false}, RmspropCase{0.9, false}, RmspropCase{0.0, true},
                              RmspropCase{0.5, true}})
    for (bool many : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "momentum " << c.momentum << " centered " << c.centered << " many " << many);
      rmsprop_case(c, many);
      if (HasFatalFailure()) return;
    }
}

// One launch over every tensor = one launch per tensor, bit for bit (each element's update
// depends on that element alone).
TEST(MultiTensor, OneLaunchEqualsTensorByTensor) {
  Model a = make_model(true, 3), b = make_model(true, 3);
  const sk::AdamConfig cfg;
  for (int step = 0; step < 3; ++step) {
    new_gradients(a, static_cast<uint32_t>(step));
    new_gradients(b, static_cast<uint32_t>(step));
    auto ta = a.tensors(), tb = b.tensors();
    sk::adam_update(ta.data(), ta.size(), cfg, static_cast<uint64_t>(step), 1.f);
    for (auto& t : tb) sk::adam_update(&t, 1, cfg, static_cast<uint64_t>(step), 1.f);
  }
  EXPECT_EQ(a.p, b.p);
  EXPECT_EQ(a.s0, b.s0);
  EXPECT_EQ(a.s1, b.s1);
}

TEST(MultiTensor, TableFindsEveryElementsTensor) {
  sk::TensorTable t;
  const size_t ends[] = {3, 3, 10, 11, 40};
  t.count = 5;
  for (uint32_t k = 0; k < 5; ++k) t.end[k] = ends[k];
  size_t k = 0;
  for (size_t i = 0; i < 40; ++i) {
    while (ends[k] <= i) ++k;
    EXPECT_EQ(t.find(i), k) << i;
  }
}

TEST(MultiTensor, RejectsMissingSlots) {
  std::vector<float> p(4), g(4), m(4);
  sk::OptimTensor t{p.data(), g.data(), m.data(), nullptr, 4};
  EXPECT_THROW(sk::adam_update(&t, 1, {}, 0, 1.f), std::invalid_argument);
  t.slot0 = nullptr;
  EXPECT_THROW(sk::sgd_update(&t, 1, sk::SgdConfig{0.1, 0.9, false}, 1.f), std::invalid_argument);
  EXPECT_NO_THROW(sk::sgd_update(&t, 1, sk::SgdConfig{0.1, 0.0, false}, 1.f));
  t.slot0 = m.data();
  EXPECT_THROW(sk::rmsprop_update(&t, 1, sk::RmspropConfig{0.1, 0.9, 0.0, 1e-7, true}, 1.f), std::invalid_argument);
  EXPECT_NO_THROW(sk::rmsprop_update(&t, 1, sk::RmspropConfig{}, 1.f));
}

}  // namespace
