// Learning-rate schedules and gradient clipping across the engine's state and its replicas
// (docs/compute-backends.md, "Learning-rate schedules", "Gradient clipping"): the schedule's step
// is the engine's step counter, which state_dict carries, so a run resumed at step k continues
// the schedule bit for bit; clipping works on the allreduced mean with sums that do not depend on
// the thread count, so replicas on different core counts stay bit-identical.
#include "helpers.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

using namespace cpu_test;
using skyforge::cpu::CpuEngine;

namespace {

constexpr uint32_t kBatch = 16;

// A batch of MLP input (784 features) and labels, the same for a given step.
struct Batch {
  std::vector<float> x = std::vector<float>(kBatch * 784);
  std::vector<int32_t> y = std::vector<int32_t>(kBatch);
  explicit Batch(uint32_t step) {
    std::mt19937 g(step + 1);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (float& v : x) v = u(g);
    for (int32_t& v : y) v = static_cast<int32_t>(g() % 10);
  }
};

std::vector<float> params_of(const skyforge::Engine& e) {
  std::vector<float> p(e.param_count());
  e.get_params(p.data(), p.size());
  return p;
}

void train(skyforge::Engine& e, uint32_t from, uint32_t to) {
  for (uint32_t s = from; s < to; ++s) {
    const Batch b(s);
    e.train_step(b.x.data(), b.y.data(), kBatch);
  }
}

ModelSpec with(ModelSpec m, const char* optimizer, std::initializer_list<std::pair<const char*, const char*>> options) {
  m.optimizer = optimizer;
  m.optimizer_options = opts(options);
  return m;
}

// Each schedule type (with a clipping norm), on an optimizer with slots.
std::vector<ModelSpec> scheduled_models() {
  return {with(mlp(31), "adam",
               {{"learning_rate_schedule", "cosine_decay"},
                {"learning_rate_schedule.initial_learning_rate", "0"},
                {"learning_rate_schedule.decay_steps", "6"},
                {"learning_rate_schedule.warmup_target", "0.003"},
                {"learning_rate_schedule.warmup_steps", "3"},
                {"global_clipnorm", "0.5"}}),
          with(mlp(32), "sgd",
               {{"momentum", "0.9"},
                {"learning_rate_schedule", "exponential_decay"},
                {"learning_rate_schedule.initial_learning_rate", "0.1"},
                {"learning_rate_schedule.decay_steps", "2"},
                {"learning_rate_schedule.decay_rate", "0.7"},
                {"clipnorm", "0.2"}}),
          with(mlp(33), "rmsprop",
               {{"learning_rate_schedule", "piecewise_constant_decay"},
                {"learning_rate_schedule.boundaries", "3,5"},
                {"learning_rate_schedule.values", "0.002,0.001,0.0005"}})};
}

}  // namespace

// 10 steps straight == 4 steps, state_dict, a fresh engine loading it, 6 more steps.
TEST(Schedules, ResumeFromStateContinuesTheScheduleExactly) {
  for (const ModelSpec& m : scheduled_models()) {
    CpuEngine straight(m, skyforge::Communicator());
    train(straight, 0, 10);
    CpuEngine first(m, skyforge::Communicator());
    train(first, 0, 4);
    ModelSpec other = m;
    other.seed = m.seed + 100;  // its own initial weights: the state replaces them
    CpuEngine resumed(other, skyforge::Communicator());
    resumed.load_state(first.state_dict());
    train(resumed, 4, 10);
    const auto a = params_of(straight), b = params_of(resumed);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << m.optimizer;
    // Restarting the schedule (a fresh engine on the same weights but step 0) would not be this.
    CpuEngine restarted(m, skyforge::Communicator());
    restarted.set_params(params_of(first).data(), first.param_count());
    train(restarted, 4, 10);
    EXPECT_NE(params_of(restarted), a) << m.optimizer;
  }
}

// Clipping on 2 ranks, one thread and two: the replicas hold the same bits every step.
TEST(Schedules, ClippedReplicasStayIdentical) {
  for (const char* norm : {"clipnorm", "global_clipnorm"}) {
    const ModelSpec m = with(mlp(34), "adam", {{"learning_rate", "0.01"}, {norm, "0.1"}});
    ThreadGroup g(2);
    std::vector<float> params[2];
    g.run([&](uint32_t rank) {
      ModelSpec mine = m;
      mine.threads = rank + 1;
      CpuEngine e(mine, skyforge::Communicator(g.comm(rank)));
      for (uint32_t s = 0; s < 5; ++s) {
        const Batch b(s);
        const uint32_t half = kBatch / 2;
        e.train_step(b.x.data() + rank * half * 784, b.y.data() + rank * half, half);
      }
      params[rank] = params_of(e);
    });
    EXPECT_EQ(0, std::memcmp(params[0].data(), params[1].data(), params[0].size() * sizeof(float))) << norm;
  }
}
