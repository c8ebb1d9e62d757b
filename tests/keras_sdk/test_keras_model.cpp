// skyforge::keras::Sequential end to end on the REAL parts (real_parts.hpp): the `cpu` compute
// backend behind its C hooks, and for the data-parallel rules 2 ranks (threads), each with its
// own GlooCommunicator over a real rendezvous store. Spies that forward every call count what
// the SDK hands the backend and the communicator. Compile's hand-off, backend failures,
// fit/evaluate/predict, the files fit() writes, resume, and the data-parallel contract.
#include <skyforge/keras.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model_util.hpp"
#include "real_parts.hpp"
#include "test_util.hpp"

namespace K = skyforge::keras;
namespace fs = std::filesystem;
using Opts = std::vector<std::pair<std::string, std::string>>;
using namespace model_util;
using namespace real;

namespace {

// The TensorBoard scalars `tag` in the event files of `dir`, as (step, value) in file order.
std::vector<std::pair<int64_t, float>> scalars_in(const fs::path& dir, const std::string& tag) {
  std::vector<std::pair<int64_t, float>> out;
  for (const auto& f : fs::directory_iterator(dir))
    for (const auto& rec : skyforge::tfevents::read_records(f.path())) {
      const auto ev = skyforge::tfevents::parse_event(rec);
      for (const auto& [t, v] : ev.scalars)
        if (t == tag) out.emplace_back(ev.step, v);
    }
  return out;
}

}  // namespace

// ---- compile -----------------------------------------------------------------------------------
TEST(KerasModel, CompileHandsTheSpecToTheBackend) {
  SpiedCpu b;
  K::Sequential m = small_model();
  m.compile(K::SGD{0.05, 0.9, true}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b, nullptr, 42));
  EXPECT_EQ(b.spy.engines_created, 1u);
  EXPECT_EQ(b.spy.seen.input_shape, (std::vector<uint32_t>{2, 3, 1}));
  EXPECT_EQ(b.spy.seen.layer_types, (std::vector<std::string>{"flatten", "dense"}));
  EXPECT_EQ(b.spy.seen.layer_options[1], (Opts{{"units", "3"}, {"activation", "linear"}, {"use_bias", "true"}}));
  EXPECT_EQ(b.spy.seen.optimizer, "sgd");
  EXPECT_EQ(b.spy.seen.optimizer_options, (Opts{{"learning_rate", "0.05"}, {"momentum", "0.9"}, {"nesterov", "true"}}));
  EXPECT_EQ(b.spy.seen.loss, "sparse_categorical_crossentropy");
  EXPECT_EQ(b.spy.seen.seed, 42u);
  EXPECT_EQ(b.spy.seen.threads, 1u);
  EXPECT_EQ(m.spec().n_layers, 2u);
  EXPECT_EQ(m.spec_text(),
            "input=2x3x1;flatten();dense(units=3,activation=linear,use_bias=true);optimizer=sgd;"
            "loss=sparse_categorical_crossentropy");
  EXPECT_NE(error_of([&] { m.add(K::Dense(3)); }).find("after compile"), std::string::npos);
  // The real engine built that model: 6 x 3 kernel + 3 biases, as the summary counts them.
  EXPECT_EQ(m.get_weights().size(), 6u * 3u + 3u);
  EXPECT_NE(m.summary().find("Trainable params: 21"), std::string::npos) << m.summary();

  // The seed reached the engine: the same seed gives the same initial weights, another differs.
  SpiedCpu same_seed, other_seed;
  K::Sequential m42 = small_model(), m43 = small_model();
  m42.compile(K::SGD{0.05}, "sparse_categorical_crossentropy", {"accuracy"}, bind(same_seed, nullptr, 42));
  m43.compile(K::SGD{0.05}, "sparse_categorical_crossentropy", {"accuracy"}, bind(other_seed, nullptr, 43));
  EXPECT_EQ(m42.get_weights(), m.get_weights());
  EXPECT_NE(m43.get_weights(), m.get_weights());

  SpiedCpu b2;
  K::Sequential adam = small_model();
  adam.compile(K::Adam{0.01}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b2));
  EXPECT_EQ(b2.spy.engines_created, 1u);
  EXPECT_EQ(b2.spy.seen.optimizer, "adam");
  EXPECT_EQ(b2.spy.seen.optimizer_options,
            (Opts{{"learning_rate", "0.01"}, {"beta_1", "0.9"}, {"beta_2", "0.999"}, {"epsilon", "1e-07"}}));
}

