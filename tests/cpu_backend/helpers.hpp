// Shared helpers of the cpu backend tests: model specs and an in-process communicator.
#pragma once

#include "cpu_engine.hpp"

#include <barrier>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace cpu_test {

using skyforge::LayerSpec;
using skyforge::ModelSpec;
using skyforge::Options;
using skyforge::StepResult;

inline Options opts(std::initializer_list<std::pair<const char*, const char*>> kv) {
  std::vector<sf_kv> v;
  for (auto& [k, val] : kv) v.push_back(sf_kv{k, val});
  return Options(v.data(), v.size());
}

inline LayerSpec layer(const char* type, std::initializer_list<std::pair<const char*, const char*>> kv = {}) {
  return LayerSpec{type, opts(kv)};
}

inline ModelSpec mlp(uint64_t seed = 1, uint32_t threads = 0) {
  ModelSpec m;
  m.input_shape = {28, 28, 1};
  m.layers = {layer("flatten"), layer("dense", {{"units", "128"}, {"activation", "relu"}}),
              layer("dense", {{"units", "10"}})};
  m.seed = seed;
  m.threads = threads;
  return m;
}

// The convnet of the Keras distributed-training guide.
inline ModelSpec convnet(uint64_t seed = 1, uint32_t threads = 0) {
  ModelSpec m;
  m.input_shape = {28, 28, 1};
  m.layers = {
      layer("conv2d", {{"filters", "12"}, {"kernel_size", "3"}, {"padding", "same"}, {"use_bias", "false"}}),
      layer("batch_normalization", {{"scale", "false"}, {"center", "true"}}),
      layer("relu"),
      layer("conv2d", {{"filters", "24"}, {"kernel_size", "6"}, {"use_bias", "false"}, {"strides", "2"}}),
      layer("batch_normalization", {{"scale", "false"}, {"center", "true"}}),
      layer("relu"),
      layer("conv2d", {{"filters", "32"}, {"kernel_size", "6"}, {"padding", "same"}, {"strides", "2"}}),
      layer("batch_normalization", {{"scale", "false"}, {"center", "true"}}),
      layer("relu"),
      layer("global_average_pooling2d"),
      layer("dense", {{"units", "256"}, {"activation", "relu"}}),
      layer("dropout", {{"rate", "0.5"}}),
      layer("dense", {{"units", "10"}}),
  };
  m.seed = seed;
  m.threads = threads;
  return m;
}

// A communicator over threads of this process: every rank's buffer is summed in rank order,
// so results are identical on every rank (the sf_communicator contract).
class ThreadGroup {
 public:
  explicit ThreadGroup(uint32_t size) : size_(size), bar_(size), ptrs_(size), ranks_(size) {
    for (uint32_t r = 0; r < size; ++r) {
      ranks_[r].group = this;
      sf_communicator& c = ranks_[r].comm;
      c.struct_size = sizeof(sf_communicator);
      c.ctx = &ranks_[r];
      c.rank = r;
      c.size = size;
      c.allreduce = &allreduce;
      c.broadcast = &broadcast;
      c.allgather = &allgather;
      c.barrier = &barrier;
      c.last_error = [](void*) -> const char* { return ""; };
    }
  }
  const sf_communicator* comm(uint32_t rank) const { return &ranks_[rank].comm; }
  size_t allreduce_calls(uint32_t rank) const { return ranks_[rank].allreduces; }
  // Runs fn(rank) on `size` threads and joins them.
  void run(const std::function<void(uint32_t)>& fn) {
    std::vector<std::thread> t;
    for (uint32_t r = 0; r < size_; ++r) t.emplace_back(fn, r);
    for (auto& th : t) th.join();
  }

 private:
  struct Rank {
    ThreadGroup* group = nullptr;
    sf_communicator comm{};
    size_t allreduces = 0;
  };
  template <class T>
  static void sum(Rank* me, T* data, size_t n) {
    ThreadGroup& g = *me->group;
    std::vector<T> tmp(n, T{});
    for (uint32_t r = 0; r < g.size_; ++r) {
      const T* p = static_cast<const T*>(g.ptrs_[r]);
      for (size_t i = 0; i < n; ++i) tmp[i] += p[i];
    }
    g.bar_.arrive_and_wait();
    std::memcpy(data, tmp.data(), n * sizeof(T));
  }
  static sf_status allreduce(void* ctx, void* data, size_t n, sf_dtype dt, sf_reduce_op op) {
    auto* me = static_cast<Rank*>(ctx);
    if (op != SF_REDUCE_SUM) return SF_ERR_UNSUPPORTED;
    ++me->allreduces;
    me->group->ptrs_[me->comm.rank] = data;
    me->group->bar_.arrive_and_wait();
    if (dt == SF_DTYPE_F32) sum(me, static_cast<float*>(data), n);
    else if (dt == SF_DTYPE_F64) sum(me, static_cast<double*>(data), n);
    else return SF_ERR_UNSUPPORTED;
    return SF_OK;
  }
  static sf_status broadcast(void* ctx, void* data, size_t bytes, uint32_t root) {
    auto* me = static_cast<Rank*>(ctx);
    ThreadGroup& g = *me->group;
    g.ptrs_[me->comm.rank] = data;
    g.bar_.arrive_and_wait();
    if (me->comm.rank != root) std::memcpy(data, g.ptrs_[root], bytes);
    g.bar_.arrive_and_wait();
    return SF_OK;
  }
  static sf_status allgather(void* ctx, const void* in, size_t bytes, void* out) {
    auto* me = static_cast<Rank*>(ctx);
    ThreadGroup& g = *me->group;
    g.ptrs_[me->comm.rank] = const_cast<void*>(in);
    g.bar_.arrive_and_wait();
    for (uint32_t r = 0; r < g.size_; ++r) std::memcpy(static_cast<char*>(out) + r * bytes, g.ptrs_[r], bytes);
    g.bar_.arrive_and_wait();
    return SF_OK;
  }
  static sf_status barrier(void* ctx) {
    static_cast<Rank*>(ctx)->group->bar_.arrive_and_wait();
    return SF_OK;
  }

  uint32_t size_;
  std::barrier<> bar_;
  std::vector<void*> ptrs_;
  std::vector<Rank> ranks_;
};

}  // namespace cpu_test
