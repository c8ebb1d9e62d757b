// skyforge::keras — a Keras-like API for native apps, header-only, over ANY compute backend.
//
//   namespace K = skyforge::keras;
//   auto [train, test] = skyforge::datasets::load_fashion_mnist();
//   auto info = host().instance_info();
//   auto [x, y] = skyforge::shard(info, /*shuffle=*/true, /*seed=*/42, ...);   // or Data::replicated
//
//   K::Sequential model({K::Input({28, 28, 1}),
//                        K::Conv2D(32, 3, 1, "same"), K::BatchNormalization(), K::ReLU(),
//                        K::MaxPooling2D(2), K::Flatten(),
//                        K::Dense(128, "relu"), K::Dropout(0.2), K::Dense(10)});
//   model.compile(K::Adam{1e-3}, "sparse_categorical_crossentropy", {"accuracy"},
//                 K::CompileOptions::from_host(host(), /*seed=*/42));
//   K::History h = model.fit(train.x, train.y, {.epochs = 5, .batch_size = 128,
//                                               .validation_data = {test.x, test.y},
//                                               .callbacks = {.csv = "history.csv",
//                                                             .tensorboard = "logs",
//                                                             .checkpoint_dir = "ckpt",
//                                                             .resume = true}});
//   K::EvalResult r = model.evaluate(test.x, test.y, 256);
//
// Or Keras' functional form (keras_layers.hpp): calls of layers on tensors, then Model:
//   auto inputs = K::Input({28, 28, 1});
//   auto x = K::Conv2D(16, 3, {.padding = "same", .name = "stem"})(inputs);
//   auto y = K::Conv2D(16, 3, {.padding = "same"})(K::ReLU()(x));
//   K::Model model(inputs, K::Dense(10)(K::GlobalAveragePooling2D()(K::Add()({x, y}))));
//
// The model is a list of sf_layer_spec (abi.h) handed to the backend's engine_create; every
// step goes through the sf_compute_hooks C table, so any backend (cpu, cuda, third-party) works.
//
// Data-parallel contract (docs/keras-api.md has the full text):
//  - batch_size is the GLOBAL batch (Keras' DataParallel / tf.distribute convention): with W
//    ranks each rank feeds batch_size / W samples per step (the first batch_size % W ranks one
//    more), and the engine averages gradients over the global batch. 1 node with batch_size 128
//    and 4 nodes with batch_size 128 take the same optimisation steps.
//  - Data::sharded (default): each rank passes its own part (skyforge::shard). Steps per epoch =
//    min over ranks of ceil(local / per-rank batch): every rank makes the same number of
//    train_step calls; a rank with a longer shard skips its last few samples that epoch (a
//    different few each epoch when shuffling).
//  - Data::replicated: every rank passes the SAME full arrays; each global batch is drawn from
//    one global permutation (seed + epoch) and split across ranks in rank order, so N nodes see
//    exactly the batches 1 node sees. A final partial global batch smaller than W is dropped.
//  - evaluate() and validation_data default to Data::replicated (the full test set on every
//    rank, each evaluating 1/W); replicated arrays are checked to be identical on every rank.
//  - Only rank 0 prints and writes files (progress, CSV, TensorBoard, checkpoints); failures of
//    that I/O are broadcast so every rank throws the same error instead of hanging.
#pragma once

#include <skyforge/abi.h>
#include <skyforge/keras_callbacks.hpp>
#include <skyforge/keras_functional.hpp>
#include <skyforge/keras_layers.hpp>
#include <skyforge/keras_schedules.hpp>
#include <skyforge/layer_schema.hpp>
#include <skyforge/lr_schedule_of.hpp>
#include <skyforge/model_summary.hpp>
#include <skyforge/optimizer_schema.hpp>
#include <skyforge/sdk.hpp>
#include <skyforge/tfevents.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <optional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <unistd.h>

namespace skyforge::keras {

// ---- optimizers, backend, options -------------------------------------------------------------
// Keras' optimizers, Keras' defaults: both from the optimizer schema (optimizer_schema.hpp),
// which compile() checks them against. learning_rate is a number or a schedule, clipnorm and
// global_clipnorm (0: off) clip the mean gradient (keras_schedules.hpp).
struct SGD {
  LearningRate learning_rate = schema::default_real("sgd", "learning_rate");
  double momentum = schema::default_real("sgd", "momentum");
  bool nesterov = false;
  double clipnorm = 0, global_clipnorm = 0;
};
struct Adam {
  LearningRate learning_rate = schema::default_real("adam", "learning_rate");
  double beta_1 = schema::default_real("adam", "beta_1");
  double beta_2 = schema::default_real("adam", "beta_2");
  double epsilon = schema::default_real("adam", "epsilon");
  double clipnorm = 0, global_clipnorm = 0;
};
struct AdamW {
  LearningRate learning_rate = schema::default_real("adamw", "learning_rate");
  double weight_decay = schema::default_real("adamw", "weight_decay");
  double beta_1 = schema::default_real("adamw", "beta_1");
  double beta_2 = schema::default_real("adamw", "beta_2");
  double epsilon = schema::default_real("adamw", "epsilon");
  double clipnorm = 0, global_clipnorm = 0;
};
struct RMSprop {
  LearningRate learning_rate = schema::default_real("rmsprop", "learning_rate");
  double rho = schema::default_real("rmsprop", "rho");
  double momentum = schema::default_real("rmsprop", "momentum");
  double epsilon = schema::default_real("rmsprop", "epsilon");
  bool centered = false;
  double clipnorm = 0, global_clipnorm = 0;
};
using Optimizer = std::variant<SGD, Adam, AdamW, RMSprop>;

// A compute backend instance: the pair Host::compute_backend() returns.
struct Backend {
  const sf_compute_hooks* hooks = nullptr;
  void* self = nullptr;
  Backend() = default;
  Backend(const sf_compute_hooks* h, void* s) : hooks(h), self(s) {}
  Backend(std::pair<const sf_compute_hooks*, void*> p) : hooks(p.first), self(p.second) {}  // NOLINT
  explicit operator bool() const { return hooks != nullptr; }
};

struct CompileOptions {
  Backend backend{};          // none: compile() only checks the model; fit() then throws
  Communicator communicator{};  // none or size 1: one replica; size > 1: data-parallel
  uint64_t seed = 0;          // initial weights, dropout masks, and fit()'s default shuffle seed
  uint32_t threads = 0;       // backend threads; 0: every core