// A spec the backend refuses: the backend's own message reaches the caller. (The SDK and every
// backend read one layer schema, so a layer the SDK accepts the backend accepts too; the spy hands
// the backend a loss the SDK would have refused.)
TEST(KerasModel, BackendFailureCarriesItsMessage) {
  SpiedCpu b;
  b.spy.loss_override = "mse";
  K::Sequential m({K::Input({2, 3, 1}), K::Flatten(), K::Dense(3)});
  const std::string err =
      error_of([&] { m.compile(K::Adam{}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b)); });
  EXPECT_NE(err.find("keras: engine_create failed: unknown loss 'mse' (known: sparse_categorical_crossentropy, "
                     "from logits)"),
            std::string::npos)
      << err;
  EXPECT_EQ(b.spy.engines_created, 0u);
  EXPECT_FALSE(m.compiled());
}

// ---- one rank ---------------------------------------------------------------------------------
TEST(KerasFit, LearnsAndReports) {
  SpiedCpu b;
  K::Sequential m = small_model();
  m.compile(K::SGD{0.5}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b));
  const Synthetic train = make_data(300, 1), val = make_data(90, 2);
  std::FILE* out = std::tmpfile();
  K::FitOptions o;
  o.epochs = 4;
  o.batch_size = 32;
  o.validation_data = {val.x, val.y};
  o.out = out;
  o.tty = false;
  std::vector<uint32_t> callback_epochs;
  o.callbacks.on_epoch_end = [&](uint32_t e, const K::Logs& logs) {
    callback_epochs.push_back(e);
    EXPECT_EQ(logs.count("val_loss"), 1u);
  };
  const K::History h = m.fit(train.x, train.y, o);
  ASSERT_EQ(h.size(), 4u);
  EXPECT_EQ(h.epoch, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(callback_epochs, h.epoch);
  EXPECT_LT(h["loss"][3], h["loss"][0]);
  EXPECT_GT(h["accuracy"][3], 0.9);
  EXPECT_GT(h["val_accuracy"][3], 0.9);
  EXPECT_EQ(b.spy.train_calls, 4u * 10u);  // ceil(300 / 32) steps per epoch
  EXPECT_EQ(b.spy.train_batches.back(), 300u - 9u * 32u);
  EXPECT_EQ(b.engine_step(), 4u * 10u);  // the engine applied every one of them

  // Progress: "Epoch i/4", then lines (no \r: not a tty), the final one with the val metrics.
  std::rewind(out);
  std::string text(1 << 16, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), out));
  std::fclose(out);
  EXPECT_NE(text.find("Epoch 1/4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Epoch 4/4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("10/10 [==============================] - "), std::string::npos) << text;
  EXPECT_NE(text.find(" - val_loss: "), std::string::npos) << text;
  EXPECT_NE(text.find(" samples/s"), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);

  // evaluate == the last epoch's validation metrics (same weights, same data; another batch
  // size, so only the order of the float sums may differ).
  const K::EvalResult r = m.evaluate(val.x, val.y, 16);
  EXPECT_EQ(r.samples, 90u);
  EXPECT_NEAR(r.loss, h["val_loss"][3], 1e-6);
  EXPECT_NEAR(r.accuracy, h["val_accuracy"][3], 1e-12);

  // predict: logits whose argmax agrees with evaluate's accuracy.
  const uint64_t predicts_before = b.spy.predict_calls;
  const std::vector<float> logits = m.predict(val.x, 7);
  EXPECT_EQ(b.spy.predict_calls - predicts_before, 13u);  // ceil(90 / 7)
  ASSERT_EQ(logits.size(), 90u * 3u);
  size_t right = 0;
  for (size_t i = 0; i < 90; ++i) {
    const float* z = logits.data() + i * 3;
    const auto arg = static_cast<int32_t>(std::max_element(z, z + 3) - z);
    right += arg == val.y[i];
  }
  EXPECT_NEAR(static_cast<double>(right) / 90.0, r.accuracy, 1e-12);

  const std::vector<float> w = m.get_weights();
  EXPECT_EQ(w.size(), 6u * 3u + 3u);
  // set_weights round-trips through the engine, and predict follows the weights.
  std::vector<float> zeros(w.size(), 0.0f);
  m.set_weights(zeros);
  EXPECT_EQ(m.get_weights(), zeros);
  for (float z : m.predict(val.x, 32)) EXPECT_EQ(z, 0.0f);
  m.set_weights(w);
  EXPECT_EQ(m.predict(val.x, 7), logits);
}

TEST(KerasFit, InputErrors) {
  SpiedCpu b;
  K::Sequential m = small_model();
  m.compile(K::SGD{0.1}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b));
  Synthetic d = make_data(20, 1);
  EXPECT_NE(error_of([&] { m.fit(std::span<const float>(d.x).first(100), d.y); }).find("x has 100 floats"),
            std::string::npos);
  d.y[5] = 3;
  EXPECT_NE(error_of([&] { m.fit(d.x, d.y); }).find("label 3 at index 5 is outside [0, 3)"), std::string::npos);
  d.y[5] = 0;
  K::FitOptions o;
  o.batch_size = 0;
  EXPECT_NE(error_of([&] { m.fit(d.x, d.y, o); }).find("batch_size"), std::string::npos);
  EXPECT_EQ(b.spy.train_calls, 0u);
  EXPECT_EQ(b.engine_step(), 0u);
}

