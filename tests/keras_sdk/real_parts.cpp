// real_parts.hpp: the real cpu backend behind its C table, real GlooCommunicators over a real
// rendezvous store, and the forwarding spies.
#include "real_parts.hpp"

#include <skyforge/sdk.hpp>

#include "communicator.hpp"  // host/src/node (skyforge_worker)
#include "cpu_engine.hpp"    // backends/cpu (skyforge_cpu_engine)
#include "store.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <stdexcept>
#include <thread>

namespace real {

// ---- the cpu backend ----------------------------------------------------------------------------
namespace {

// The same ComputeBackend the `cpu` plugin registers (backends/cpu/cpu_plugin.cpp) around the
// engine library, without its `threads` option (tests pass CompileOptions::threads instead).
class CpuBackend : public skyforge::ComputeBackend {
 public:
  using ComputeBackend::ComputeBackend;
  std::unique_ptr<skyforge::Engine> create_engine(const skyforge::ModelSpec& spec,
                                                  const skyforge::Communicator& comm) override {
    return skyforge::cpu::make_engine(spec, comm);
  }
};

}  // namespace

CpuInstance::CpuInstance() {
  // As the plugin descriptor's create() (what the host calls when it loads the .so).
  if (skyforge::detail::create<CpuBackend>(nullptr, nullptr, 0, &self_) != SF_OK)
    throw std::runtime_error(std::string("cpu backend create: ") + skyforge::detail::last_error(nullptr));
}
CpuInstance::~CpuInstance() { skyforge::detail::destroy<CpuBackend>(self_); }
skyforge::keras::Backend CpuInstance::backend() const {
  return skyforge::keras::Backend(skyforge::detail::compute_hooks<CpuBackend>(), self_);
}
uint64_t CpuInstance::engine_step(void* engine) {
  // detail::compute_hooks' engine handle is the skyforge::Engine that create_engine returned.
  auto* e = dynamic_cast<skyforge::cpu::CpuEngine*>(static_cast<skyforge::Engine*>(engine));
  if (!e) throw std::logic_error("engine_step: not a cpu engine");
  return e->step();
}

// ---- BackendSpy ----------------------------------------------------------------------------------
namespace {

BackendSpy& spy_of(void* self) { return *static_cast<BackendSpy*>(self); }
const sf_compute_hooks& real_hooks(void* self) { return *spy_of(self).real().hooks; }
void* real_self(void* self) { return spy_of(self).real().self; }

SeenSpec copy_spec(const sf_model_spec& s) {
  SeenSpec out;
  out.input_shape.assign(s.input_shape, s.input_shape + s.input_rank);
  for (size_t i = 0; i < s.n_layers; ++i) {
    out.layer_types.emplace_back(s.layers[i].type);
    auto& opts = out.layer_options.emplace_back();
    for (size_t k = 0; k < s.layers[i].n_options; ++k)
      opts.emplace_back(s.layers[i].options[k].key, s.layers[i].options[k].value);
  }
  out.optimizer = s.optimizer ? s.optimizer : "";
  for (size_t k = 0; k < s.n_optimizer_options; ++k)
    out.optimizer_options.emplace_back(s.optimizer_options[k].key, s.optimizer_options[k].value);
  out.loss = s.loss ? s.loss : "";
  out.seed = s.seed;
  out.threads = s.threads;
  return out;
}

const sf_compute_hooks* spy_hooks() {
  static const sf_compute_hooks h = [] {
    sf_compute_hooks t{};
    t.struct_size = sizeof t;
    t.engine_create = [](void* self, const sf_model_spec* spec, const sf_communicator* comm, void** engine) {
      BackendSpy& s = spy_of(self);
      s.seen = copy_spec(*spec);
      sf_model_spec handed = *spec;
      if (!s.loss_override.empty()) handed.loss = s.loss_override.c_str();
      const sf_status st = real_hooks(self).engine_create(real_self(self), &handed, comm, engine);
      if (st == SF_OK) {
        ++s.engines_created;
        s.last_engine = *engine;
      }
      return st;
    };
    t.engine_destroy = [](void* self, void* engine) {
      if (spy_of(self).last_engine == engine) spy_of(self).last_engine = nullptr;
      real_hooks(self).engine_destroy(real_self(self), engine);
    };
    t.engine_last_error = [](void* self, void* engine) {
      return real_hooks(self).engine_last_error(real_self(self), engine);
    };
    t.train_step = [](void* self, void* engine, const float* x, const int32_t* y, uint32_t batch,
                      sf_step_result* out) {
      ++spy_of(self).train_calls;
      spy_of(self).train_batches.push_back(batch);
      return real_hooks(self).train_step(real_self(self), engine, x, y, batch, out);
    };
    t.eval_step = [](void* self, void* engine, const float* x, const int32_t* y, uint32_t batch,
                     sf_step_result* out) {
      ++spy_of(self).eval_calls;
      spy_of(self).eval_batches.push_back(batch);
      return real_hooks(self).eval_step(real_self(self), engine, x, y, batch, out);
    };
    t.predict = [](void* self, void* engine, const float* x, uint32_t batch, float* logits) {
      ++spy_of(self).predict_calls;
      return real_hooks(self).predict(real_self(self), engine, x, batch, logits);
    };
    t.param_count = [](void* self, void* engine, uint64_t* n) {
      return real_hooks(self).param_count(real_self(self), engine, n);
    };
    t.get_params = [](void* self, void* engine, float* out, uint64_t n) {
      return real_hooks(self).get_params(real_self(self), engine, out, n);
    };
    t.set_params = [](void* self, void* engine, const float* in, uint64_t n) {
      return real_hooks(self).set_params(real_self(self), engine, in, n);
    };
    t.state_dict = [](void* self, void* engine, sf_sink out) {
      return real_hooks(self).state_dict(real_self(self), engine, out);
    };
    t.load_state = [](void* self, void* engine, const char* data, size_t n) {
      return real_hooks(self).load_state(real_self(self), engine, data, n);
    };
    return t;
  }();
  return &h;
}

}  // namespace

skyforge::keras::Backend BackendSpy::backend() { return skyforge::keras::Backend(spy_hooks(), this); }

// ---- CommSpy -------------------------------------------------------------------------------------
namespace {
const char* dtype_name(sf_dtype t) {
  switch (t) {
    case SF_DTYPE_F32: return "f32";
    case SF_DTYPE_F64: return "f64";
    case SF_DTYPE_I32: return "i32";
    case SF_DTYPE_I64: return "i64";
    default: return "dtype?";
  }
}
const char* op_name(sf_reduce_op op) {
  return op == SF_REDUCE_SUM ? "sum" : op == SF_REDUCE_MAX ? "max" : op == SF_REDUCE_MIN ? "min" : "op?";
}
}  // namespace

struct CommSpyGlue {
  static CommSpy& of(void* ctx) { return *static_cast<CommSpy*>(ctx); }
  static const sf_communicator& real(void* ctx) { return *of(ctx).real_; }
  static sf_status allreduce(void* ctx, void* data, size_t count, sf_dtype dtype, sf_reduce_op op) {
    of(ctx).calls.push_back("allreduce n=" + std::to_string(count) + " " + dtype_name(dtype) + " " + op_name(op));
    return real(ctx).allreduce(real(ctx).ctx, data, count, dtype, op);
  }
  static sf_status broadcast(void* ctx, void* data, size_t bytes, uint32_t root) {
    of(ctx).calls.push_back("broadcast " + std::to_string(bytes) + " B root " + std::to_string(root));
    return real(ctx).broadcast(real(ctx).ctx, data, bytes, root);
  }
  static sf_status allgather(void* ctx, const void* in, size_t bytes, void* out) {
    of(ctx).calls.push_back("allgather " + std::to_string(bytes) + " B");
    return real(ctx).allgather(real(ctx).ctx, in, bytes, out);
  }
  static sf_status barrier(void* ctx) {
    of(ctx).calls.push_back("barrier");
    return real(ctx).barrier(real(ctx).ctx);
  }
  static const char* last_error(void* ctx) { return real(ctx).last_error(real(ctx).ctx); }
};

CommSpy::CommSpy(const sf_communicator* real) : real_(real) {
  table_.struct_size = sizeof(sf_communicator);
  table_.ctx = this;
  table_.rank = real->rank;
  table_.size = real->size;
  table_.allreduce = &CommSpyGlue::allreduce;
  table_.broadcast = &CommSpyGlue::broadcast;
  table_.allgather = &CommSpyGlue::allgather;
  table_.barrier = &CommSpyGlue::barrier;
  table_.last_error = &CommSpyGlue::last_error;
}

// ---- ranks over real communicators ---------------------------------------------------------------
RanksResult run_ranks_on(uint32_t world, const std::function<void(uint32_t, const sf_communicator*)>& f,
                         Transport transport) {
  static std::atomic<int> worlds{0};
  const std::string secret = "keras-sdk-test";
  const std::string prefix = "keras_sdk/" + std::to_string(worlds++) + "/";

  // The pool's store, as the head node runs it, on loopback with an ephemeral port.
  boost::asio::io_context io;
  auto guard = boost::asio::make_work_guard(io);
  std::thread io_thread([&] { io.run(); });
  struct Stop {
    boost::asio::io_context& io;
    decltype(guard)& g;
    std::thread& t;
    std::unique_ptr<skyforge::net::StoreServer> server;
    ~Stop() {
      if (server) server->close();
      g.reset();
      io.stop();
      t.join();
    }
  } stop{io, guard, io_thread, nullptr};
  stop.server = std::make_unique<skyforge::net::StoreServer>(io, "127.0.0.1", 0, secret);
  const uint16_t port = stop.server->port();

  RanksResult out;
  out.errors.resize(world);
  out.transports.resize(world);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto client = skyforge::net::StoreClient::connect("127.0.0.1", port, secret, r, 5000);
        skyforge::GlooCommunicator::Options o;
        o.rank = r;
        o.size = world;
        o.prefix = prefix;
        o.timeout = std::chrono::seconds(20);
        if (transport == Transport::tcp) o.shm = false;
        skyforge::GlooCommunicator comm(*client, o);
        out.transports[r] = comm.transport();
        f(r, comm.table());
      } catch (const std::exception& e) {
        out.errors[r] = e.what();
        if (out.errors[r].empty()) out.errors[r] = "(empty exception message)";
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace real
