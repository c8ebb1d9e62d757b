// keras fit() and evaluate() on bound data (abi.h ABI 1.8; docs/compute-backends.md, "Bound
// data"): the cuda engine's host build behind its C table, as a loaded plugin is reached. The
// same fit with the bound-data hooks hidden (keras then copies each batch and reads every
// step's result) must train the same bits; results are read back only when something shows
// them, counted here.
#include "cuda_host.hpp"  // tests/backend_check/fixtures: the host build as a ComputeBackend

#include <skyforge/keras.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "real_parts.hpp"  // tests/keras_sdk: real GlooCommunicators over a real store

namespace K = skyforge::keras;

namespace {

// The real table, one without the bound-data hooks, and one that counts what keras asks.
const sf_compute_hooks& real_hooks() { return *skyforge::detail::compute_hooks<CudaHost>(); }
// The arrays step_batches was given on this thread (a rank's), in order.
thread_local std::vector<std::vector<uint32_t>>* t_batches = nullptr;
const sf_compute_hooks* recording_step_batches() {
  static sf_compute_hooks t = [] {
    sf_compute_hooks h = real_hooks();
    h.step_batches = [](void* s, void* e, const uint32_t* b, uint32_t ranks) {
      if (t_batches) t_batches->emplace_back(b, b + ranks);
      return real_hooks().step_batches(s, e, b, ranks);
    };
    return h;
  }();
  return &t;
}
const sf_compute_hooks* without_step_batches() {
  static sf_compute_hooks t = [] {
    sf_compute_hooks h = real_hooks();
    h.step_batches = nullptr;
    return h;
  }();
  return &t;
}
const sf_compute_hooks* without_bound_data() {
  static sf_compute_hooks t = [] {
    sf_compute_hooks h = real_hooks();
    h.bind_data = nullptr;
    h.release_data = nullptr;
    h.train_step_indexed = nullptr;
    h.eval_step_indexed = nullptr;
    h.take_results = nullptr;
    return h;
  }();
  return &t;
}
std::atomic<int> g_steps{0}, g_steps_with_result{0}, g_takes{0}, g_binds{0}, g_releases{0};
const sf_compute_hooks* counting() {
  static sf_compute_hooks t = [] {
    sf_compute_hooks h = real_hooks();
    h.bind_data = [](void* s, void* e, const float* x, const int32_t* y, uint64_t n, uint64_t* d) {
      ++g_binds;
      return real_hooks().bind_data(s, e, x, y, n, d);
    };
    h.release_data = [](void* s, void* e, uint64_t d) {
      ++g_releases;
      return real_hooks().release_data(s, e, d);
    };
    h.train_step_indexed = [](void* s, void* e, uint64_t d, const uint64_t* idx, uint32_t b, sf_step_result* out) {
      ++g_steps;
      if (out) ++g_steps_with_result;
      return real_hooks().train_step_indexed(s, e, d, idx, b, out);
    };
    h.take_results = [](void* s, void* e, sf_step_result* out) {
      ++g_takes;
      return real_hooks().take_results(s, e, out);
    };
    return h;
  }();
  return &t;
}

struct Instance {
  void* self = nullptr;
  Instance() {
    if (skyforge::detail::create<CudaHost>(nullptr, nullptr, 0, &self) != SF_OK) throw std::runtime_error("create");
  }
  ~Instance() { skyforge::detail::destroy<CudaHost>(self); }
};

struct Data {
  std::vector<float> x;
  std::vector<int32_t> y;
};
// Samples whose class shows in their pixels, so that training has something to learn.
Data make_data(uint32_t n, uint64_t seed) {
  skyforge::Rng rng(seed);
  Data d;
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t c = static_cast<int32_t>(rng.next() % 10);
    d.y.push_back(c);
    for (int p = 0; p < 64; ++p)
      d.x.push_back(static_cast<float>(rng.next() >> 40) / 16777216.0f + (p % 10 == c ? 1.f : 0.f));
  }
  return d;
}

K::Sequential model() {
  return K::Sequential({K::Input({8, 8, 1}), K::Flatten(), K::Dense(32, "relu"), K::Dropout(0.25), K::Dense(10)});
}

struct FitRun {
  K::History history;
  std::vector<float> weights;
  std::string progress;
  K::EvalResult eval, eval_sharded;
};