TEST(KerasFit, DropRemainder) {
  SpiedCpu b;
  K::Sequential m = small_model();
  m.compile(K::SGD{0.1}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b));
  const Synthetic d = make_data(100, 1);
  K::FitOptions o;
  o.batch_size = 32;
  o.drop_remainder = true;
  o.verbose = 0;
  m.fit(d.x, d.y, o);
  EXPECT_EQ(b.spy.train_batches, (std::vector<uint32_t>{32, 32, 32}));
}

// CSV, TensorBoard and checkpoints written by fit().
TEST(KerasFit, WritesCsvTensorBoardAndCheckpoints) {
  TempDir dir("fit_files");
  SpiedCpu b;
  K::Sequential m = sgd_model(b);
  const Synthetic train = make_data(120, 3), val = make_data(30, 4);
  K::FitOptions o = quiet_fit(3, 16);
  o.validation_data = {val.x, val.y};
  o.callbacks.csv = (dir.path / "history.csv").string();
  o.callbacks.tensorboard = (dir.path / "logs").string();
  o.callbacks.tensorboard_update_freq = 4;
  o.callbacks.checkpoint_dir = (dir.path / "ckpt").string();
  const K::History h = m.fit(train.x, train.y, o);

  EXPECT_EQ(K::read_file(dir.path / "history.csv"), K::history_csv(h));
  EXPECT_EQ(K::read_file(dir.path / "history.csv").substr(0, 42), "epoch,accuracy,loss,val_accuracy,val_loss\n");

  for (uint32_t e = 1; e <= 3; ++e) EXPECT_TRUE(fs::exists(dir.path / "ckpt" / ("ckpt-" + std::to_string(e) + ".bin")));
  EXPECT_EQ(K::read_file(dir.path / "ckpt" / "latest"), "ckpt-3.bin\n");
  const K::Checkpoint ck = K::decode_checkpoint(K::read_file(dir.path / "ckpt" / "ckpt-3.bin"), "ckpt-3.bin");
  EXPECT_EQ(ck.epoch, 3u);
  EXPECT_EQ(ck.step, 3u * 8u);
  EXPECT_EQ(ck.fingerprint, m.fingerprint());
  EXPECT_EQ(ck.state, m.state_dict());
  // The stored state is the engine's: a fresh engine loading it holds the same weights, and
  // one loading the epoch-1 checkpoint does not.
  SpiedCpu fresh;
  K::Sequential again = sgd_model(fresh, nullptr, 99);
  EXPECT_NE(again.get_weights(), m.get_weights());
  again.load_checkpoint(dir.path / "ckpt" / "ckpt-3.bin");
  EXPECT_EQ(again.get_weights(), m.get_weights());
  EXPECT_EQ(fresh.engine_step(), 3u * 8u);
  again.load_checkpoint(dir.path / "ckpt" / "ckpt-1.bin");
  EXPECT_NE(again.get_weights(), m.get_weights());
  EXPECT_EQ(fresh.engine_step(), 8u);

  // TensorBoard, read back with our reader: Keras' layout and tags.
  const auto epoch_loss = scalars_in(dir.path / "logs" / "train", "epoch_loss");
  const auto batch_loss = scalars_in(dir.path / "logs" / "train", "batch_loss");
  const auto val_acc = scalars_in(dir.path / "logs" / "validation", "epoch_accuracy");
  ASSERT_EQ(epoch_loss.size(), 3u);
  for (int64_t e = 0; e < 3; ++e) {
    EXPECT_EQ(epoch_loss[static_cast<size_t>(e)].first, e);
    EXPECT_EQ(epoch_loss[static_cast<size_t>(e)].second, static_cast<float>(h["loss"][static_cast<size_t>(e)]));
  }
  ASSERT_EQ(val_acc.size(), 3u);
  EXPECT_EQ(val_acc[2].second, static_cast<float>(h["val_accuracy"][2]));
  EXPECT_EQ(batch_loss.size(), 6u);  // 24 steps, every 4th
  EXPECT_EQ(batch_loss[0].first, 4);
  // Keras' TensorBoard callback adds the optimizer's rate to the train writer (SGD(0.3) here),
  // and neither History nor the CSV has it.
  EXPECT_EQ(scalars_in(dir.path / "logs" / "train", "epoch_learning_rate"),
            (std::vector<std::pair<int64_t, float>>{{0, 0.3f}, {1, 0.3f}, {2, 0.3f}}));
  EXPECT_EQ(h.history.count("learning_rate"), 0u);

  // ... and with the real tensorboard package.
  const std::string py = venv_python_or_skip();
  if (py.empty()) GTEST_SKIP() << skip_reason();
  auto expect = [&](const std::string& tag, const std::string& metric) {
    std::string s = " --expect " + tag + "=";
    for (size_t e = 0; e < 3; ++e)
      s += (e ? "," : "") + std::to_string(e) + ":" + K::format_double(static_cast<float>(h[metric][e]));
    return s;
  };
  EXPECT_EQ(run_command(py + " " + CHECK_TFEVENTS_PY + " " + (dir.path / "logs" / "train").string() +
                        expect("epoch_loss", "loss") + expect("epoch_accuracy", "accuracy")),
            0);
  EXPECT_EQ(run_command(py + " " + CHECK_TFEVENTS_PY + " " + (dir.path / "logs" / "validation").string() +
                        expect("epoch_loss", "val_loss") + expect("epoch_accuracy", "val_accuracy")),
            0);
}

