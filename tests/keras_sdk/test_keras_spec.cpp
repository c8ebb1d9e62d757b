// skyforge::keras::Sequential without a backend: the layer builders' specs, Keras' shape
// inference and summary, compile()'s checks, and what an unbound model says. (Everything that
// needs an engine is in test_keras_model.cpp, on the real cpu backend.)
#include <skyforge/keras.hpp>

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "model_util.hpp"

namespace K = skyforge::keras;
using Opts = std::vector<std::pair<std::string, std::string>>;
using namespace model_util;

// ---- layers and specs --------------------------------------------------------------------------
TEST(KerasLayers, BuildersRecordTheArgumentsGiven) {
  EXPECT_EQ(K::Dense(128, "relu").options, (Opts{{"units", "128"}, {"activation", "relu"}}));
  EXPECT_EQ(K::layers::Dense(10).options, (Opts{{"units", "10"}}));
  EXPECT_EQ(K::Conv2D(32, 3, 1, "same", false).options,
            (Opts{{"filters", "32"}, {"kernel_size", "3"}, {"strides", "1"}, {"padding", "same"},
                  {"use_bias", "false"}}));
  EXPECT_EQ(K::Conv2D(8, {3, 5}, {2, 1}).option("kernel_size"), "3,5");
  EXPECT_EQ(K::Conv2D(8, {3, 5}, {2, 1}).option("strides"), "2,1");
  EXPECT_EQ(K::MaxPooling2D(2).options, (Opts{{"pool_size", "2"}}));
  EXPECT_EQ(K::MaxPooling2D(3, K::Size2(1)).option("strides"), "1");
  EXPECT_TRUE(K::BatchNormalization().options.empty());
  EXPECT_EQ(K::BatchNormalization(0.9, 1e-5, true, false).options,
            (Opts{{"momentum", "0.9"}, {"epsilon", "1e-05"}, {"center", "true"}, {"scale", "false"}}));
  EXPECT_EQ(K::Dropout(0.5).options, (Opts{{"rate", "0.5"}}));
  EXPECT_EQ(K::ReLU().type, "relu");
  EXPECT_EQ(K::Softmax().type, "softmax");
  EXPECT_EQ(K::Flatten().type, "flatten");
  EXPECT_EQ(K::GlobalAveragePooling2D().type, "global_average_pooling2d");
}

// What the backend receives: every option of the layer, the schema's defaults (Keras') filled in.
TEST(KerasLayers, CompileHandsTheBackendEveryOptionWithTheSchemasDefaults) {
  K::Sequential m({K::Input({8, 8, 1}), K::Conv2D(4, 3), K::BatchNormalization(), K::MaxPooling2D(),
                   K::Flatten(), K::Dense(3, "none")});
  m.compile(K::Adam{});
  const sf_model_spec& spec = m.spec();
  ASSERT_EQ(spec.n_layers, 5u);
  auto options = [&](size_t i) {
    Opts out;
    for (size_t k = 0; k < spec.layers[i].n_options; ++k)
      out.emplace_back(spec.layers[i].options[k].key, spec.layers[i].options[k].value);
    return out;
  };
  EXPECT_EQ(options(0), (Opts{{"filters", "4"}, {"kernel_size", "3"}, {"strides", "1"}, {"padding", "valid"},
                              {"use_bias", "true"}, {"activation", "linear"}}));
  EXPECT_EQ(options(1), (Opts{{"momentum", "0.99"}, {"epsilon", "0.001"}, {"center", "true"}, {"scale", "true"}, {"synchronized", "false"}}));
  EXPECT_EQ(options(2), (Opts{{"pool_size", "2"}, {"strides", "2"}, {"padding", "valid"}}));
  EXPECT_TRUE(options(3).empty());
  EXPECT_EQ(options(4), (Opts{{"units", "3"}, {"activation", "linear"}, {"use_bias", "true"}}));  // none = linear
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
  EXPECT_NE(compile_error(K::Sequential({K::Input({4}), K::Dropout(1.5), K::Dense(2)}))
                .find("layer 0 (dropout): option 'rate': expected a number in [0, 1), got '1.5'"),
            std::string::npos);
  EXPECT_NE(compile_error(K::Sequential({K::Input({4}), K::Dense(2, "swish")}))
                .find("layer 0 (dense): option 'activation': expected one of linear, relu, softmax, gelu, tanh, "
                      "sigmoid, got 'swish'"),
            std::string::npos);
  EXPECT_NE(error_of([] { K::Sequential({K::Dense(2), K::Input({4})}); }).find("Input must come first"),
            std::string::npos);
  EXPECT_NE(error_of([] { K::Sequential m = small_model(); m.compile(K::SGD{-1}); }).find("learning_rate"),
            std::string::npos);
}