  // The backend the manifest selected (or `backend_name`), and the pool's communicator when the
  // pool has more than one node. Call on a node (in App::run()).
  static CompileOptions from_host(const Host& host, uint64_t seed = 0, const std::string& backend_name = "") {
    CompileOptions o;
    o.backend = Backend(host.compute_backend(backend_name));
    if (host.instance_info().total_nodes > 1) o.communicator = host.communicator();
    o.seed = seed;
    return o;
  }
};

// How the arrays given to fit()/evaluate() relate across ranks.
enum class Data {
  sharded,     // each rank passes its own part (skyforge::shard); the default
  replicated,  // every rank passes the same full arrays; fit() splits each global batch
};

// Evaluated after every epoch. By default every rank passes the same full arrays (Keras'
// validation_data=(x_test, y_test)) and evaluates 1/W of them; pass Data::sharded when each
// rank passes its own part.
struct ValidationData {
  std::span<const float> x{};
  std::span<const int32_t> y{};
  Data data = Data::replicated;
  bool empty() const { return y.empty(); }
};

struct Callbacks {
  std::string csv{};                  // CSVLogger: rewritten after every epoch (rank 0)
  std::string tensorboard{};          // log dir: <dir>/train and <dir>/validation event files (rank 0)
  uint32_t tensorboard_update_freq = 0;  // > 0: also batch_loss / batch_accuracy every N steps
  std::string checkpoint_dir{};       // <dir>/ckpt-<epoch>.bin + <dir>/latest after every epoch (rank 0)
  uint64_t checkpoint_every_steps = 0;  // > 0: also <dir>/ckpt-<epoch>-<step>.bin every N steps within an epoch
  bool resume = false;                // load <dir>/latest on every rank and continue where it stopped
  uint32_t max_to_keep = 0;           // > 0: keep only the newest N checkpoints
  // Rank 0 locks checkpoint_dir (<dir>/lock) for the whole fit(): another run writing there fails
  // at once, naming the holder; then it removes what an interrupted run left (temporaries,
  // mid-epoch checkpoints `latest` does not name). read_only: only resume from the directory —
  // no lock, nothing written (a replica that is not the writer). lock_wait_s > 0: wait that long
  // for a holder to go first (a restart, whose previous worker may be on its way out).
  bool checkpoint_read_only = false;
  double checkpoint_lock_wait_s = 0;
  // Called on every rank after each epoch, after the files are written.
  std::function<void(uint32_t epoch, const Logs& logs)> on_epoch_end{};
};

struct FitOptions {
  uint32_t epochs = 1;
  uint32_t batch_size = 32;  // GLOBAL batch, split across ranks
  bool shuffle = true;
  std::optional<uint64_t> seed{};  // shuffle seed; default: compile's seed
  Data data = Data::sharded;
  bool drop_remainder = false;  // drop each epoch's last partial batch
  uint64_t steps_per_epoch = 0;  // > 0: at most this many steps per epoch (Keras' steps_per_epoch)
  ValidationData validation_data{};
  uint32_t validation_batch_size = 0;  // 0: batch_size
  uint32_t initial_epoch = 0;          // first epoch to run (resume overrides it)
  int verbose = 1;                     // 0 silent, 1 progress bar, 2 one line per epoch
  int progress_percent = 10;           // not a TTY: a line every N % of an epoch
  std::FILE* out = nullptr;            // progress output; default stdout
  std::optional<bool> tty{};           // default: isatty(out)
  Callbacks callbacks{};
};

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  uint64_t samples = 0;  // over every rank
};

// ---- internals --------------------------------------------------------------------------------
namespace detail {

using schema::detail::shape_text;

inline uint64_t product(const std::vector<uint32_t>& s) {
  uint64_t n = 1;
  for (uint32_t d : s) n *= d;
  return n;
}

// Text form of an optimizer and its options (the keys abi.h lists), checked by the optimizer
// schema: a value outside Keras' range is refused here, naming the option.
inline std::pair<std::string, std::vector<std::pair<std::string, std::string>>> optimizer_spec(const Optimizer& o) {
  std::pair<std::string, std::vector<std::pair<std::string, std::string>>> spec;
  if (const auto* s = std::get_if<SGD>(&o)) {
    spec = {"sgd", common_options(*s, {{"momentum", num(s->momentum)}, {"nesterov", boolean(s->nesterov)}})};
  } else if (const auto* a = std::get_if<Adam>(&o)) {
    spec = {"adam",
            common_options(*a, {{"beta_1", num(a->beta_1)}, {"beta_2", num(a->beta_2)}, {"epsilon", num(a->epsilon)}})};
  } else if (const auto* w = std::get_if<AdamW>(&o)) {
    spec = {"adamw", common_options(*w, {{"weight_decay", num(w->weight_decay)}, {"beta_1", num(w->beta_1)},
                                         {"beta_2", num(w->beta_2)}, {"epsilon", num(w->epsilon)}})};
  } else {
    const auto& r = std::get<RMSprop>(o);
    spec = {"rmsprop", common_options(r, {{"rho", num(r.rho)}, {"momentum", num(r.momentum)},
                                          {"epsilon", num(r.epsilon)}, {"centered", boolean(r.centered)}})};
  }
  try {
    schema::parse_optimizer(spec.first, spec.second);
  } catch (const schema::OptimizerError& e) {
    throw Error(e.what(), SF_ERR_INVALID);
  }
  return spec;
}

// Every rank learns whether any rank failed a local check, and all throw the same message
// (the lowest failing rank's), instead of the healthy ranks hanging in the next collective.
inline void collective_check(const Communicator& comm, const std::string& local_error) {
  if (comm.size() <= 1) {
    if (!local_error.empty()) throw Error(local_error, SF_ERR_INVALID);
    return;
  }
  int32_t flag = local_error.empty() ? 0 : 1;
  comm.allreduce(&flag, 1, SF_REDUCE_MAX);
  if (!flag) return;
  constexpr size_t kMsg = 480;
  std::string mine(kMsg, '\0');
  std::memcpy(mine.data(), local_error.data(), std::min(kMsg - 1, local_error.size()));
  const std::string all = comm.allgather(mine);
  for (uint32_t r = 0; r < comm.size(); ++r) {
    const char* m = all.data() + r * kMsg;
    if (*m) throw Error("rank " + std::to_string(r) + ": " + std::string(m), SF_ERR_INVALID);
  }
  throw Error("a rank failed without a message", SF_ERR_INVALID);
}

// Root's string, on every rank.
inline void broadcast_string(const Communicator& comm, std::string& s) {
  if (comm.size() <= 1) return;
  uint64_t n = s.size();
  comm.broadcast(&n, sizeof n, 0);
  s.resize(static_cast<size_t>(n));
  comm.broadcast(s.data(), s.size(), 0);
}

// Runs f on rank 0 only; a failure there becomes the same Error on every rank.
template <class F>
void on_rank0(const Communicator& comm, F&& f) {
  std::string err;
  if (comm.rank() == 0) {
    try {
      f();
    } catch (const std::exception& e) {
      err = *e.what() ? e.what() : "failed";
    }
  }
  broadcast_string(comm, err);
  if (!err.empty()) throw Error(err);
}

// Owns an engine made by a backend's engine_create; destroys it with engine_destroy.
class EngineHandle {
 public:
  EngineHandle(Backend b, const sf_model_spec& spec, const Communicator& comm) : b_(b) {
    if (!b.hooks) throw Error("keras: no compute backend", SF_ERR_INVALID);
    if (b.hooks->struct_size < offsetof(sf_compute_hooks, load_state) + sizeof(b.hooks->load_state))
      throw Error("keras: the compute backend's hook table is older than ABI 1.1", SF_ERR_UNSUPPORTED);
    if (!b.hooks->engine_create || !b.hooks->engine_destroy || !b.hooks->train_step || !b.hooks->eval_step)
      throw Error("keras: the compute backend lacks engine_create/engine_destroy/train_step/eval_step",
                  SF_ERR_UNSUPPORTED);
    void* e = nullptr;
    const sf_status st = b.hooks->engine_create(b.self, &spec, comm.size() > 1 ? comm.raw() : nullptr, &e);
    if (st != SF_OK || !e) {
      const char* m = b.hooks->engine_last_error ? b.hooks->engine_last_error(b.self, nullptr) : nullptr;
      throw Error(std::string("keras: engine_create failed: ") + (m && *m ? m : "no message"), st ? st : SF_ERR);
    }
    e_ = e;
  }
  EngineHandle(const EngineHandle&) = delete;
  EngineHandle& operator=(const EngineHandle&) = delete;
  ~EngineHandle() {
    if (e_) b_.hooks->engine_destroy(b_.self, e_);
  }
  const sf_compute_hooks& hooks() const { return *b_.hooks; }
  void* self() const { return b_.self; }
  void* engine() const { return e_; }
  void check(sf_status st, const char* what) const {
    if (st == SF_OK) return;
    const char* m = b_.hooks->engine_last_error ? b_.hooks->engine_last_error(b_.self, e_) : nullptr;
    throw Error(std::string("keras: ") + what + " failed: " + (m && *m ? m : "no message"), st);
  }
  template <class Fn>
  Fn need(Fn fn, const char* name) const {
    if (!fn) throw Error(std::string("keras: the compute backend has no ") + name + " hook", SF_ERR_UNSUPPORTED);
    return fn;
  }