// With a schedule, epoch_learning_rate is the rate of the next update: ExponentialDecay(0.1, 8,
// 0.5) after 8 and 16 updates (8 steps an epoch) is 0.05 and 0.025.
TEST(KerasFit, TensorBoardLogsTheScheduledLearningRate) {
  TempDir dir("fit_lr");
  SpiedCpu b;
  K::Sequential m = small_model();
  m.compile(K::SGD{.learning_rate = K::ExponentialDecay{.initial_learning_rate = 0.1, .decay_steps = 8, .decay_rate = 0.5}},
            "sparse_categorical_crossentropy", {"accuracy"}, bind(b));
  const Synthetic d = make_data(128, 3);
  K::FitOptions o = quiet_fit(2, 16);
  o.callbacks.tensorboard = (dir.path / "logs").string();
  m.fit(d.x, d.y, o);
  EXPECT_EQ(scalars_in(dir.path / "logs" / "train", "epoch_learning_rate"),
            (std::vector<std::pair<int64_t, float>>{{0, 0.05f}, {1, 0.025f}}));
}

// Training 4 epochs straight == training 2, stopping, and resuming to 4 from the checkpoint:
// bit for bit, on a model whose state is more than its weights (Adam's slots and step, the
// batch-norm moving statistics, dropout's generator).
TEST(KerasFit, ResumeContinuesExactly) {
  TempDir dir("resume");
  const Synthetic d = make_data(150, 5);
  auto model = [] {
    return K::Sequential({K::Input({2, 3, 1}), K::Flatten(), K::Dense(8), K::BatchNormalization(), K::ReLU(),
                          K::Dropout(0.25), K::Dense(3)});
  };
  auto opts = [&](uint32_t epochs, bool resume, const fs::path& ckdir) {
    K::FitOptions o = quiet_fit(epochs, 16);
    o.seed = 11;
    o.callbacks.checkpoint_dir = ckdir.string();
    o.callbacks.csv = (ckdir / "h.csv").string();
    o.callbacks.resume = resume;
    return o;
  };
  SpiedCpu b1;
  K::Sequential straight = model();
  straight.compile(K::Adam{0.01}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b1));
  const K::History h1 = straight.fit(d.x, d.y, opts(4, false, dir.path / "a"));
  EXPECT_LT(h1["loss"][3], h1["loss"][0]);

  SpiedCpu b2;
  {
    K::Sequential first = model();
    first.compile(K::Adam{0.01}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b2));
    first.fit(d.x, d.y, opts(2, true, dir.path / "b"));  // resume with no checkpoint yet: from scratch
    EXPECT_EQ(b2.spy.train_calls, 2u * 10u);
  }
  SpiedCpu b3;
  K::Sequential second = model();
  second.compile(K::Adam{0.01}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b3));
  const K::History h2 = second.fit(d.x, d.y, opts(4, true, dir.path / "b"));
  EXPECT_EQ(b3.spy.train_calls, 2u * 10u);  // only epochs 3 and 4 ran here
  EXPECT_EQ(b3.engine_step(), 4u * 10u);    // the backend's own state came back
  EXPECT_EQ(h2.epoch, h1.epoch);
  EXPECT_EQ(h2.history, h1.history);
  EXPECT_EQ(second.get_weights(), straight.get_weights());
  EXPECT_EQ(second.state_dict(), straight.state_dict());  // slots, moving statistics, generator, step
  EXPECT_EQ(K::read_file(dir.path / "b" / "h.csv"), K::read_file(dir.path / "a" / "h.csv"));

  // Resuming a finished run trains nothing and returns the stored history.
  SpiedCpu b4;
  K::Sequential third = model();
  third.compile(K::Adam{0.01}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b4));
  const K::History h3 = third.fit(d.x, d.y, opts(4, true, dir.path / "b"));
  EXPECT_EQ(b4.spy.train_calls, 0u);
  EXPECT_EQ(h3.history, h1.history);
  EXPECT_EQ(third.get_weights(), straight.get_weights());
}

