// skyforge::keras::Sequential end to end over a backend behind the C hooks (fake_backend.hpp):
// layer specs, shape inference, compile errors, fit/evaluate/predict, the files fit() writes,
// resume, and the data-parallel rules with 2 ranks (threads sharing an in-process communicator).
#include <skyforge/keras.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "fake_backend.hpp"
#include "test_util.hpp"

namespace K = skyforge::keras;
namespace fs = std::filesystem;
using Opts = std::vector<std::pair<std::string, std::string>>;

namespace {

// 3 separable classes of 2x3x1 "images": class k has +2 on feature k, uniform noise of +-0.5.
struct Synthetic {
  std::vector<float> x;
  std::vector<int32_t> y;
};
Synthetic make_data(size_t n, uint64_t seed) {
  Synthetic d;
  skyforge::Rng rng(seed);
  for (size_t i = 0; i < n; ++i) {
    const auto k = static_cast<int32_t>(rng.below(3));
    d.y.push_back(k);
    for (int j = 0; j < 6; ++j)
      d.x.push_back((j == k ? 2.0f : 0.0f) + static_cast<float>(rng.below(1001)) / 1000.0f - 0.5f);
  }
  return d;
}
Synthetic slice(const Synthetic& d, size_t begin, size_t count) {
  Synthetic s;
  s.x.assign(d.x.begin() + static_cast<std::ptrdiff_t>(begin * 6),
             d.x.begin() + static_cast<std::ptrdiff_t>((begin + count) * 6));
  s.y.assign(d.y.begin() + static_cast<std::ptrdiff_t>(begin), d.y.begin() + static_cast<std::ptrdiff_t>(begin + count));
  return s;
}

K::Sequential small_model(uint32_t classes = 3) {
  return K::Sequential({K::Input({2, 3, 1}), K::Flatten(), K::Dense(classes)});
}

K::CompileOptions bind(fake::Backend& b, const sf_communicator* comm = nullptr, uint64_t seed = 7) {
  K::CompileOptions o;
  o.backend = K::Backend(fake::hooks(), &b);
  o.communicator = skyforge::Communicator(comm);
  o.seed = seed;
  return o;
}

fake::Engine& engine_of(fake::Backend& b) { return *b.last_engine; }

// Runs f(rank, comm) on W threads; rethrows nothing, returns each rank's error text ("" = ok).
std::vector<std::string> run_ranks(uint32_t W, const std::function<void(uint32_t, const sf_communicator*)>& f) {
  fake::World world(W);
  std::vector<std::string> errors(W);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < W; ++r)
    threads.emplace_back([&, r] {
      try {
        f(r, world.comm(r));
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "(empty)";
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---- layers and specs --------------------------------------------------------------------------
TEST(KerasLayers, BuildersEmitKerasOptionNames) {
  EXPECT_EQ(K::Dense(128, "relu").options, (Opts{{"units", "128"}, {"activation", "relu"}, {"use_bias", "true"}}));
  EXPECT_EQ(K::layers::Dense(10).options, (Opts{{"units", "10"}, {"activation", "linear"}, {"use_bias", "true"}}));
  EXPECT_EQ(K::Conv2D(32, 3, 1, "same", false).options,
            (Opts{{"filters", "32"}, {"kernel_size", "3"}, {"strides", "1"}, {"padding", "same"},
                  {"use_bias", "false"}, {"activation", "linear"}}));
  EXPECT_EQ(K::Conv2D(8, {3, 5}, {2, 1}).option("kernel_size"), "3,5");
  EXPECT_EQ(K::Conv2D(8, {3, 5}, {2, 1}).option("strides"), "2,1");
  EXPECT_EQ(K::MaxPooling2D(2).options, (Opts{{"pool_size", "2"}, {"strides", "2"}, {"padding", "valid"}}));
  EXPECT_EQ(K::MaxPooling2D(3, K::Size2(1)).option("strides"), "1");
  EXPECT_EQ(K::BatchNormalization().options, (Opts{{"momentum", "0.99"}, {"epsilon", "0.001"}}));
  EXPECT_EQ(K::BatchNormalization(0.9, 1e-5, true, false).options,
            (Opts{{"momentum", "0.9"}, {"epsilon", "1e-05"}, {"scale", "false"}}));
  EXPECT_EQ(K::Dropout(0.5).options, (Opts{{"rate", "0.5"}}));
  EXPECT_EQ(K::ReLU().type, "relu");
  EXPECT_EQ(K::Softmax().type, "softmax");
  EXPECT_EQ(K::Flatten().type, "flatten");
  EXPECT_EQ(K::GlobalAveragePooling2D().type, "global_average_pooling2d");
}

// The Keras multi-device guide's convnet: shapes and parameter counts as Keras computes them.
TEST(KerasModel, ShapeInferenceAndSummary) {
  K::Sequential m({K::Input({28, 28, 1}), K::Conv2D(12, 3, 1, "same", false), K::BatchNormalization(), K::ReLU(),
                   K::Conv2D(24, 6, 2, "same", false), K::BatchNormalization(), K::ReLU(),
                   K::Conv2D(32, 6, 2, "same", false), K::BatchNormalization(), K::ReLU(),
                   K::GlobalAveragePooling2D(), K::Dense(256, "relu"), K::Dropout(0.5), K::Dense(10)});
  EXPECT_EQ(m.output_shape(), (std::vector<uint32_t>{10}));
  EXPECT_EQ(m.num_classes(), 10u);
  const std::string s = m.summary();
  EXPECT_NE(s.find("conv2d_1 (Conv2D)"), std::string::npos) << s;
  EXPECT_NE(s.find("(None, 14, 14, 24)"), std::string::npos) << s;
  EXPECT_NE(s.find("(None, 7, 7, 32)"), std::string::npos) << s;
  EXPECT_NE(s.find("Total params: 49414"), std::string::npos) << s;
  EXPECT_NE(s.find("Trainable params: 49278"), std::string::npos) << s;
  EXPECT_NE(s.find("Non-trainable params: 136"), std::string::npos) << s;

  K::Sequential mlp({K::Input({28, 28, 1}), K::Conv2D(32, 3), K::MaxPooling2D(2), K::Flatten(), K::Dense(10)});
  EXPECT_EQ(mlp.output_shape(), (std::vector<uint32_t>{10}));
  EXPECT_NE(mlp.summary().find("(None, 13, 13, 32)"), std::string::npos) << mlp.summary();
  EXPECT_NE(mlp.summary().find("Total params: 54410"), std::string::npos) << mlp.summary();  // 320 + 5408*10+10
}

TEST(KerasModel, CompileErrorsAreClear) {
  auto compile_error = [](K::Sequential m, const std::string& loss = "sparse_categorical_crossentropy",
                          std::vector<std::string> metrics = {"accuracy"}) {
    return error_of([&] { m.compile(K::Adam{}, loss, metrics); });
  };
  EXPECT_NE(compile_error(K::Sequential({K::Dense(10)})).find("no Input"), std::string::npos);
  EXPECT_NE(compile_error(K::Sequential({K::Input({4})})).find("no layers"), std::string::npos);
  EXPECT_NE(compile_error(K::Sequential({K::Input({4, 4, 1}), K::Dense(10)})).find("must be (None, classes)"),
            std::string::npos);
  EXPECT_NE(compile_error(K::Sequential({K::Input({16}), K::Conv2D(4, 3), K::Dense(2)}))
                .find("layer 0 (conv2d): expects an input of rank 3"),
            std::string::npos);
  EXPECT_NE(compile_error(K::Sequential({K::Input({2, 2, 1}), K::Conv2D(4, 3), K::Flatten(), K::Dense(2)}))
                .find("window 3 is larger than the input"),
            std::string::npos);
  EXPECT_NE(compile_error(small_model(), "mse").find("loss 'mse' is not supported"), std::string::npos);
  EXPECT_NE(compile_error(small_model(), "sparse_categorical_crossentropy", {"auc"}).find("metric 'auc'"),
            std::string::npos);
  EXPECT_NE(compile_error(K::Sequential({K::Input({4}), K::Dropout(1.5), K::Dense(2)})).find("rate must be in"),
            std::string::npos);
  EXPECT_NE(error_of([] { K::Sequential({K::Dense(2), K::Input({4})}); }).find("Input must come first"),
            std::string::npos);
  EXPECT_NE(error_of([] { K::Sequential m = small_model(); m.compile(K::SGD{-1}); }).find("learning_rate"),
            std::string::npos);
}

TEST(KerasModel, CompileHandsTheSpecToTheBackend) {
  fake::Backend b;
  K::Sequential m = small_model();
  m.compile(K::SGD{0.05, 0.9, true}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b, nullptr, 42));
  EXPECT_EQ(b.engines_created, 1u);
  EXPECT_EQ(b.seen_layer_types, (std::vector<std::string>{"flatten", "dense"}));
  EXPECT_EQ(b.seen_layer_options[1], (Opts{{"units", "3"}, {"activation", "linear"}, {"use_bias", "true"}}));
  EXPECT_EQ(b.seen_optimizer, "sgd");
  EXPECT_EQ(b.seen_optimizer_options, (Opts{{"learning_rate", "0.05"}, {"momentum", "0.9"}, {"nesterov", "true"}}));
  EXPECT_EQ(b.seen_seed, 42u);
  EXPECT_EQ(m.spec().n_layers, 2u);
  EXPECT_EQ(m.spec_text(),
            "input=2x3x1;flatten();dense(units=3,activation=linear,use_bias=true);optimizer=sgd;"
            "loss=sparse_categorical_crossentropy");
  EXPECT_NE(error_of([&] { m.add(K::Dense(3)); }).find("after compile"), std::string::npos);

  fake::Backend b2;
  K::Sequential adam = small_model();
  adam.compile(K::Adam{0.01}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b2));
  EXPECT_EQ(b2.seen_optimizer, "adam");
  EXPECT_EQ(b2.seen_optimizer_options,
            (Opts{{"learning_rate", "0.01"}, {"beta_1", "0.9"}, {"beta_2", "0.999"}, {"epsilon", "1e-07"}}));
}

TEST(KerasModel, UnboundModelSaysHowToBind) {
  K::Sequential m = small_model();
  m.compile(K::Adam{});
  const Synthetic d = make_data(10, 1);
  EXPECT_NE(error_of([&] { m.fit(d.x, d.y); }).find("not bound to a compute backend"), std::string::npos);
  K::Sequential not_compiled = small_model();
  EXPECT_NE(error_of([&] { not_compiled.predict(d.x); }).find("compile() first"), std::string::npos);
}

TEST(KerasModel, BackendFailureCarriesItsMessage) {
  fake::Backend b;
  K::Sequential m({K::Input({4}), K::ReLU()});  // no dense: the fake backend refuses
  EXPECT_NE(error_of([&] { m.compile(K::Adam{}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b)); })
                .find("engine_create failed: fake backend: no dense layer"),
            std::string::npos);
}

// ---- one rank ---------------------------------------------------------------------------------
TEST(KerasFit, LearnsAndReports) {
  fake::Backend b;
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
  EXPECT_EQ(engine_of(b).train_calls, 4u * 10u);  // ceil(300 / 32) steps per epoch
  EXPECT_EQ(engine_of(b).train_batches.back(), 300u - 9u * 32u);

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

  // evaluate == the last epoch's validation metrics (same weights, same data).
  const K::EvalResult r = m.evaluate(val.x, val.y, 16);
  EXPECT_EQ(r.samples, 90u);
  EXPECT_NEAR(r.loss, h["val_loss"][3], 1e-12);
  EXPECT_NEAR(r.accuracy, h["val_accuracy"][3], 1e-12);

  // predict: logits whose argmax agrees with evaluate's accuracy.
  const std::vector<float> logits = m.predict(val.x, 7);
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
}

TEST(KerasFit, InputErrors) {
  fake::Backend b;
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
  EXPECT_EQ(engine_of(b).train_calls, 0u);
}

TEST(KerasFit, DropRemainder) {
  fake::Backend b;
  K::Sequential m = small_model();
  m.compile(K::SGD{0.1}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b));
  const Synthetic d = make_data(100, 1);
  K::FitOptions o;
  o.batch_size = 32;
  o.drop_remainder = true;
  o.verbose = 0;
  m.fit(d.x, d.y, o);
  EXPECT_EQ(engine_of(b).train_batches, (std::vector<uint32_t>{32, 32, 32}));
}