 private:
  Backend b_;
  void* e_ = nullptr;
};

// A data set bound to the engine (abi.h, sf_compute_hooks::bind_data, ABI 1.8) for one fit or
// evaluate: steps then name samples by index and the engine gathers them where it runs. Not
// bound (ok() false) when the backend has no such hooks or answers SF_ERR_UNSUPPORTED (it keeps
// no data, or the set does not fit): the caller copies each batch as before. Released at the end.
class BoundData {
 public:
  // Collective: every rank binds its part, or none does (the two paths' steps must not mix).
  BoundData(const EngineHandle& e, std::span<const float> x, std::span<const int32_t> y, const Communicator& comm)
      : e_(e) {
    const sf_compute_hooks& h = e.hooks();
    const bool has = h.struct_size >= offsetof(sf_compute_hooks, take_results) + sizeof(h.take_results) &&
                     h.bind_data && h.release_data && h.train_step_indexed && h.eval_step_indexed && h.take_results;
    std::string err;
    if (has && !y.empty()) {
      const sf_status st = h.bind_data(e.self(), e.engine(), x.data(), y.data(), y.size(), &id_);
      if (st == SF_OK) ok_ = true;
      else if (st != SF_ERR_UNSUPPORTED) {
        const char* m = h.engine_last_error ? h.engine_last_error(e.self(), e.engine()) : nullptr;
        err = std::string("bind_data failed: ") + (m && *m ? m : "no message");
      }
    }
    if (comm.size() > 1) {
      int64_t all_ok = ok_ ? 1 : 0;
      comm.allreduce(&all_ok, 1, SF_REDUCE_MIN);
      if (ok_ && !all_ok) {  // another rank could not bind its part: every rank copies batches
        (void)h.release_data(e.self(), e.engine(), id_);
        ok_ = false;
      }
      collective_check(comm, err);
    } else if (!err.empty()) {
      throw Error("keras: " + err, SF_ERR);
    }
    if (ok_) take();  // sums a failed fit left pending are not this one's
    batches_ = ok_ && h.struct_size >= offsetof(sf_compute_hooks, step_batches) + sizeof(h.step_batches) &&
               h.step_batches;
  }
  BoundData(const BoundData&) = delete;
  BoundData& operator=(const BoundData&) = delete;
  ~BoundData() {
    if (ok_) (void)e_.hooks().release_data(e_.self(), e_.engine(), id_);
  }
  bool ok() const { return ok_; }
  bool takes_batches() const { return batches_; }  // (the same on every rank: one engine kind)
  // Every rank's batch for the next step, batch_of(r) for r < world (abi.h, step_batches, ABI
  // 1.9), from the schedule every rank shares: a GPU engine then picks the step's graph without
  // a per-step exchange. Nothing to do for an engine without the hook.
  template <class BatchOf>
  void next_batches(uint32_t world, const BatchOf& batch_of) const {
    if (!batches_) return;
    all_.resize(world);
    for (uint32_t r = 0; r < world; ++r) all_[r] = static_cast<uint32_t>(batch_of(r));
    e_.check(e_.hooks().step_batches(e_.self(), e_.engine(), all_.data(), world), "step_batches");
  }
  // One step on samples idx[0 .. n); out null: deferred (take() hands its sums over).
  void train(const uint64_t* idx, uint64_t n, sf_step_result* out) const {
    e_.check(e_.hooks().train_step_indexed(e_.self(), e_.engine(), id_, idx, static_cast<uint32_t>(n), out),
             "train_step_indexed");
  }
  void eval(const uint64_t* idx, uint64_t n, sf_step_result* out) const {
    e_.check(e_.hooks().eval_step_indexed(e_.self(), e_.engine(), id_, idx, static_cast<uint32_t>(n), out),
             "eval_step_indexed");
  }
  sf_step_result take() const {
    sf_step_result r{};
    r.struct_size = sizeof r;
    e_.check(e_.hooks().take_results(e_.self(), e_.engine(), &r), "take_results");
    return r;
  }

 private:
  const EngineHandle& e_;
  uint64_t id_ = 0;
  bool ok_ = false;
  bool batches_ = false;  // the engine takes step_batches
  mutable std::vector<uint32_t> all_;  // next_batches' array
};

// The C view of a model spec; owns everything the pointers point at.
struct CompiledSpec {
  std::vector<Layer> layers;
  std::vector<uint32_t> input_shape;
  std::string optimizer;
  std::vector<std::pair<std::string, std::string>> optimizer_options;
  std::string loss;
  std::vector<std::vector<sf_kv>> layer_kv;
  std::vector<sf_layer_spec> c_layers;
  std::vector<sf_kv> c_opt;
  sf_model_spec spec{};

  void build(uint64_t seed, uint32_t threads) {
    layer_kv.clear();
    c_layers.clear();
    for (const Layer& l : layers) {
      auto& kv = layer_kv.emplace_back();
      for (const auto& [k, v] : l.options) kv.push_back(sf_kv{k.c_str(), v.c_str()});
    }
    for (size_t i = 0; i < layers.size(); ++i)
      c_layers.push_back(sf_layer_spec{layers[i].type.c_str(), layer_kv[i].data(), layer_kv[i].size()});
    c_opt.clear();
    for (const auto& [k, v] : optimizer_options) c_opt.push_back(sf_kv{k.c_str(), v.c_str()});
    spec = sf_model_spec{};
    spec.struct_size = sizeof(sf_model_spec);
    spec.input_shape = input_shape.data();
    spec.input_rank = static_cast<uint32_t>(input_shape.size());
    spec.layers = c_layers.data();
    spec.n_layers = c_layers.size();
    spec.optimizer = optimizer.c_str();
    spec.optimizer_options = c_opt.data();
    spec.n_optimizer_options = c_opt.size();
    spec.loss = loss.c_str();
    spec.seed = seed;
    spec.threads = threads;
  }
};

// Per-rank share of a global batch: the first (global % world) ranks take one more.
inline uint64_t share(uint64_t global, uint32_t world, uint32_t rank) {
  return global / world + (rank < global % world ? 1 : 0);
}
inline uint64_t share_begin(uint64_t global, uint32_t world, uint32_t rank) {
  return rank * (global / world) + std::min<uint64_t>(rank, global % world);
}

// The shuffle seed of an epoch: seed + epoch (DistributedSampler's rule) on rank 0 and in
// replicated mode; mixed with the rank for the other ranks' local shuffles.
inline uint64_t epoch_seed(uint64_t seed, uint32_t epoch, uint32_t rank) {
  return (seed + epoch) ^ (uint64_t{rank} * 0x9E3779B97F4A7C15ULL);
}

inline bool is_tty(std::FILE* f) { return f && ::isatty(::fileno(f)) == 1; }

}  // namespace detail

// ---- the model ---------------------------------------------------------------------------------
// Keras' Model: a functional model, Model(inputs, outputs), from the tensors its layers were
// called on (keras_layers.hpp); Sequential below is the list form. Both hand the backend the
// layer list (layer_schema.hpp's graph: a functional model's layers carry `name` and `inputs`).
class Model {
 public:
  // The layers `outputs` depends on, in the order they were called, named as Keras names them.
  // One input and one output; a layer is called once (no shared layers).
  Model(const Tensor& inputs, const Tensor& outputs, std::string name = "functional")
      : name_(std::move(name)) {
    detail::Functional f = detail::functional(inputs, outputs);
    input_shape_ = std::move(f.input_shape);
    layers_ = std::move(f.layers);
  }
  Model(Model&&) noexcept = default;
  Model& operator=(Model&&) noexcept = default;

  const std::string& name() const { return name_; }
  const std::vector<uint32_t>& input_shape() const { return input_shape_; }
  const std::vector<Layer>& layers() const { return layers_; }

  // Output shape of one sample (Keras' shape rules); throws naming the first bad layer.
  std::vector<uint32_t> output_shape() const {
    const schema::Graph g = graph();
    return g.shapes[g.output].output;
  }
  uint64_t num_classes() const { return detail::product(output_shape()); }