TEST(KerasFit, ResumeWithAnotherModelIsAClearError) {
  TempDir dir("resume_mismatch");
  const Synthetic d = make_data(40, 5);
  K::FitOptions o;
  o.epochs = 1;
  o.verbose = 0;
  o.callbacks.checkpoint_dir = dir.path.string();
  o.callbacks.resume = true;
  SpiedCpu b1;
  K::Sequential a({K::Input({2, 3, 1}), K::Flatten(), K::Dense(3)});
  a.compile(K::SGD{0.2}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b1));
  a.fit(d.x, d.y, o);

  SpiedCpu b2;
  K::Sequential other({K::Input({2, 3, 1}), K::Flatten(), K::Dense(4)});
  other.compile(K::SGD{0.2}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b2));
  o.epochs = 2;
  const std::string err = error_of([&] { other.fit(d.x, d.y, o); });
  EXPECT_NE(err.find("ckpt-1.bin was written for a different model"), std::string::npos) << err;
  EXPECT_NE(err.find("checkpoint has 'dense(units=3,activation=linear,use_bias=true)', this model has "
                     "'dense(units=4,activation=linear,use_bias=true)'"),
            std::string::npos)
      << err;
  EXPECT_EQ(b2.spy.train_calls, 0u);

  // A changed learning rate is not a different model: the engine takes the state and goes on.
  SpiedCpu b3;
  K::Sequential same({K::Input({2, 3, 1}), K::Flatten(), K::Dense(3)});
  same.compile(K::SGD{0.01}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b3));
  EXPECT_EQ(same.fit(d.x, d.y, o).size(), 2u);
  EXPECT_EQ(b3.spy.train_calls, 2u);           // epoch 2 only: ceil(40 / 32)
  EXPECT_EQ(b3.engine_step(), 2u + 2u);        // epoch 1's steps came back with the state
}

// ---- data-parallel -----------------------------------------------------------------------------
// Compile is a collective: every replica starts from rank 0's initial weights, whatever its seed.
TEST(KerasDataParallel, CompileStartsEveryReplicaFromRankZerosWeights) {
  SpiedCpu single;
  K::Sequential m1 = sgd_model(single, nullptr, 100);
  std::vector<std::vector<float>> w(2);
  const auto errors = run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
    SpiedCpu b;
    K::Sequential m = sgd_model(b, comm, 100 + r);
    w[r] = m.get_weights();
  });
  ASSERT_EQ(errors, (std::vector<std::string>{"", ""}));
  EXPECT_EQ(w[0], m1.get_weights());
  EXPECT_EQ(w[1], w[0]);
}

