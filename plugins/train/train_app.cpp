// The built-in `train` job (docs/training.md). The host flattens a manifest's [train] table into
// config keys (skyforge/config_keys.hpp: train.epochs, train.layers.0.type, ...; every default
// filled in, paths already absolute) and runs this app
// once on every node. Each node loads the whole dataset and fit() splits every global batch
// across the nodes (Data::replicated), so N nodes take exactly the optimisation steps one node
// takes on the same global batch; gradients are averaged through the pool's communicator.
//
// Environment from the `keras` framework plugin, when the manifest lists it:
//   SKYFORGE_SEED           the pool-wide seed ([train] seed overrides it)
//   SKYFORGE_DATA_PARALLEL  "0": no gradient averaging; every node trains its own replica
// The compute backend is the one the host selected (config compute.backend).
//
// The result (one line of JSON per node) carries the test metrics, the training throughput and
// an FNV-1a checksum of the final weights, so a caller can check that the replicas agree.
//
// With [search] (a grid search, docs/training.md) the job is a map instead: each task is one fit
// of one candidate on one fold — "fold=K;name=value;..." — run on one slot with no communicator,
// validated on the fold (search.cv folds of the training set, split by search.seed), and answered
// with its validation accuracy and loss as one line of JSON.
#include <skyforge/config_keys.hpp>
#include <skyforge/datasets.hpp>
#include <skyforge/keras.hpp>
#include <skyforge/layer_schema.hpp>
#include <skyforge/optimizer_schema.hpp>
#include <skyforge/sdk.hpp>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace K = skyforge::keras;
namespace keys = skyforge::config::keys;

namespace {

using skyforge::Error;

// The job's train.* keys (skyforge/config_keys.hpp), typed, with a grid-search task's values over
// them. The host's [train] table wrote every default: none here.
class TrainConfig {
 public:
  explicit TrainConfig(const skyforge::Host& host, const std::vector<std::pair<std::string, std::string>>& task_values = {})
      : host_(host) {
    for (const auto& [name, value] : task_values) overrides_[keys::train_key(name)] = value;
  }

  // The lookup config::Key reads through.
  std::optional<std::string> operator()(const std::string& key) const {
    if (auto it = overrides_.find(key); it != overrides_.end()) return it->second;
    return host_.config(key);
  }
  template <class T>
  T get(const skyforge::config::Key<T>& key) const {
    return key.get(*this);
  }
  template <class T>
  std::optional<T> find(const skyforge::config::Key<T>& key) const {
    return key.find(*this);
  }

 private:
  const skyforge::Host& host_;
  std::map<std::string, std::string> overrides_;
};

// Every option of the schema's `def` that the config holds under prefix + option, as text.
template <class Def>
std::vector<std::pair<std::string, std::string>> options_from(const TrainConfig& c, const Def& def, const std::string& key_of) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& option : def.options)
    if (auto v = c(key_of + std::string(option.name))) out.emplace_back(option.name, *v);
  return out;
}

// [[train.layers]] #i as the host checked it against the layer schema (canonical text, no
// defaults added); compile() fills in the schema's defaults. No number is parsed here.
K::Layer layer_from(const TrainConfig& c, uint64_t i) {
  const std::string type_key = keys::train_layer(i, "type");
  K::Layer layer{c.get(skyforge::config::Key<std::string>{type_key, {}, "a [[train.layers]] type"}), {}, {}};
  const skyforge::schema::LayerDef* def = skyforge::schema::find(layer.type);
  if (!def) throw Error("train: layer " + std::to_string(i) + " has unknown type '" + layer.type + "'", SF_ERR_INVALID);
  layer.options = options_from(c, *def, keys::train_layer(i, ""));
  for (const char* graph_key : {"name", "inputs"})  // the model graph's (layer_schema.hpp)
    if (auto v = c(keys::train_layer(i, graph_key))) layer.options.emplace_back(graph_key, *v);
  return layer;
}