// sharded_eval: also evaluate() this rank's part of a sharded set after the fit.
FitRun fit(const sf_compute_hooks* hooks, void* self, const skyforge::Communicator& comm, const Data& train,
        const Data& val, K::Data how, const Data* sharded_eval = nullptr) {
  K::Sequential m = model();
  K::CompileOptions co;
  co.backend = K::Backend(hooks, self);
  co.communicator = comm;
  co.seed = 5;
  m.compile(K::Adam{3e-3}, "sparse_categorical_crossentropy", {"accuracy"}, co);
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* out = open_memstream(&buf, &len);
  K::FitOptions o;
  o.epochs = 3;
  o.batch_size = 24;
  o.data = how;
  o.validation_data = {val.x, val.y};
  o.out = out;
  o.tty = false;
  FitRun r;
  r.history = m.fit(train.x, train.y, o);
  r.eval = m.evaluate(val.x, val.y, 16);
  if (sharded_eval) r.eval_sharded = m.evaluate(sharded_eval->x, sharded_eval->y, 16, K::Data::sharded);
  std::fclose(out);
  r.progress.assign(buf, len);
  std::free(buf);
  r.weights = m.get_weights();
  return r;
}

void expect_same_training(const FitRun& bound, const FitRun& plain) {
  ASSERT_EQ(bound.weights.size(), plain.weights.size());
  EXPECT_EQ(0, std::memcmp(bound.weights.data(), plain.weights.data(), bound.weights.size() * sizeof(float)))
      << "bound data trained other weights";
  for (const char* k : {"loss", "accuracy", "val_loss", "val_accuracy"}) {
    ASSERT_EQ(bound.history[k].size(), 3u) << k;
    for (size_t e = 0; e < 3; ++e)  // sums in another order: the same up to rounding
      EXPECT_NEAR(bound.history[k][e], plain.history[k][e], 1e-12 * std::fabs(plain.history[k][e])) << k << " " << e;
  }
  EXPECT_NEAR(bound.eval.loss, plain.eval.loss, 1e-12 * plain.eval.loss);
  EXPECT_EQ(bound.eval.accuracy, plain.eval.accuracy);
  EXPECT_EQ(bound.eval.samples, plain.eval.samples);
}

}  // namespace

TEST(KerasBoundData, FitTrainsTheSameBitsAndReadsResultsOnlyWhenShown) {
  const Data train = make_data(500, 1), val = make_data(100, 2);
  Instance inst;
  g_steps = g_steps_with_result = g_takes = g_binds = g_releases = 0;
  const FitRun bound = fit(counting(), inst.self, skyforge::Communicator{}, train, val, K::Data::sharded);
  const FitRun plain = fit(without_bound_data(), inst.self, skyforge::Communicator{}, train, val, K::Data::sharded);
  expect_same_training(bound, plain);
  EXPECT_GT(bound.history["accuracy"][2], 0.5) << "nothing learnt";
  // 3 epochs of ceil(500 / 24) = 21 steps, every one deferred. Reads: the progress lines (at most
  // one a 10 % of an epoch, the last step being the epoch's end) and each epoch's end, plus one
  // per validation pass (3) and one for evaluate().
  EXPECT_EQ(g_steps.load(), 63);
  EXPECT_EQ(g_steps_with_result.load(), 0);
  // (And one at each of the 3 bindings: sums an earlier failed fit left pending are dropped.)
  EXPECT_LE(g_takes.load(), 3 * 10 + 3 + 1 + 3) << "a result read back per step";
  EXPECT_GE(g_takes.load(), 3 + 3 + 1 + 3);
  std::printf("%d steps, %d of them read back; %d reads of the deferred sums\n", g_steps.load(),
              g_steps_with_result.load(), g_takes.load());
  // The training set once, the validation set once for the whole fit, evaluate()'s once.
  EXPECT_EQ(g_binds.load(), 3);
  EXPECT_EQ(g_releases.load(), 3);
  // The same progress lines (steps and metrics as printed; the times differ).
  auto lines = [](const std::string& s) {
    // "21/21 [===] - 0s 88us/step - loss: ...", " 3/21 [>..] - ETA: 0s - ... - 2e+05 samples/s": times out.
    return std::regex_replace(s, std::regex("ETA: \\S+|\\S+ \\S+/step|\\S+ samples/s"), "T");
  };
  EXPECT_EQ(lines(bound.progress), lines(plain.progress));
}

// Two ranks, each binding its own shard: the replicas are bit-identical and equal the plain run.
TEST(KerasBoundData, TwoRanksOnBoundDataFollowThePlainRun) {
  for (K::Data how : {K::Data::sharded, K::Data::replicated}) {
    std::vector<FitRun> bound(2), plain(2);
    Instance inst;
    for (bool use_bound : {true, false}) {
      const auto errors = real::run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
        const Data train = how == K::Data::sharded ? make_data(250, 10 + r) : make_data(500, 10);
        const Data val = make_data(100, 20);
        (use_bound ? bound : plain)[r] = fit(use_bound ? &real_hooks() : without_bound_data(), inst.self,
                                             skyforge::Communicator(comm), train, val, how);
      });
      for (const std::string& e : errors) ASSERT_EQ(e, "");
    }
    EXPECT_EQ(bound[0].weights, bound[1].weights) << "replicas differ";
    expect_same_training(bound[0], plain[0]);
    EXPECT_EQ(bound[0].history["loss"], bound[1].history["loss"]);
  }
}

