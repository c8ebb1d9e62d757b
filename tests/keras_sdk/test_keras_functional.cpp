// skyforge::keras's functional API without a backend: Model(inputs, outputs) from layer calls
// (the layer list with `name` and `inputs` it hands the backend, Keras' auto-names, the order),
// the builders of the graph layers, the functional summary, and the errors of a call or a model.
#include <skyforge/keras.hpp>

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "model_util.hpp"

namespace K = skyforge::keras;
using Opts = std::vector<std::pair<std::string, std::string>>;
using model_util::error_of;

namespace {

struct Expected {
  std::string type;
  Opts options;
};
void expect_layers(const K::Model& m, const std::vector<Expected>& want) {
  ASSERT_EQ(m.layers().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(m.layers()[i].type, want[i].type) << "layer " << i;
    EXPECT_EQ(m.layers()[i].options, want[i].options) << "layer " << i;
  }
}

// A residual block on Fashion-MNIST's shape: stem, conv-bn-relu-conv, added to the stem.
K::Model residual() {
  auto inputs = K::Input({28, 28, 1});
  auto x = K::Conv2D(8, 3, {.padding = "same", .name = "stem"})(inputs);
  auto y = K::Conv2D(8, 3, {.padding = "same", .use_bias = false})(x);
  y = K::ReLU()(K::BatchNormalization()(y));
  y = K::Conv2D(8, 3, {.padding = "same"})(y);
  auto z = K::ReLU()(K::Add()({x, y}));
  auto outputs = K::Dense(10)(K::GlobalAveragePooling2D()(z));
  return K::Model(inputs, outputs, "residual");
}

// A ViT encoder block on 49 patches of 16 values: pre-norm self-attention and MLP, both residual.
K::Model vit() {
  auto inputs = K::Input({28, 28, 1});
  auto x = K::Dense(32, {.name = "patches"})(K::Reshape({49, 16})(inputs));
  x = K::Add()({x, K::PositionEmbedding(49)(x)});
  auto h = K::LayerNormalization({.epsilon = 1e-6})(x);
  h = K::MultiHeadAttention(2, 16, {.dropout = 0.1})(h, h);
  x = K::Add()({x, h});
  h = K::LayerNormalization({.epsilon = 1e-6})(x);
  h = K::Dense(16)(K::Dense(64, {.activation = "gelu"})(h));
  h = K::Dense(32)(K::Activation("tanh")(h));
  x = K::Add()({x, h});
  return K::Model(inputs, K::Dense(10)(K::GlobalAveragePooling1D()(x)));
}

}  // namespace

TEST(KerasFunctional, ResidualBlockGivesNamedLayersAndTheirInputsInCallOrder) {
  const K::Model m = residual();
  EXPECT_EQ(m.input_shape(), (std::vector<uint32_t>{28, 28, 1}));
  EXPECT_EQ(m.output_shape(), (std::vector<uint32_t>{10}));
  expect_layers(m, {
      {"conv2d", {{"filters", "8"}, {"kernel_size", "3"}, {"padding", "same"}, {"name", "stem"}, {"inputs", "input"}}},
      {"conv2d",
       {{"filters", "8"}, {"kernel_size", "3"}, {"padding", "same"}, {"use_bias", "false"}, {"name", "conv2d"},
        {"inputs", "stem"}}},
      {"batch_normalization", {{"name", "batch_normalization"}, {"inputs", "conv2d"}}},
      {"relu", {{"name", "relu"}, {"inputs", "batch_normalization"}}},
      {"conv2d", {{"filters", "8"}, {"kernel_size", "3"}, {"padding", "same"}, {"name", "conv2d_1"}, {"inputs", "relu"}}},
      {"add", {{"name", "add"}, {"inputs", "stem,conv2d_1"}}},
      {"relu", {{"name", "relu_1"}, {"inputs", "add"}}},
      {"global_average_pooling2d", {{"name", "global_average_pooling2d"}, {"inputs", "relu_1"}}},
      {"dense", {{"units", "10"}, {"name", "dense"}, {"inputs", "global_average_pooling2d"}}},
  });
}