// CSV, TensorBoard and checkpoints written by fit().
TEST(KerasFit, WritesCsvTensorBoardAndCheckpoints) {
  TempDir dir("fit_files");
  fake::Backend b;
  K::Sequential m = small_model();
  m.compile(K::SGD{0.3}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b));
  const Synthetic train = make_data(120, 3), val = make_data(30, 4);
  K::FitOptions o;
  o.epochs = 3;
  o.batch_size = 16;
  o.verbose = 0;
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

  // TensorBoard, read back with our reader: Keras' layout and tags.
  auto events_in = [](const fs::path& d) {
    std::vector<skyforge::tfevents::Event> evs;
    for (const auto& f : fs::directory_iterator(d))
      for (const auto& rec : skyforge::tfevents::read_records(f.path())) evs.push_back(skyforge::tfevents::parse_event(rec));
    return evs;
  };
  const auto tr = events_in(dir.path / "logs" / "train");
  const auto va = events_in(dir.path / "logs" / "validation");
  std::vector<std::pair<int64_t, float>> epoch_loss, batch_loss, val_acc;
  for (const auto& e : tr)
    for (const auto& [tag, v] : e.scalars) {
      if (tag == "epoch_loss") epoch_loss.emplace_back(e.step, v);
      if (tag == "batch_loss") batch_loss.emplace_back(e.step, v);
    }
  for (const auto& e : va)
    for (const auto& [tag, v] : e.scalars)
      if (tag == "epoch_accuracy") val_acc.emplace_back(e.step, v);
  ASSERT_EQ(epoch_loss.size(), 3u);
  for (int64_t e = 0; e < 3; ++e) {
    EXPECT_EQ(epoch_loss[static_cast<size_t>(e)].first, e);
    EXPECT_EQ(epoch_loss[static_cast<size_t>(e)].second, static_cast<float>(h["loss"][static_cast<size_t>(e)]));
  }
  ASSERT_EQ(val_acc.size(), 3u);
  EXPECT_EQ(val_acc[2].second, static_cast<float>(h["val_accuracy"][2]));
  EXPECT_EQ(batch_loss.size(), 6u);  // 24 steps, every 4th
  EXPECT_EQ(batch_loss[0].first, 4);

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