// Data::replicated: 2 ranks on the same GLOBAL batch follow 1 rank's trajectory, step by step
// (the per-step losses TensorBoard records), even when the batch does not divide evenly
// (33 = 17 + 16) and the last batch is partial; the replicas stay bit-identical. On both of the
// communicator's transports.
TEST(KerasDataParallel, ReplicatedMatchesSingleRank) {
  const Synthetic d = make_data(203, 9), val = make_data(41, 10);
  for (const real::Transport transport : {real::Transport::automatic, real::Transport::tcp})
    for (uint32_t batch : {32u, 33u}) {
      const std::string where =
          std::string(transport == real::Transport::tcp ? "tcp" : "default transport") + ", batch " +
          std::to_string(batch);
      TempDir dir("replicated");
      K::FitOptions o = quiet_fit(3, batch);
      o.seed = 5;
      o.data = K::Data::replicated;
      o.validation_data = {val.x, val.y};
      o.callbacks.tensorboard_update_freq = 1;

      SpiedCpu single;
      K::Sequential m1 = sgd_model(single);
      K::FitOptions o1 = o;
      o1.callbacks.tensorboard = (dir.path / "one").string();
      const K::History h1 = m1.fit(d.x, d.y, o1);
      const std::vector<float> w1 = m1.get_weights();

      std::vector<K::History> h2(2);
      std::vector<std::vector<float>> w2(2);
      std::vector<uint64_t> calls(2);
      std::vector<std::vector<uint32_t>> batches(2);
      const real::RanksResult run = real::run_ranks_on(
          2,
          [&](uint32_t r, const sf_communicator* comm) {
            SpiedCpu b;
            K::Sequential m = sgd_model(b, comm);
            K::FitOptions o2 = o;
            o2.callbacks.tensorboard = (dir.path / "two").string();  // rank 0 writes
            h2[r] = m.fit(d.x, d.y, o2);
            w2[r] = m.get_weights();
            calls[r] = b.spy.train_calls;
            batches[r] = b.spy.train_batches;
          },
          transport);
      ASSERT_EQ(run.errors, (std::vector<std::string>{"", ""})) << where;
      if (transport == real::Transport::tcp) {
        EXPECT_EQ(run.transports[0], "gloo") << where;
      }
      EXPECT_EQ(run.transports[0], run.transports[1]) << where;
      EXPECT_EQ(calls[0], calls[1]) << where;
      EXPECT_EQ(calls[0], single.spy.train_calls) << where;
      EXPECT_EQ(batches[0][0] + batches[1][0], batch) << where;
      EXPECT_EQ(batches[0][0], (batch + 1) / 2) << where;  // the first batch % W ranks take one more
      EXPECT_EQ(w2[0], w2[1]) << where;                     // replicas stay bit-identical
      ASSERT_EQ(w2[0].size(), w1.size());
      for (size_t i = 0; i < w1.size(); ++i) EXPECT_NEAR(w2[0][i], w1[i], 1e-5) << where << " weight " << i;
      for (const char* k : {"loss", "accuracy", "val_loss", "val_accuracy"})
        for (size_t e = 0; e < 3; ++e) EXPECT_NEAR(h2[0][k][e], h1[k][e], 1e-5) << where << " " << k << " epoch " << e;
      EXPECT_EQ(h2[0].history, h2[1].history) << where;
      // Step by step: the global batch's loss, every step.
      const auto loss1 = scalars_in(dir.path / "one" / "train", "batch_loss");
      const auto loss2 = scalars_in(dir.path / "two" / "train", "batch_loss");
      ASSERT_EQ(loss1.size(), single.spy.train_calls) << where;
      ASSERT_EQ(loss2.size(), loss1.size()) << where;
      for (size_t s = 0; s < loss1.size(); ++s) {
        EXPECT_EQ(loss2[s].first, loss1[s].first);
        EXPECT_NEAR(loss2[s].second, loss1[s].second, 1e-5) << where << " step " << loss1[s].first;
      }
      EXPECT_LT(loss1.back().second, loss1.front().second) << where;
    }
}

