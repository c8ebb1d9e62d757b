// [[train.layers]] as a model graph (train_graph.hpp).
#include "train_graph.hpp"

#include <skyforge/config_keys.hpp>
#include <skyforge/layer_schema.hpp>
#include <skyforge/model_summary.hpp>

#include <charconv>
#include <map>
#include <optional>
#include <vector>

namespace skyforge {

namespace {

using namespace toml_in;
namespace keys = config::keys;

// One sample of the [train] datasets (fashion-mnist and mnist: 28x28 grey images).
const std::vector<uint32_t> kSampleShape = {28, 28, 1};

// The layers as the train app builds them: each layer's config keys through schema::parse,
// indexed as listed (from 0, as [search]'s "layers.<i>" and the engines count).
std::vector<schema::LayerConfig> layer_configs(const TrainSpec& train) {
  const std::map<std::string, std::string> c(train.config.begin(), train.config.end());
  std::vector<schema::LayerConfig> out;
  const size_t n = std::stoul(c.at(std::string(keys::train_layers.name)));
  for (size_t i = 0; i < n; ++i) {
    const std::string prefix = keys::train_layer(i, "");
    std::vector<std::pair<std::string, std::string>> options;
    std::string type;
    for (auto it = c.lower_bound(prefix); it != c.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      const std::string key = it->first.substr(prefix.size());
      if (key == "type") type = it->second;
      else if (key.find('.') == std::string::npos) options.emplace_back(key, it->second);
    }
    out.push_back(schema::parse(type, options, i));
  }
  return out;
}

// The listing index a schema message names ("layer 7 (add 'b1_add'): ..."), if it names one.
std::optional<size_t> layer_of(const std::string& message) {
  const std::string_view prefix = "layer ";
  if (message.rfind(prefix, 0) != 0) return std::nullopt;
  size_t i = 0;
  const char* begin = message.data() + prefix.size();
  const auto [end, ec] = std::from_chars(begin, message.data() + message.size(), i);
  if (ec != std::errc() || end == begin || *end != ' ') return std::nullopt;
  return i;
}

// The key of a layer's table that a graph problem is about: its inputs (an unknown one, a cycle,
// too many or too few), its name (given twice), else its type (shapes, an unused output).
std::string key_of(const std::string& message, const Value& layer) {
  const size_t colon = message.find("): ");
  const std::string what = colon == std::string::npos ? message : message.substr(colon + 3);
  const bool about_inputs = what.rfind("input '", 0) == 0 || what.rfind("names itself", 0) == 0 ||
                            what.rfind("the inputs form a cycle", 0) == 0 || what.rfind("takes ", 0) == 0;
  if (about_inputs && Reader::find(layer, "inputs")) return "inputs";
  if (what.rfind("the name '", 0) == 0 && Reader::find(layer, "name")) return "name";
  return "type";
}

}  // namespace

void read_layer_links(Reader& r, const Value& layer, const std::string& where,
                      const std::function<void(std::string_view, std::string)>& put) {
  auto name_text = [&](const Value& v, const std::string& label, bool input_allowed) -> std::optional<std::string> {
    if (!v.is_string()) {
      r.expected(v, label, input_allowed ? "a layer's name or \"input\"" : "a string");
      return std::nullopt;
    }
    const std::string& s = v.as_string().str;
    if (input_allowed && s == schema::kModelInputName) return s;
    if (const std::string why = schema::detail::name_problem(s); !why.empty()) {
      r.error(r.pos(v), label + ": " + why);
      return std::nullopt;
    }
    return s;
  };
  if (const Value* v = Reader::find(layer, "name"))
    if (auto s = name_text(*v, where + " name", false)) put("name", *s);
  const Value* v = Reader::find(layer, "inputs");
  if (!v) return;
  if (v->is_string()) {  // inputs = "stem": Keras' layer(x)
    if (auto s = name_text(*v, where + " inputs", true)) put("inputs", *s);
    return;
  }
  if (!v->is_array() || v->as_array().empty()) {
    r.expected(*v, where + " inputs", "a layer's name or a non-empty array of them, e.g. [\"stem\", \"b1_bn2\"]");
    return;
  }
  std::string text;
  bool ok = true;
  for (size_t k = 0; k < v->as_array().size(); ++k) {
    const auto s = name_text(v->as_array()[k], where + " inputs[" + std::to_string(k) + "]", true);
    if (s) text += (k ? "," : "") + *s;
    ok = ok && s;
  }
  if (ok) put("inputs", text);
}

void check_train_graph(Reader& r, const Value& layers, const TrainSpec& train) {
  const auto& arr = layers.as_array();
  auto at = [&](const std::string& message) {
    const std::optional<size_t> i = layer_of(message);
    if (!i || *i >= arr.size()) return r.pos(layers);
    const Value& l = arr[*i];
    const std::string key = key_of(message, l);
    return r.key_pos(*Reader::find(l, key), key);
  };
  try {
    const std::vector<schema::LayerConfig> configs = layer_configs(train);
    const schema::Graph g = schema::graph(kSampleShape, configs);
    schema::classes_of(g.shapes[g.output].output, g.output, configs[g.output].type());
  } catch (const schema::LayerError& e) {
    r.error(at(e.what()), e.what());
  }
}

std::string train_model_summary(const TrainSpec& train) {
  return schema::summary(kSampleShape, layer_configs(train));
}

}  // namespace skyforge