// Training 4 epochs straight == training 2, stopping, and resuming to 4 from the checkpoint.
TEST(KerasFit, ResumeContinuesExactly) {
  TempDir dir("resume");
  const Synthetic d = make_data(150, 5);
  auto opts = [&](uint32_t epochs, bool resume, const fs::path& ckdir) {
    K::FitOptions o;
    o.epochs = epochs;
    o.batch_size = 16;
    o.verbose = 0;
    o.seed = 11;
    o.callbacks.checkpoint_dir = ckdir.string();
    o.callbacks.csv = (ckdir / "h.csv").string();
    o.callbacks.resume = resume;
    return o;
  };
  fake::Backend b1;
  K::Sequential straight = small_model();
  straight.compile(K::SGD{0.2}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b1));
  const K::History h1 = straight.fit(d.x, d.y, opts(4, false, dir.path / "a"));

  fake::Backend b2;
  {
    K::Sequential first = small_model();
    first.compile(K::SGD{0.2}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b2));
    first.fit(d.x, d.y, opts(2, true, dir.path / "b"));  // resume with no checkpoint yet: from scratch
  }
  fake::Backend b3;
  K::Sequential second = small_model();
  second.compile(K::SGD{0.2}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b3));
  const K::History h2 = second.fit(d.x, d.y, opts(4, true, dir.path / "b"));
  EXPECT_EQ(engine_of(b3).train_calls, 2u * 10u);  // only epochs 3 and 4 ran here
  EXPECT_EQ(engine_of(b3).steps, 4u * 10u);        // the backend's own state came back
  EXPECT_EQ(h2.epoch, h1.epoch);
  EXPECT_EQ(h2.history, h1.history);
  EXPECT_EQ(second.get_weights(), straight.get_weights());
  EXPECT_EQ(K::read_file(dir.path / "b" / "h.csv"), K::read_file(dir.path / "a" / "h.csv"));

  // Resuming a finished run trains nothing and returns the stored history.
  fake::Backend b4;
  K::Sequential third = small_model();
  third.compile(K::SGD{0.2}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b4));
  const K::History h3 = third.fit(d.x, d.y, opts(4, true, dir.path / "b"));
  EXPECT_EQ(engine_of(b4).train_calls, 0u);
  EXPECT_EQ(h3.history, h1.history);
}

