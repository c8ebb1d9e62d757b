// The pool's communicator (DESIGN.md §6, abi.h sf_communicator): one Gloo process group over
// every node, rank = node, size = total_nodes. Built only into skyforge-worker (the client has
// no pool and does not link Gloo).
//
// Rendezvous rides on the head's key-value store (store.hpp): every rank publishes its pair
// addresses under "<prefix><rank>" and reads the others', then a gloo::transport::tcp device
// bound to this node's own address (Job::private_ip, so it works across network namespaces)
// connects the full mesh. Construction is therefore collective: every rank must construct its
// communicator, or the others fail after `timeout` with a message naming the missing nodes.
//
// Every operation is collective and serialised (one at a time per process); results are
// identical, bit for bit, on every rank: allreduce is Gloo's ring algorithm (each segment is
// reduced on exactly one rank, in a fixed order, and then copied to the others), broadcast
// and allgather only copy bytes. Large buffers are split into chunks of `chunk_bytes`, so
// `timeout` bounds the wait for a peer, not the duration of a large transfer. After an
// operation fails (timeout, a peer gone) the group is in an unknown state: every later call
// fails at once with the first error.
//
// Nothing here throws across the ABI: the sf_communicator table's functions return an
// sf_status and keep the message for last_error() (per thread).
#pragma once

#include <skyforge/abi.h>

#include <chrono>
#include <cstdint>
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

class GlooCommunicator {
 public:
  struct Options {
    uint32_t rank = 0;
    uint32_t size = 1;
    std::string address = "127.0.0.1";  // this node's address; the tcp device binds there
    std::string prefix = "gloo/0/";     // namespace of the rendezvous keys in the store
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};
    size_t chunk_bytes = size_t{16} << 20;  // largest single Gloo operation
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

  // The C++ side of the table (same semantics; failures return a status and set the
  // thread's last error, see last_error()).
  sf_status allreduce(void* data, size_t count, sf_dtype dtype, sf_reduce_op op);
  sf_status broadcast(void* data, size_t bytes, uint32_t root);
  sf_status allgather(const void* in, size_t bytes, void* out);
  sf_status barrier();
  static const char* last_error();

  // "config" value of job.collective_timeout (seconds, > 0) or, when absent, the environment
  // variable SKYFORGE_COLLECTIVE_TIMEOUT; 300 s otherwise. Throws std::invalid_argument for a
  // value that is not a positive number of seconds.
  static std::chrono::milliseconds parse_timeout(const char* config_value, const char* env_value);

 private:
  template <class F>
  sf_status guarded(const char* what, F&& f);

  Options opt_;
  sf_communicator table_{};
  std::shared_ptr<gloo::Context> ctx_;  // null when size == 1
  std::mutex mu_;                       // one collective at a time
  std::string broken_;                  // first failure; every later call fails with it
  uint32_t tag_ = 0;
};

}  // namespace skyforge