// Data::sharded with uneven shards: every rank makes the same number of train_step and
// eval_step calls, indeed the same communicator calls in the same order; evaluation still
// counts every sample exactly once.
TEST(KerasDataParallel, UnevenShardsStayCollective) {
  const Synthetic d = make_data(200, 12);
  std::vector<uint64_t> train_calls(2), eval_calls(2);
  std::vector<std::vector<uint32_t>> eval_batches(2);
  std::vector<std::vector<std::string>> comm_calls(2);
  std::vector<K::EvalResult> results(2);
  std::vector<std::vector<float>> w(2);
  const auto errors = run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
    const Synthetic mine = r == 0 ? slice(d, 0, 130) : slice(d, 130, 70);
    real::CommSpy spy(comm);
    SpiedCpu b;
    K::Sequential m = sgd_model(b, spy.table());
    K::FitOptions o = quiet_fit(2, 20);  // 10 per rank: rank 0 has 13 batches, rank 1 has 7
    m.fit(mine.x, mine.y, o);
    train_calls[r] = b.spy.train_calls;
    results[r] = m.evaluate(mine.x, mine.y, 20, K::Data::sharded);
    eval_calls[r] = b.spy.eval_calls;
    eval_batches[r] = b.spy.eval_batches;
    comm_calls[r] = spy.calls;
    w[r] = m.get_weights();
  });
  ASSERT_EQ(errors, (std::vector<std::string>{"", ""}));
  EXPECT_EQ(train_calls, (std::vector<uint64_t>{14, 14}));  // min(13, 7) per epoch
  EXPECT_EQ(eval_calls[0], eval_calls[1]);
  EXPECT_EQ(eval_calls[0], 13u);  // max(ceil(130 / 10), ceil(70 / 10)) = 13 <= 70 samples
  uint64_t seen = 0;
  for (const auto& v : eval_batches)
    for (uint32_t n : v) {
      EXPECT_GT(n, 0u);
      seen += n;
    }
  EXPECT_EQ(seen, 200u);
  EXPECT_EQ(results[0].samples, 200u);
  EXPECT_EQ(results[1].samples, 200u);
  EXPECT_EQ(results[0].loss, results[1].loss);
  EXPECT_EQ(results[0].accuracy, results[1].accuracy);
  EXPECT_EQ(w[0], w[1]);
  EXPECT_FALSE(comm_calls[0].empty());
  EXPECT_EQ(comm_calls[0], comm_calls[1]);
}

// Shards made by skyforge::shard() (sizes differ by one) and a global batch of 32 split 16+16.
TEST(KerasDataParallel, ShardedWithSkyforgeShard) {
  const Synthetic d = make_data(201, 13);
  std::vector<std::vector<uint32_t>> batches(2);
  std::vector<K::History> h(2);
  std::vector<std::vector<float>> w(2);
  const auto errors = run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
    const std::vector<size_t> idx = skyforge::shard(201, r, 2, true, 42);
    Synthetic mine;
    for (size_t i : idx) {
      mine.y.push_back(d.y[i]);
      mine.x.insert(mine.x.end(), d.x.begin() + static_cast<std::ptrdiff_t>(i * 6),
                    d.x.begin() + static_cast<std::ptrdiff_t>(i * 6 + 6));
    }
    SpiedCpu b;
    K::Sequential m = sgd_model(b, comm);
    K::FitOptions o = quiet_fit(2, 32);
    h[r] = m.fit(mine.x, mine.y, o);
    batches[r] = b.spy.train_batches;
    w[r] = m.get_weights();
  });
  ASSERT_EQ(errors, (std::vector<std::string>{"", ""}));
  ASSERT_EQ(batches[0].size(), batches[1].size());
  EXPECT_EQ(batches[0].size(), 2u * 7u);  // ceil(101 / 16) = ceil(100 / 16) = 7
  EXPECT_EQ(batches[0][0], 16u);
  EXPECT_EQ(batches[0][6], 101u - 96u);
  EXPECT_EQ(batches[1][6], 100u - 96u);
  EXPECT_EQ(h[0].history, h[1].history);
  EXPECT_EQ(w[0], w[1]);
  EXPECT_LT(h[0]["loss"][1], h[0]["loss"][0]);
}