TEST(KerasFit, ResumeWithAnotherModelIsAClearError) {
  TempDir dir("resume_mismatch");
  const Synthetic d = make_data(40, 5);
  K::FitOptions o;
  o.epochs = 1;
  o.verbose = 0;
  o.callbacks.checkpoint_dir = dir.path.string();
  o.callbacks.resume = true;
  fake::Backend b1;
  K::Sequential a({K::Input({2, 3, 1}), K::Flatten(), K::Dense(3)});
  a.compile(K::SGD{0.2}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b1));
  a.fit(d.x, d.y, o);

  fake::Backend b2;
  K::Sequential other({K::Input({2, 3, 1}), K::Flatten(), K::Dense(4)});
  other.compile(K::SGD{0.2}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b2));
  o.epochs = 2;
  const std::string err = error_of([&] { other.fit(d.x, d.y, o); });
  EXPECT_NE(err.find("ckpt-1.bin was written for a different model"), std::string::npos) << err;
  EXPECT_NE(err.find("checkpoint has 'dense(units=3,activation=linear,use_bias=true)', this model has "
                     "'dense(units=4,activation=linear,use_bias=true)'"),
            std::string::npos)
      << err;
  EXPECT_EQ(engine_of(b2).train_calls, 0u);

  // A changed learning rate is not a different model.
  fake::Backend b3;
  K::Sequential same({K::Input({2, 3, 1}), K::Flatten(), K::Dense(3)});
  same.compile(K::SGD{0.01}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b3));
  EXPECT_EQ(same.fit(d.x, d.y, o).size(), 2u);
}

