// The CUDA build's cache of plans by shape: cuBLASLt's fused GEMMs (device_blas.cpp) and cuDNN's
// convolutions (device_cudnn.cpp) are each described and chosen once per shape and kept here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

namespace skyforge::cuda {

// Plans by shape. A run meets a few shapes per layer (the batch, an epoch's last batch, the
// evaluation batch), so a deep model holds hundreds of plans; past kMaxPlans the cache starts
// over rather than grow without bound (plans hold host descriptors only, no device memory, and
// a captured graph keeps nothing of them). A plan re-made inside a capture cannot time cuDNN's
// candidates, so with autotune it takes the heuristics' choice: past kMaxPlans windows only.
template <class Plan, size_t N>
class PlanCache {
 public:
  using Key = std::array<uint64_t, N>;
  // The plan for key, made by make(plan) at its first use. A make that throws leaves no plan.
  template <class Make>
  Plan& get(const Key& key, const Make& make) {
    if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
    if (plans_.size() >= kMaxPlans) plans_.clear();
    auto plan = std::make_unique<Plan>();
    make(*plan);
    return *plans_.emplace(key, std::move(plan)).first->second;
  }
  void clear() { plans_.clear(); }
  template <class F>
  void for_each(const F& f) const {
    for (const auto& [key, plan] : plans_) f(key, *plan);
  }

 private:
  static constexpr size_t kMaxPlans = 1024;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace skyforge::cuda
