// The pool communicator's front (communicator.hpp): the sf_communicator table, the choice of
// transport (shared memory, communicator_shm.cpp, or Gloo/TCP, communicator_gloo.cpp), one
// collective at a time, and every failure turned into a status and a last_error() message.
#include "communicator_internal.hpp"

#include <skyforge/config_keys.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "store.hpp"

namespace skyforge {
namespace {

thread_local std::string t_error;

sf_status fail(sf_status st, std::string message) {
  t_error = std::move(message);
  return st;
}

}  // namespace

std::string seconds_text(std::chrono::milliseconds t) {
  const auto ms = t.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", double(ms) / 1000.0);
  return buf;
}

uint64_t dtype_size(sf_dtype d) { return d == SF_DTYPE_F64 || d == SF_DTYPE_I64 ? 8 : 4; }

const char* dtype_name(sf_dtype d) {
  switch (d) {
    case SF_DTYPE_F32: return "f32";
    case SF_DTYPE_F64: return "f64";
    case SF_DTYPE_I32: return "i32";
    case SF_DTYPE_I64: return "i64";
    default: return nullptr;
  }
}

std::chrono::milliseconds GlooCommunicator::parse_timeout(const char* config_value, const char* env_value) {
  const double s = skyforge::config::collective_timeout_s(config_value, env_value);
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

  const bool on_shm = try_shm(store);
  if (!on_shm) setup_gloo(store);
  transport_ = on_shm ? "shm" : "gloo";
  if (opt_.rank == 0) store.set(opt_.prefix + "transport", transport_);
}

GlooCommunicator::~GlooCommunicator() {
  std::lock_guard<std::mutex> lock(mu_);
  shm_.reset();
  ctx_.reset();
}

const char* GlooCommunicator::last_error() { return t_error.c_str(); }

template <class F>
sf_status GlooCommunicator::guarded(const char* what, uint64_t bytes, F&& f) {
  auto now_ns = [] { return std::chrono::steady_clock::now().time_since_epoch().count(); };
  op_ = what;
  bytes_ = bytes;
  changed_ns_ = now_ns();
  entered_.fetch_add(1);
  struct Done {
    GlooCommunicator* c;
    decltype(now_ns)& now;
    ~Done() {
      c->changed_ns_ = now();
      c->done_.fetch_add(1);
    }
  } done{this, now_ns};
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.empty())
    return fail(SF_ERR, std::string(what) + ": the communicator is unusable after an earlier failure: " + broken_);
  if (!ctx_ && !shm_) return fail(SF_ERR, std::string(what) + ": the communicator is closed");
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
    if (shm_) shm_->mark_broken();  // peers waiting for this node fail now, not after their timeout
    return fail(timed_out ? SF_ERR_TIMEOUT : SF_ERR, msg);
  } catch (...) {
    if (shm_) shm_->mark_broken();
    broken_ = std::string(what) + " failed on node " + std::to_string(opt_.rank) + ": unknown error";
    return fail(SF_ERR, broken_);
  }
}

sf_status GlooCommunicator::allreduce(void* data, size_t count, sf_dtype dtype, sf_reduce_op op) {
  if (!dtype_name(dtype)) return fail(SF_ERR_INVALID, "allreduce: unknown dtype " + std::to_string(dtype));
  if (op != SF_REDUCE_SUM && op != SF_REDUCE_MAX && op != SF_REDUCE_MIN)
    return fail(SF_ERR_INVALID, "allreduce: unknown reduce op " + std::to_string(op));
  if (count == 0 || opt_.size == 1) return SF_OK;
  if (!data) return fail(SF_ERR_INVALID, "allreduce: data is NULL");
  return guarded("allreduce", count * dtype_size(dtype), [&] {
    if (shm_) return shm_->allreduce(data, count, dtype, op);
    gloo_allreduce(data, count, dtype, op);
  });
}

sf_status GlooCommunicator::broadcast(void* data, size_t bytes, uint32_t root) {
  if (root >= opt_.size)
    return fail(SF_ERR_INVALID, "broadcast: root " + std::to_string(root) + " is not a rank (size " +
                                    std::to_string(opt_.size) + ")");
  if (bytes == 0 || opt_.size == 1) return SF_OK;
  if (!data) return fail(SF_ERR_INVALID, "broadcast: data is NULL");
  return guarded("broadcast", bytes, [&] {
    auto* p = static_cast<uint8_t*>(data);
    if (shm_) return shm_->broadcast(p, bytes, root);
    gloo_broadcast(p, bytes, root);
  });
}

sf_status GlooCommunicator::allgather(const void* in, size_t bytes, void* out) {
  if (bytes == 0) return SF_OK;
  if (!in || !out) return fail(SF_ERR_INVALID, "allgather: in or out is NULL");
  if (opt_.size == 1) {
    std::memmove(out, in, bytes);
    return SF_OK;
  }
  return guarded("allgather", bytes, [&] {
    auto* src = static_cast<uint8_t*>(const_cast<void*>(in));
    auto* dst = static_cast<uint8_t*>(out);
    if (shm_) return shm_->allgather(src, bytes, dst);
    gloo_allgather(src, bytes, dst);
  });
}

sf_status GlooCommunicator::barrier() {
  if (opt_.size == 1) return SF_OK;
  return guarded("barrier", 0, [&] {
    if (shm_) return shm_->barrier();
    gloo_barrier();
  });
}

GlooCommunicator::Progress GlooCommunicator::progress() const {
  Progress p;
  p.done = done_.load();
  p.entered = entered_.load();
  p.op = op_.load();
  p.bytes = bytes_.load();
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  p.since_ms = std::max<int64_t>(0, (now - changed_ns_.load()) / 1000000);
  return p;
}

}  // namespace skyforge