// ---- data-parallel -----------------------------------------------------------------------------
// Data::replicated: 2 ranks on the same GLOBAL batch follow 1 rank's trajectory, even when the
// batch does not divide evenly (33 = 17 + 16) and the last batch is partial.
TEST(KerasDataParallel, ReplicatedMatchesSingleRank) {
  const Synthetic d = make_data(203, 9), val = make_data(41, 10);
  for (uint32_t batch : {32u, 33u}) {
    K::FitOptions o;
    o.epochs = 3;
    o.batch_size = batch;
    o.verbose = 0;
    o.seed = 5;
    o.data = K::Data::replicated;
    o.validation_data = {val.x, val.y};

    fake::Backend single;
    K::Sequential m1 = small_model();
    m1.compile(K::SGD{0.3}, "sparse_categorical_crossentropy", {"accuracy"}, bind(single));
    const K::History h1 = m1.fit(d.x, d.y, o);
    const std::vector<float> w1 = m1.get_weights();

    std::vector<K::History> h2(2);
    std::vector<std::vector<float>> w2(2);
    std::vector<uint64_t> calls(2);
    std::vector<std::vector<uint32_t>> batches(2);
    const auto errors = run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
      fake::Backend b;
      K::Sequential m = small_model();
      m.compile(K::SGD{0.3}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b, comm));
      h2[r] = m.fit(d.x, d.y, o);
      w2[r] = m.get_weights();
      calls[r] = engine_of(b).train_calls;
      batches[r] = engine_of(b).train_batches;
    });
    ASSERT_EQ(errors, (std::vector<std::string>{"", ""}));
    EXPECT_EQ(calls[0], calls[1]);
    EXPECT_EQ(calls[0], engine_of(single).train_calls);
    EXPECT_EQ(batches[0][0] + batches[1][0], batch);
    EXPECT_EQ(w2[0], w2[1]);  // replicas stay identical
    ASSERT_EQ(w2[0].size(), w1.size());
    for (size_t i = 0; i < w1.size(); ++i) EXPECT_NEAR(w2[0][i], w1[i], 1e-5) << "batch " << batch << " weight " << i;
    for (const char* k : {"loss", "accuracy", "val_loss", "val_accuracy"})
      for (size_t e = 0; e < 3; ++e) EXPECT_NEAR(h2[0][k][e], h1[k][e], 1e-5) << k << " epoch " << e;
    EXPECT_EQ(h2[0].history, h2[1].history);
  }
}

