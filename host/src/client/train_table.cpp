// The [train] table (train_table.hpp).
#include "train_table.hpp"

#include "train_graph.hpp"

#include <skyforge/config_keys.hpp>
#include <skyforge/layer_schema.hpp>
#include <skyforge/optimizer_schema.hpp>

#include <algorithm>
#include <charconv>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

namespace skyforge {

namespace {

using namespace toml_in;

// Layers are checked against the SDK's layer schema (skyforge/layer_schema.hpp), the optimizer
// against its optimizer schema (skyforge/optimizer_schema.hpp): the catalogues the train app
// and every backend read too. The config keys and their defaults are skyforge/config_keys.hpp's.
namespace keys = config::keys;

// The [train] key a train.* config key holds: "train.batch_size" -> "batch_size".
template <class T>
std::string field(const config::Key<T>& key) {
  return std::string(keys::train_field(key.name));
}

// Canonical text of a [train] count (an integer in [1, 2^31-1]), or (nullopt) an error reported.
std::optional<std::string> count_text(Reader& r, const Value& v, const std::string& label) {
  auto i = v.is_integer() ? checked_integer(v) : std::nullopt;
  if (i && (*i < 1 || *i > std::numeric_limits<int32_t>::max())) {
    r.error(r.pos(v), label + ": expected an integer between 1 and 2147483647, got " + std::to_string(*i));
    return std::nullopt;
  }
  if (!i) {
    r.expected(v, label, "an integer >= 1");
    return std::nullopt;
  }
  return std::to_string(*i);
}

// One layer option: the TOML value as the schema's text, checked by the schema; nullopt when
// refused (reported at the value).
std::optional<std::string> layer_option_text(Reader& r, const Value& v, const schema::OptionDef& o,
                                             const std::string& label) {
  std::optional<std::string> text;
  switch (o.kind) {
    case schema::OptionKind::count:
      if (auto i = v.is_integer() ? checked_integer(v) : std::nullopt) text = std::to_string(*i);
      break;
    case schema::OptionKind::size2:
      if (auto i = v.is_integer() ? checked_integer(v) : std::nullopt) {
        text = std::to_string(*i);
      } else if (v.is_array() && v.as_array().size() == 2 && v.as_array()[0].is_integer() &&
                 v.as_array()[1].is_integer()) {  // kernel_size = [3, 5]
        auto h = checked_integer(v.as_array()[0]), w = checked_integer(v.as_array()[1]);
        if (h && w) text = std::to_string(*h) + "," + std::to_string(*w);
      }
      break;
    case schema::OptionKind::real:
      if (v.is_floating() || v.is_integer())
        text = float_text(v.is_floating() ? v.as_floating() : static_cast<double>(v.as_integer()));
      break;
    case schema::OptionKind::boolean:
      if (v.is_boolean()) text = v.as_boolean() ? "true" : "false";
      break;
    case schema::OptionKind::choice:
      if (v.is_string()) text = v.as_string().str;
      break;
    case schema::OptionKind::integer:  // concatenate's axis = -1
      if (auto i = v.is_integer() ? checked_integer(v) : std::nullopt) text = std::to_string(*i);
      break;
    case schema::OptionKind::dims:  // reshape's target_shape = [49, 64]
      if (v.is_array() && !v.as_array().empty()) {
        text.emplace();
        for (const Value& d : v.as_array()) {
          const auto i = d.is_integer() ? checked_integer(d) : std::nullopt;
          if (!i) {
            text.reset();
            break;
          }
          *text += (text->empty() ? "" : ",") + std::to_string(*i);
        }
      }
      break;
  }
  if (!text) {
    r.expected(v, label, schema::expectation(o));
    return std::nullopt;
  }
  const schema::Checked c = schema::check(o, *text);
  if (c.ok) return c.canonical;
  std::string hint;
  if (o.kind == schema::OptionKind::choice) {
    std::vector<std::string> names;
    schema::detail::each_choice(o.choices, [&](std::string_view n, std::string_view) { names.emplace_back(n); });
    hint = did_you_mean(*text, names);
  }
  r.error(r.pos(v), label + ": expected " + schema::expectation(o) + ", got " +
                        (o.kind == schema::OptionKind::choice ? quote(*text) : *text) + hint);
  return std::nullopt;
}

const std::vector<std::string> kTrainKeys = {"dataset", "data_dir", "layers", "optimizer", "learning_rate", "momentum",
                                             "nesterov", "weight_decay", "rho", "centered", "clipnorm", "global_clipnorm",
                                             "learning_rate_schedule",
                                             "loss", "metrics", "epochs", "batch_size", "steps_per_epoch", "shuffle", "seed",
                                             "history", "tensorboard", "checkpoint", "checkpoint_every", "resume", "threads", "evaluate"};

// The optimizer options [train] sets (an optimizer's others keep Keras' defaults).
const std::vector<config::Key<std::string>> kOptimizerOptions = {
    keys::train_learning_rate, keys::train_momentum, keys::train_nesterov, keys::train_weight_decay,
    keys::train_rho,           keys::train_centered, keys::train_clipnorm, keys::train_global_clipnorm};

// A [train] optimizer option, checked against the option of that name in the optimizer schema:
// `optimizer`'s, or (an option it does not have, e.g. momentum with adam: accepted, unused) the
// first optimizer's that has one.
const schema::OptionDef& optimizer_option(const schema::OptimizerDef* optimizer, const std::string& name) {
  if (const schema::OptionDef* o = optimizer ? schema::find_option(*optimizer, name) : nullptr) return *o;
  for (const schema::OptimizerDef& d : schema::optimizers())
    if (const schema::OptionDef* o = schema::find_option(d, name)) return *o;
  throw std::logic_error("[train] " + name + ": no optimizer has this option");
}

std::vector<std::string> optimizer_names() {
  std::vector<std::string> out;
  for (const schema::OptimizerDef& d : schema::optimizers()) out.emplace_back(d.name);
  return out;
}

// A TOML array as a schedule's list text ("100,200"): integers >= 0 (boundaries) or numbers.
std::optional<std::string> list_text(Reader& r, const Value& v, const std::string& label, bool steps) {
  std::string text;
  bool ok = v.is_array() && !v.as_array().empty();
  for (size_t i = 0; ok && i < v.as_array().size(); ++i) {
    const Value& x = v.as_array()[i];
    const auto n = x.is_integer() ? checked_integer(x) : std::nullopt;
    ok = steps ? n && *n >= 0 : (x.is_integer() || x.is_floating());
    if (ok) text += (i ? "," : "") + (steps ? std::to_string(*n) : float_text(x.is_floating() ? x.as_floating() : static_cast<double>(x.as_integer())));
  }
  if (ok) return text;
  r.expected(v, label, steps ? "an array of steps (integers >= 0)" : "an array of numbers");
  return std::nullopt;
}

// [train.learning_rate_schedule]: its type and Keras' arguments, each checked at its value
// against the optimizer schema's schedule, then together as the schema checks them (at the
// list the problem is in, else at the table). Puts the config keys.
void read_schedule(Reader& r, const Value& s, const std::function<void(std::string_view, std::string)>& put) {
  const std::string where = "[train.learning_rate_schedule]";
  if (!s.is_table()) {
    r.expected(s, "[train] learning_rate_schedule", "a table ([train.learning_rate_schedule] with 'type')");
    return;
  }
  std::vector<std::string> names;
  for (const schema::ScheduleDef& d : schema::schedules()) names.emplace_back(d.name);
  const Value* type = Reader::find(s, "type");
  const schema::ScheduleDef* def = type && type->is_string() ? schema::find_schedule(type->as_string().str) : nullptr;
  if (!type) r.error(r.pos(s), where + ": missing 'type' (one of " + join(names, ", ") + ")");
  else if (!def)
    r.expected(*type, where + " type", "one of " + join(names, ", ") + (type->is_string() ? did_you_mean(type->as_string().str, names) : ""));
  if (!def) return;
  const std::string label = where + " (" + std::string(def->name) + ")";
  std::vector<std::string> known = {"type"};
  for (const auto& o : def->options) known.emplace_back(o.name);
  if (def->lists) known.insert(known.end(), {"boundaries", "values"});
  r.check_keys(s, known, label);
  std::vector<std::pair<std::string, std::string>> arguments;
  bool ok = true;
  auto take = [&](const std::string& key, std::optional<std::string> text) {
    if (text) arguments.emplace_back(key, *text);
    ok = ok && text;
  };
  for (const auto& o : def->options)
    if (const Value* v = Reader::find(s, std::string(o.name))) take(std::string(o.name), layer_option_text(r, *v, o, label + " " + std::string(o.name)));
  if (def->lists)
    for (const std::string key : {"boundaries", "values"})
      if (const Value* v = Reader::find(s, key)) take(key, list_text(r, *v, label + " " + key, key == "boundaries"));
  if (!ok) return;
  try {
    schema::parse_schedule(def->name, arguments);
  } catch (const schema::OptimizerError& e) {
    const std::string m = e.what();
    const std::string problem = m.substr(m.find(": ") + 2);  // after the schema's "learning_rate_schedule <type>"
    const Value* at = &s;
    for (const char* list : {"boundaries", "values"})
      if (problem.rfind(list, 0) == 0 && Reader::find(s, list)) at = Reader::find(s, list);
    r.error(r.pos(*at), label + ": " + problem);
    return;
  }
  put(keys::train_learning_rate_schedule.name, std::string(def->name));
  for (const auto& [key, text] : arguments) put(keys::train_schedule_argument(key), text);
}

}  // namespace

void read_train(toml_in::Reader& r, const toml_in::Value& t, const std::string& dir, TrainSpec& train) {
  r.check_keys(t, kTrainKeys, "[train]");
  train.present = true;
  train.pos = r.pos(t);
  auto put = [&](std::string_view key, std::string value) { train.config.emplace_back(key, std::move(value)); };
  // Each key below with its default (config_keys.hpp) when [train] leaves it out: the one place
  // [train]'s defaults are filled in; the train app reads them with none of its own.
  auto choice = [&](const config::Key<std::string>& key, std::vector<std::string> allowed) {
    std::string value(key.fallback);
    if (const Value* v = Reader::find(t, field(key))) {
      if (v->is_string() && std::find(allowed.begin(), allowed.end(), v->as_string().str) != allowed.end())
        value = v->as_string().str;
      else
        r.expected(*v, "[train] " + field(key), "one of " + join(allowed, ", ") +
                                                    (v->is_string() ? did_you_mean(v->as_string().str, allowed) : ""));
    }
    put(key.name, value);
    return value;
  };
  auto count = [&](const config::Key<uint64_t>& key) {
    if (const Value* v = Reader::find(t, field(key))) {
      if (auto s = count_text(r, *v, "[train] " + field(key))) put(key.name, *s);
    } else if (!key.fallback.empty()) {
      put(key.name, std::string(key.fallback));
    }
  };
  auto boolean = [&](const config::Key<bool>& key) {
    if (auto b = r.boolean(t, field(key), "[train]")) put(key.name, *b ? "true" : "false");
    else if (!Reader::find(t, field(key))) put(key.name, std::string(key.fallback));
  };
  auto path = [&](const config::Key<std::string>& key) {
    if (auto s = r.string(t, field(key), "[train]", true)) put(key.name, detail::normalise_path(*s, dir));
  };

  const std::string dataset = choice(keys::train_dataset, {"fashion-mnist", "mnist"});
  if (auto s = r.string(t, field(keys::train_data_dir), "[train]", true))
    put(keys::train_data_dir.name, detail::normalise_path(*s, dir));
  else
    put(keys::train_data_dir.name, "/usr/share/datasets/" + dataset);
  const std::string optimizer = choice(keys::train_optimizer, optimizer_names());
  const Value* schedule = Reader::find(t, field(keys::train_learning_rate_schedule));
  for (const auto& key : kOptimizerOptions) {
    const schema::OptimizerDef* def = schema::find_optimizer(optimizer);
    const schema::OptionDef& o = optimizer_option(def, field(key));
    const bool clip = key.name == keys::train_clipnorm.name || key.name == keys::train_global_clipnorm.name;
    if (key.name == keys::train_learning_rate.name && schedule) {
      if (const Value* v = Reader::find(t, field(key)))
        r.error(r.pos(*v), "[train] learning_rate: give it or [train.learning_rate_schedule], not both (the schedule is the learning rate)");
    } else if (const Value* v = Reader::find(t, field(key))) {
      const std::optional<double> d = v->is_floating()  ? std::optional(v->as_floating())
                                      : v->is_integer() ? std::optional(static_cast<double>(v->as_integer()))
                                                        : std::nullopt;
      const bool flag = o.kind == schema::OptionKind::boolean;
      const std::optional<std::string> text =
          flag ? (v->is_boolean() ? std::optional<std::string>(v->as_boolean() ? "true" : "false") : std::nullopt)
               : (d ? std::optional(float_text(*d)) : std::nullopt);
      const schema::Checked c = text ? schema::check(o, *text) : schema::Checked{};
      if (c.ok && !(clip && c.real == 0)) put(key.name, c.canonical);
      else r.expected(*v, "[train] " + field(key), clip ? "a number > 0" : schema::expectation(o));
    } else if (def && schema::find_option(*def, field(key))) {
      put(key.name, std::string(o.fallback));  // the optimizer's own default: sgd's learning rate is 0.01
    }
  }
  auto positive = [&](const config::Key<std::string>& key) {
    const Value* v = Reader::find(t, field(key));
    return v && (v->is_floating() ? v->as_floating() > 0 : v->is_integer() && v->as_integer() > 0) ? v : nullptr;
  };
  if (const Value* v = positive(keys::train_global_clipnorm); v && positive(keys::train_clipnorm))
    r.error(r.pos(*v), "[train] global_clipnorm: give clipnorm or global_clipnorm, not both (Keras takes one)");
  if (schedule) read_schedule(r, *schedule, put);
  choice(keys::train_loss, {"sparse_categorical_crossentropy"});
  if (auto m = r.string_array(t, field(keys::train_metrics), "[train]", false, [](const std::string& s, size_t) {
        return s == "accuracy" ? std::string() : "expected \"accuracy\", got " + quote(s);
      }))
    put(keys::train_metrics.name, join(*m, ","));
  else if (!Reader::find(t, field(keys::train_metrics)))
    put(keys::train_metrics.name, std::string(keys::train_metrics.fallback));
  count(keys::train_epochs);
  count(keys::train_batch_size);
  count(keys::train_steps_per_epoch);
  if (auto n = r.integer(t, field(keys::train_seed), "[train]", 0, std::numeric_limits<int64_t>::max()))
    put(keys::train_seed.name, std::to_string(*n));
  boolean(keys::train_shuffle);
  boolean(keys::train_resume);
  boolean(keys::train_evaluate);
  if (auto n = r.integer(t, field(keys::train_threads), "[train]", 0, 4096)) put(keys::train_threads.name, std::to_string(*n));
  path(keys::train_history);
  path(keys::train_tensorboard);
  path(keys::train_checkpoint);
  if (const Value* v = Reader::find(t, "checkpoint_every")) {
    if (v->is_string() && v->as_string().str == "epoch") {
      put(keys::train_checkpoint_every.name, "epoch");
    } else if (auto n = v->is_integer() ? checked_integer(*v) : std::nullopt; n && *n >= 1) {
      put(keys::train_checkpoint_every.name, std::to_string(*n));
    } else {
      r.expected(*v, "[train] checkpoint_every", "\"epoch\" or a number of steps >= 1");
    }
    if (!Reader::find(t, "checkpoint"))
      r.error(r.key_pos(*v, "checkpoint_every"), "[train] checkpoint_every: needs 'checkpoint' (the directory to write to)");
  } else {
    put(keys::train_checkpoint_every.name, std::string(keys::train_checkpoint_every.fallback));
  }
  if (const Value* v = Reader::find(t, "resume"); v && v->is_boolean() && v->as_boolean() && !Reader::find(t, "checkpoint"))
    r.error(r.key_pos(*v, "resume"), "[train] resume: needs 'checkpoint' (the directory to resume from)");

  const Value* layers = Reader::find(t, "layers");
  if (!layers || !layers->is_array() || layers->as_array().empty()) {
    if (layers)
      r.expected(*layers, "[train] layers", "a non-empty array of tables ([[train.layers]] with 'type')");
    else
      r.error(r.pos(t), "[train]: missing 'layers' (one [[train.layers]] table per layer, each with 'type')");
    return;
  }
  const std::vector<std::string> types = schema::type_names();
  const size_t problems_before = r.problems().size();
  const auto& arr = layers->as_array();
  put(keys::train_layers.name, std::to_string(arr.size()));
  for (size_t i = 0; i < arr.size(); ++i) {
    const Value& l = arr[i];
    const std::string where = "[[train.layers]] #" + std::to_string(i + 1);
    if (!l.is_table()) {
      r.expected(l, where, "a table with 'type' and the layer's options");
      continue;
    }
    const Value* type = Reader::find(l, "type");
    if (!type) {
      r.error(r.pos(l), where + ": missing 'type' (one of " + join(types, ", ") + ")");
      continue;
    }
    const schema::LayerDef* def = type->is_string() ? schema::find(type->as_string().str) : nullptr;
    if (!def) {
      r.expected(*type, where + " type",
                 "one of " + join(types, ", ") + (type->is_string() ? did_you_mean(type->as_string().str, types) : ""));
      continue;
    }
    const std::string name(def->type);
    put(keys::train_layer(i, "type"), name);
    std::vector<std::string> known = {"type", "name", "inputs"};
    for (const auto& o : def->options) known.emplace_back(o.name);
    r.check_keys(l, known, where + " (" + name + ")");
    read_layer_links(r, l, where, [&](std::string_view key, std::string text) { put(keys::train_layer(i, key), std::move(text)); });
    for (const auto& o : def->options) {
      const std::string key(o.name);
      if (const Value* v = Reader::find(l, key)) {
        if (auto text = layer_option_text(r, *v, o, where + " " + key)) put(keys::train_layer(i, key), *text);
      } else if (o.required()) {
        r.error(r.pos(*type), where + " (" + name + "): missing '" + key + "'");
      }
    }
  }
  if (r.problems().size() == problems_before) check_train_graph(r, *layers, train);  // each layer read: the model
}

namespace {

// [train] keys a grid search may vary (a layer's options are named "layers.<i>.<option>").
// (A schedule's arguments are not: [train.learning_rate_schedule] is fixed for the whole search.)
const std::vector<std::string> kSearchableKeys = {"optimizer", "learning_rate", "momentum",  "nesterov",
                                                  "weight_decay", "rho", "centered", "clipnorm",
                                                  "global_clipnorm", "epochs", "batch_size", "steps_per_epoch",
                                                  "shuffle"};

// param_grid's entries, flattened: { learning_rate = [...], layers = { 0 = { units = [...] } } }
// and { "layers.0.units" = [...] } both name "layers.0.units". Leaves are the value arrays.
void flatten_grid(Reader& r, const Value& t, const std::string& prefix, std::vector<std::pair<std::string, const Value*>>& out) {
  for (const auto& [key, value] : t.as_table()) {
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    if (value.is_table()) {
      flatten_grid(r, value, name, out);
    } else if (value.is_array() && !value.as_array().empty()) {
      out.emplace_back(name, &value);
    } else {
      r.expected(value, "[search] param_grid " + name, "a non-empty array of the values to try");
    }
  }
}

// The [train] table with `name` (a searchable key or "layers.<i>.<option>") set to `v`, or a
// reason it cannot be.
std::string substitute(Value& train, const std::string& name, const Value& v) {
  if (std::find(kSearchableKeys.begin(), kSearchableKeys.end(), name) != kSearchableKeys.end()) {
    train.as_table()[name] = v;
    return "";
  }
  const std::string hint = "a [train] key (" + join(kSearchableKeys, ", ") + ") or a layer's option, \"layers.<i>.<option>\"";
  if (name.rfind("layers.", 0) != 0) return "expected " + hint;
  const size_t dot = name.find('.', 7);
  const std::string index = name.substr(7, dot == std::string::npos ? std::string::npos : dot - 7);
  if (dot == std::string::npos || index.empty() || index.find_first_not_of("0123456789") != std::string::npos)
    return "expected " + hint;
  Value* layers = train.is_table() && train.as_table().count("layers") ? &train.as_table()["layers"] : nullptr;
  // Digits only, but maybe more than size_t holds (found by fuzz_manifest: std::stoul threw).
  size_t i = 0;
  if (std::from_chars(index.data(), index.data() + index.size(), i).ec != std::errc()) i = SIZE_MAX;
  if (!layers || !layers->is_array() || i >= layers->as_array().size() || !layers->as_array()[i].is_table())
    return "[train] has no layer " + index + " (layers count from 0)";
  Value& layer = layers->as_array()[i];
  const Value* type = Reader::find(layer, "type");
  const schema::LayerDef* def = type && type->is_string() ? schema::find(type->as_string().str) : nullptr;
  if (!def) return "";  // read_train reports the layer itself
  const std::string option = name.substr(dot + 1);
  std::vector<std::string> names;
  for (const auto& o : def->options) names.emplace_back(o.name);
  if (std::find(names.begin(), names.end(), option) == names.end())
    return "layer " + index + " (" + std::string(def->type) + ") has no option '" + option + "' (it has: " +
           join(names, ", ") + ")" + did_you_mean(option, names);
  layer.as_table()[option] = v;
  return "";
}

// A grid of optimizers whose default learning rates differ (adam 0.001, sgd 0.01) needs the
// learning rate set: [train] holds one optimizer's default, and a fit of another would train at it.
void refuse_unset_learning_rate(Reader& r, const Value& values, const std::vector<std::string>& optimizers,
                                const Value& train, const std::vector<std::pair<std::string, const Value*>>& entries) {
  const std::string lr = field(keys::train_learning_rate);
  if (Reader::find(train, lr) || Reader::find(train, field(keys::train_learning_rate_schedule)) ||
      std::any_of(entries.begin(), entries.end(), [&](const auto& e) { return e.first == lr; }))
    return;
  std::vector<std::string> defaults;  // "adam 0.001"
  std::set<std::string_view> rates;
  for (const std::string& o : optimizers) {
    const std::string_view rate = schema::find_option(*schema::find_optimizer(o), lr)->fallback;
    defaults.push_back(o + " " + std::string(rate));
    rates.insert(rate);
  }
  if (rates.size() > 1)
    r.error(r.pos(values), "[search] param_grid optimizer: the optimizers' default learning rates differ (" +
                               join(defaults, ", ") + "): set [train] learning_rate or add it to param_grid");
}

}  // namespace

void read_search(Reader& r, const Value& t, const Value& train, const std::string& dir, SearchSpec& search) {
  r.check_keys(t, {"param_grid", "cv", "seed", "csv"}, "[search]");
  search.present = true;
  search.pos = r.pos(t);
  auto put = [&](std::string_view key, std::string value) { search.config.emplace_back(key, std::move(value)); };
  // A number given, else the key's default (config_keys.hpp).
  auto number = [&](const config::Key<uint64_t>& key, std::optional<int64_t> given) {
    const std::string text = given ? std::to_string(*given) : std::string(key.fallback);
    put(key.name, text);
    return std::stoull(text);
  };
  const uint64_t cv = number(keys::search_cv, r.integer(t, "cv", "[search]", 2, 1000));
  number(keys::search_seed, r.integer(t, "seed", "[search]", 0, std::numeric_limits<int64_t>::max()));
  put(keys::search_csv.name, detail::normalise_path(r.string(t, "csv", "[search]", true).value_or("cv_results.csv"), dir));

  const Value* grid = Reader::find(t, "param_grid");
  if (!grid || !grid->is_table() || grid->as_table().empty()) {
    if (grid)
      r.expected(*grid, "[search] param_grid", "a table of the values to try, e.g. { learning_rate = [1e-3, 3e-4] }");
    else
      r.error(r.pos(t), "[search]: missing 'param_grid' (a table of the values to try, e.g. { learning_rate = [1e-3, 3e-4] })");
    return;
  }
  std::vector<std::pair<std::string, const Value*>> entries;
  flatten_grid(r, *grid, "", entries);
  // scikit-learn's ParameterGrid order: names sorted, the last one varying fastest.
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> names;
  uint64_t candidates = 1;
  Reader base(r.file());  // [train] as written: its own problems are reported by read_train
  TrainSpec base_spec;
  read_train(base, train, dir, base_spec);
  for (const auto& [name, values] : entries) {
    // Each value as the [train] table would hold it: the table with the value put in, read by
    // read_train; what it says about the value (found at the value's own position) is ours.
    std::vector<std::string> texts;
    bool ok = true;
    for (const Value& v : values->as_array()) {
      Value copy = train;
      if (std::string why = substitute(copy, name, v); !why.empty()) {
        r.error(r.key_pos(*values, name.substr(name.rfind('.') + 1)), "[search] param_grid " + name + ": " + why);
        ok = false;
        break;
      }
      Reader scratch(r.file());
      TrainSpec spec;
      read_train(scratch, copy, dir, spec);
      const SourcePos at = r.pos(v);
      for (const auto& problem : scratch.problems())
        if (problem.pos.line == at.line && problem.pos.column == at.column) {
          r.error(at, "[search] param_grid " + name + ": " + problem.message);
          ok = false;
        }
      // A value fine in itself may break the model elsewhere (a block's filters the residual add
      // no longer matches): the first problem [train] alone does not have, said at the value.
      for (const auto& problem : scratch.problems())
        if (ok && std::none_of(base.problems().begin(), base.problems().end(),
                               [&](const Problem& b) { return b.message == problem.message; })) {
          r.error(at, "[search] param_grid " + name + ": with this value, " + problem.pos.str() + ": " + problem.message);
          ok = false;
        }
      const std::string key = keys::train_key(name);  // (a structured binding: not capturable before clang 16)
      const auto it = std::find_if(spec.config.begin(), spec.config.end(), [&](const auto& kv) { return kv.first == key; });
      if (ok && it != spec.config.end()) texts.push_back(it->second);
    }
    if (!ok) continue;
    std::vector<std::string> unique = texts;
    std::sort(unique.begin(), unique.end());
    if (std::adjacent_find(unique.begin(), unique.end()) != unique.end()) {
      r.error(r.pos(*values), "[search] param_grid " + name + ": a value is listed twice");
      continue;
    }
    if (name == "optimizer") refuse_unset_learning_rate(r, *values, texts, train, entries);
    names.push_back(name);
    candidates *= texts.size();
    put(keys::search_param_grid(name), config::join_lines(texts));
  }
  if (candidates * cv > 1000000)
    r.error(r.pos(*grid), "[search] param_grid: " + std::to_string(candidates) + " candidates x cv " + std::to_string(cv) +
                              " fits is more than 1000000");
  put(keys::search_params.name, config::join_lines(names));
}

}  // namespace skyforge