// A rank that cannot bind its part (here: its table has no bound-data hooks) makes every rank
// copy batches: the ranks agree before the first step, so the engine's collectives never mix
// the two paths, and the run is the plain one.
TEST(KerasBoundData, OneRankWithoutBoundDataMakesEveryRankCopyBatches) {
  std::vector<FitRun> mixed(2), plain(2);
  Instance inst;
  for (bool mix : {true, false}) {
    g_binds = g_releases = 0;
    const auto errors = real::run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
      const Data train = make_data(250, 30 + r), val = make_data(100, 40);
      const sf_compute_hooks* hooks = mix && r == 0 ? counting() : without_bound_data();
      (mix ? mixed : plain)[r] = fit(hooks, inst.self, skyforge::Communicator(comm), train, val, K::Data::sharded);
    });
    for (const std::string& e : errors) ASSERT_EQ(e, "");
    if (mix) {
      EXPECT_EQ(g_binds.load(), 3) << "rank 0 bound its sets";
      EXPECT_EQ(g_releases.load(), 3) << "and let them go at once";
    }
  }
  EXPECT_EQ(mixed[0].weights, mixed[1].weights);
  EXPECT_EQ(mixed[0].weights, plain[0].weights);
  EXPECT_EQ(mixed[0].history["loss"], plain[0].history["loss"]);
}

// fit() and evaluate() tell the engine every rank's batch at every step (step_batches, from the
// schedule every rank shares), so the engine chooses its graphs without exchanging a key with its
// peers each step (the "allgather 16 B" of its GraphKey). The shards differ in size, so the ranks'
// last batches of an epoch differ, and so do their parts of a sharded evaluate(): every rank is
// told the same arrays, each naming every rank's real batch. Without the hook (an older engine
// table) the engine gathers the key every step; both train the same bits.
TEST(KerasBoundData, TwoRanksChooseTheirGraphsWithoutAnExchangeEachStep) {
  std::map<bool, std::vector<FitRun>> runs;
  std::map<bool, std::vector<size_t>> key_gathers;
  std::vector<std::vector<std::vector<uint32_t>>> told(2);
  Instance inst;
  for (bool schedule : {true, false}) {
    runs[schedule].resize(2);
    key_gathers[schedule].resize(2);
    const auto errors = real::run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
      const Data train = make_data(r == 0 ? 250 : 245, 50 + r), val = make_data(100, 60);
      const Data part = make_data(r == 0 ? 53 : 40, 70 + r);  // evaluate(): 7 steps, of 8 or 7 here, of 6 or 5 on rank 1
      real::CommSpy spy(comm);
      t_batches = schedule ? &told[r] : nullptr;
      runs[schedule][r] = fit(schedule ? recording_step_batches() : without_step_batches(), inst.self,
                              skyforge::Communicator(spy.table()), train, val, K::Data::sharded, &part);
      t_batches = nullptr;
      key_gathers[schedule][r] = static_cast<size_t>(std::count(spy.calls.begin(), spy.calls.end(), "allgather 16 B"));
    });
    for (const std::string& e : errors) ASSERT_EQ(e, "");
  }
  EXPECT_EQ(runs[true][0].weights, runs[true][1].weights) << "replicas differ";
  EXPECT_EQ(runs[true][0].weights, runs[false][0].weights) << "step_batches changed what was trained";
  EXPECT_EQ(runs[true][0].history["loss"], runs[false][0].history["loss"]);
  EXPECT_EQ(runs[true][0].eval_sharded.loss, runs[false][0].eval_sharded.loss);
  EXPECT_EQ(runs[true][0].eval_sharded.samples, 93u);
  // 3 epochs of 21 steps of 12 (the last 10 and 5); 3 validation passes of 5 steps (50 samples
  // a rank, 12 a step); evaluate's 7 (16 a step: 8 a rank); the sharded evaluate's 7.
  const size_t steps = 3 * 21 + 3 * 5 + 7 + 7;
  EXPECT_EQ(key_gathers[true][0], 0u);
  EXPECT_EQ(key_gathers[false][0], steps);
  ASSERT_EQ(told[0].size(), steps);
  EXPECT_EQ(told[0], told[1]) << "the ranks were told different batches";
  EXPECT_EQ(told[0][20], (std::vector<uint32_t>{10, 5})) << "an epoch's last step";
  EXPECT_EQ(told[0][steps - 1], (std::vector<uint32_t>{7, 5})) << "the sharded evaluate's last step";
}
