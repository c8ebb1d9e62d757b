#include "communicator.hpp"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "store.hpp"

namespace skyforge {
namespace {

thread_local std::string t_error;

sf_status fail(sf_status st, std::string message) {
  t_error = std::move(message);
  return st;
}

std::string seconds_text(std::chrono::milliseconds t) {
  const auto ms = t.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", double(ms) / 1000.0);
  return buf;
}

// Gloo's messages start with "[/path/to/file.cc:123] "; keep what follows.
std::string gloo_message(const char* what) {
  std::string m = what ? what : "";
  if (!m.empty() && m[0] == '[') {
    auto close = m.find("] ");
    if (close != std::string::npos && close < 200) m = m.substr(close + 2);
  }
  return m;
}

// A rendezvous key's node: Gloo names its keys after the publishing rank (trailing digits).
std::string node_of_key(const std::string& key) {
  size_t i = key.size();
  while (i > 0 && key[i - 1] >= '0' && key[i - 1] <= '9') --i;
  return i == key.size() ? std::string() : key.substr(i);
}

// gloo::rendezvous::Store over the pool's rendezvous store (the head's key-value store).
class KvStore final : public gloo::rendezvous::Store {
 public:
  KvStore(net::StoreClient& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, std::string_view(data.data(), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    std::string v = store_.get(prefix_ + key, 0);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
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

 private:
  net::StoreClient& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

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

const char* dtype_name(sf_dtype d) {
  switch (d) {
    case SF_DTYPE_F32: return "f32";
    case SF_DTYPE_F64: return "f64";
    case SF_DTYPE_I32: return "i32";
    case SF_DTYPE_I64: return "i64";
    default: return nullptr;
  }
}

}  // namespace

std::chrono::milliseconds GlooCommunicator::parse_timeout(const char* config_value, const char* env_value) {
  const char* v = config_value && *config_value ? config_value : env_value && *env_value ? env_value : nullptr;
  if (!v) return std::chrono::seconds(300);
  const std::string what = config_value && *config_value ? "job.collective_timeout" : "SKYFORGE_COLLECTIVE_TIMEOUT";
  double s = 0;
  size_t used = 0;
  try {
    s = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != std::strlen(v) || !(s > 0) || !std::isfinite(s) || s > 1e7)
    throw std::invalid_argument(what + " = '" + v + "': expected a positive number of seconds");
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(s * 1000.0)));
}

GlooCommunicator::GlooCommunicator(net::StoreClient& store, Options options) : opt_(std::move(options)) {
  if (opt_.size == 0 || opt_.rank >= opt_.size)
    throw std::invalid_argument("communicator: rank " + std::to_string(opt_.rank) + " out of range for size " +
                                std::to_string(opt_.size));
  opt_.chunk_bytes = std::max<size_t>(opt_.chunk_bytes, 64);
  table_.struct_size = sizeof(sf_communicator);
  table_.ctx = this;
  table_.rank = opt_.rank;
  table_.size = opt_.size;
  table_.allreduce = [](void* c, void* data, size_t count, sf_dtype dtype, sf_reduce_op op) -> sf_status {
    return static_cast<GlooCommunicator*>(c)->allreduce(data, count, dtype, op);
  };
  table_.broadcast = [](void* c, void* data, size_t bytes, uint32_t root) -> sf_status {
    return static_cast<GlooCommunicator*>(c)->broadcast(data, bytes, root);
  };
  table_.allgather = [](void* c, const void* in, size_t bytes, void* out) -> sf_status {
    return static_cast<GlooCommunicator*>(c)->allgather(in, bytes, out);
  };
  table_.barrier = [](void* c) -> sf_status { return static_cast<GlooCommunicator*>(c)->barrier(); };
  table_.last_error = [](void*) -> const char* { return GlooCommunicator::last_error(); };
  if (opt_.size == 1) return;  // one rank: every operation is local

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

GlooCommunicator::~GlooCommunicator() {
  std::lock_guard<std::mutex> lock(mu_);
  ctx_.reset();
}

const char* GlooCommunicator::last_error() { return t_error.c_str(); }

template <class F>
sf_status GlooCommunicator::guarded(const char* what, F&& f) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.empty())
    return fail(SF_ERR, std::string(what) + ": the communicator is unusable after an earlier failure: " + broken_);
  if (!ctx_) return fail(SF_ERR, std::string(what) + ": the communicator is closed");
  try {
    f();
    return SF_OK;
  } catch (const std::exception& e) {
    const std::string m = gloo_message(e.what());
    const bool timed_out = m.find("Timed out") != std::string::npos || m.find("timed out") != std::string::npos;
    std::string msg = std::string(what) + " failed on node " + std::to_string(opt_.rank) + ": " + m;
    if (timed_out)
      msg += " (no answer from a peer within " + seconds_text(opt_.timeout) +
             ": every node must make the same collective calls in the same order; did another node fail?)";
    else
      msg += " (did another node fail or exit?)";
    broken_ = msg;
    return fail(timed_out ? SF_ERR_TIMEOUT : SF_ERR, msg);
  } catch (...) {
    broken_ = std::string(what) + " failed on node " + std::to_string(opt_.rank) + ": unknown error";
    return fail(SF_ERR, broken_);
  }
}

namespace {
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

sf_status GlooCommunicator::allreduce(void* data, size_t count, sf_dtype dtype, sf_reduce_op op) {
  if (!dtype_name(dtype)) return fail(SF_ERR_INVALID, "allreduce: unknown dtype " + std::to_string(dtype));
  if (op != SF_REDUCE_SUM && op != SF_REDUCE_MAX && op != SF_REDUCE_MIN)
    return fail(SF_ERR_INVALID, "allreduce: unknown reduce op " + std::to_string(op));
  if (count == 0 || opt_.size == 1) return SF_OK;
  if (!data) return fail(SF_ERR_INVALID, "allreduce: data is NULL");
  return guarded("allreduce", [&] {
    switch (dtype) {
      case SF_DTYPE_F32: ring_allreduce(ctx_, static_cast<float*>(data), count, op, opt_.chunk_bytes, tag_, opt_.timeout); break;
      case SF_DTYPE_F64: ring_allreduce(ctx_, static_cast<double*>(data), count, op, opt_.chunk_bytes, tag_, opt_.timeout); break;
      case SF_DTYPE_I32: ring_allreduce(ctx_, static_cast<int32_t*>(data), count, op, opt_.chunk_bytes, tag_, opt_.timeout); break;
      case SF_DTYPE_I64: ring_allreduce(ctx_, static_cast<int64_t*>(data), count, op, opt_.chunk_bytes, tag_, opt_.timeout); break;
    }
  });
}

sf_status GlooCommunicator::broadcast(void* data, size_t bytes, uint32_t root) {
  if (root >= opt_.size)
    return fail(SF_ERR_INVALID, "broadcast: root " + std::to_string(root) + " is not a rank (size " +
                                    std::to_string(opt_.size) + ")");
  if (bytes == 0 || opt_.size == 1) return SF_OK;
  if (!data) return fail(SF_ERR_INVALID, "broadcast: data is NULL");
  return guarded("broadcast", [&] {
    auto* p = static_cast<uint8_t*>(data);
    for (size_t off = 0; off < bytes; off += opt_.chunk_bytes) {
      const size_t n = std::min(opt_.chunk_bytes, bytes - off);
      gloo::BroadcastOptions o(ctx_);
      o.setOutput(p + off, n);
      o.setRoot(static_cast<int>(root));
      o.setTag(tag_++);
      o.setTimeout(opt_.timeout);
      gloo::broadcast(o);
    }
  });
}

sf_status GlooCommunicator::allgather(const void* in, size_t bytes, void* out) {
  if (bytes == 0) return SF_OK;
  if (!in || !out) return fail(SF_ERR_INVALID, "allgather: in or out is NULL");
  if (opt_.size == 1) {
    std::memmove(out, in, bytes);
    return SF_OK;
  }
  return guarded("allgather", [&] {
    auto* src = static_cast<uint8_t*>(const_cast<void*>(in));
    auto* dst = static_cast<uint8_t*>(out);
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
  });
}

sf_status GlooCommunicator::barrier() {
  if (opt_.size == 1) return SF_OK;
  return guarded("barrier", [&] {
    gloo::BarrierOptions o(ctx_);
    o.setTag(tag_++);
    o.setTimeout(opt_.timeout);
    gloo::barrier(o);
  });
}

}  // namespace skyforge
