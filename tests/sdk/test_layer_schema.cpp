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
    EXPECT_NE(def.shape, nullptr) << def.type;
    std::set<std::string_view> names;
    for (size_t i = 0; i < def.options.size(); ++i) {
      const schema::OptionDef& o = def.options[i];
      EXPECT_TRUE(names.insert(o.name).second) << def.type << "." << o.name;
      EXPECT_NE(o.name, "name") << "`name` is accepted on every layer";
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
            (Opts{{"momentum", "0.99"}, {"epsilon", "0.001"}, {"center", "true"}, {"scale", "true"}}));
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
            "dropout, flatten, global_average_pooling2d, max_pooling2d)");
  EXPECT_EQ(error_of({{"unit", "3"}}), "layer 2 (dense): option 'units' is required");
  EXPECT_EQ(error_of({{"units", "3"}, {"activaton", "relu"}}), "layer 2 (dense): unknown option 'activaton'");
  EXPECT_EQ(error_of({{"units", "0"}}),
            "layer 2 (dense): option 'units': expected an integer between 1 and 2147483647, got '0'");
  EXPECT_EQ(error_of({{"units", "2147483648"}}),
            "layer 2 (dense): option 'units': expected an integer between 1 and 2147483647, got '2147483648'");
  EXPECT_EQ(error_of({{"units", "3"}, {"activation", "tanh"}}),
            "layer 2 (dense): option 'activation': expected one of linear, relu, softmax, got 'tanh'");
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
