// The pool communicator's Gloo/TCP transport (communicator.hpp): the rendezvous on the pool's
// store, the full mesh of a gloo::transport::tcp device bound to this node's address, and the
// collectives, chunked so that the timeout bounds the wait for a peer.
#include "communicator_internal.hpp"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <vector>

#include "store.hpp"

namespace skyforge {
namespace {

// A rendezvous key's node: Gloo names its keys after the publishing rank (trailing digits).
std::string node_of_key(const std::string& key) {
  size_t i = key.size();
  while (i > 0 && key[i - 1] >= '0' && key[i - 1] <= '9') --i;
  return i == key.size() ? std::string() : key.substr(i);
}

// Element-wise reductions, c may alias a. Integers wrap (two's complement) instead of
// overflowing; MAX/MIN propagate NaN. Each output segment is computed on one rank only, so the
// result is the same bits everywhere whatever the order of operands.
template <class T>
void reduce_sum(void* c, const void* a, const void* b, size_t n) {
  T* C = static_cast<T*>(c);
  const T* A = static_cast<const T*>(a);
  const T* B = static_cast<const T*>(b);
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    for (size_t i = 0; i < n; ++i) C[i] = static_cast<T>(static_cast<U>(A[i]) + static_cast<U>(B[i]));
  } else {
    for (size_t i = 0; i < n; ++i) C[i] = A[i] + B[i];
  }
}
template <class T>
void reduce_max(void* c, const void* a, const void* b, size_t n) {
  T* C = static_cast<T*>(c);
  const T* A = static_cast<const T*>(a);
  const T* B = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) C[i] = (A[i] < B[i] || B[i] != B[i]) ? B[i] : A[i];
}
template <class T>
void reduce_min(void* c, const void* a, const void* b, size_t n) {
  T* C = static_cast<T*>(c);
  const T* A = static_cast<const T*>(a);
  const T* B = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) C[i] = (B[i] < A[i] || B[i] != B[i]) ? B[i] : A[i];
}

template <class T>
void ring_allreduce(const std::shared_ptr<gloo::Context>& ctx, T* data, size_t count, sf_reduce_op op,
                    size_t chunk_bytes, uint32_t& tag, std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions::Func fn = op == SF_REDUCE_SUM ? &reduce_sum<T> : op == SF_REDUCE_MAX ? &reduce_max<T>
                                                                                             : &reduce_min<T>;
  const size_t per = std::max<size_t>(1, chunk_bytes / sizeof(T));
  for (size_t off = 0; off < count; off += per) {
    const size_t n = std::min(per, count - off);
    gloo::AllreduceOptions o(ctx);
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    o.setOutput(data + off, n);
    o.setReduceFunction(fn);
    o.setTag(tag++);
    o.setTimeout(timeout);
    gloo::allreduce(o);
  }
}

}  // namespace

// Gloo's messages start with "[/path/to/file.cc:123] "; keep what follows.
std::string gloo_message(const char* what) {
  std::string m = what ? what : "";
  if (!m.empty() && m[0] == '[') {
    auto close = m.find("] ");
    if (close != std::string::npos && close < 200) m = m.substr(close + 2);
  }
  return m;
}

void KvStore::set(const std::string& key, const std::vector<char>& data) {
  store_.set(prefix_ + key, std::string_view(data.data(), data.size()));
}

std::vector<char> KvStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::string v = store_.get(prefix_ + key, 0);
  return std::vector<char>(v.begin(), v.end());
}

void KvStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // Gloo passes kNoTimeout (0) for "the default"; our store reads 0 as "do not wait".
  const auto t = timeout.count() > 0 ? timeout : timeout_;
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(prefix_ + k);
  try {
    store_.wait(full, t.count());
  } catch (const net::StoreTimeout&) {
    std::set<std::string> missing;
    for (const auto& k : keys) {
      bool present = false;
      try {
        present = store_.check({prefix_ + k});
      } catch (const std::exception&) {
      }
      if (!present) missing.insert(node_of_key(k).empty() ? "'" + k + "'" : node_of_key(k));
    }
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    throw std::runtime_error(
        "node" + std::string(missing.size() == 1 ? " " : "s ") + (list.empty() ? "?" : list) +
        " did not join the communicator within " + seconds_text(t) +
        " (communicator() is collective: every node's app must call it; did that node fail, or skip it?)");
  }
}