  // Keras' summary table (skyforge/model_summary.hpp), titled `name` (default: the model's). A
  // model that is not a chain lists its input first and what each layer is connected to.
  std::string summary(const std::string& name = "") const {
    const std::vector<schema::LayerConfig> c = configs();
    return detail::schema_call([&] { return schema::summary(input_shape_, c, name.empty() ? name_ : name); });
  }

  // Checks the model, builds its sf_model_spec and, given a backend, creates the engine (a
  // collective when the communicator has more than one rank: the engine broadcasts rank 0's
  // initial weights).
  void compile(const Optimizer& optimizer, const std::string& loss = "sparse_categorical_crossentropy",
               const std::vector<std::string>& metrics = {"accuracy"}, CompileOptions options = {}) {
    if (loss != "sparse_categorical_crossentropy")
      throw Error("keras: loss '" + loss + "' is not supported (sparse_categorical_crossentropy, from logits)",
                  SF_ERR_INVALID);
    std::vector<std::string> accuracy_names;
    for (const auto& m : metrics) {
      if (m == "accuracy" || m == "acc" || m == "sparse_categorical_accuracy") accuracy_names.push_back(m);
      else throw Error("keras: metric '" + m + "' is not supported (accuracy)", SF_ERR_INVALID);
    }
    if (layers_.empty()) throw Error("keras: the model has no layers", SF_ERR_INVALID);
    const std::vector<uint32_t> out = output_shape();
    if (out.size() != 1)
      throw Error("keras: the model's output " + detail::shape_text(out) +
                      " must be (None, classes): add Flatten() or GlobalAveragePooling2D() before the last Dense",
                  SF_ERR_INVALID);
    auto c = std::make_unique<detail::CompiledSpec>();
    c->layers = layers_;
    for (size_t i = 0; i < c->layers.size(); ++i) c->layers[i].options = detail::config(layers_[i], i).options();
    c->input_shape = input_shape_;
    std::tie(c->optimizer, c->optimizer_options) = detail::optimizer_spec(optimizer);
    c->loss = loss;
    c->build(options.seed, options.threads);
    const std::string text = spec_text(*c);
    std::unique_ptr<detail::EngineHandle> engine;
    if (options.backend) engine = std::make_unique<detail::EngineHandle>(options.backend, c->spec, options.communicator);
    if (layers_.back().type == "softmax" && options.communicator.rank() == 0)
      std::fprintf(stderr, "keras: warning: the last layer is Softmax, but the loss expects logits\n");
    spec_ = std::move(c);
    engine_ = std::move(engine);
    comm_ = options.communicator;
    seed_ = options.seed;
    accuracy_names_ = accuracy_names;
    spec_text_ = text;
    compiled_ = true;
  }

  bool compiled() const { return compiled_; }
  bool bound() const { return engine_ != nullptr; }
  const Communicator& communicator() const { return comm_; }
  const sf_model_spec& spec() const {
    require_compiled();
    return spec_->spec;
  }
  // Canonical text of the spec (what the checkpoint fingerprint hashes): input shape, layers
  // with their options, optimizer kind, loss. Learning rates and seeds are left out, so a
  // resumed run may change them.
  const std::string& spec_text() const {
    require_compiled();
    return spec_text_;
  }
  uint64_t fingerprint() const { return fnv1a64(spec_text()); }