// What the backend receives: the schema's defaults filled in, then `name` and `inputs`.
TEST(KerasFunctional, CompileHandsTheBackendTheGraph) {
  K::Model m = residual();
  m.compile(K::Adam{});
  const sf_model_spec& spec = m.spec();
  ASSERT_EQ(spec.n_layers, 9u);
  Opts add;
  for (size_t k = 0; k < spec.layers[5].n_options; ++k) add.emplace_back(spec.layers[5].options[k].key, spec.layers[5].options[k].value);
  EXPECT_EQ(add, (Opts{{"name", "add"}, {"inputs", "stem,conv2d_1"}}));
  const sf_layer_spec& stem = spec.layers[0];
  ASSERT_EQ(stem.n_options, 8u);
  EXPECT_STREQ(stem.options[5].key, "activation");
  EXPECT_STREQ(stem.options[6].value, "stem");
  EXPECT_STREQ(stem.options[7].value, "input");
}

TEST(KerasFunctional, VitBlock) {
  const K::Model m = vit();
  EXPECT_EQ(m.name(), "functional");
  EXPECT_EQ(m.output_shape(), (std::vector<uint32_t>{10}));
  expect_layers(m, {
      {"reshape", {{"target_shape", "49,16"}, {"name", "reshape"}, {"inputs", "input"}}},
      {"dense", {{"units", "32"}, {"name", "patches"}, {"inputs", "reshape"}}},
      {"position_embedding", {{"sequence_length", "49"}, {"name", "position_embedding"}, {"inputs", "patches"}}},
      {"add", {{"name", "add"}, {"inputs", "patches,position_embedding"}}},
      {"layer_normalization", {{"epsilon", "1e-06"}, {"name", "layer_normalization"}, {"inputs", "add"}}},
      {"multi_head_attention",
       {{"num_heads", "2"}, {"key_dim", "16"}, {"dropout", "0.1"}, {"name", "multi_head_attention"},
        {"inputs", "layer_normalization"}}},
      {"add", {{"name", "add_1"}, {"inputs", "add,multi_head_attention"}}},
      {"layer_normalization", {{"epsilon", "1e-06"}, {"name", "layer_normalization_1"}, {"inputs", "add_1"}}},
      {"dense", {{"units", "64"}, {"activation", "gelu"}, {"name", "dense"}, {"inputs", "layer_normalization_1"}}},
      {"dense", {{"units", "16"}, {"name", "dense_1"}, {"inputs", "dense"}}},
      {"tanh", {{"name", "activation"}, {"inputs", "dense_1"}}},
      {"dense", {{"units", "32"}, {"name", "dense_2"}, {"inputs", "activation"}}},
      {"add", {{"name", "add_2"}, {"inputs", "add_1,dense_2"}}},
      {"global_average_pooling1d", {{"name", "global_average_pooling1d"}, {"inputs", "add_2"}}},
      {"dense", {{"units", "10"}, {"name", "dense_3"}, {"inputs", "global_average_pooling1d"}}},
  });
  // Keras' parameter counts: attention 4 x (32*2*16 + 32), position table 49*32.
  const std::string s = m.summary();
  EXPECT_NE(s.find(" (MultiHeadAttention)"), std::string::npos) << s;
  EXPECT_NE(s.find("4224"), std::string::npos) << s;
  EXPECT_NE(s.find("1568"), std::string::npos) << s;
}

// Keras' functional table (skyforge/model_summary.hpp): the input first, the layers in call
// order with what each is connected to, Keras' parameter counts.
TEST(KerasFunctional, SummaryIsKerasFunctionalTable) {
  const std::string s = residual().summary();
  size_t at = 0;
  for (const std::string row : {"Model: \"residual\"\n", "Connected to\n", " input (InputLayer)", " stem (Conv2D)",
                                " conv2d (Conv2D)", " batch_normalization", "(BatchNormalization)", " relu (ReLU)",
                                " conv2d_1 (Conv2D)", " add (Add)", "stem, conv2d_1\n", " relu_1 (ReLU)",
                                " global_average_pooling2d", "(GlobalAveragePooling2D)", " dense (Dense)",
                                "Total params: 1362\nTrainable params: 1346\nNon-trainable params: 16\n"}) {
    const size_t found = s.find(row, at);
    ASSERT_NE(found, std::string::npos) << "'" << row << "' after offset " << at << " in\n" << s;
    at = found + row.size();
  }
  EXPECT_NE(s.find("(None, 28, 28, 8)         576"), std::string::npos) << s;  // 3*3*8*8, no bias
  EXPECT_EQ(residual().summary("renamed").substr(0, 16), "Model: \"renamed\"");
}