TEST(KerasDataParallel, OneRanksBadInputFailsEveryRank) {
  const Synthetic d = make_data(40, 1);
  std::vector<uint64_t> train_calls(2, 99);
  const auto errors = run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
    Synthetic mine = d;
    if (r == 1) mine.y[3] = 9;
    SpiedCpu b;
    K::Sequential m = sgd_model(b, comm);
    K::FitOptions o;
    o.verbose = 0;
    try {
      m.fit(mine.x, mine.y, o);
    } catch (...) {
      train_calls[r] = b.spy.train_calls;
      throw;
    }
  });
  for (const auto& e : errors) EXPECT_NE(e.find("rank 1: fit: label 9 at index 3"), std::string::npos) << e;
  EXPECT_EQ(train_calls, (std::vector<uint64_t>{0, 0}));  // refused before the first step
}

TEST(KerasDataParallel, BatchSmallerThanWorldAndEmptyEvalShard) {
  const Synthetic d = make_data(10, 1);
  const auto errors = run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
    SpiedCpu b;
    K::Sequential m = sgd_model(b, comm);
    K::FitOptions o;
    o.verbose = 0;
    o.batch_size = 1;
    const std::string fit_err = error_of([&] { m.fit(d.x, d.y, o); });
    if (fit_err.find("batch_size 1 (global) is smaller than the 2 replicas") == std::string::npos)
      throw std::runtime_error("unexpected: " + fit_err);
    const Synthetic mine = r == 0 ? d : Synthetic{};
    m.evaluate(mine.x, mine.y, 4, K::Data::sharded);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("a rank has no samples"), std::string::npos) << e;
}

// Data::replicated checks that the ranks really pass the same arrays (equal-sized shards are
// the easy mistake: the sizes match, the contents do not).
TEST(KerasDataParallel, ReplicatedRefusesDifferentArrays) {
  const Synthetic d = make_data(40, 1);
  const auto errors = run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
    const Synthetic mine = slice(d, r * 20, 20);
    SpiedCpu b;
    K::Sequential m = sgd_model(b, comm);
    const std::string eval_err = error_of([&] { m.evaluate(mine.x, mine.y); });
    if (eval_err.find("evaluate: Data::replicated needs the same arrays on every rank") == std::string::npos)
      throw std::runtime_error("unexpected evaluate error: " + eval_err);
    K::FitOptions o;
    o.verbose = 0;
    o.data = K::Data::replicated;
    m.fit(mine.x, mine.y, o);
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("fit: Data::replicated needs the same arrays on every rank, but they differ"), std::string::npos)
        << e;
}

// Rank 0's file I/O failing (here: the checkpoint dir is a regular file) fails every rank alike.
TEST(KerasDataParallel, Rank0IoFailureReachesEveryRank) {
  TempDir dir("io_fail");
  std::ofstream(dir.path / "not_a_dir") << "x";
  const Synthetic d = make_data(40, 1);
  const auto errors = run_ranks(2, [&](uint32_t, const sf_communicator* comm) {
    SpiedCpu b;
    K::Sequential m = sgd_model(b, comm);
    K::FitOptions o;
    o.verbose = 0;
    o.data = K::Data::replicated;
    o.callbacks.checkpoint_dir = (dir.path / "not_a_dir" / "ckpt").string();
    m.fit(d.x, d.y, o);
  });
  ASSERT_FALSE(errors[0].empty());
  EXPECT_EQ(errors[0], errors[1]);
  EXPECT_NE(errors[0].find("not_a_dir"), std::string::npos) << errors[0];
}

// Only rank 0 prints.
TEST(KerasDataParallel, OnlyRankZeroPrints) {
  const Synthetic d = make_data(64, 1);
  std::vector<std::string> printed(2);
  const auto errors = run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
    SpiedCpu b;
    K::Sequential m = sgd_model(b, comm);
    std::FILE* f = std::tmpfile();
    K::FitOptions o;
    o.epochs = 2;
    o.out = f;
    o.tty = false;
    o.data = K::Data::replicated;
    m.fit(d.x, d.y, o);
    std::rewind(f);
    std::string s(1 << 14, '\0');
    s.resize(std::fread(s.data(), 1, s.size(), f));
    std::fclose(f);
    printed[r] = s;
  });
  ASSERT_EQ(errors, (std::vector<std::string>{"", ""}));
  EXPECT_NE(printed[0].find("Epoch 2/2"), std::string::npos) << printed[0];
  EXPECT_NE(printed[0].find("2/2 [==============================]"), std::string::npos) << printed[0];
  EXPECT_EQ(printed[1], "");
}
