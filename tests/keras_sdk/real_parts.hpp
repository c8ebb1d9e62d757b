// The real parts the Keras SDK tests run on (no fakes):
//  - CpuInstance: the real `cpu` compute backend (backends/cpu, static library
//    skyforge_cpu_engine) behind the sf_compute_hooks table that skyforge::detail::compute_hooks
//    builds for its plugin, i.e. exactly what a native app gets from Host::compute_backend();
//  - run_ranks: W ranks as threads, each with its own real GlooCommunicator (host/src/node,
//    skyforge_worker) built over a real rendezvous store (StoreServer on loopback, in-process);
//  - BackendSpy / CommSpy: thin decorators over those real tables that forward EVERY call
//    unchanged and only count (and record what they forwarded), for the tests that assert how
//    the SDK drives a backend or a communicator.
// Implemented in real_parts.cpp, so the test files need neither Boost nor Gloo headers.
#pragma once

#include <skyforge/abi.h>
#include <skyforge/keras.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model_util.hpp"

namespace real {

// One instance of the real cpu backend; engines made through backend() belong to it.
class CpuInstance {
 public:
  CpuInstance();
  ~CpuInstance();
  CpuInstance(const CpuInstance&) = delete;
  CpuInstance& operator=(const CpuInstance&) = delete;
  skyforge::keras::Backend backend() const;
  // skyforge::cpu::CpuEngine::step() (optimizer updates applied) of an engine made by
  // backend()'s engine_create (the `engine` handle the C table passes around).
  static uint64_t engine_step(void* engine);

 private:
  void* self_ = nullptr;
};

// What the last engine_create was handed, copied out of the C spec.
struct SeenSpec {
  using Opts = std::vector<std::pair<std::string, std::string>>;
  std::vector<uint32_t> input_shape;
  std::vector<std::string> layer_types;
  std::vector<Opts> layer_options;
  std::string optimizer;
  Opts optimizer_options;
  std::string loss;
  uint64_t seed = 0;
  uint32_t threads = 0;
};

// Forwards every sf_compute_hooks call to `real` (same engine handles, same statuses, same
// messages) and counts. Not copyable: backend() hands out a pointer to this object.
class BackendSpy {
 public:
  explicit BackendSpy(skyforge::keras::Backend real) : real_(real) {}
  BackendSpy(const BackendSpy&) = delete;
  BackendSpy& operator=(const BackendSpy&) = delete;
  skyforge::keras::Backend backend();
  const skyforge::keras::Backend& real() const { return real_; }

  uint64_t engines_created = 0;
  uint64_t train_calls = 0, eval_calls = 0, predict_calls = 0;
  // Non-empty: engine_create hands the real backend this loss instead of the SDK's (a spec the
  // SDK would refuse, to see the backend's own refusal reach the caller).
  std::string loss_override;
  std::vector<uint32_t> train_batches;  // per train_step, this rank's batch
  std::vector<uint32_t> eval_batches;
  SeenSpec seen;
  void* last_engine = nullptr;  // the real engine handle of the last successful engine_create

 private:
  skyforge::keras::Backend real_;
};

// The real cpu backend seen through a BackendSpy: what most tests bind a model to.
struct SpiedCpu {
  CpuInstance cpu;
  BackendSpy spy{cpu.backend()};
  skyforge::keras::Backend backend() { return spy.backend(); }
  uint64_t engine_step() const { return CpuInstance::engine_step(spy.last_engine); }
};

// Compile options on a spied cpu backend: one engine thread (ranks are threads and the machine
// may have 1-2 cores), `comm` for data parallelism (null: one rank), `seed`.
inline skyforge::keras::CompileOptions bind(SpiedCpu& b, const sf_communicator* comm = nullptr, uint64_t seed = 7) {
  skyforge::keras::CompileOptions o;
  o.backend = b.backend();
  o.communicator = skyforge::Communicator(comm);
  o.seed = seed;
  o.threads = 1;
  return o;
}

// small_model() compiled as most tests train it: SGD(0.3), sparse categorical cross-entropy and
// accuracy, on `b` as bind(b, comm, seed) sets it up.
inline skyforge::keras::Sequential sgd_model(SpiedCpu& b, const sf_communicator* comm = nullptr, uint64_t seed = 7) {
  skyforge::keras::Sequential m = model_util::small_model();
  m.compile(skyforge::keras::SGD{0.3}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b, comm, seed));
  return m;
}

// Forwards every sf_communicator call to `real` and records its signature ("allreduce n=3
// f64 sum", "broadcast 84 B root 0", ...), in call order.
class CommSpy {
 public:
  explicit CommSpy(const sf_communicator* real);
  CommSpy(const CommSpy&) = delete;
  CommSpy& operator=(const CommSpy&) = delete;
  const sf_communicator* table() const { return &table_; }
  std::vector<std::string> calls;

 private:
  const sf_communicator* real_;
  sf_communicator table_{};
  friend struct CommSpyGlue;
};

// Which transport the GlooCommunicator may pick: whatever it chooses by default for ranks that
// are all on this host (its shared-memory path, unless SKYFORGE_COMM_SHM=0), or Gloo/TCP only
// (Options::shm = false).
enum class Transport { automatic, tcp };

struct RanksResult {
  std::vector<std::string> errors;      // per rank: "" = returned normally, else the exception's text
  std::vector<std::string> transports;  // per rank: GlooCommunicator::transport()
};

// Runs f(rank, comm) on `world` threads; each thread connects to a fresh in-process rendezvous
// store, builds its GlooCommunicator (a collective, 20 s timeout so a hang fails the test instead
// of the ctest timeout) and passes its sf_communicator table. Exceptions are caught per rank.
RanksResult run_ranks_on(uint32_t world, const std::function<void(uint32_t, const sf_communicator*)>& f,
                         Transport transport = Transport::automatic);
inline std::vector<std::string> run_ranks(uint32_t world,
                                          const std::function<void(uint32_t, const sf_communicator*)>& f,
                                          Transport transport = Transport::automatic) {
  return run_ranks_on(world, f, transport).errors;
}

}  // namespace real