// SGD{}, Adam{}, AdamW{} and RMSprop{} hold Keras' defaults, from the optimizer schema, and compile() checks them
// against its (Keras') ranges, with the message every backend gives.
TEST(KerasModel, OptimizersFollowTheOptimizerSchema) {
  EXPECT_EQ(K::SGD{}.learning_rate, 0.01);
  EXPECT_EQ(K::SGD{}.momentum, 0.0);
  EXPECT_EQ(K::Adam{}.learning_rate, 0.001);
  EXPECT_EQ(K::Adam{}.beta_1, 0.9);
  EXPECT_EQ(K::Adam{}.beta_2, 0.999);
  EXPECT_EQ(K::Adam{}.epsilon, 1e-7);
  EXPECT_EQ(K::detail::optimizer_spec(K::SGD{0.1, 1.0}).first, "sgd");  // Keras: momentum in [0, 1]
  EXPECT_EQ(error_of([] { K::Sequential m = small_model(); m.compile(K::Adam{1e-3, 1.0}); }),
            "optimizer adam: option 'beta_1': expected a number in [0, 1), got '1'");
  EXPECT_EQ(K::AdamW{}.weight_decay, 0.004);
  EXPECT_EQ(K::AdamW{}.learning_rate, 0.001);
  EXPECT_EQ(K::RMSprop{}.rho, 0.9);
  EXPECT_EQ(K::RMSprop{}.learning_rate, 0.001);
  EXPECT_FALSE(K::RMSprop{}.centered);
  const auto rms = K::detail::optimizer_spec(K::RMSprop{0.01, 0.8, 0.5, 1e-6, true});
  EXPECT_EQ(rms.first, "rmsprop");
  EXPECT_EQ(rms.second, (std::vector<std::pair<std::string, std::string>>{
                            {"learning_rate", "0.01"}, {"rho", "0.8"}, {"momentum", "0.5"}, {"epsilon", "1e-06"}, {"centered", "true"}}));
  EXPECT_EQ(K::detail::optimizer_spec(K::AdamW{}).first, "adamw");
  EXPECT_EQ(error_of([] { K::Sequential m = small_model(); m.compile(K::AdamW{1e-3, -1}); }),
            "optimizer adamw: option 'weight_decay': expected a number >= 0, got '-1'");
}

TEST(KerasModel, UnboundModelSaysHowToBind) {
  K::Sequential m = small_model();
  m.compile(K::Adam{});
  const Synthetic d = make_data(10, 1);
  EXPECT_NE(error_of([&] { m.fit(d.x, d.y); }).find("not bound to a compute backend"), std::string::npos);
  K::Sequential not_compiled = small_model();
  EXPECT_NE(error_of([&] { not_compiled.predict(d.x); }).find("compile() first"), std::string::npos);
}


// keras_schedules.hpp: a schedule in place of learning_rate and the clipping norms become the
// optimizer schema's options, checked at compile() like the others.
TEST(KerasModel, SchedulesAndClippingBecomeOptimizerOptions) {
  const auto a = K::detail::optimizer_spec(
      K::AdamW{.learning_rate = K::CosineDecay{.initial_learning_rate = 0, .decay_steps = 100, .warmup_target = 1e-3,
                                               .warmup_steps = 10},
               .global_clipnorm = 1});
  EXPECT_EQ(a.second, (Opts{{"learning_rate_schedule", "cosine_decay"},
                            {"learning_rate_schedule.initial_learning_rate", "0"},
                            {"learning_rate_schedule.decay_steps", "100"},
                            {"learning_rate_schedule.alpha", "0"},
                            {"learning_rate_schedule.warmup_target", "0.001"},
                            {"learning_rate_schedule.warmup_steps", "10"},
                            {"weight_decay", "0.004"}, {"beta_1", "0.9"}, {"beta_2", "0.999"}, {"epsilon", "1e-07"},
                            {"global_clipnorm", "1"}}));
  const auto s = K::detail::optimizer_spec(
      K::SGD{.learning_rate = K::PiecewiseConstantDecay{{10, 20}, {0.1, 0.01, 0.001}}, .clipnorm = 0.5});
  EXPECT_EQ(s.second, (Opts{{"learning_rate_schedule", "piecewise_constant_decay"},
                            {"learning_rate_schedule.boundaries", "10,20"},
                            {"learning_rate_schedule.values", "0.1,0.01,0.001"},
                            {"momentum", "0"}, {"nesterov", "false"}, {"clipnorm", "0.5"}}));
  EXPECT_THROW(K::detail::optimizer_spec(K::SGD{.clipnorm = 1, .global_clipnorm = 1}), skyforge::Error);
  EXPECT_THROW(K::detail::optimizer_spec(K::Adam{.learning_rate = K::PiecewiseConstantDecay{{10}, {0.1}}}), skyforge::Error);
  EXPECT_THROW(K::detail::optimizer_spec(K::Adam{.learning_rate = K::ExponentialDecay{0.1, 0, 0.5}}), skyforge::Error);
}