void GlooCommunicator::setup_gloo(net::StoreClient& store) {
  std::shared_ptr<gloo::transport::Device> dev;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = opt_.address;
    dev = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot open a Gloo tcp device on " + opt_.address + ": " + gloo_message(e.what()));
  }
  auto ctx = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(opt_.rank), static_cast<int>(opt_.size));
  ctx->setTimeout(opt_.timeout);
  KvStore kv(store, opt_.prefix, opt_.timeout);
  try {
    ctx->connectFullMesh(kv, dev);
  } catch (const std::exception& e) {
    throw std::runtime_error("communicator rendezvous failed on node " + std::to_string(opt_.rank) + ": " +
                             gloo_message(e.what()));
  }
  ctx_ = std::move(ctx);
  // Every rank connected before anyone returns: failures show up here, not in the first call.
  try {
    gloo::BarrierOptions b(ctx_);
    b.setTag(tag_++);
    b.setTimeout(opt_.timeout);
    gloo::barrier(b);
  } catch (const std::exception& e) {
    ctx_.reset();
    throw std::runtime_error("communicator rendezvous failed on node " + std::to_string(opt_.rank) +
                             " while waiting for every node to connect (within " + seconds_text(opt_.timeout) +
                             "): " + gloo_message(e.what()));
  }
}

void GlooCommunicator::gloo_allreduce(void* data, size_t count, sf_dtype dtype, sf_reduce_op op) {
  switch (dtype) {
    case SF_DTYPE_F32: ring_allreduce(ctx_, static_cast<float*>(data), count, op, opt_.chunk_bytes, tag_, opt_.timeout); break;
    case SF_DTYPE_F64: ring_allreduce(ctx_, static_cast<double*>(data), count, op, opt_.chunk_bytes, tag_, opt_.timeout); break;
    case SF_DTYPE_I32: ring_allreduce(ctx_, static_cast<int32_t*>(data), count, op, opt_.chunk_bytes, tag_, opt_.timeout); break;
    case SF_DTYPE_I64: ring_allreduce(ctx_, static_cast<int64_t*>(data), count, op, opt_.chunk_bytes, tag_, opt_.timeout); break;
  }
}

void GlooCommunicator::gloo_broadcast(uint8_t* p, size_t bytes, uint32_t root) {
  for (size_t off = 0; off < bytes; off += opt_.chunk_bytes) {
    const size_t n = std::min(opt_.chunk_bytes, bytes - off);
    gloo::BroadcastOptions o(ctx_);
    o.setOutput(p + off, n);
    o.setRoot(static_cast<int>(root));
    o.setTag(tag_++);
    o.setTimeout(opt_.timeout);
    gloo::broadcast(o);
  }
}

void GlooCommunicator::gloo_allgather(uint8_t* src, size_t bytes, uint8_t* dst) {
  const size_t n_ranks = opt_.size;
  const size_t per = std::max<size_t>(1, opt_.chunk_bytes / n_ranks);
  if (bytes <= per) {
    gloo::AllgatherOptions o(ctx_);
    o.setInput(src, bytes);
    o.setOutput(dst, bytes * n_ranks);
    o.setTag(tag_++);
    o.setTimeout(opt_.timeout);
    gloo::allgather(o);
    return;
  }
  // Large contributions: gather a slice of every rank's bytes at a time, then place them.
  std::vector<uint8_t> tmp(per * n_ranks);
  for (size_t off = 0; off < bytes; off += per) {
    const size_t n = std::min(per, bytes - off);
    gloo::AllgatherOptions o(ctx_);
    o.setInput(src + off, n);
    o.setOutput(tmp.data(), n * n_ranks);
    o.setTag(tag_++);
    o.setTimeout(opt_.timeout);
    gloo::allgather(o);
    for (size_t r = 0; r < n_ranks; ++r) std::memcpy(dst + r * bytes + off, tmp.data() + r * n, n);
  }
}

void GlooCommunicator::gloo_barrier() {
  gloo::BarrierOptions o(ctx_);
  o.setTag(tag_++);
  o.setTimeout(opt_.timeout);
  gloo::barrier(o);
}

}  // namespace skyforge