// The optimizer and the options [train] set (the host wrote the optimizer's defaults for those
// it left out) with [train.learning_rate_schedule], checked by the optimizer schema, which fills
// in the rest.
K::Optimizer optimizer_from(const TrainConfig& c) {
  const std::string name = c.get(keys::train_optimizer);
  const skyforge::schema::OptimizerDef* def = skyforge::schema::find_optimizer(name);
  if (!def)
    throw Error("train.optimizer: expected one of " + skyforge::schema::optimizer_names() + ", got '" + name + "'", SF_ERR_INVALID);
  auto options = options_from(c, *def, keys::train_key(""));
  if (auto type = c.find(keys::train_learning_rate_schedule)) {  // [train.learning_rate_schedule]
    options.emplace_back(skyforge::schema::kScheduleOption, *type);
    const skyforge::schema::ScheduleDef* s = skyforge::schema::find_schedule(*type);
    std::vector<std::string> arguments = {"boundaries", "values"};
    for (const auto& o : s ? s->options : std::span<const skyforge::schema::OptionDef>{}) arguments.emplace_back(o.name);
    for (const auto& a : arguments)
      if (auto v = c(keys::train_schedule_argument(a))) options.emplace_back(skyforge::schema::schedule_key(a), *v);
  }
  const skyforge::schema::OptimizerConfig o = skyforge::schema::parse_optimizer(name, options);
  const K::LearningRate lr = K::LearningRate::of(o);
  const double clip = o.real("clipnorm"), global_clip = o.real("global_clipnorm");
  if (o.name() == "sgd") return K::SGD{lr, o.real("momentum"), o.flag("nesterov"), clip, global_clip};
  if (o.name() == "adamw")
    return K::AdamW{lr, o.real("weight_decay"), o.real("beta_1"), o.real("beta_2"), o.real("epsilon"), clip, global_clip};
  if (o.name() == "rmsprop")
    return K::RMSprop{lr, o.real("rho"), o.real("momentum"), o.real("epsilon"), o.flag("centered"), clip, global_clip};
  return K::Adam{lr, o.real("beta_1"), o.real("beta_2"), o.real("epsilon"), clip, global_clip};
}

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ULL;
  return h;
}
uint64_t fnv1a64(const std::vector<float>& w) {
  return fnv1a64(std::string_view(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float)));
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

K::Sequential build_model(const TrainConfig& c, const std::vector<uint32_t>& sample_shape) {
  K::Sequential model;
  model.add(K::Input(sample_shape));
  const uint64_t layers = c.get(keys::train_layers);
  for (uint64_t i = 0; i < layers; ++i) model.add(layer_from(c, i));
  return model;
}

