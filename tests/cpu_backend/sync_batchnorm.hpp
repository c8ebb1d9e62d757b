// Synchronized batch_normalization, for any engine: a small model with two BatchNorm layers,
// replicas trained on a real in-process communicator (unequal shares of each global batch), and
// the moving statistics read back from a state through the cpu engine (states are portable).
// Used by the cpu tests and the cuda host build's.
#pragma once

#include "helpers.hpp"

#include <gtest/gtest.h>

#include <skyforge/sdk.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace cpu_test {

inline constexpr uint32_t kSyncGlobalBatch = 8;

// conv2d -> batch_normalization (+ a fused relu) -> flatten -> dense -> batch_normalization ->
// dense: statistics over 36 positions a sample, then over samples alone. SGD, whose update is
// linear in the gradient, so rounding is not magnified.
inline ModelSpec sync_bn_model(bool synchronized, uint64_t seed = 3) {
  const char* sync = synchronized ? "true" : "false";
  ModelSpec m;
  m.input_shape = {6, 6, 3};
  m.layers = {layer("conv2d", {{"filters", "4"}, {"kernel_size", "3"}, {"padding", "same"}, {"use_bias", "false"}}),
              layer("batch_normalization", {{"momentum", "0.5"}, {"synchronized", sync}}),
              layer("relu"),
              layer("flatten"),
              layer("dense", {{"units", "8"}}),
              layer("batch_normalization", {{"momentum", "0.5"}, {"synchronized", sync}}),
              layer("dense", {{"units", "10"}})};
  m.optimizer = "sgd";
  m.optimizer_options = opts({{"learning_rate", "0.1"}});
  m.seed = seed;
  m.threads = 1;
  return m;
}

inline size_t features_of(const ModelSpec& m) {
  size_t f = 1;
  for (uint32_t d : m.input_shape) f *= d;
  return f;
}

// Global batch `step`: features in [-1, 3) (a mean well away from 0) and labels in [0, 10).
struct SyncBatch {
  std::vector<float> x;
  std::vector<int32_t> y;
};
inline SyncBatch sync_batch(const ModelSpec& m, uint32_t step) {
  skyforge::Rng rng(1000 + step);
  SyncBatch b;
  b.x.resize(kSyncGlobalBatch * features_of(m));
  for (float& v : b.x) v = 4.f * skyforge::cpu::uniform01(rng) - 1.f;
  for (uint32_t i = 0; i < kSyncGlobalBatch; ++i) b.y.push_back(static_cast<int32_t>(rng.next() % 10));
  return b;
}

// Rank `rank` of `ranks` (1 or 2): its first row of each global batch and how many: one replica
// takes all 8, two take the first 5 and the last 3.
struct Share {
  uint32_t first, rows;
};
inline Share share_of(uint32_t ranks, uint32_t rank) {
  if (ranks == 1) return {0, kSyncGlobalBatch};
  return rank == 0 ? Share{0, 5} : Share{5, 3};
}

// One replica's record: each step's loss and state_dict (parameters, moving statistics).
struct ReplicaRun {
  std::vector<double> losses;
  std::vector<std::string> states;
};

// `ranks` (1 or 2) replicas of `m` made by make(spec, communicator) train `steps` steps, each on
// its share_of every global batch. Every rank has the same seed, so equal states mean equal
// moving statistics too. *allreduces: rank 0's count.
template <class Make>
std::vector<ReplicaRun> train_replicas(const ModelSpec& m, Make make, uint32_t ranks, uint32_t steps,
                                       size_t* allreduces = nullptr) {
  const size_t f = features_of(m);
  skyforge::ThreadGroup group(ranks);
  std::vector<ReplicaRun> runs(ranks);
  group.run([&](uint32_t rank) {
    std::unique_ptr<skyforge::Engine> e = make(m, skyforge::Communicator(group.comm(rank)));
    const Share my = share_of(ranks, rank);
    for (uint32_t s = 0; s < steps; ++s) {
      const SyncBatch b = sync_batch(m, s);
      const StepResult r = e->train_step(b.x.data() + my.first * f, b.y.data() + my.first, my.rows);
      EXPECT_EQ(r.samples, kSyncGlobalBatch);
      runs[rank].losses.push_back(r.loss);
      runs[rank].states.push_back(e->state_dict());
    }
  });
  if (allreduces) *allreduces = group.allreduce_calls(0);
  return runs;
}

