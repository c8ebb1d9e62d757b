// An sf_communicator over threads of one process: `size` ranks, each a thread, every collective
// meeting at a barrier. What a compute backend's author needs to test data parallelism without
// a pool — 1 rank against N on the same global batch — and what `skyforge backend-check` runs
// (docs/compute-backends.md). Sums run in rank order, so every rank gets the same bits (the
// sf_communicator contract, abi.h). Header-only.
//
//   skyforge::ThreadGroup g(2);
//   g.run([&](uint32_t rank) { /* engine_create(..., g.comm(rank), ...), train_step ... */ });
#pragma once

#include <skyforge/abi.h>

#include <atomic>
#include <barrier>
#include <exception>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace skyforge {

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
      c.last_error = [](void*) -> const char* {
        return "ThreadGroup: a rank left the group, or not SF_REDUCE_SUM of f32/f64";
      };
    }
  }
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  uint32_t size() const { return size_; }
  // Rank `rank`'s communicator; lives as long as the group. Use it from that rank's thread only.
  const sf_communicator* comm(uint32_t rank) const { return &ranks_[rank].comm; }
  size_t allreduce_calls(uint32_t rank) const { return ranks_[rank].allreduces; }
  size_t allgather_calls(uint32_t rank) const { return ranks_[rank].allgathers; }
  // Runs fn(rank) on `size` threads and joins them. Every rank makes the same collective calls
  // in the same order; a rank whose fn throws leaves the group (the others' collectives then
  // fail with SF_ERR instead of waiting for it forever), and run() rethrows the first exception.
  void run(const std::function<void(uint32_t)>& fn) {
    std::vector<std::thread> t;
    std::vector<std::exception_ptr> errors(size_);
    for (uint32_t r = 0; r < size_; ++r)
      t.emplace_back([&, r] {
        try {
          fn(r);
        } catch (...) {
          errors[r] = std::current_exception();
          broken_ = true;
          bar_.arrive_and_drop();
        }
      });
    for (auto& th : t) th.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

 private:
  struct Rank {
    ThreadGroup* group = nullptr;
    sf_communicator comm{};
    size_t allreduces = 0, allgathers = 0;
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
  // After a barrier: a rank has left, so nobody reads its (maybe dead) buffer.
  bool left() const { return broken_; }
  static sf_status allreduce(void* ctx, void* data, size_t n, sf_dtype dt, sf_reduce_op op) {
    auto* me = static_cast<Rank*>(ctx);
    if (op != SF_REDUCE_SUM || (dt != SF_DTYPE_F32 && dt != SF_DTYPE_F64)) return SF_ERR_UNSUPPORTED;
    ++me->allreduces;
    me->group->ptrs_[me->comm.rank] = data;
    me->group->bar_.arrive_and_wait();
    if (me->group->left()) return SF_ERR;
    if (dt == SF_DTYPE_F32) sum(me, static_cast<float*>(data), n);
    else sum(me, static_cast<double*>(data), n);
    return SF_OK;
  }
  static sf_status broadcast(void* ctx, void* data, size_t bytes, uint32_t root) {
    auto* me = static_cast<Rank*>(ctx);
    ThreadGroup& g = *me->group;
    g.ptrs_[me->comm.rank] = data;
    g.bar_.arrive_and_wait();
    if (g.left()) return SF_ERR;
    if (me->comm.rank != root) std::memcpy(data, g.ptrs_[root], bytes);
    g.bar_.arrive_and_wait();
    return SF_OK;
  }
  static sf_status allgather(void* ctx, const void* in, size_t bytes, void* out) {
    auto* me = static_cast<Rank*>(ctx);
    ++me->allgathers;
    ThreadGroup& g = *me->group;
    g.ptrs_[me->comm.rank] = const_cast<void*>(in);
    g.bar_.arrive_and_wait();
    if (g.left()) return SF_ERR;
    for (uint32_t r = 0; r < g.size_; ++r) std::memcpy(static_cast<char*>(out) + r * bytes, g.ptrs_[r], bytes);
    g.bar_.arrive_and_wait();
    return SF_OK;
  }
  static sf_status barrier(void* ctx) {
    ThreadGroup& g = *static_cast<Rank*>(ctx)->group;
    g.bar_.arrive_and_wait();
    return g.left() ? SF_ERR : SF_OK;
  }

  uint32_t size_;
  std::atomic<bool> broken_{false};  // a rank left: every collective from now on fails
  std::barrier<> bar_;
  std::vector<void*> ptrs_;
  std::vector<Rank> ranks_;
};

}  // namespace skyforge