std::vector<std::string> metrics(const TrainConfig& c) {
  std::vector<std::string> out;
  const std::string m = c.get(keys::train_metrics);
  for (size_t b = 0; b < m.size();) {
    const size_t e = std::min(m.find(',', b), m.size());
    if (e > b) out.push_back(m.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

class Train : public skyforge::App {
 public:
  using App::App;

  // One fit of a grid search: "fold=K;name=value;..." (config_keys.hpp, SearchTask).
  std::string task(std::string_view input, uint32_t slot) override {
    const skyforge::config::SearchTask t = skyforge::config::parse_search_task(input);
    const uint64_t fold = t.fold, folds = *host().config(keys::search_cv);
    const uint64_t split_seed = *host().config(keys::search_seed);
    if (folds < 2 || fold >= folds) throw Error("train: fold " + std::to_string(fold) + " of search.cv = " + std::to_string(folds), SF_ERR_INVALID);
    const TrainConfig c(host(), t.values);

    // The training set, split into the search's folds the same way on every node.
    const std::shared_ptr<const skyforge::datasets::ByteDataset> all = training_set(c);
    std::vector<size_t> order = skyforge::permutation(all->size(), true, split_seed);
    const std::vector<size_t> held_out = skyforge::shard(all->size(), uint32_t(fold), uint32_t(folds), true, split_seed);
    std::vector<size_t> kept;
    kept.reserve(order.size() - held_out.size());
    const size_t begin = size_t(std::find(order.begin(), order.end(), held_out.empty() ? 0 : held_out.front()) - order.begin());
    for (size_t i = 0; i < order.size(); ++i)
      if (held_out.empty() || i < begin || i >= begin + held_out.size()) kept.push_back(order[i]);
    // Into this slot's buffers from its last fit: same sizes, so no fresh pages (faulting them in
    // took a third of a fit's time on Fashion-MNIST). The node keeps the images as bytes and
    // converts only what a fold copies.
    FoldBuffers& buf = fold_buffers(slot);
    all->take(kept, buf.fit_on);
    all->take(held_out, buf.validate_on);
    const skyforge::datasets::Dataset &fit_on = buf.fit_on, &validate_on = buf.validate_on;

    K::Sequential model = build_model(c, all->sample_shape);
    K::CompileOptions co;
    co.backend = K::Backend(host().compute_backend());
    co.seed = c.find(keys::train_seed).value_or(split_seed);
    co.threads = static_cast<uint32_t>(c.find(keys::train_threads).value_or(1));  // one core per slot unless [train] threads says
    model.compile(optimizer_from(c), c.get(keys::train_loss), metrics(c), co);
    K::FitOptions fo;
    fo.epochs = static_cast<uint32_t>(c.get(keys::train_epochs));
    fo.batch_size = static_cast<uint32_t>(c.get(keys::train_batch_size));
    fo.shuffle = c.get(keys::train_shuffle);
    fo.steps_per_epoch = c.find(keys::train_steps_per_epoch).value_or(0)  /* 0: every batch */;
    fo.verbose = 0;
    const auto t0 = std::chrono::steady_clock::now();
    model.fit(fit_on.x, fit_on.y, fo);
    const double fit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const K::EvalResult r = model.evaluate(validate_on.x, validate_on.y, 512);
    return "{\"fold\": " + std::to_string(fold) + ", \"accuracy\": " + K::format_double(r.accuracy) +
           ", \"loss\": " + K::format_double(r.loss) + ", \"fit_seconds\": " + K::format_double(fit_s) + "}";
  }

  std::string run() override {
    const skyforge::InstanceInfo info = instance_info();
    const TrainConfig c(host());
    const bool data_parallel = info.total_nodes > 1 && env_flag("SKYFORGE_DATA_PARALLEL", true);
    const uint64_t seed = pool_seed(c, info);

    const std::string dataset = c.get(keys::train_dataset);
    auto [train, test] = skyforge::datasets::load_fashion_mnist(c.get(keys::train_data_dir));  // the same IDX layout for MNIST

    K::Sequential model = build_model(c, train.sample_shape);

    K::CompileOptions co;
    co.backend = K::Backend(host().compute_backend());
    if (data_parallel) co.communicator = host().communicator();
    co.seed = seed;
    co.threads = static_cast<uint32_t>(c.find(keys::train_threads).value_or(0));  // every core unless [train] threads says
    model.compile(optimizer_from(c), c.get(keys::train_loss), metrics(c), co);

    // Without DataParallel every node is a rank 0 of its own: only the head writes files.
    const bool writer = data_parallel || info.is_head;
    if (info.is_head) {
      std::printf("%s", model.summary().c_str());
      std::printf("%s on %u node%s (%s), backend %s, seed %llu, global batch %llu\n", dataset.c_str(),
                  info.total_nodes, info.total_nodes == 1 ? "" : "s",
                  data_parallel ? "data-parallel" : "independent replicas",
                  host().config(keys::compute_backend).value_or("?").c_str(), static_cast<unsigned long long>(seed),
                  static_cast<unsigned long long>(c.get(keys::train_batch_size)));
      std::fflush(stdout);
    }

    K::FitOptions fo;
    fo.epochs = static_cast<uint32_t>(c.get(keys::train_epochs));
    fo.batch_size = static_cast<uint32_t>(c.get(keys::train_batch_size));
    fo.shuffle = c.get(keys::train_shuffle);
    fo.data = K::Data::replicated;
    fo.steps_per_epoch = c.find(keys::train_steps_per_epoch).value_or(0)  /* 0: every batch */;
    fo.verbose = writer ? 1 : 0;
    if (writer) {
      fo.callbacks.csv = c.find(keys::train_history).value_or("");
      fo.callbacks.tensorboard = c.find(keys::train_tensorboard).value_or("");
      fo.callbacks.checkpoint_dir = c.find(keys::train_checkpoint).value_or("");
      // [train] checkpoint_every: "epoch" (the default) or N steps (then after every epoch too).
      if (const std::string every = c.get(keys::train_checkpoint_every); every != "epoch")
        fo.callbacks.checkpoint_every_steps = std::strtoull(every.c_str(), nullptr, 10);
    }
    // [train] resume, `skyforge run --resume` (job.resume) or a restart after a lost node
    // (job.restart, [job] max_restarts): go on from the last checkpoint, when there is one. The
    // data order and dropout masks are functions of seed and step, so the run ends with the
    // weights it would have had without the interruption.
    const bool restarted = *host().config(keys::job_resume) || host().config(keys::job_restart).has_value();
    const bool resume = c.get(keys::train_resume) || restarted;
    fo.callbacks.resume = resume && !c.find(keys::train_checkpoint).value_or("").empty();
    if (fo.callbacks.resume && !writer) {  // reads the head's checkpoint, writes and locks nothing
      fo.callbacks.checkpoint_dir = c.find(keys::train_checkpoint).value_or("");
      fo.callbacks.checkpoint_read_only = true;
    }
    // The writer holds the checkpoint directory's lock while it trains: another run there fails
    // at once. A restart or `run --resume` waits a while for it instead: the previous attempt's
    // worker may still be on its way out (its lock goes with its process).
    if (restarted) fo.callbacks.checkpoint_lock_wait_s = 30;

    // Each epoch's wall time besides the total: the first epoch carries the one-time costs (a
    // GPU backend's library loading, algorithm choice and graph capture), the later ones are the
    // steady state a benchmark compares.
    std::vector<double> epoch_s;
    const auto t0 = std::chrono::steady_clock::now();
    auto last = t0;
    fo.callbacks.on_epoch_end = [&](uint32_t, const K::Logs&) {
      const auto now = std::chrono::steady_clock::now();
      epoch_s.push_back(std::chrono::duration<double>(now - last).count());
      last = now;
    };
    const K::History history = model.fit(train.x, train.y, fo);
    const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    std::string out = "{\"node\": " + std::to_string(info.node) + ", \"epochs\": " + std::to_string(history.epoch.size());
    if (!history.epoch.empty()) {
      const auto& loss = history.history.at("loss");
      out += ", \"loss\": " + K::format_double(loss.back());
      if (auto it = history.history.find("accuracy"); it != history.history.end())
        out += ", \"accuracy\": " + K::format_double(it->second.back());
    }
    if (c.get(keys::train_evaluate)) {
      const K::EvalResult r = model.evaluate(test.x, test.y, 512, K::Data::replicated);
      if (info.is_head) {
        std::printf("Test loss: %.4f - test accuracy: %.4f (%llu samples)\n", r.loss, r.accuracy,
                    static_cast<unsigned long long>(r.samples));
        std::fflush(stdout);
      }
      out += ", \"test_loss\": " + K::format_double(r.loss) + ", \"test_accuracy\": " + K::format_double(r.accuracy);
    }
    // Samples per second over the whole pool, fit() wall time (evaluation excluded).
    const uint64_t steps = steps_per_epoch(train.size(), fo);
    const uint64_t samples = steps * fo.batch_size * history.epoch.size();
    std::string epochs_out;
    for (const double e : epoch_s) epochs_out += (epochs_out.empty() ? "" : ", ") + K::format_double(e);
    out += ", \"train_seconds\": " + K::format_double(train_s) + ", \"epoch_seconds\": [" + epochs_out + "]" +
           ", \"samples_per_second\": " + K::format_double(train_s > 0 ? static_cast<double>(samples) / train_s : 0) +
           ", \"weights_fnv1a64\": \"" + hex(fnv1a64(model.get_weights())) + "\"" +
           ", \"state_fnv1a64\": \"" + hex(fnv1a64(model.state_dict())) + "\"}";  // moving statistics too
    return out;
  }

 private:
  // The training set, loaded once per node for every slot's fits.
  std::shared_ptr<const skyforge::datasets::ByteDataset> training_set(const TrainConfig& c) {
    std::lock_guard<std::mutex> lock(data_mu_);
    if (!train_set_) {
      auto [train, test] = skyforge::datasets::load_fashion_mnist_bytes(c.get(keys::train_data_dir));
      train_set_ = std::make_shared<const skyforge::datasets::ByteDataset>(std::move(train));
    }
    return train_set_;
  }

  struct FoldBuffers {
    skyforge::datasets::Dataset fit_on, validate_on;
  };
  // A slot runs one task at a time, so its buffers are its own; the map's nodes never move.
  FoldBuffers& fold_buffers(uint32_t slot) {
    std::lock_guard<std::mutex> lock(data_mu_);
    return fold_buffers_[slot];
  }

  std::mutex data_mu_;
  std::shared_ptr<const skyforge::datasets::ByteDataset> train_set_;
  std::map<uint32_t, FoldBuffers> fold_buffers_;

  static bool env_flag(const char* name, bool fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    return std::strcmp(v, "0") != 0;
  }

  // [train] seed, else the keras plugin's pool-wide SKYFORGE_SEED, else one the head draws and
  // shares through the pool's store.
  uint64_t pool_seed(const TrainConfig& c, const skyforge::InstanceInfo& info) const {
    if (auto s = c.find(keys::train_seed)) return *s;
    if (const char* e = std::getenv("SKYFORGE_SEED"); e && *e) return std::strtoull(e, nullptr, 10);
    return host().shared_seed(info, "train/seed");
  }

  // fit()'s step count for Data::replicated (the full global batches, a final partial one).
  static uint64_t steps_per_epoch(uint64_t n, const K::FitOptions& o) {
    const uint64_t steps = o.drop_remainder ? n / o.batch_size : (n + o.batch_size - 1) / o.batch_size;
    return o.steps_per_epoch ? std::min(steps, o.steps_per_epoch) : steps;
  }
};

}  // namespace

SKYFORGE_PLUGIN(Train, "train", "0.1.0", "the built-in [train] job: a Keras-style model, data-parallel over the pool")