// A chain built with calls is its Sequential twin: the same architecture (what checkpoints and
// engines compare), shapes, names and parameters: the same summary.
TEST(KerasFunctional, ChainEqualsItsSequentialTwin) {
  auto inputs = K::Input({28, 28, 1});
  auto x = K::Conv2D(4, 3, {.strides = 2, .activation = "relu"})(inputs);
  x = K::MaxPooling2D({.pool_size = 2})(K::BatchNormalization({.momentum = 0.9})(x));
  const K::Model f(inputs, K::Dense(10)(K::Dropout(0.25)(K::Flatten()(x))));
  const K::Sequential s({K::Input({28, 28, 1}), K::Conv2D(4, 3, 2, {}, {}, "relu"), K::BatchNormalization(0.9),
                         K::MaxPooling2D(2), K::Flatten(), K::Dropout(0.25), K::Dense(10)});
  auto architecture = [](const K::Model& m) {
    std::vector<skyforge::schema::LayerConfig> configs;
    for (size_t i = 0; i < m.layers().size(); ++i) configs.push_back(K::detail::config(m.layers()[i], i));
    return skyforge::schema::architecture_text(m.input_shape(), configs, "adam");
  };
  EXPECT_EQ(architecture(f), architecture(s));
  EXPECT_EQ(f.output_shape(), s.output_shape());
  EXPECT_EQ(f.summary("twin"), s.summary("twin"));
  EXPECT_EQ(f.summary().substr(0, 19), "Model: \"functional\"");
}

// Names given are kept; Keras' names skip them. A call the output does not depend on is not in
// the model (Keras' rule), and a layer may take the model's input twice.
TEST(KerasFunctional, NamesAndUnusedCalls) {
  auto inputs = K::Input({6});
  auto a = K::Dense(4, {.name = "dense"})(inputs);
  auto b = K::Dense(4)(inputs);
  (void)K::Dense(3)(b);  // not on the way to the output
  auto c = K::Concatenate({.axis = -1, .name = "cat"})({a, b, a});
  const K::Model m(inputs, K::Dense(2)(c));
  ASSERT_EQ(m.layers().size(), 4u);
  EXPECT_EQ(m.layers()[1].option("name"), "dense_1");
  EXPECT_EQ(m.layers()[2].options, (Opts{{"axis", "-1"}, {"name", "cat"}, {"inputs", "dense,dense_1,dense"}}));
  EXPECT_EQ(m.layers()[3].option("name"), "dense_2");
  EXPECT_EQ(m.output_shape(), (std::vector<uint32_t>{2}));
  EXPECT_EQ(a.shape(), (std::vector<uint32_t>{4}));
  EXPECT_EQ(c.shape(), (std::vector<uint32_t>{12}));
}

TEST(KerasFunctional, BuildersOfTheGraphLayers) {
  EXPECT_EQ(K::AveragePooling2D(3, 1, std::string("same")).options,
            (Opts{{"pool_size", "3"}, {"strides", "1"}, {"padding", "same"}}));
  EXPECT_EQ(K::AveragePooling2D({.pool_size = 2, .name = "pool"}).options, (Opts{{"pool_size", "2"}, {"name", "pool"}}));
  EXPECT_EQ(K::Concatenate(1).options, (Opts{{"axis", "1"}}));
  EXPECT_EQ(K::Concatenate().options, Opts{});
  EXPECT_EQ(K::Reshape({-1, 16}).options, (Opts{{"target_shape", "-1,16"}}));
  EXPECT_EQ(K::LayerNormalization({.epsilon = 1e-5, .center = false, .scale = true}).options,
            (Opts{{"epsilon", "1e-05"}, {"center", "false"}, {"scale", "true"}}));
  EXPECT_EQ(K::MultiHeadAttention(4, 8, {.value_dim = 16, .dropout = 0.1, .use_bias = false}).options,
            (Opts{{"num_heads", "4"}, {"key_dim", "8"}, {"value_dim", "16"}, {"dropout", "0.1"}, {"use_bias", "false"}}));
  EXPECT_EQ(K::Embedding(1000, 64).options, (Opts{{"input_dim", "1000"}, {"output_dim", "64"}}));
  EXPECT_EQ(K::PositionEmbedding(49, {.name = "pos"}).options, (Opts{{"sequence_length", "49"}, {"name", "pos"}}));
  EXPECT_EQ(K::Activation("gelu").type, "gelu");
  EXPECT_EQ(K::Activation("sigmoid").type, "sigmoid");
  EXPECT_EQ(K::Activation("relu").type, "relu");
  EXPECT_EQ(K::GlobalAveragePooling1D().type, "global_average_pooling1d");
  EXPECT_EQ(K::Add({.name = "res"}).options, (Opts{{"name", "res"}}));
  EXPECT_EQ(K::BatchNormalization({.synchronized = true}).options, (Opts{{"synchronized", "true"}}));
  EXPECT_EQ(K::Dense(8, {.activation = "sigmoid", .use_bias = false, .name = "gate"}).options,
            (Opts{{"units", "8"}, {"activation", "sigmoid"}, {"use_bias", "false"}, {"name", "gate"}}));
  EXPECT_EQ(K::Conv2D(8, 3, {.strides = {2, 1}, .activation = "gelu"}).options,
            (Opts{{"filters", "8"}, {"kernel_size", "3"}, {"strides", "2,1"}, {"activation", "gelu"}}));
  // A Sequential model takes the same builders, names included.
  const K::Sequential s({K::Input({4}), K::Dense(3, {.name = "hidden"}), K::Activation("tanh"), K::Dense(2)});
  EXPECT_NE(s.summary().find(" hidden (Dense)"), std::string::npos) << s.summary();
}

