// The pool's communicator (docs/runtime-api.md, abi.h sf_communicator): one process group over every
// node, rank = node, size = total_nodes, on Gloo/TCP or, when every node is on this host, on
// shared memory (below). Built only into skyforge-worker (the client has no pool and does not
// link Gloo).
//
// Rendezvous rides on the head's key-value store (store.hpp): every rank publishes its pair
// addresses under "<prefix><rank>" and reads the others', then a gloo::transport::tcp device
// bound to this node's own address (Job::private_ip, so it works across network namespaces)
// connects the full mesh. Construction is therefore collective: every rank must construct its
// communicator, or the others fail after `timeout` with a message naming the missing nodes.
//
// Intra-host shared memory: when every rank runs on this same host (same boot id, network
// namespace, /dev/shm mount and user, as each rank publishes under "<prefix>shm/host/<rank>")
// and none has it switched off (Options::shm, SKYFORGE_COMM_SHM=0), no Gloo context is built:
// the collectives run through one POSIX shared-memory segment instead (as NCCL's SHM
// transport). Its name carries the pool id and a random token from rank 0; every rank maps it
// and it is unlinked as soon as all have, so nothing stays in /dev/shm whatever happens
// later. Each rank owns two slots of shm_slot_bytes (alternate operations use alternate
// slots) and a sequence number that it bumps when its data is in place; waiting yields the
// CPU for a while (optionally spinning first), then sleeps on a futex. Allreduce sums (max,
// min) in rank order 0, 1, ..., size-1 for every element: small buffers are reduced whole by
// every rank, large ones reduce-scattered (each rank reduces 1/size of the elements), then
// gathered. A peer that closed its communicator, failed a collective or whose process exited
// fails the wait at once; one that does not arrive fails it after `timeout`; calls that do not
// match (allreduce here, broadcast there) fail naming both. Rank 0 records the transport chosen
// ("shm" or "gloo") under "<prefix>transport".
//
// Every operation is collective and serialised (one at a time per process); results are
// identical, bit for bit, on every rank: allreduce is Gloo's ring algorithm (each segment is
// reduced on exactly one rank, in a fixed order, and then copied to the others) or the
// shared-memory rank-order reduction; broadcast and allgather only copy bytes. Large buffers
// are split into chunks of `chunk_bytes` (shm: a slot), so `timeout` bounds the wait for a
// peer, not the duration of a large transfer. After an operation fails (timeout, a peer gone)
// the group is in an unknown state: every later call fails at once with the first error.
//
// Nothing here throws across the ABI: the sf_communicator table's functions return an
// sf_status and keep the message for last_error() (per thread).
#pragma once

#include <skyforge/abi.h>

#include <chrono>
#include <cstdint>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

namespace gloo {
class Context;
}

namespace skyforge {
namespace net {
class StoreClient;
}
class ShmGroup;  // communicator_internal.hpp: the shared-memory transport

class GlooCommunicator {
 public:
  struct Options {
    uint32_t rank = 0;
    uint32_t size = 1;
    std::string address = "127.0.0.1";  // this node's address; the tcp device binds there
    std::string prefix = "gloo/0/";     // namespace of the rendezvous keys in the store
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};
    size_t chunk_bytes = size_t{16} << 20;  // largest single Gloo operation
    // Shared memory when every rank is on this host (and SKYFORGE_COMM_SHM is not 0 here).
    bool shm = true;
    size_t shm_slot_bytes = size_t{4} << 20;  // per rank and slot: larger operations are chunked
    std::string shm_tag;                      // in the segment's name; empty: $SKYFORGE_POOL_ID
    // Waiting for a peer: spin this long, then sched_yield() until spin + yield, then sleep on a
    // futex. No spinning by default: ranks may outnumber free cores, and a spinning rank keeps
    // a peer that shares its core off the CPU (bench/bench_allreduce.cpp measures the choices).
    std::chrono::microseconds shm_spin{0};
    std::chrono::microseconds shm_yield{100};
    std::string host_identity;  // empty: detected (tests pass distinct ones to fake hosts)
  };

  // Collective: returns once every rank is connected. Throws std::runtime_error (naming the
  // nodes that did not join, or the transport error) on failure or after options.timeout.
  GlooCommunicator(net::StoreClient& store, Options options);
  ~GlooCommunicator();
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  const sf_communicator* table() const { return &table_; }
  uint32_t rank() const { return opt_.rank; }
  uint32_t size() const { return opt_.size; }
  // "shm", "gloo", or "local" (size 1). When shared memory was possible but could not be set
  // up, shm_fallback() says why ("" otherwise).
  const std::string& transport() const { return transport_; }
  const std::string& shm_fallback() const { return shm_fallback_; }

  // The C++ side of the table (same semantics; failures return a status and set the
  // thread's last error, see last_error()).
  sf_status allreduce(void* data, size_t count, sf_dtype dtype, sf_reduce_op op);
  sf_status broadcast(void* data, size_t bytes, uint32_t root);
  sf_status allgather(const void* in, size_t bytes, void* out);
  sf_status barrier();
  static const char* last_error();

  // What the host's collective watchdog sees (msg::Progress): the collectives entered and
  // completed so far through the table above, and the current or last one. Any thread.
  struct Progress {
    uint64_t entered = 0, done = 0, bytes = 0;
    const char* op = "";
    int64_t since_ms = 0;  // inside one: for how long; else since the last one ended
  };
  Progress progress() const;

  // "config" value of job.collective_timeout (seconds, > 0) or, when absent, the environment
  // variable SKYFORGE_COLLECTIVE_TIMEOUT; 300 s otherwise. Throws std::invalid_argument for a
  // value that is not a positive number of seconds.
  static std::chrono::milliseconds parse_timeout(const char* config_value, const char* env_value);
  // SKYFORGE_COMM_SHM: unset/"" or 1/true/on/yes = allowed, 0/false/off/no = off. Throws
  // std::invalid_argument otherwise.
  static bool parse_shm_switch(const char* env_value);

 private:
  template <class F>
  sf_status guarded(const char* what, uint64_t bytes, F&& f);
  // Shared memory (communicator_shm.cpp): whether every rank is on this host and may use it,
  // then the segment's setup; false (and shm_fallback_ set) when every rank falls back to Gloo.
  bool try_shm(net::StoreClient& store);
  bool setup_shm(net::StoreClient& store, const std::string& name, bool same_pidns);
  // Gloo/TCP (communicator_gloo.cpp): the full mesh, then the collectives on it.
  void setup_gloo(net::StoreClient& store);
  void gloo_allreduce(void* data, size_t count, sf_dtype dtype, sf_reduce_op op);
  void gloo_broadcast(uint8_t* data, size_t bytes, uint32_t root);
  void gloo_allgather(uint8_t* in, size_t bytes, uint8_t* out);
  void gloo_barrier();

  Options opt_;
  sf_communicator table_{};
  std::shared_ptr<gloo::Context> ctx_;  // null when size == 1 or on shared memory
  std::unique_ptr<ShmGroup> shm_;       // non-null on shared memory
  std::string transport_ = "local";
  std::string shm_fallback_;
  std::mutex mu_;                       // one collective at a time
  std::string broken_;                  // first failure; every later call fails with it
  // progress(): written by the calling thread, read by the worker's reporter
  std::atomic<uint64_t> entered_{0}, done_{0}, bytes_{0};
  std::atomic<const char*> op_{""};
  std::atomic<int64_t> changed_ns_{0};  // steady clock: the current one's entry, or the last one's end
  uint32_t tag_ = 0;
};

}  // namespace skyforge
