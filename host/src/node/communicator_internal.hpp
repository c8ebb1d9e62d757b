// What the pool communicator's files share, and nothing else includes (other code includes
// communicator.hpp): communicator.cpp holds the front (the sf_communicator table, the choice of
// transport, one call at a time, errors), communicator_shm.cpp the shared-memory transport and
// communicator_gloo.cpp the Gloo/TCP one. communicator.hpp describes both transports.
#pragma once

#include <gloo/rendezvous/store.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "communicator.hpp"

namespace skyforge {

// A timeout for a message: "300 s", "0.25 s".
std::string seconds_text(std::chrono::milliseconds t);
// Gloo's messages start with "[/path/to/file.cc:123] "; keep what follows.
std::string gloo_message(const char* what);
// "f32", "f64", "i32", "i64"; null for a dtype the communicator does not know.
const char* dtype_name(sf_dtype d);

// gloo::rendezvous::Store over the pool's rendezvous store (the head's key-value store), keys
// under `prefix`. Both transports meet through it; a wait that times out names the nodes whose
// keys are missing (communicator_gloo.cpp).
class KvStore final : public gloo::rendezvous::Store {
 public:
  KvStore(net::StoreClient& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  net::StoreClient& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// The shared-memory transport (communicator_shm.cpp): the collectives over one segment that
// every rank has mapped. Each call throws std::runtime_error when it fails.
class ShmGroup {
 public:
  struct Config {
    uint32_t rank = 0, size = 1;
    size_t slot = 0;
    std::chrono::milliseconds timeout{0};
    std::chrono::microseconds spin{0}, yield{0};
  };
  // The segment's layout (communicator_shm.cpp): a rank's control block, an operation's
  // description.
  struct RankCtl;
  struct OpDesc;

  // Takes the mapping (base, len), already attached (every rank's pid is in its RankCtl).
  ShmGroup(void* base, size_t len, Config c) : base_(static_cast<uint8_t*>(base)), len_(len), c_(c) {}
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // Dead-peer detection: a pidfd per peer process (not for ranks in this process).
  void watch_peers(bool same_pidns);
  void mark_broken();

  void barrier();
  void allreduce(void* data, size_t count, sf_dtype dtype, sf_reduce_op op);
  void broadcast(uint8_t* data, size_t bytes, uint32_t root);
  void allgather(const uint8_t* in, size_t bytes, uint8_t* out);

 private:
  RankCtl& ctl(uint32_t r) const;
  uint8_t* slot(uint32_t r, uint32_t p) const;
  uint32_t parity() const;
  static bool reached(uint32_t seq, uint32_t target);
  void sync(const OpDesc& d, bool first);
  uint32_t next_pending(uint32_t from, uint32_t target) const;
  void check_state(uint32_t r, uint32_t target) const;
  void check_alive(uint32_t from, uint32_t target) const;
  void wait_all(uint32_t target);
  [[noreturn]] void mismatch(uint32_t r, const OpDesc& theirs, const OpDesc& mine) const;
  template <class T>
  void allreduce_typed(T* data, size_t count, sf_dtype dtype, sf_reduce_op op);
  template <class T>
  std::pair<size_t, size_t> share(size_t n, uint32_t r) const;
  template <class T>
  void reduce_range(T* dst, const T* own, size_t lo, size_t hi, uint32_t p, sf_reduce_op op, T* copy_to);
  template <class T>
  void allreduce_chunk(T* data, size_t n, const OpDesc& d, sf_reduce_op op);

  uint8_t* base_;
  size_t len_;
  Config c_;
  uint64_t ops_ = 0;  // operations (chunks) so far: selects the slot parity
  uint32_t pub_ = 0;  // my publications so far (= my seq)
  std::vector<int> pidfds_;
  std::vector<pid_t> pids_;
};

}  // namespace skyforge
