// The layer schema (skyforge/layer_schema.hpp, docs/layers.md): the one catalogue of layer types,
// options, defaults, ranges and shape rules that the manifest, the train app, the Keras-style API
// and every compute backend read. These tests pin its table and its rules.
#include <skyforge/layer_schema.hpp>

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

namespace schema = skyforge::schema;
using Opts = std::vector<std::pair<std::string, std::string>>;

namespace {
std::string error_of(const Opts& options, const char* type = "dense", size_t index = 2) {
  try {
    schema::parse(type, options, index);
  } catch (const schema::LayerError& e) {
    return e.what();
  }
  return "";
}
std::string shape_error(const char* type, const Opts& options, const std::vector<uint32_t>& in) {
  try {
    schema::parse(type, options, 1).infer(in);
  } catch (const schema::LayerError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// The table itself is consistent: unique names, defaults that pass their own check, a
// default_from that names an earlier option, a shape rule for every type.
TEST(LayerSchema, TableIsConsistent) {
  std::set<std::string_view> types;
  for (const schema::LayerDef& def : schema::catalogue()) {
    EXPECT_TRUE(types.insert(def.type).second) << def.type;
    EXPECT_FALSE(def.keras_name.empty()) << def.type;
    EXPECT_EQ(def.shape == nullptr, def.merge != nullptr) << def.type << ": one shape rule, for one input or many";
    std::set<std::string_view> names;
    for (size_t i = 0; i < def.options.size(); ++i) {
      const schema::OptionDef& o = def.options[i];
      EXPECT_TRUE(names.insert(o.name).second) << def.type << "." << o.name;
      EXPECT_NE(o.name, "name") << "`name` is accepted on every layer";
      EXPECT_NE(o.name, "inputs") << "`inputs` is accepted on every layer";
      if (!o.fallback.empty()) {
        EXPECT_TRUE(schema::check(o, o.fallback).ok) << def.type << "." << o.name;
      }
      if (!o.default_from.empty()) {
        const schema::OptionDef* from = schema::find_option(def, o.default_from);
        ASSERT_NE(from, nullptr) << def.type << "." << o.name;
        EXPECT_LT(from - def.options.data(), static_cast<std::ptrdiff_t>(i)) << def.type << "." << o.name;
        EXPECT_EQ(from->kind, o.kind);
      }
    }
  }
  EXPECT_EQ(schema::find("Dense"), nullptr);  // types are the snake_case names
  ASSERT_NE(schema::find("dense"), nullptr);
  EXPECT_EQ(schema::find("dense")->keras_name, "Dense");
}

TEST(LayerSchema, ParseFillsKerasDefaultsInSchemaOrder) {
  EXPECT_EQ(schema::parse("batch_normalization", {}, 0).options(),
            (Opts{{"momentum", "0.99"}, {"epsilon", "0.001"}, {"center", "true"}, {"scale", "true"}, {"synchronized", "false"}}));
  EXPECT_EQ(schema::parse("dense", {{"use_bias", "false"}, {"units", "7"}}, 0).options(),
            (Opts{{"units", "7"}, {"activation", "linear"}, {"use_bias", "false"}}));
  // MaxPooling2D's strides default to its pool_size, as in Keras.
  const schema::LayerConfig pool = schema::parse("max_pooling2d", {{"pool_size", "3,2"}}, 0);
  EXPECT_EQ(pool.size("strides"), schema::Size2(3, 2));
  EXPECT_EQ(pool.options(), (Opts{{"pool_size", "3,2"}, {"strides", "3,2"}, {"padding", "valid"}}));
  EXPECT_EQ(schema::parse("relu", {}, 0).options(), Opts{});
}

TEST(LayerSchema, ParseCanonicalisesTextAndTypesIt) {
  const schema::LayerConfig c = schema::parse(
      "conv2d", {{"filters", "8"}, {"kernel_size", "(3, 5)"}, {"strides", "[2, 2]"}, {"use_bias", "False"},
                 {"activation", "none"}, {"name", "stem"}},
      0);
  EXPECT_EQ(c.count("filters"), 8u);
  EXPECT_EQ(c.size("kernel_size"), schema::Size2(3, 5));
  EXPECT_EQ(c.size("strides"), schema::Size2(2));
  EXPECT_FALSE(c.flag("use_bias"));
  EXPECT_EQ(c.choice("activation"), "linear");  // none = linear
  EXPECT_EQ(c.name(), "stem");
  EXPECT_EQ(c.options(), (Opts{{"filters", "8"}, {"kernel_size", "3,5"}, {"strides", "2"}, {"padding", "valid"},
                               {"use_bias", "false"}, {"activation", "linear"}, {"name", "stem"}}));
  EXPECT_EQ(schema::parse("batch_normalization", {{"epsilon", "1e-3"}, {"momentum", ".9"}}, 0).options()[0].second,
            "0.9");
  EXPECT_DOUBLE_EQ(schema::parse("dropout", {{"rate", "0.25"}}, 0).real("rate"), 0.25);
  // A backend asking for an option its layer does not have is a bug, not bad input.
  EXPECT_THROW(schema::parse("relu", {}, 0).count("units"), std::logic_error);
}

TEST(LayerSchema, ErrorsNameTheLayerTheOptionAndWhatWasExpected) {
  EXPECT_EQ(error_of({}, "dens", 1),
            "layer 1 (dens): unknown layer type 'dens' (known: dense, conv2d, batch_normalization, relu, softmax, "
            "dropout, flatten, global_average_pooling2d, max_pooling2d, average_pooling2d, global_average_pooling1d, "
            "reshape, layer_normalization, multi_head_attention, embedding, position_embedding, gelu, tanh, sigmoid, "
            "add, concatenate)");
  EXPECT_EQ(error_of({{"unit", "3"}}), "layer 2 (dense): option 'units' is required");
  EXPECT_EQ(error_of({{"units", "3"}, {"activaton", "relu"}}), "layer 2 (dense): unknown option 'activaton'");
  EXPECT_EQ(error_of({{"units", "0"}}),
            "layer 2 (dense): option 'units': expected an integer between 1 and 2147483647, got '0'");
  EXPECT_EQ(error_of({{"units", "2147483648"}}),
            "layer 2 (dense): option 'units': expected an integer between 1 and 2147483647, got '2147483648'");
  EXPECT_EQ(error_of({{"units", "3"}, {"activation", "swish"}}),
            "layer 2 (dense): option 'activation': expected one of linear, relu, softmax, gelu, tanh, sigmoid, got "
            "'swish'");
  EXPECT_EQ(error_of({{"units", "3"}, {"name", "a,b"}}),
            "layer 2 (dense): option 'name': a layer name may not hold control characters, commas or quotes: 'a,b'");
  EXPECT_EQ(error_of({{"units", "3"}, {"name", "input"}}),
            "layer 2 (dense): option 'name': 'input' names the model's input; choose another name");
  EXPECT_EQ(error_of({{"target_shape", "7,-1,-1"}}, "reshape"),
            "layer 2 (reshape): option 'target_shape': expected a shape like 7,7,16 (one entry may be -1), got "
            "'7,-1,-1'");
  EXPECT_EQ(error_of({{"axis", "x"}}, "concatenate"), "layer 2 (concatenate): option 'axis': expected an integer, got 'x'");
  EXPECT_EQ(error_of({{"rate", "1"}}, "dropout"), "layer 2 (dropout): option 'rate': expected a number in [0, 1), got '1'");
  EXPECT_EQ(error_of({{"rate", "0.5x"}}, "dropout"),
            "layer 2 (dropout): option 'rate': expected a number in [0, 1), got '0.5x'");
  EXPECT_EQ(error_of({{"rate", "nan"}}, "dropout"),
            "layer 2 (dropout): option 'rate': expected a number in [0, 1), got 'nan'");
  EXPECT_EQ(error_of({{"epsilon", "0"}}, "batch_normalization"),
            "layer 2 (batch_normalization): option 'epsilon': expected a number > 0, got '0'");
  EXPECT_EQ(error_of({{"momentum", "1"}}, "batch_normalization"), "");  // [0, 1]: 1 freezes the statistics
  EXPECT_EQ(error_of({{"filters", "2"}, {"kernel_size", "3,0"}}, "conv2d"),
            "layer 2 (conv2d): option 'kernel_size': expected an integer between 1 and 2147483647, or a pair like "
            "3,5, got '3,0'");
  EXPECT_EQ(error_of({{"units", "3"}, {"use_bias", "yes"}}),
            "layer 2 (dense): option 'use_bias': expected true or false, got 'yes'");
}

// Keras' shape rules and parameter counts (checked against Keras' own model.summary()).
TEST(LayerSchema, ShapeRulesAreKeras) {
  schema::LayerShape s = schema::parse("conv2d", {{"filters", "24"}, {"kernel_size", "6"}, {"strides", "2"},
                                                  {"padding", "same"}, {"use_bias", "false"}},
                                       0)
                             .infer({28, 28, 12});
  EXPECT_EQ(s.output, (std::vector<uint32_t>{14, 14, 24}));
  EXPECT_EQ(s.trainable, 6u * 6 * 12 * 24);
  // TensorFlow's 'same': total padding (14-1)*2 + 6 - 28 = 4, two before and two after.
  EXPECT_EQ(s.rows.pad, 2u);
  EXPECT_EQ(s.cols.out, 14u);

  s = schema::parse("conv2d", {{"filters", "32"}, {"kernel_size", "3"}}, 0).infer({28, 28, 1});
  EXPECT_EQ(s.output, (std::vector<uint32_t>{26, 26, 32}));
  EXPECT_EQ(s.trainable, 320u);
  EXPECT_EQ(s.rows.pad, 0u);

  s = schema::parse("max_pooling2d", {}, 0).infer({26, 26, 32});
  EXPECT_EQ(s.output, (std::vector<uint32_t>{13, 13, 32}));
  EXPECT_EQ(s.trainable, 0u);

  s = schema::parse("batch_normalization", {{"scale", "false"}}, 0).infer({7, 7, 32});
  EXPECT_EQ(s.trainable, 32u);      // beta only
  EXPECT_EQ(s.non_trainable, 64u);  // moving mean and variance

  s = schema::parse("dense", {{"units", "10"}}, 0).infer({4, 6});  // on the last axis
  EXPECT_EQ(s.output, (std::vector<uint32_t>{4, 10}));
  EXPECT_EQ(s.trainable, 70u);

  EXPECT_EQ(schema::parse("flatten", {}, 0).infer({13, 13, 32}).output, (std::vector<uint32_t>{5408}));
  EXPECT_EQ(schema::parse("global_average_pooling2d", {}, 0).infer({7, 7, 32}).output, (std::vector<uint32_t>{32}));
  EXPECT_EQ(schema::parse("dropout", {{"rate", "0.5"}}, 0).infer({3, 5}).output, (std::vector<uint32_t>{3, 5}));
}

TEST(LayerSchema, ShapeErrorsNameTheLayerAndTheShape) {
  EXPECT_EQ(shape_error("conv2d", {{"filters", "4"}, {"kernel_size", "3"}}, {16}),
            "layer 1 (conv2d): expects an input of rank 3 (height, width, channels), got (None, 16)");
  EXPECT_EQ(shape_error("conv2d", {{"filters", "4"}, {"kernel_size", "40"}}, {28, 28, 1}),
            "layer 1 (conv2d): window 40 is larger than the input's height 28 with padding 'valid'");
  EXPECT_EQ(shape_error("max_pooling2d", {{"pool_size", "1,9"}}, {8, 8, 1}),
            "layer 1 (max_pooling2d): window 9 is larger than the input's width 8 with padding 'valid'");
  EXPECT_EQ(shape_error("dense", {{"units", "3"}}, {}), "layer 1 (dense): needs an input");
  EXPECT_EQ(shape_error("relu", {}, {4, 0}), "layer 1 (relu): input shape (None, 4, 0) is empty");
}

// The new layers' shapes and parameter counts, as Keras' model.summary() gives them.
TEST(LayerSchema, TransformerAndMergeShapesAreKeras) {
  // MultiHeadAttention(num_heads=4, key_dim=16) on (49, 64): 4 x (64*4*16 + 4*16) = 16,640.
  schema::LayerShape s =
      schema::parse("multi_head_attention", {{"num_heads", "4"}, {"key_dim", "16"}}, 0).infer({49, 64});
  EXPECT_EQ(s.output, (std::vector<uint32_t>{49, 64}));
  EXPECT_EQ(s.trainable, 16640u);
  EXPECT_EQ(s.weights, (std::vector<uint64_t>{4096, 64, 4096, 64, 4096, 64, 4096, 64}));
  s = schema::parse("multi_head_attention", {{"num_heads", "2"}, {"key_dim", "8"}, {"value_dim", "4"}, {"use_bias", "false"}},
                    0)
          .infer({10, 6});
  EXPECT_EQ(s.weights, (std::vector<uint64_t>{96, 96, 48, 48}));
  s = schema::parse("layer_normalization", {}, 0).infer({49, 64});
  EXPECT_EQ(s.weights, (std::vector<uint64_t>{64, 64}));  // gamma, beta
  s = schema::parse("embedding", {{"input_dim", "1000"}, {"output_dim", "32"}}, 0).infer({20});
  EXPECT_EQ(s.output, (std::vector<uint32_t>{20, 32}));
  EXPECT_EQ(s.trainable, 32000u);
  s = schema::parse("position_embedding", {{"sequence_length", "64"}}, 0).infer({49, 32});
  EXPECT_EQ(s.output, (std::vector<uint32_t>{49, 32}));
  EXPECT_EQ(s.trainable, 64u * 32);
  EXPECT_EQ(schema::parse("reshape", {{"target_shape", "(-1, 16)"}}, 0).infer({7, 7, 16}).output,
            (std::vector<uint32_t>{49, 16}));
  EXPECT_EQ(schema::parse("average_pooling2d", {{"padding", "same"}}, 0).infer({7, 7, 3}).output,
            (std::vector<uint32_t>{4, 4, 3}));
  EXPECT_EQ(schema::parse("global_average_pooling1d", {}, 0).infer({49, 64}).output, (std::vector<uint32_t>{64}));
  const std::vector<std::vector<uint32_t>> two = {{7, 7, 16}, {7, 7, 8}};
  EXPECT_EQ(schema::parse("concatenate", {}, 0).infer_inputs(two).output, (std::vector<uint32_t>{7, 7, 24}));
  EXPECT_EQ(schema::parse("dense", {{"units", "5"}}, 0).infer({3, 4, 6}).output, (std::vector<uint32_t>{3, 4, 5}));
  auto error = [](auto f) {
    try {
      f();
    } catch (const schema::LayerError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error([&] { schema::parse("add", {{"name", "sum"}}, 4).infer_inputs(two); }),
            "layer 4 (add 'sum'): inputs must have one shape: input 1 is (None, 7, 7, 16), input 2 is (None, 7, 7, 8)");
  EXPECT_EQ(error([&] { schema::parse("concatenate", {{"axis", "1"}}, 4).infer_inputs(two); }),
            "layer 4 (concatenate): input 2 (None, 7, 7, 8) does not match input 1 (None, 7, 7, 16) on every axis but 1");
  EXPECT_EQ(error([&] { schema::parse("reshape", {{"target_shape", "5,-1"}}, 2).infer({7, 7}); }),
            "layer 2 (reshape): cannot reshape (None, 7, 7) (49 values) with a -1 entry: 49 is not a multiple of 5");
  // Products and sums that would wrap around are refused, not divided by (SIGFPE) or truncated.
  EXPECT_EQ(error([&] {
              schema::parse("reshape", {{"target_shape", "65536,65536,65536,65536,-1"}}, 2).infer({7, 7});
            }),
            "layer 2 (reshape): target_shape holds more values than the input (None, 7, 7) (49)");
  EXPECT_EQ(error([&] {
              schema::parse("concatenate", {}, 3).infer_inputs({{2000000000}, {2000000000}});
            }),
            "layer 3 (concatenate): the joined axis would hold more than 2147483647 values");
  EXPECT_EQ(error([&] { schema::parse("add", {}, 1).infer({7, 7}); }),
            "layer 1 (add): takes two or more inputs: name them with inputs = [\"a\", \"b\"]");
}

namespace {
std::vector<schema::LayerConfig> layers_of(const std::vector<std::pair<std::string, Opts>>& specs) {
  std::vector<schema::LayerConfig> out;
  for (size_t i = 0; i < specs.size(); ++i) out.push_back(schema::parse(specs[i].first, specs[i].second, i));
  return out;
}
std::string graph_error(const std::vector<std::pair<std::string, Opts>>& specs, std::vector<uint32_t> in = {8, 8, 4}) {
  try {
    schema::graph(in, layers_of(specs));
  } catch (const schema::LayerError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// A residual block: names, inputs, the run order, fan-out, and the architecture text.
TEST(LayerSchema, GraphResolvesNamesOrderAndShapes) {
  const auto layers = layers_of({
      {"conv2d", {{"filters", "4"}, {"kernel_size", "3"}, {"padding", "same"}, {"name", "stem"}}},
      {"conv2d", {{"filters", "4"}, {"kernel_size", "3"}, {"padding", "same"}, {"name", "b1"}}},
      {"add", {{"inputs", "stem, b1"}}},
      {"global_average_pooling2d", {}},
      {"dense", {{"units", "3"}}},
  });
  const schema::Graph g = schema::graph({8, 8, 4}, layers);
  EXPECT_FALSE(g.sequential());
  EXPECT_EQ(g.order, (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(g.inputs[0], (std::vector<size_t>{schema::Graph::kInput}));
  EXPECT_EQ(g.inputs[2], (std::vector<size_t>{0, 1}));
  EXPECT_EQ(g.consumers[0], (std::vector<size_t>{1, 2}));  // fan-out: stem feeds b1 and the add
  EXPECT_EQ(g.shapes[2].output, (std::vector<uint32_t>{8, 8, 4}));
  EXPECT_EQ(g.output, 4u);
  EXPECT_EQ(schema::architecture_text({8, 8, 4}, layers, "adam").substr(0, 80),
            "input(None, 8, 8, 4);conv2d<in(None, 8, 8, 4)->(None, 8, 8, 4)/filters=4/kernel_");
  // A layer may name one listed later: the run order is then not the listing order.
  const auto later = layers_of({
      {"dense", {{"units", "4"}, {"name", "a"}, {"inputs", "b"}}},
      {"dense", {{"units", "4"}, {"name", "b"}, {"inputs", "input"}}},
      {"dense", {{"units", "2"}, {"inputs", "a"}}},
  });
  EXPECT_EQ(schema::graph({6}, later).order, (std::vector<size_t>{1, 0, 2}));
  const std::string text = schema::architecture_text({8, 8, 4}, layers, "adam");
  EXPECT_NE(text.find(";add<0,1(None, 8, 8, 4)(None, 8, 8, 4)->(None, 8, 8, 4);"), std::string::npos) << text;
  // A Sequential list keeps the architecture text it always had (old checkpoints still load).
  const auto seq = layers_of({{"flatten", {}}, {"dense", {{"units", "3"}}}});
  EXPECT_TRUE(schema::graph({2, 2}, seq).sequential());
  EXPECT_EQ(schema::architecture_text({2, 2}, seq, "sgd"),
            "input(None, 2, 2);flatten(None, 2, 2)->(None, 4);dense(None, 4)->(None, 3)/units=3/activation=linear/"
            "use_bias=true;sgd");
}

TEST(LayerSchema, GraphErrorsNameTheLayer) {
  EXPECT_EQ(graph_error({{"relu", {{"name", "a"}}}, {"add", {{"inputs", "a,z"}}}}),
            "layer 1 (add): input 'z' names no layer (named layers: a; the model's input is 'input')");
  EXPECT_EQ(graph_error({{"relu", {{"name", "a"}}}, {"relu", {{"name", "a"}}}}),
            "layer 1 (relu 'a'): the name 'a' is also layer 0 (relu 'a')'s");
  EXPECT_EQ(graph_error({{"relu", {{"name", "a"}, {"inputs", "b"}}}, {"relu", {{"name", "b"}, {"inputs", "a"}}}}),
            "layer 0 (relu 'a'): the inputs form a cycle among layer 0 (relu 'a'), layer 1 (relu 'b')");
  EXPECT_EQ(graph_error({{"relu", {{"name", "a"}}}, {"relu", {{"inputs", "input"}}}}),
            "layer 0 (relu 'a'): its output feeds no layer and it is not the model's output (the last layer listed); "
            "name it in a later layer's inputs or remove it");
  EXPECT_EQ(graph_error({{"relu", {{"name", "a"}}}, {"relu", {{"inputs", "a,a"}}}}),
            "layer 1 (relu): takes one input, 2 named");
  EXPECT_EQ(graph_error({{"relu", {{"name", "a"}}}, {"relu", {{"name", "b"}, {"inputs", "b"}}}}),
            "layer 1 (relu 'b'): names itself as its input");
}
