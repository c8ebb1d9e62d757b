// The CUDA build's cache of plans by shape: cuBLASLt's fused GEMMs (device_blas.cpp) and cuDNN's
// convolutions (device_cudnn.cpp) are each described and chosen once per shape and kept here,
// the least recently used plan dropped past a bound. Plain C++: tested by the host build
// (tests/cuda_backend/test_plan_cache.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>

namespace skyforge::cuda {

// Plans by shape. A run meets a few shapes per layer (the batch, an epoch's last batch, the
// evaluation batch), so a deep model holds hundreds of plans; past Bound plans the least
// recently used one goes (plans hold host descriptors only, no device memory, and a captured
// graph keeps nothing of them). A run that keeps using a set of up to Bound shapes never makes
// a plan twice: with autotune, a plan re-made inside a capture could not time cuDNN's
// candidates and would take the heuristics' choice, another algorithm mid-run.
template <class Plan, size_t N, size_t Bound = 1024>
class PlanCache {
  static_assert(Bound > 0, "a plan cache holds at least the plan get() returns");

 public:
  using Key = std::array<uint64_t, N>;
  // The plan for key, made by make(plan) at its first use. A make that throws leaves no plan.
  // The reference stays valid until the plan is evicted (at the earliest by the Bound-th get of
  // other keys after its last use) or the cache cleared.
  template <class Make>
  Plan& get(const Key& key, const Make& make) {
    if (auto it = index_.find(key); it != index_.end()) {
      used_.splice(used_.begin(), used_, it->second);  // now the most recently used
      return it->second->plan;
    }
    used_.emplace_front(key);
    try {
      make(used_.front().plan);
      index_.emplace(key, used_.begin());
    } catch (...) {
      used_.pop_front();
      throw;
    }
    if (used_.size() > Bound) {
      index_.erase(used_.back().key);
      used_.pop_back();
    }
    return used_.front().plan;
  }
  void clear() {
    index_.clear();
    used_.clear();
  }
  // f(key, plan) for every plan, in key order.
  template <class F>
  void for_each(const F& f) const {
    for (const auto& [key, entry] : index_) f(key, static_cast<const Plan&>(entry->plan));
  }

 private:
  struct Entry {
    explicit Entry(const Key& k) : key(k) {}
    Key key;
    Plan plan;
  };
  std::list<Entry> used_;  // most recently used first; list nodes stay put, so do references
  std::map<Key, typename std::list<Entry>::iterator> index_;
};

}  // namespace skyforge::cuda
