// The pool's rendezvous key-value store (docs/architecture.md): run by the head node, used by every
// node for Gloo's Store and the NCCL unique-id exchange. Clients authenticate with the pool
// secret exactly as workers do (protocol.hpp); requests are msg::KvRequest frames of type
// KvSet / KvGet / KvAdd, each answered by one msg::KvReply carrying the request's id. Requests
// are pipelined: replies may come back in any order.
//
// Semantics
//   set(key, value)   stores value (any bytes), waking every get() waiting for key.
//   get(key, t)       returns the value once key exists. t > 0: waits at most t ms, then fails
//                     with SF_ERR_TIMEOUT; t == 0: does not wait; t < 0: waits as long as the
//                     connection lives. A waiting get() blocks neither its client's other
//                     requests nor other clients.
//   add(key, delta)   atomically adds delta to the decimal integer stored at key (absent = 0),
//                     stores the result as decimal text and returns it. Overflow is an error.
// Limits: keys of 1..kMaxKeyBytes bytes, at most kMaxKeys keys and kMaxStoreBytes bytes of keys
// plus values, at most kMaxWaitersPerClient pending gets per connection.
#pragma once

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "protocol.hpp"

namespace skyforge::net {

// A get() that ran out of time (SF_ERR_TIMEOUT on the wire).
class StoreTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxKeys = 1u << 20;
constexpr size_t kMaxStoreBytes = size_t{1} << 30;
constexpr size_t kMaxWaitersPerClient = 1u << 16;

class StoreServer {
 public:
  // Listens at once; port 0 picks an ephemeral port. Runs on `io` (any number of threads).
  StoreServer(boost::asio::io_context& io, const std::string& bind_address, uint16_t port, std::string secret,
              ConnectionOptions options = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const;
  // Stops listening and drops every client (their pending gets fail with a closed
  // connection). Synchronous for the listening socket; idempotent.
  void close();

  struct State;

 private:
  std::shared_ptr<State> state_;
  std::unique_ptr<Server> server_;
};

// Thread-safe client: any number of threads may call it at once; each call blocks only its own
// thread. It runs its own io thread. Errors other than timeouts (store full, bad key, connection
// lost) throw std::runtime_error.
class StoreClient {
 public:
  static std::unique_ptr<StoreClient> connect(const std::string& host, uint16_t port, const std::string& secret,
                                              uint32_t node, int timeout_ms);
  ~StoreClient();  // graceful close, then joins the io thread
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, std::string_view value);
  // Throws StoreTimeout when the key did not appear within timeout_ms (see semantics above).
  std::string get(const std::string& key, int64_t timeout_ms);
  int64_t add(const std::string& key, int64_t delta);
  // True if every key exists now (does not wait).
  bool check(const std::vector<std::string>& keys);
  // Waits until every key exists; throws StoreTimeout naming the first missing key.
  void wait(const std::vector<std::string>& keys, int64_t timeout_ms);

  struct Impl;

 private:
  explicit StoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace skyforge::net