TEST(KerasFunctional, ErrorsAreClear) {
  auto inputs = K::Input({8, 8, 1});
  // Keras' shared layers (one layer's weights in two calls) are refused.
  const K::Layer shared = K::Dense(4, {.name = "fc"});
  auto flat = K::Flatten()(inputs);
  (void)shared(flat);
  EXPECT_NE(error_of([&] { (void)shared(flat); })
                .find("Dense 'fc' was already called on a tensor: a layer is called once here (Keras' shared layers"),
            std::string::npos);
  // A shape the layer cannot take is refused at the call, naming the layer and the shapes.
  EXPECT_EQ(error_of([&] { (void)K::Conv2D(4, 3, {.name = "c"})(flat); }),
            "keras: Conv2D 'c' called on (None, 64): expects an input of rank 3 (height, width, channels), got (None, 64)");
  EXPECT_NE(error_of([&] { (void)K::Add()({flat, K::Dense(3)(flat)}); })
                .find("keras: Add called on (None, 64), (None, 3): inputs must have one shape"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)K::Add()(flat); }).find("takes two or more inputs"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)K::Dense(2)({flat, flat}); }).find("takes one input, 2 named"), std::string::npos);
  // Self-attention only.
  auto seq = K::Reshape({8, 8})(inputs);
  EXPECT_NE(error_of([&] { (void)K::MultiHeadAttention(2, 4)(seq, K::Dense(8)(seq)); }).find("is self-attention here"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)K::Dense(2)(seq, seq); }).find("Dense takes one tensor"), std::string::npos);
  EXPECT_NE(error_of([] { (void)K::Activation("swish"); }).find("expected relu, softmax, gelu, tanh or sigmoid"),
            std::string::npos);
  EXPECT_NE(error_of([] { (void)K::Input({4, 0}); }).find("has a zero"), std::string::npos);
  EXPECT_NE(error_of([] { (void)K::Dense(2)(K::Tensor()); }).find("an empty Tensor"), std::string::npos);

  // A tensor of another model's input.
  auto other = K::Input({4});
  auto mixed = K::Concatenate()({K::Flatten()(inputs), K::Dense(64)(other)});
  EXPECT_NE(error_of([&] { (void)K::Model(inputs, K::Dense(2)(mixed)); })
                .find("the outputs depend on another Input (None, 4) than the model's inputs (None, 8, 8, 1) (graph "
                      "disconnected"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)K::Model(inputs, K::Dense(2)(other)); }).find("another Input"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)K::Model(flat, flat); }).find("inputs must be the tensor Input() made, not Flatten's output"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)K::Model(inputs, inputs); }).find("the model has no layers"), std::string::npos);
  auto a = K::Dense(3, {.name = "x"})(flat);
  auto b = K::Dense(3, {.name = "x"})(flat);
  EXPECT_NE(error_of([&] { (void)K::Model(inputs, K::Add()({a, b})); }).find("two layers are named 'x'"), std::string::npos);
  // A layer's output is not a Sequential's layer.
  EXPECT_NE(error_of([&] { K::Sequential({flat, K::Dense(2)}); }).find("this tensor is Flatten's output"),
            std::string::npos);
  // compile()'s checks hold for a functional model too.
  EXPECT_NE(error_of([&] { (void)K::Model(inputs, K::Dense(2)(seq)).compile(K::Adam{}); }).find("must be (None, classes)"),
            std::string::npos);
}
