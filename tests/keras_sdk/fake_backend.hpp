// Test doubles for the Keras SDK: a tiny compute backend behind the real C table
// (sf_compute_hooks) and an in-process communicator (sf_communicator) whose ranks are threads.
//
// The engine is softmax regression on the flattened input (the model's layers only decide the
// class count: the last dense's units), trained by plain SGD with gradients averaged over the
// global batch through the communicator, exactly the contract abi.h states. It counts its
// calls so tests can check that every rank makes the same collective calls.
#pragma once

#include <skyforge/abi.h>
#include <skyforge/data.hpp>

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace fake {

// ---- communicator over threads ---------------------------------------------------------------
struct Shared {
  explicit Shared(uint32_t w) : world(w), bar(static_cast<std::ptrdiff_t>(w)), slots(w) {}
  uint32_t world;
  std::barrier<> bar;
  std::vector<std::vector<char>> slots;
  int64_t calls = 0;
};

struct RankComm {
  Shared* shared = nullptr;
  uint32_t rank = 0;
  sf_communicator c{};
  std::string err;
  uint64_t collectives = 0;
};

template <class T>
void reduce_into(const std::vector<std::vector<char>>& slots, void* data, size_t count, sf_reduce_op op) {
  std::vector<T> acc(count);
  std::memcpy(acc.data(), slots[0].data(), count * sizeof(T));
  for (size_t r = 1; r < slots.size(); ++r) {
    const T* v = reinterpret_cast<const T*>(slots[r].data());
    for (size_t i = 0; i < count; ++i) {
      if (op == SF_REDUCE_SUM) acc[i] += v[i];
      else if (op == SF_REDUCE_MAX) acc[i] = std::max(acc[i], v[i]);
      else acc[i] = std::min(acc[i], v[i]);
    }
  }
  std::memcpy(data, acc.data(), count * sizeof(T));
}

inline size_t dtype_size(sf_dtype t) { return t == SF_DTYPE_F32 || t == SF_DTYPE_I32 ? 4 : 8; }

inline sf_status c_allreduce(void* ctx, void* data, size_t count, sf_dtype dtype, sf_reduce_op op) {
  auto* rc = static_cast<RankComm*>(ctx);
  ++rc->collectives;
  Shared& s = *rc->shared;
  auto& mine = s.slots[rc->rank];
  mine.assign(static_cast<char*>(data), static_cast<char*>(data) + count * dtype_size(dtype));
  s.bar.arrive_and_wait();
  switch (dtype) {
    case SF_DTYPE_F32: reduce_into<float>(s.slots, data, count, op); break;
    case SF_DTYPE_F64: reduce_into<double>(s.slots, data, count, op); break;
    case SF_DTYPE_I32: reduce_into<int32_t>(s.slots, data, count, op); break;
    default: reduce_into<int64_t>(s.slots, data, count, op); break;
  }
  s.bar.arrive_and_wait();
  return SF_OK;
}
inline sf_status c_broadcast(void* ctx, void* data, size_t bytes, uint32_t root) {
  auto* rc = static_cast<RankComm*>(ctx);
  ++rc->collectives;
  Shared& s = *rc->shared;
  if (rc->rank == root) s.slots[root].assign(static_cast<char*>(data), static_cast<char*>(data) + bytes);
  s.bar.arrive_and_wait();
  if (rc->rank != root) {
    if (s.slots[root].size() != bytes) {
      rc->err = "broadcast size mismatch";
      s.bar.arrive_and_wait();
      return SF_ERR;
    }
    std::memcpy(data, s.slots[root].data(), bytes);
  }
  s.bar.arrive_and_wait();
  return SF_OK;
}
inline sf_status c_allgather(void* ctx, const void* in, size_t bytes, void* out) {
  auto* rc = static_cast<RankComm*>(ctx);
  ++rc->collectives;
  Shared& s = *rc->shared;
  s.slots[rc->rank].assign(static_cast<const char*>(in), static_cast<const char*>(in) + bytes);
  s.bar.arrive_and_wait();
  for (uint32_t r = 0; r < s.world; ++r) std::memcpy(static_cast<char*>(out) + r * bytes, s.slots[r].data(), bytes);
  s.bar.arrive_and_wait();
  return SF_OK;
}
inline sf_status c_barrier(void* ctx) {
  auto* rc = static_cast<RankComm*>(ctx);
  ++rc->collectives;
  rc->shared->bar.arrive_and_wait();
  return SF_OK;
}
inline const char* c_last_error(void* ctx) { return static_cast<RankComm*>(ctx)->err.c_str(); }

// World of `w` ranks; rank r's communicator is comms[r]->c.
struct World {
  explicit World(uint32_t w) : shared(w) {
    for (uint32_t r = 0; r < w; ++r) {
      auto rc = std::make_unique<RankComm>();
      rc->shared = &shared;
      rc->rank = r;
      rc->c = sf_communicator{sizeof(sf_communicator), rc.get(), r, w, &c_allreduce, &c_broadcast,
                              &c_allgather, &c_barrier, &c_last_error};
      comms.push_back(std::move(rc));
    }
  }
  const sf_communicator* comm(uint32_t r) const { return &comms[r]->c; }
  Shared shared;
  std::vector<std::unique_ptr<RankComm>> comms;
};

// ---- the engine ------------------------------------------------------------------------------
struct Engine {
  size_t d = 0, c = 0;
  double lr = 0.01;
  std::vector<float> w;  // d x c, then c biases
  const sf_communicator* comm = nullptr;
  std::string err;
  uint64_t train_calls = 0, eval_calls = 0, predict_calls = 0;
  std::vector<uint32_t> train_batches;
  uint64_t steps = 0;  // part of the state

  // Local sums for a batch: gradient (unless null), loss, correct.
  void local(const float* x, const int32_t* y, uint32_t n, std::vector<double>* grad, double& loss,
             double& correct) const {
    std::vector<double> z(c);
    for (uint32_t i = 0; i < n; ++i) {
      const float* xi = x + i * d;
      for (size_t k = 0; k < c; ++k) {
        double s = w[d * c + k];
        for (size_t j = 0; j < d; ++j) s += static_cast<double>(xi[j]) * w[j * c + k];
        z[k] = s;
      }
      double m = z[0];
      size_t arg = 0;
      for (size_t k = 1; k < c; ++k)
        if (z[k] > m) m = z[k], arg = k;
      double sum = 0;
      for (size_t k = 0; k < c; ++k) sum += std::exp(z[k] - m);
      const auto yi = static_cast<size_t>(y[i]);
      loss += -(z[yi] - m - std::log(sum));
      correct += arg == yi ? 1 : 0;
      if (grad) {
        for (size_t k = 0; k < c; ++k) {
          const double g = std::exp(z[k] - m) / sum - (k == yi ? 1.0 : 0.0);
          for (size_t j = 0; j < d; ++j) (*grad)[j * c + k] += g * xi[j];
          (*grad)[d * c + k] += g;
        }
      }
    }
  }
  sf_status step(const float* x, const int32_t* y, uint32_t n, sf_step_result* out, bool train) {
    if (n == 0) {
      err = "batch must be > 0";
      return SF_ERR_INVALID;
    }
    std::vector<double> buf(train ? w.size() + 3 : 3, 0.0);
    std::vector<double> grad(train ? w.size() : 0, 0.0);
    double loss = 0, correct = 0;
    local(x, y, n, train ? &grad : nullptr, loss, correct);
    std::copy(grad.begin(), grad.end(), buf.begin());
    buf[buf.size() - 3] = loss;
    buf[buf.size() - 2] = correct;
    buf[buf.size() - 1] = n;
    if (comm && comm->size > 1) {
      const sf_status st = comm->allreduce(comm->ctx, buf.data(), buf.size(), SF_DTYPE_F64, SF_REDUCE_SUM);
      if (st != SF_OK) return st;
    }
    const double total = buf.back();
    if (train) {
      for (size_t i = 0; i < w.size(); ++i) w[i] -= static_cast<float>(lr * buf[i] / total);
      ++steps;
    }
    out->struct_size = sizeof(sf_step_result);
    out->loss = buf[buf.size() - 3] / total;
    out->correct = static_cast<uint64_t>(buf[buf.size() - 2]);
    out->samples = static_cast<uint64_t>(total);
    return SF_OK;
  }
};

struct Backend {
  uint64_t engines_created = 0;
  std::string last_create_error;
  std::vector<std::string> seen_layer_types;  // of the last spec
  std::vector<std::vector<std::pair<std::string, std::string>>> seen_layer_options;
  std::string seen_optimizer;
  std::vector<std::pair<std::string, std::string>> seen_optimizer_options;
  uint64_t seen_seed = 0;
  Engine* last_engine = nullptr;
};

inline sf_status h_create(void* self, const sf_model_spec* spec, const sf_communicator* comm, void** out) {
  auto* b = static_cast<Backend*>(self);
  b->seen_layer_types.clear();
  b->seen_layer_options.clear();
  size_t classes = 0;
  for (size_t i = 0; i < spec->n_layers; ++i) {
    const sf_layer_spec& l = spec->layers[i];
    b->seen_layer_types.emplace_back(l.type);
    auto& opts = b->seen_layer_options.emplace_back();
    for (size_t k = 0; k < l.n_options; ++k) {
      opts.emplace_back(l.options[k].key, l.options[k].value);
      if (std::string(l.type) == "dense" && std::string(l.options[k].key) == "units")
        classes = std::stoul(l.options[k].value);
    }
  }
  b->seen_optimizer = spec->optimizer;
  b->seen_optimizer_options.clear();
  auto e = std::make_unique<Engine>();
  for (size_t k = 0; k < spec->n_optimizer_options; ++k) {
    b->seen_optimizer_options.emplace_back(spec->optimizer_options[k].key, spec->optimizer_options[k].value);
    if (std::string(spec->optimizer_options[k].key) == "learning_rate") e->lr = std::stod(spec->optimizer_options[k].value);
  }
  b->seen_seed = spec->seed;
  if (classes == 0) {
    b->last_create_error = "fake backend: no dense layer";
    return SF_ERR_INVALID;
  }
  e->d = 1;
  for (uint32_t i = 0; i < spec->input_rank; ++i) e->d *= spec->input_shape[i];
  e->c = classes;
  e->comm = comm;
  e->w.resize(e->d * e->c + e->c);
  skyforge::Rng rng(spec->seed);
  for (auto& v : e->w) v = static_cast<float>(static_cast<double>(rng.below(2001)) / 1000.0 - 1.0) * 0.05f;
  if (comm && comm->size > 1) {  // rank 0's initial weights everywhere
    const sf_status st = comm->broadcast(comm->ctx, e->w.data(), e->w.size() * sizeof(float), 0);
    if (st != SF_OK) return st;
  }
  ++b->engines_created;
  b->last_engine = e.get();
  *out = e.release();
  return SF_OK;
}
inline void h_destroy(void* self, void* e) {
  auto* b = static_cast<Backend*>(self);
  if (b->last_engine == e) b->last_engine = nullptr;
  delete static_cast<Engine*>(e);
}
inline const char* h_error(void* self, void* e) {
  return e ? static_cast<Engine*>(e)->err.c_str() : static_cast<Backend*>(self)->last_create_error.c_str();
}
inline sf_status h_train(void*, void* e, const float* x, const int32_t* y, uint32_t n, sf_step_result* out) {
  auto* en = static_cast<Engine*>(e);
  ++en->train_calls;
  en->train_batches.push_back(n);
  return en->step(x, y, n, out, true);
}
inline sf_status h_eval(void*, void* e, const float* x, const int32_t* y, uint32_t n, sf_step_result* out) {
  auto* en = static_cast<Engine*>(e);
  ++en->eval_calls;
  return en->step(x, y, n, out, false);
}
inline sf_status h_predict(void*, void* e, const float* x, uint32_t n, float* logits) {
  auto* en = static_cast<Engine*>(e);
  ++en->predict_calls;
  for (uint32_t i = 0; i < n; ++i)
    for (size_t k = 0; k < en->c; ++k) {
      double s = en->w[en->d * en->c + k];
      for (size_t j = 0; j < en->d; ++j) s += static_cast<double>(x[i * en->d + j]) * en->w[j * en->c + k];
      logits[i * en->c + k] = static_cast<float>(s);
    }
  return SF_OK;
}
inline sf_status h_count(void*, void* e, uint64_t* n) {
  *n = static_cast<Engine*>(e)->w.size();
  return SF_OK;
}
inline sf_status h_get(void*, void* e, float* out, uint64_t n) {
  auto* en = static_cast<Engine*>(e);
  if (n != en->w.size()) {
    en->err = "get_params: wrong count";
    return SF_ERR_INVALID;
  }
  std::memcpy(out, en->w.data(), n * sizeof(float));
  return SF_OK;
}
inline sf_status h_set(void*, void* e, const float* in, uint64_t n) {
  auto* en = static_cast<Engine*>(e);
  if (n != en->w.size()) {
    en->err = "set_params: wrong count";
    return SF_ERR_INVALID;
  }
  std::memcpy(en->w.data(), in, n * sizeof(float));
  return SF_OK;
}
inline sf_status h_state(void*, void* e, sf_sink out) {
  auto* en = static_cast<Engine*>(e);
  std::string s("FAKE", 4);
  s.append(reinterpret_cast<const char*>(&en->steps), sizeof en->steps);
  s.append(reinterpret_cast<const char*>(en->w.data()), en->w.size() * sizeof(float));
  out.write(out.ctx, s.data(), s.size());
  return SF_OK;
}
inline sf_status h_load(void*, void* e, const char* data, size_t n) {
  auto* en = static_cast<Engine*>(e);
  if (n != 4 + sizeof en->steps + en->w.size() * sizeof(float) || std::memcmp(data, "FAKE", 4) != 0) {
    en->err = "load_state: not this engine's state";
    return SF_ERR_INVALID;
  }
  std::memcpy(&en->steps, data + 4, sizeof en->steps);
  std::memcpy(en->w.data(), data + 4 + sizeof en->steps, en->w.size() * sizeof(float));
  return SF_OK;
}

inline const sf_compute_hooks* hooks() {
  static const sf_compute_hooks h = [] {
    sf_compute_hooks t{};
    t.struct_size = sizeof t;
    t.engine_create = &h_create;
    t.engine_destroy = &h_destroy;
    t.engine_last_error = &h_error;
    t.train_step = &h_train;
    t.eval_step = &h_eval;
    t.predict = &h_predict;
    t.param_count = &h_count;
    t.get_params = &h_get;
    t.set_params = &h_set;
    t.state_dict = &h_state;
    t.load_state = &h_load;
    return t;
  }();
  return &h;
}

}  // namespace fake
