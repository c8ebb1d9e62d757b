// One engine of a backend, driven through its C table only (sf_compute_hooks), as a node's
// keras job drives it; and how a check reports that it does not hold or does not apply.
#pragma once

#include <skyforge/keras.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "models.hpp"

namespace skyforge::backend_check {

namespace kd = keras::detail;

// A check that does not hold / does not apply to this backend (SF_ERR_UNSUPPORTED).
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct Skip : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Engine {
 public:
  Engine(keras::Backend b, const Model& m, uint64_t seed, const sf_communicator* comm = nullptr) {
    spec_.layers = m.layers;
    spec_.input_shape = m.input;
    spec_.optimizer = m.optimizer;
    spec_.optimizer_options = m.optimizer_options;
    spec_.loss = "sparse_categorical_crossentropy";
    spec_.build(seed, 1);
    try {
      h_ = std::make_unique<kd::EngineHandle>(b, spec_.spec, Communicator(comm));
    } catch (const Error& e) {
      if (e.status() == SF_ERR_UNSUPPORTED) throw Skip(e.what());
      throw Failure(e.what());
    }
    uint64_t n = 0;
    check(h_->hooks().param_count(h_->self(), h_->engine(), &n), "param_count");
    n_ = static_cast<size_t>(n);
  }
  size_t param_count() const { return n_; }
  // train_step / eval_step; the status, with the engine's message in *why.
  sf_status try_step(bool train, const Vec& x, const std::vector<int32_t>& y, uint32_t batch, sf_step_result& r,
                     std::string* why = nullptr) {
    r = sf_step_result{};
    r.struct_size = sizeof r;
    auto fn = train ? h_->hooks().train_step : h_->hooks().eval_step;
    const sf_status st = fn(h_->self(), h_->engine(), x.data(), y.data(), batch, &r);
    if (st != SF_OK && why) *why = message();
    return st;
  }
  sf_step_result step(bool train, const Vec& x, const std::vector<int32_t>& y, uint32_t batch) {
    sf_step_result r;
    check(try_step(train, x, y, batch, r), train ? "train_step" : "eval_step");
    return r;
  }
  Vec params() const {
    Vec p(n_);
    check(h_->hooks().get_params(h_->self(), h_->engine(), p.data(), n_), "get_params");
    return p;
  }
  void set_params(const Vec& p) { check(h_->hooks().set_params(h_->self(), h_->engine(), p.data(), p.size()), "set_params"); }
  std::string state() const {
    std::string s;
    check(h_->hooks().state_dict(h_->self(), h_->engine(), skyforge::detail::string_sink(s)), "state_dict");
    return s;
  }
  // Bound data (ABI 1.8): false when the backend has no such hooks or keeps no data here.
  bool bind(const Vec& x, const std::vector<int32_t>& y) {
    const sf_compute_hooks& h = h_->hooks();
    if (!h.bind_data) return false;
    const sf_status st = h.bind_data(h_->self(), h_->engine(), x.data(), y.data(), y.size(), &data_);
    if (st == SF_ERR_UNSUPPORTED) return false;
    check(st, "bind_data");
    return true;
  }
  sf_status try_indexed(bool train, uint64_t data, const std::vector<uint64_t>& idx, sf_step_result* r,
                        std::string* why = nullptr) {
    if (r) *r = sf_step_result{}, r->struct_size = sizeof *r;
    auto fn = train ? h_->hooks().train_step_indexed : h_->hooks().eval_step_indexed;
    const sf_status st = fn(h_->self(), h_->engine(), data, idx.data(), static_cast<uint32_t>(idx.size()), r);
    if (st != SF_OK && why) *why = message();
    return st;
  }
  // ABI 1.9, where the table has it: every rank's batch for the next indexed step (one rank here).
  void step_batches(uint32_t batch) {
    const sf_compute_hooks& h = h_->hooks();
    if (h.struct_size >= offsetof(sf_compute_hooks, step_batches) + sizeof(h.step_batches) && h.step_batches)
      check(h.step_batches(h_->self(), h_->engine(), &batch, 1), "step_batches");
  }
  void indexed(bool train, const std::vector<uint64_t>& idx, sf_step_result* r) {
    check(try_indexed(train, data_, idx, r), train ? "train_step_indexed" : "eval_step_indexed");
  }
  sf_step_result take() {
    sf_step_result r{};
    r.struct_size = sizeof r;
    check(h_->hooks().take_results(h_->self(), h_->engine(), &r), "take_results");
    return r;
  }
  sf_status release(uint64_t data) { return h_->hooks().release_data(h_->self(), h_->engine(), data); }
  uint64_t data() const { return data_; }
  sf_status try_load(const std::string& s, std::string* why) {
    const sf_status st = h_->hooks().load_state(h_->self(), h_->engine(), s.data(), s.size());
    if (st != SF_OK) *why = message();
    return st;
  }

 private:
  std::string message() const {
    const char* m = h_->hooks().engine_last_error(h_->self(), h_->engine());
    return m ? m : "";
  }
  void check(sf_status st, const char* what) const {
    if (st != SF_OK) throw Failure(std::string(what) + " failed: " + (message().empty() ? "no message" : message()));
  }

  kd::CompiledSpec spec_;
  std::unique_ptr<kd::EngineHandle> h_;
  size_t n_ = 0;
  uint64_t data_ = 0;  // the bound set
};

}  // namespace skyforge::backend_check