// Data::sharded with uneven shards: every rank makes the same number of train_step and
// eval_step calls; evaluation still counts every sample exactly once.
TEST(KerasDataParallel, UnevenShardsStayCollective) {
  const Synthetic d = make_data(200, 12);
  std::vector<uint64_t> train_calls(2), eval_calls(2);
  std::vector<K::EvalResult> results(2);
  const auto errors = run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
    const Synthetic mine = r == 0 ? slice(d, 0, 130) : slice(d, 130, 70);
    fake::Backend b;
    K::Sequential m = small_model();
    m.compile(K::SGD{0.3}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b, comm));
    K::FitOptions o;
    o.epochs = 2;
    o.batch_size = 20;  // 10 per rank: rank 0 has 13 batches, rank 1 has 7
    o.verbose = 0;
    m.fit(mine.x, mine.y, o);
    train_calls[r] = engine_of(b).train_calls;
    results[r] = m.evaluate(mine.x, mine.y, 20, K::Data::sharded);
    eval_calls[r] = engine_of(b).eval_calls;
  });
  ASSERT_EQ(errors, (std::vector<std::string>{"", ""}));
  EXPECT_EQ(train_calls, (std::vector<uint64_t>{14, 14}));  // min(13, 7) per epoch
  EXPECT_EQ(eval_calls[0], eval_calls[1]);
  EXPECT_EQ(results[0].samples, 200u);
  EXPECT_EQ(results[1].samples, 200u);
  EXPECT_EQ(results[0].loss, results[1].loss);

}

// Shards made by skyforge::shard() (sizes differ by one) and a global batch of 32 split 16+16.
TEST(KerasDataParallel, ShardedWithSkyforgeShard) {
  const Synthetic d = make_data(201, 13);
  std::vector<std::vector<uint32_t>> batches(2);
  std::vector<K::History> h(2);
  const auto errors = run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
    const std::vector<size_t> idx = skyforge::shard(201, r, 2, true, 42);
    Synthetic mine;
    for (size_t i : idx) {
      mine.y.push_back(d.y[i]);
      mine.x.insert(mine.x.end(), d.x.begin() + static_cast<std::ptrdiff_t>(i * 6),
                    d.x.begin() + static_cast<std::ptrdiff_t>(i * 6 + 6));
    }
    fake::Backend b;
    K::Sequential m = small_model();
    m.compile(K::SGD{0.3}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b, comm));
    K::FitOptions o;
    o.epochs = 2;
    o.batch_size = 32;
    o.verbose = 0;
    h[r] = m.fit(mine.x, mine.y, o);
    batches[r] = engine_of(b).train_batches;
  });
  ASSERT_EQ(errors, (std::vector<std::string>{"", ""}));
  ASSERT_EQ(batches[0].size(), batches[1].size());
  EXPECT_EQ(batches[0].size(), 2u * 7u);  // ceil(101 / 16) = ceil(100 / 16) = 7
  EXPECT_EQ(batches[0][0], 16u);
  EXPECT_EQ(batches[0][6], 101u - 96u);
  EXPECT_EQ(batches[1][6], 100u - 96u);
  EXPECT_EQ(h[0].history, h[1].history);
}

TEST(KerasDataParallel, OneRanksBadInputFailsEveryRank) {
  const Synthetic d = make_data(40, 1);
  const auto errors = run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
    Synthetic mine = d;
    if (r == 1) mine.y[3] = 9;
    fake::Backend b;
    K::Sequential m = small_model();
    m.compile(K::SGD{0.3}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b, comm));
    K::FitOptions o;
    o.verbose = 0;
    m.fit(mine.x, mine.y, o);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("rank 1: fit: label 9 at index 3"), std::string::npos) << e;
}

TEST(KerasDataParallel, BatchSmallerThanWorldAndEmptyEvalShard) {
  const Synthetic d = make_data(10, 1);
  const auto errors = run_ranks(2, [&](uint32_t r, const sf_communicator* comm) {
    fake::Backend b;
    K::Sequential m = small_model();
    m.compile(K::SGD{0.3}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b, comm));
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
    fake::Backend b;
    K::Sequential m = small_model();
    m.compile(K::SGD{0.3}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b, comm));
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
    fake::Backend b;
    K::Sequential m = small_model();
    m.compile(K::SGD{0.3}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b, comm));
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
    fake::Backend b;
    K::Sequential m = small_model();
    m.compile(K::SGD{0.3}, "sparse_categorical_crossentropy", {"accuracy"}, bind(b, comm));
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