  // ---- training ---------------------------------------------------------------------------
  History fit(std::span<const float> x, std::span<const int32_t> y, const FitOptions& o = {}) {
    const detail::EngineHandle& e = require_engine();
    const uint32_t W = comm_.size(), R = comm_.rank();
    const size_t sample = sample_size();
    const uint64_t B = o.batch_size;
    const uint64_t seed = o.seed ? *o.seed : seed_;
    std::FILE* out = o.out ? o.out : stdout;
    const bool tty = o.tty ? *o.tty : detail::is_tty(out);
    const bool talk = R == 0 && o.verbose > 0;

    // Local checks, then one collective verdict.
    std::string err = check_xy(x, y, "fit");
    if (err.empty() && o.batch_size == 0) err = "fit: batch_size must be > 0";
    if (err.empty() && o.batch_size < W)
      err = "fit: batch_size " + std::to_string(o.batch_size) + " (global) is smaller than the " +
            std::to_string(W) + " replicas";
    if (err.empty() && !o.validation_data.empty()) err = check_xy(o.validation_data.x, o.validation_data.y, "fit validation_data");
    detail::collective_check(comm_, err);

    // The plan: steps per epoch, equal on every rank.
    const uint64_t n = y.size();
    uint64_t steps = 0;
    const uint64_t b_local = detail::share(B, W, R);
    if (o.data == Data::sharded) {
      int64_t local_steps = static_cast<int64_t>(o.drop_remainder ? n / b_local : (n + b_local - 1) / b_local);
      comm_.allreduce(&local_steps, 1, SF_REDUCE_MIN);
      steps = static_cast<uint64_t>(local_steps);
      if (steps == 0)
        detail::collective_check(comm_, "fit: a rank has fewer samples than its share of the batch (" +
                                            std::to_string(b_local) + "); nothing to train on");
    } else {
      int64_t mm[2] = {static_cast<int64_t>(n), -static_cast<int64_t>(n)};
      comm_.allreduce(mm, 2, SF_REDUCE_MAX);
      if (mm[0] != -mm[1])
        detail::collective_check(comm_, "fit: Data::replicated needs the same arrays on every rank, but sizes differ (" +
                                            std::to_string(-mm[1]) + " to " + std::to_string(mm[0]) + " samples)");
      if (!same_on_all_ranks(data_hash(x, y)))
        detail::collective_check(comm_, "fit: Data::replicated needs the same arrays on every rank, but they differ "
                                        "(pass Data::sharded when each rank passes its own part)");
      steps = o.drop_remainder ? n / B : (n + B - 1) / B;
      if (steps > 0 && n - (steps - 1) * B < W) --steps;  // a final global batch too small to split
      if (steps == 0) detail::collective_check(comm_, "fit: fewer samples than replicas; nothing to train on");
    }
    if (o.steps_per_epoch > 0) steps = std::min(steps, o.steps_per_epoch);
    warn_if_replicated_by_mistake(x, y, o);

    History history;
    uint32_t first_epoch = o.initial_epoch;
    uint64_t global_step = 0;
    // A mid-epoch checkpoint: the first epoch starts at this step, with these running sums. The
    // epoch's order is a function of the seed and the epoch, so its remaining batches are the same.
    uint64_t resume_step = 0;
    double resume_loss_sum = 0;
    uint64_t resume_correct = 0, resume_seen = 0;
    const Callbacks& cb = o.callbacks;
    uint32_t tb_batch_freq = cb.tensorboard_update_freq;
    // The checkpoint directory is this fit's alone (rank 0 writes it): locked, then cleaned.
    std::optional<CheckpointLock> ck_lock;
    if (!cb.checkpoint_dir.empty() && !cb.checkpoint_read_only)
      detail::on_rank0(comm_, [&] {
        ck_lock.emplace(CheckpointLock::acquire(cb.checkpoint_dir, cb.checkpoint_lock_wait_s, talk ? out : stderr));
        if (const std::string was = ck_lock->taken_over(); !was.empty() && talk)
          std::fprintf(out, "Took over %s/lock from a run that ended without letting go of it (%s)\n",
                       cb.checkpoint_dir.c_str(), was.c_str());
        const std::vector<std::string> removed = clean_checkpoint_dir(cb.checkpoint_dir);
        if (!removed.empty() && talk) {
          std::string names;
          for (size_t i = 0; i < removed.size() && i < 8; ++i) names += (i ? ", " : "") + removed[i];
          if (removed.size() > 8) names += ", ...";
          std::fprintf(out, "Removed %zu file%s an interrupted run left in %s: %s\n", removed.size(),
                       removed.size() == 1 ? "" : "s", cb.checkpoint_dir.c_str(), names.c_str());
        }
        if (talk) std::fflush(out);
      });
    if (cb.resume && !cb.checkpoint_dir.empty()) {
      if (auto ck = load_latest_checkpoint(cb.checkpoint_dir)) {
        // Another run's checkpoint (another seed: another data order and dropout) is refused.
        detail::collective_check(comm_, run_mismatch(*ck, seed, B, steps));
        if (R == 0 && ck->batch_size && ck->epoch_step == 0 && (ck->batch_size != B || ck->steps_per_epoch != steps))
          std::fprintf(stderr,
                       "keras: warning: resuming %s, written with a global batch of %llu and %llu steps per epoch, "
                       "with a batch of %llu and %llu steps: the epochs from here take other steps than that run's\n",
                       ck_path_.c_str(), static_cast<unsigned long long>(ck->batch_size),
                       static_cast<unsigned long long>(ck->steps_per_epoch), static_cast<unsigned long long>(B),
                       static_cast<unsigned long long>(steps));
        first_epoch = ck->epoch;
        global_step = ck->step;
        if (ck->epoch_step > 0 && ck->epoch_step < steps) {
          resume_step = ck->epoch_step;
          resume_loss_sum = ck->loss_sum;
          resume_correct = ck->correct;
          resume_seen = ck->seen;
        }
        history = parse_history_csv(ck->history);
        if (talk && resume_step)
          std::fprintf(out, "Resuming from %s: epoch %u done and %llu steps of epoch %u, step %llu\n", ck_path_.c_str(),
                       ck->epoch, static_cast<unsigned long long>(resume_step), ck->epoch + 1,
                       static_cast<unsigned long long>(ck->step));
        else if (talk)
          std::fprintf(out, "Resuming from %s: epoch %u done, step %llu\n", ck_path_.c_str(), ck->epoch,
                       static_cast<unsigned long long>(ck->step));
      } else if (talk) {
        std::fprintf(out, "No checkpoint in %s yet; starting from epoch 1\n", cb.checkpoint_dir.c_str());
      }
    }

    // Rank 0's writers. TensorBoard's train writer also gets epoch_learning_rate, as Keras'
    // callback writes it: the rate of the next update (the History and the CSV do not).
    std::optional<tfevents::EventWriter> tb_train, tb_val;
    const LrSchedule lr_schedule = schedule_of(schema::parse_optimizer(spec_->optimizer, spec_->optimizer_options));
    detail::on_rank0(comm_, [&] {
      if (!cb.tensorboard.empty()) {
        tb_train.emplace(std::filesystem::path(cb.tensorboard) / "train");
        if (!o.validation_data.empty()) tb_val.emplace(std::filesystem::path(cb.tensorboard) / "validation");
      }
      if (!cb.csv.empty()) write_file_atomic(cb.csv, history_csv(history));
    });

    // Rank 0: the state after `epochs_done` epochs and `epoch_step` steps of the next one.
    auto checkpoint = [&](uint32_t epochs_done, uint64_t epoch_step, double loss_sum, uint64_t correct, uint64_t seen) {
      Checkpoint ck;
      ck.epoch = epochs_done;
      ck.step = global_step;
      ck.epoch_step = epoch_step;
      ck.loss_sum = loss_sum;
      ck.correct = correct;
      ck.seen = seen;
      ck.seed = seed;
      ck.batch_size = B;
      ck.steps_per_epoch = steps;
      ck.fingerprint = fingerprint();
      ck.spec = spec_text_;
      ck.history = history_csv(history);
      ck.state = state_dict();
      write_checkpoint(cb.checkpoint_dir, ck, cb.max_to_keep);
    };

    std::vector<float> xb;
    std::vector<int32_t> yb;
    // Bound data: one copy of x for the whole fit; a step's result is read back only when the
    // progress bar, a batch-level TensorBoard point, a checkpoint or the epoch's end shows it.
    const detail::BoundData bound(e, x, y, comm_);
    std::optional<detail::BoundData> bound_validation;  // bound at the first epoch's end
    std::vector<uint64_t> ids;
    // Every rank's part (sharded: gathered once), so that each rank knows every rank's batch at
    // every step (BoundData::next_batches).
    const std::vector<uint64_t> parts = part_sizes(n, o.data == Data::sharded && bound.takes_batches());
    using Clock = std::chrono::steady_clock;
    // Where this node is, told to the host (a status, at most every 50 ms): the host quotes it
    // when the node is lost or lags in a collective ("last seen at epoch 3/6, step 412/900;
    // last checkpoint: epoch 2"). Every rank knows the checkpoints rank 0 writes.
    const Host host(::skyforge::detail::g_host);
    auto checkpoint_name = [](uint32_t epochs_done, uint64_t epoch_step) {
      return epoch_step ? "epoch " + std::to_string(epochs_done + 1) + ", step " + std::to_string(epoch_step)
                        : "end of epoch " + std::to_string(epochs_done);
    };
    std::string last_checkpoint = cb.checkpoint_dir.empty() ? "" : global_step ? checkpoint_name(first_epoch, resume_step) : "none yet";
    auto told = Clock::now() - std::chrono::seconds(1);
    auto tell = [&](uint32_t epoch, uint64_t done, bool now) {
      const auto t = Clock::now();
      if (!now && t - told < std::chrono::milliseconds(50)) return;
      told = t;
      host.status("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(o.epochs) + ", step " + std::to_string(done) +
                  "/" + std::to_string(steps) + (last_checkpoint.empty() ? "" : "; last checkpoint: " + last_checkpoint));
    };
    for (uint32_t epoch = first_epoch; epoch < o.epochs; ++epoch) {
      if (talk) {
        std::fprintf(out, "Epoch %u/%u\n", epoch + 1, o.epochs);
        std::fflush(out);
      }
      const std::vector<size_t> perm = skyforge::permutation(
          n, o.shuffle,
          detail::epoch_seed(seed, epoch, o.data == Data::sharded ? R : 0));
      ProgressBar bar(steps, talk && o.verbose == 1 ? out : nullptr, tty, o.progress_percent);
      const auto t0 = Clock::now();
      const uint64_t first_step = epoch == first_epoch ? resume_step : 0;
      double loss_sum = first_step ? resume_loss_sum : 0;
      uint64_t correct = first_step ? resume_correct : 0, seen = first_step ? resume_seen : 0;
      auto state = [&](uint64_t done) {
        ProgressState p;
        p.current = done;
        p.target = steps;
        p.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (seen) {
          p.metrics.emplace_back("loss", loss_sum / static_cast<double>(seen));
          for (const auto& name : accuracy_names_)
            p.metrics.emplace_back(name, static_cast<double>(correct) / static_cast<double>(seen));
        }
        p.samples_per_s = p.elapsed_s > 0 ? static_cast<double>(seen) / p.elapsed_s : 0;
        return p;
      };
      for (uint64_t s = first_step; s < steps; ++s) {
        // Rank r's batch at step s, and this rank's positions in perm.
        auto batch_of = [&](uint32_t r) {
          if (o.data == Data::sharded) {
            const uint64_t b = detail::share(B, W, r);
            return std::min<uint64_t>(b, parts[r] - s * b);
          }
          return detail::share(std::min<uint64_t>(B, n - s * B), W, r);
        };
        const uint64_t count = batch_of(R);
        const uint64_t begin = o.data == Data::sharded
                                   ? s * b_local
                                   : s * B + detail::share_begin(std::min<uint64_t>(B, n - s * B), W, R);
        sf_step_result r{};
        r.struct_size = sizeof r;
        auto add = [&](const sf_step_result& q) {
          loss_sum += q.loss * static_cast<double>(q.samples);
          correct += q.correct;
          seen += q.samples;
        };
        const bool tb_point = R == 0 && tb_train && tb_batch_freq && (global_step + 1) % tb_batch_freq == 0;
        bool shown = true;  // the totals are this step's
        if (bound.ok()) {
          ids.assign(perm.begin() + static_cast<ptrdiff_t>(begin), perm.begin() + static_cast<ptrdiff_t>(begin + count));
          bound.next_batches(W, batch_of);
          bound.train(ids.data(), count, tb_point ? &r : nullptr);  // its own result only for TensorBoard
          if (tb_point) add(r);
          const bool show = s + 1 == steps ||
                            (cb.checkpoint_every_steps && (global_step + 1) % cb.checkpoint_every_steps == 0) ||
                            (R == 0 && bar.due(s + 1, std::chrono::duration<double>(Clock::now() - t0).count()));
          if (show) add(bound.take());
          shown = show;
        } else {
          gather(x, y, perm.data() + begin, count, sample, xb, yb);
          e.check(e.hooks().train_step(e.self(), e.engine(), xb.data(), yb.data(), static_cast<uint32_t>(count), &r),
                  "train_step");
          add(r);
        }
        ++global_step;
        if (R == 0) {
          if (shown) bar.update(state(s + 1));
          if (tb_point) {
            try {
              std::vector<std::pair<std::string, float>> v{{"batch_loss", static_cast<float>(r.loss)}};
              if (r.samples) v.emplace_back("batch_accuracy", static_cast<float>(r.correct) / static_cast<float>(r.samples));
              tb_train->add_scalars(v, static_cast<int64_t>(global_step));
            } catch (const std::exception& ex) {
              std::fprintf(stderr, "keras: warning: batch-level TensorBoard logging stopped: %s\n", ex.what());
              tb_batch_freq = 0;
            }
          }
        }
        if (cb.checkpoint_every_steps && !cb.checkpoint_dir.empty() && global_step % cb.checkpoint_every_steps == 0 &&
            s + 1 < steps) {
          detail::on_rank0(comm_, [&] { checkpoint(epoch, s + 1, loss_sum, correct, seen); });
          last_checkpoint = checkpoint_name(epoch, s + 1);
          tell(epoch, s + 1, true);
        } else {
          tell(epoch, s + 1, false);
        }
      }
      Logs logs;
      logs["loss"] = seen ? loss_sum / static_cast<double>(seen) : std::nan("");
      for (const auto& name : accuracy_names_)
        logs[name] = seen ? static_cast<double>(correct) / static_cast<double>(seen) : std::nan("");
      ProgressState final_state = state(steps);
      if (!o.validation_data.empty()) {
        const EvalResult v = evaluate_impl(o.validation_data.x, o.validation_data.y,
                                           o.validation_batch_size ? o.validation_batch_size : o.batch_size,
                                           o.validation_data.data, &bound_validation);
        logs["val_loss"] = v.loss;
        final_state.metrics.emplace_back("val_loss", v.loss);
        for (const auto& name : accuracy_names_) {
          logs["val_" + name] = v.accuracy;
          final_state.metrics.emplace_back("val_" + name, v.accuracy);
        }
      }
      history.append(epoch, logs);
      if (talk) {
        if (o.verbose == 1) {
          bar.finish(final_state);
        } else {
          ProgressBar once(steps, out, false);
          once.finish(final_state);
        }
      }
      // Rank 0's files, then one verdict for every rank.
      std::string state_bytes;
      detail::on_rank0(comm_, [&] {
        if (!cb.csv.empty()) write_file_atomic(cb.csv, history_csv(history));
        const double wall = tfevents::now_seconds();
        if (tb_train) {
          std::vector<std::pair<std::string, float>> v;
          for (const auto& [k, val] : logs)
            if (k.rfind("val_", 0) != 0) v.emplace_back("epoch_" + k, static_cast<float>(val));
          v.emplace_back("epoch_learning_rate", skyforge::learning_rate(lr_schedule, global_step));
          tb_train->add_scalars(v, epoch, wall);
          tb_train->flush();
        }
        if (tb_val) {
          std::vector<std::pair<std::string, float>> v;
          for (const auto& [k, val] : logs)
            if (k.rfind("val_", 0) == 0) v.emplace_back("epoch_" + k.substr(4), static_cast<float>(val));
          tb_val->add_scalars(v, epoch, wall);
          tb_val->flush();
        }
        if (!cb.checkpoint_dir.empty()) checkpoint(epoch + 1, 0, 0, 0, 0);
      });
      if (!cb.checkpoint_dir.empty()) {
        last_checkpoint = checkpoint_name(epoch + 1, 0);
        tell(epoch, steps, true);
      }
      if (cb.on_epoch_end) cb.on_epoch_end(epoch, logs);
    }
    return history;
  }