// The parameters, then every batch_normalization's moving mean and variance, of a state of `m`.
inline std::vector<float> state_values(const ModelSpec& m, const std::string& state) {
  skyforge::cpu::CpuEngine e(m, skyforge::Communicator());
  e.load_state(state);
  std::vector<float> v(e.param_count());
  e.get_params(v.data(), v.size());
  for (size_t i = 0; i < e.num_layers(); ++i) {
    std::vector<std::vector<float>*> moving;
    e.layer(i).moving(moving);
    for (const auto* s : moving) v.insert(v.end(), s->begin(), s->end());
  }
  return v;
}

inline double largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(double{a[i]} - double{b[i]}));
  return d;
}

// The checks every engine passes, each engine made by make(spec, communicator).

// Two replicas on unequal shares follow one replica on the whole global batch: the same losses
// and values (parameters, moving statistics) within `tol` every step, and the replicas hold the
// same bits every step.
template <class Make>
void check_two_follow_one(Make make, double tol) {
  const ModelSpec m = sync_bn_model(true);
  const auto one = train_replicas(m, make, 1, 4);
  const auto two = train_replicas(m, make, 2, 4);
  for (size_t s = 0; s < 4; ++s) {
    EXPECT_TRUE(two[0].states[s] == two[1].states[s]) << "the replicas differ after step " << s;
    EXPECT_EQ(two[0].losses[s], two[1].losses[s]);
    EXPECT_NEAR(two[0].losses[s], one[0].losses[s], tol) << "step " << s;
    EXPECT_LT(largest_difference(state_values(m, two[0].states[s]), state_values(m, one[0].states[s])), tol)
        << "step " << s;
  }
}

// The same run discriminates: per-replica statistics leave the replicas' moving statistics apart
// (their weights still agree) and far from the global batch's.
template <class Make>
void check_unsynchronized_replicas_differ(Make make) {
  const ModelSpec m = sync_bn_model(false);
  const auto one = train_replicas(m, make, 1, 4);
  const auto two = train_replicas(m, make, 2, 4);
  for (size_t s = 0; s < 4; ++s) {
    EXPECT_FALSE(two[0].states[s] == two[1].states[s]) << "step " << s;
    EXPECT_GT(largest_difference(state_values(m, two[0].states[s]), state_values(m, one[0].states[s])), 1e-2);
  }
}

// One allreduce per synchronized BatchNorm in the forward and one in the backward (the first
// BatchNorm's dx is needed, so both layers take part in both).
template <class Make>
void check_one_allreduce_each_way(Make make) {
  size_t plain = 0, synced = 0;
  train_replicas(sync_bn_model(false), make, 2, 3, &plain);
  train_replicas(sync_bn_model(true), make, 2, 3, &synced);
  EXPECT_EQ(synced - plain, 3u * 2 * 2);
}

// On one replica the option changes nothing: the same bits.
template <class Make>
void check_one_replica_either_way(Make make) {
  const auto plain = train_replicas(sync_bn_model(false), make, 1, 3);
  const auto synced = train_replicas(sync_bn_model(true), make, 1, 3);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(plain[0].losses[s], synced[0].losses[s]);
    EXPECT_EQ(state_values(sync_bn_model(false), plain[0].states[s]),
              state_values(sync_bn_model(true), synced[0].states[s]));
  }
}

}  // namespace cpu_test