  // One optimisation step on this rank's part of a global batch (collective: every rank calls
  // it, with its own samples; gradients are averaged over the global batch). Returns the global
  // batch's loss and accuracy, as Keras' train_on_batch does.
  Logs train_on_batch(std::span<const float> x, std::span<const int32_t> y) {
    const detail::EngineHandle& e = require_engine();
    std::string err = check_xy(x, y, "train_on_batch");
    if (err.empty() && y.empty()) err = "train_on_batch: empty batch (every rank needs at least one sample)";
    if (err.empty() && y.size() > UINT32_MAX) err = "train_on_batch: more than 2^32-1 samples in one batch";
    detail::collective_check(comm_, err);
    sf_step_result r{};
    r.struct_size = sizeof r;
    e.check(e.hooks().train_step(e.self(), e.engine(), x.data(), y.data(), static_cast<uint32_t>(y.size()), &r),
            "train_step");
    Logs logs;
    logs["loss"] = r.loss;
    for (const auto& name : accuracy_names_)
      logs[name] = r.samples ? static_cast<double>(r.correct) / static_cast<double>(r.samples) : std::nan("");
    return logs;
  }

  // Loss and accuracy over every rank's samples (eval_step is collective). batch_size is the
  // global batch, as in fit(). Data::replicated (default, Keras' evaluate(x_test, y_test)):
  // every rank passes the same arrays (checked) and evaluates a contiguous 1/W of them;
  // Data::sharded: each rank passes its own part (every rank needs at least one sample).
  // Prints one summary line on rank 0 when verbose.
  EvalResult evaluate(std::span<const float> x, std::span<const int32_t> y, uint32_t batch_size = 32,
                      Data data = Data::replicated, int verbose = 0) {
    const auto t0 = std::chrono::steady_clock::now();
    EvalResult r = evaluate_impl(x, y, batch_size, data);
    if (verbose > 0 && comm_.rank() == 0) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::string line = "evaluate: " + std::to_string(r.samples) + " samples - loss: " + format_metric_value(r.loss);
      for (const auto& name : accuracy_names_) line += " - " + name + ": " + format_metric_value(r.accuracy);
      std::printf("%s - %.0fs\n", line.c_str(), secs);
      std::fflush(stdout);
    }
    return r;
  }

  // Logits (N x classes), local to this rank (no collective).
  std::vector<float> predict(std::span<const float> x, uint32_t batch_size = 32) const {
    const detail::EngineHandle& e = require_engine();
    const size_t sample = sample_size();
    if (x.size() % sample != 0)
      throw Error("predict: x has " + std::to_string(x.size()) + " floats, not a multiple of the sample size " +
                      std::to_string(sample),
                  SF_ERR_INVALID);
    if (batch_size == 0) throw Error("predict: batch_size must be > 0", SF_ERR_INVALID);
    const uint64_t n = x.size() / sample, classes = num_classes();
    std::vector<float> logits(n * classes);
    auto fn = e.need(e.hooks().predict, "predict");
    for (uint64_t i = 0; i < n; i += batch_size) {
      const uint64_t b = std::min<uint64_t>(batch_size, n - i);
      e.check(fn(e.self(), e.engine(), x.data() + i * sample, static_cast<uint32_t>(b), logits.data() + i * classes),
              "predict");
    }
    return logits;
  }

  // ---- weights and state ------------------------------------------------------------------
  std::vector<float> get_weights() const {
    const detail::EngineHandle& e = require_engine();
    uint64_t count = 0;
    e.check(e.need(e.hooks().param_count, "param_count")(e.self(), e.engine(), &count), "param_count");
    std::vector<float> w(count);
    e.check(e.need(e.hooks().get_params, "get_params")(e.self(), e.engine(), w.data(), count), "get_params");
    return w;
  }
  void set_weights(std::span<const float> w) {
    const detail::EngineHandle& e = require_engine();
    e.check(e.need(e.hooks().set_params, "set_params")(e.self(), e.engine(), w.data(), w.size()), "set_params");
  }
  // The backend's opaque training state (parameters, optimizer slots, statistics, step).
  std::string state_dict() const {
    const detail::EngineHandle& e = require_engine();
    std::string out;
    e.check(e.need(e.hooks().state_dict, "state_dict")(e.self(), e.engine(), skyforge::detail::string_sink(out)),
            "state_dict");
    return out;
  }
  void load_state(std::string_view bytes) {
    const detail::EngineHandle& e = require_engine();
    e.check(e.need(e.hooks().load_state, "load_state")(e.self(), e.engine(), bytes.data(), bytes.size()),
            "load_state");
  }
  // Checkpoint files outside fit(): rank 0 writes; load reads on rank 0 and broadcasts, and
  // every rank loads the state (a collective). load_checkpoint throws on a spec mismatch.
  void save_checkpoint(const std::filesystem::path& path, uint32_t epoch = 0, uint64_t step = 0) const {
    std::string bytes = state_dict();
    detail::on_rank0(comm_, [&] {
      Checkpoint ck;
      ck.epoch = epoch;
      ck.step = step;
      ck.fingerprint = fingerprint();
      ck.spec = spec_text_;
      ck.state = std::move(bytes);
      write_file_atomic(path, encode_checkpoint(ck));
    });
  }
  Checkpoint load_checkpoint(const std::filesystem::path& path) {
    std::string bytes;
    detail::on_rank0(comm_, [&] { bytes = read_file(path); });
    detail::broadcast_string(comm_, bytes);
    Checkpoint ck = decode_and_check(bytes, path.string());
    load_state(ck.state);
    return ck;
  }

 protected:
  explicit Model(std::string name) : name_(std::move(name)) {}

  std::string name_;
  std::vector<uint32_t> input_shape_;
  std::vector<Layer> layers_;
  bool compiled_ = false;

 private:
  // The layers' graph (layer_schema.hpp): run order, inputs, shapes; throws naming a bad layer.
  schema::Graph graph() const {
    const std::vector<schema::LayerConfig> c = configs();
    return detail::schema_call([&] { return schema::graph(input_shape_, c); });
  }
  // The layers checked against the schema, after the model's own checks.
  std::vector<schema::LayerConfig> configs() const {
    if (input_shape_.empty()) throw Error("keras: the model has no Input({...}) shape", SF_ERR_INVALID);
    if (layers_.empty()) throw Error("keras: the model has no layers", SF_ERR_INVALID);
    std::vector<schema::LayerConfig> c;
    for (size_t i = 0; i < layers_.size(); ++i) c.push_back(detail::config(layers_[i], i));
    return c;
  }
  void require_compiled() const {
    if (!compiled_) throw Error("keras: call compile() first", SF_ERR_INVALID);
  }
  const detail::EngineHandle& require_engine() const {
    require_compiled();
    if (!engine_)
      throw Error("keras: the model is not bound to a compute backend: compile(..., "
                  "CompileOptions{.backend = host().compute_backend()}) or CompileOptions::from_host(host())",
                  SF_ERR_INVALID);
    return *engine_;
  }
  size_t sample_size() const { return static_cast<size_t>(detail::product(input_shape_)); }

  static std::string spec_text(const detail::CompiledSpec& c) {
    std::string s = "input=";
    for (size_t i = 0; i < c.input_shape.size(); ++i) s += (i ? "x" : "") + std::to_string(c.input_shape[i]);
    // Appends only: GCC 12 at -O3 misreads `";" + str` chains as overlapping copies (-Wrestrict).
    for (const Layer& l : c.layers) {
      s.append(";").append(l.type).append("(");
      for (size_t i = 0; i < l.options.size(); ++i)
        s.append(i ? "," : "").append(l.options[i].first).append("=").append(l.options[i].second);
      s.append(")");
    }
    s.append(";optimizer=").append(c.optimizer).append(";loss=").append(c.loss);
    return s;
  }

  std::string check_xy(std::span<const float> x, std::span<const int32_t> y, const char* what) const {
    const size_t sample = sample_size();
    if (x.size() != y.size() * sample)
      return std::string(what) + ": x has " + std::to_string(x.size()) + " floats, expected " +
             std::to_string(y.size()) + " samples x " + std::to_string(sample) + " (" +
             detail::shape_text(input_shape_) + ") = " + std::to_string(y.size() * sample);
    const auto classes = static_cast<int64_t>(num_classes());
    for (size_t i = 0; i < y.size(); ++i)
      if (y[i] < 0 || y[i] >= classes)
        return std::string(what) + ": label " + std::to_string(y[i]) + " at index " + std::to_string(i) +
               " is outside [0, " + std::to_string(classes) + ")";
    return {};
  }

  static void gather(std::span<const float> x, std::span<const int32_t> y, const size_t* idx, uint64_t count,
                     size_t sample, std::vector<float>& xb, std::vector<int32_t>& yb) {
    xb.resize(count * sample);
    yb.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      std::memcpy(xb.data() + i * sample, x.data() + idx[i] * sample, sample * sizeof(float));
      yb[i] = y[idx[i]];
    }
  }

  // keep: where fit() keeps its validation set's binding from one epoch to the next.
  EvalResult evaluate_impl(std::span<const float> x, std::span<const int32_t> y, uint64_t B, Data data,
                           std::optional<detail::BoundData>* keep = nullptr) {
    const detail::EngineHandle& e = require_engine();
    const uint32_t W = comm_.size(), R = comm_.rank();
    const size_t sample = sample_size();
    std::string err = check_xy(x, y, "evaluate");
    if (err.empty() && B == 0) err = "evaluate: batch_size must be > 0";
    detail::collective_check(comm_, err);
    uint64_t begin = 0, n = y.size();
    const uint64_t given = n;
    if (data == Data::replicated) {
      int64_t mm[2] = {static_cast<int64_t>(n), -static_cast<int64_t>(n)};
      comm_.allreduce(mm, 2, SF_REDUCE_MAX);
      if (mm[0] != -mm[1] || !same_on_all_ranks(data_hash(x, y)))
        detail::collective_check(comm_, "evaluate: Data::replicated needs the same arrays on every rank, but they "
                                        "differ (pass Data::sharded when each rank passes its own part)");
      begin = detail::share_begin(n, W, R);
      n = detail::share(n, W, R);
    }
    const uint64_t b = std::max<uint64_t>(1, detail::share(B, W, R));
    // steps = max over ranks of ceil(n / b), but at most min over ranks of n, so that every
    // rank makes the same number of eval_step calls, each with at least one sample.
    int64_t v[2] = {static_cast<int64_t>((n + b - 1) / b), -static_cast<int64_t>(n)};
    comm_.allreduce(v, 2, SF_REDUCE_MAX);
    const uint64_t n_min = static_cast<uint64_t>(-v[1]);
    if (n_min == 0) {
      int64_t total = static_cast<int64_t>(n);
      comm_.allreduce(&total, 1, SF_REDUCE_SUM);
      detail::collective_check(comm_, total == 0 ? "evaluate: no samples"
                                                 : "evaluate: a rank has no samples (eval_step is collective: "
                                                   "give every rank at least one, or use Data::replicated)");
    }
    const uint64_t steps = std::min<uint64_t>(static_cast<uint64_t>(v[0]), n_min);
    std::vector<size_t> idx(n);
    for (uint64_t i = 0; i < n; ++i) idx[i] = begin + i;
    std::vector<float> xb;
    std::vector<int32_t> yb;
    double loss_sum = 0;
    uint64_t correct = 0, seen = 0, at = 0;
    auto add = [&](const sf_step_result& r) {
      loss_sum += r.loss * static_cast<double>(r.samples);
      correct += r.correct;
      seen += r.samples;
    };
    // Bound data: this rank's part copied once, every step deferred, one read back at the end.
    std::optional<detail::BoundData> local;
    std::optional<detail::BoundData>& slot = keep ? *keep : local;
    if (!slot) slot.emplace(e, x.subspan(begin * sample, n * sample), y.subspan(begin, n), comm_);
    const detail::BoundData& bound = *slot;
    std::vector<uint64_t> ids;
    // Every rank's part: replicated, its share of the whole; sharded, gathered once.
    std::vector<uint64_t> parts = part_sizes(n, data == Data::sharded && bound.takes_batches());
    if (data == Data::replicated)
      for (uint32_t r = 0; r < W; ++r) parts[r] = detail::share(given, W, r);
    for (uint64_t s = 0; s < steps; ++s) {
      auto batch_of = [&](uint32_t r) { return parts[r] / steps + (s < parts[r] % steps ? 1 : 0); };
      const uint64_t count = batch_of(R);
      if (bound.ok()) {
        bound.next_batches(W, batch_of);
        ids.resize(count);
        std::iota(ids.begin(), ids.end(), at);
        bound.eval(ids.data(), count, nullptr);
        at += count;
        continue;
      }
      gather(x, y, idx.data() + at, count, sample, xb, yb);
      at += count;
      sf_step_result r{};
      r.struct_size = sizeof r;
      e.check(e.hooks().eval_step(e.self(), e.engine(), xb.data(), yb.data(), static_cast<uint32_t>(count), &r),
              "eval_step");
      add(r);
    }
    if (bound.ok()) add(bound.take());
    EvalResult out;
    out.samples = seen;
    out.loss = seen ? loss_sum / static_cast<double>(seen) : std::nan("");
    out.accuracy = seen ? static_cast<double>(correct) / static_cast<double>(seen) : std::nan("");
    return out;
  }

  // Every rank's n, gathered when `gather` (collective then, and the same on every rank), else n
  // for every rank (what replicated data has).
  std::vector<uint64_t> part_sizes(uint64_t n, bool gather) const {
    std::vector<uint64_t> all(comm_.size(), n);
    if (gather && comm_.size() > 1) comm_.allgather(&n, sizeof n, all.data());
    return all;
  }

  Checkpoint decode_and_check(std::string_view bytes, const std::string& name) const {
    Checkpoint ck = decode_checkpoint(bytes, name);
    if (ck.fingerprint != fingerprint() || ck.spec != spec_text_)
      throw Error("checkpoint " + name + " was written for a different model (" +
                      spec_difference(ck.spec, spec_text_) + "); use another checkpoint_dir or the original model",
                  SF_ERR_INVALID);
    return ck;
  }

  // Why checkpoint `ck` (written by fit()) is not this run's to resume, or "": another seed is
  // another data order and other dropout masks, so the two runs would mix; within an epoch, the
  // position is counted in steps of its global batch.
  std::string run_mismatch(const Checkpoint& ck, uint64_t seed, uint64_t batch, uint64_t steps) const {
    if (!ck.batch_size) return {};  // format 1 or 2, or written outside fit(): nothing to compare
    if (ck.seed != seed)
      return "checkpoint " + ck_path_ + " was written by a run with seed " + std::to_string(ck.seed) +
             ", and this run's seed is " + std::to_string(seed) +
             ": resuming it would mix two runs (another data order and other dropout masks); give this run "
             "its own checkpoint directory, or seed " + std::to_string(ck.seed) + " to go on with that run";
    if (ck.epoch_step && (ck.batch_size != batch || ck.steps_per_epoch != steps))
      return "checkpoint " + ck_path_ + " stopped " + std::to_string(ck.epoch_step) + " steps into epoch " +
             std::to_string(ck.epoch + 1) + " of a run with a global batch of " + std::to_string(ck.batch_size) +
             " and " + std::to_string(ck.steps_per_epoch) + " steps per epoch, and this run has " +
             std::to_string(batch) + " and " + std::to_string(steps) +
             ": the position within the epoch would name other samples; resume with that run's batch size and "
             "steps, or from an epoch's checkpoint";
    return {};
  }

  // Reads <dir>/latest on rank 0, broadcasts the bytes, and every rank checks and loads them.
  std::optional<Checkpoint> load_latest_checkpoint(const std::string& dir) {
    std::string bytes, name;
    std::string found = "0";
    detail::on_rank0(comm_, [&] {
      if (auto p = latest_checkpoint(dir)) {
        name = p->string();
        bytes = read_regular_file(*p, "checkpoint " + name);
        found = "1";
      }
    });
    detail::broadcast_string(comm_, found);
    if (found != "1") return std::nullopt;
    detail::broadcast_string(comm_, name);
    detail::broadcast_string(comm_, bytes);
    std::string err;
    std::optional<Checkpoint> ck;
    try {
      ck = decode_and_check(bytes, name);
    } catch (const std::exception& ex) {
      err = ex.what();
    }
    if (!err.empty()) throw Error(err, SF_ERR_INVALID);  // identical bytes: every rank fails alike
    load_state(ck->state);
    ck_path_ = name;
    return ck;
  }

  // A cheap fingerprint of a data set: every label, a strided sample of the pixels, the sizes.
  static uint64_t data_hash(std::span<const float> x, std::span<const int32_t> y) {
    uint64_t h = fnv1a64(std::string_view(reinterpret_cast<const char*>(y.data()), y.size_bytes()));
    const size_t stride = std::max<size_t>(1, x.size() / 65536);
    for (size_t i = 0; i < x.size(); i += stride) {
      uint32_t bits = 0;
      std::memcpy(&bits, &x[i], sizeof bits);
      h = (h ^ bits) * 0x100000001b3ULL;
    }
    return h ^ (uint64_t{x.size()} * 0x9E3779B97F4A7C15ULL);
  }
  // Collective: whether every rank passed the same value.
  bool same_on_all_ranks(uint64_t value) const {
    if (comm_.size() <= 1) return true;
    int64_t v[2] = {static_cast<int64_t>(value >> 2), 0};  // 62 bits: negation cannot overflow
    v[1] = -v[0];
    comm_.allreduce(v, 2, SF_REDUCE_MAX);
    return v[0] == -v[1];
  }

  // Data::sharded with identical arrays on every rank usually means the caller forgot shard():
  // each epoch would then visit every sample W times. Warn (rank 0) when the label arrays match.
  void warn_if_replicated_by_mistake(std::span<const float> x, std::span<const int32_t> y, const FitOptions& o) const {
    if (o.data != Data::sharded || comm_.size() <= 1) return;
    if (same_on_all_ranks(data_hash(x, y)) && comm_.rank() == 0 && o.verbose > 0)
      std::fprintf(stderr,
                   "keras: warning: every rank passed the same %zu samples with Data::sharded, so each epoch "
                   "trains on them %u times; shard() them, or pass FitOptions{.data = Data::replicated}\n",
                   y.size(), comm_.size());
  }

  std::unique_ptr<detail::CompiledSpec> spec_;
  std::unique_ptr<detail::EngineHandle> engine_;
  Communicator comm_;
  uint64_t seed_ = 0;
  std::vector<std::string> accuracy_names_;
  std::string spec_text_;
  std::string ck_path_;
};

// Keras' Sequential: each layer takes the previous one's output; Input({...}) first.
class Sequential : public Model {
 public:
  Sequential() : Model("sequential") {}
  Sequential(std::initializer_list<Layer> layers) : Sequential() {
    for (const Layer& l : layers) add(l);
  }
  explicit Sequential(const std::vector<Layer>& layers) : Sequential() {
    for (const Layer& l : layers) add(l);
  }

  // Appends a layer; an Input (only first) sets the sample shape.
  Sequential& add(const Layer& l) {
    if (compiled_) throw Error("keras: add() after compile(); build the model first", SF_ERR_INVALID);
    if (l.type == "input") {
      if (!layers_.empty() || !input_shape_.empty())
        throw Error("keras: Input must come first and only once", SF_ERR_INVALID);
      input_shape_ = l.shape;
      return *this;
    }
    layers_.push_back(l);
    return *this;
  }
};

}  // namespace skyforge::keras
