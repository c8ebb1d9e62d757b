// The built-in `train` job (docs/training.md). The host flattens a manifest's [train] table into
// config keys (train.epochs, train.layers.0.type, ...; paths already absolute) and runs this app
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
#include <skyforge/datasets.hpp>
#include <skyforge/keras.hpp>
#include <skyforge/layer_schema.hpp>
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

namespace {

using skyforge::Error;

// Typed access to the host's train.* config keys, with a grid-search task's values over them.
class TrainConfig {
 public:
  explicit TrainConfig(const skyforge::Host& host, std::map<std::string, std::string> overrides = {})
      : host_(host), overrides_(std::move(overrides)) {}

  std::optional<std::string> find(const std::string& key) const {
    if (auto it = overrides_.find(key); it != overrides_.end()) return it->second;
    return host_.config("train." + key);
  }
  std::string get(const std::string& key, const std::string& fallback) const { return find(key).value_or(fallback); }
  std::string require(const std::string& key) const {
    if (auto v = find(key)) return *v;
    throw Error("train: config key 'train." + key + "' is missing (run this app through a manifest's [train] table)",
                SF_ERR_INVALID);
  }
  uint64_t uint(const std::string& key, uint64_t fallback) const {
    const auto v = find(key);
    return v ? parse_uint(key, *v) : fallback;
  }
  double real(const std::string& key, double fallback) const {
    const auto v = find(key);
    if (!v) return fallback;
    char* end = nullptr;
    const double d = std::strtod(v->c_str(), &end);
    if (v->empty() || *end != '\0') throw Error("train." + key + ": expected a number, got '" + *v + "'", SF_ERR_INVALID);
    return d;
  }
  bool boolean(const std::string& key, bool fallback) const {
    const auto v = find(key);
    if (!v) return fallback;
    if (*v == "true") return true;
    if (*v == "false") return false;
    throw Error("train." + key + ": expected true or false, got '" + *v + "'", SF_ERR_INVALID);
  }

 private:
  static uint64_t parse_uint(const std::string& key, const std::string& v) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || v[0] == '-')
      throw Error("train." + key + ": expected a non-negative integer, got '" + v + "'", SF_ERR_INVALID);
    return n;
  }
  const skyforge::Host& host_;
  std::map<std::string, std::string> overrides_;
};

// [[train.layers]] #i as the host checked it against the layer schema (canonical text, no
// defaults added); compile() fills in the schema's defaults. No number is parsed here.
K::Layer layer_from(const TrainConfig& c, uint64_t i) {
  const std::string p = "layers." + std::to_string(i) + ".";
  K::Layer layer{c.require(p + "type"), {}, {}};
  const skyforge::schema::LayerDef* def = skyforge::schema::find(layer.type);
  if (!def) throw Error("train: layer " + std::to_string(i) + " has unknown type '" + layer.type + "'", SF_ERR_INVALID);
  for (const auto& option : def->options)
    if (auto v = c.find(p + std::string(option.name))) layer.options.emplace_back(option.name, *v);
  return layer;
}

K::Optimizer optimizer_from(const TrainConfig& c) {
  const std::string name = c.get("optimizer", "adam");
  const double lr = c.real("learning_rate", 1e-3);
  if (name == "adam") return K::Adam{lr};
  if (name == "sgd") return K::SGD{lr, c.real("momentum", 0.0)};
  throw Error("train.optimizer: expected adam or sgd, got '" + name + "'", SF_ERR_INVALID);
}

std::string default_data_dir(const std::string& dataset) { return "/usr/share/datasets/" + dataset; }

uint64_t fnv1a64(const std::vector<float>& w) {
  uint64_t h = 0xcbf29ce484222325ULL;
  const auto* b = reinterpret_cast<const unsigned char*>(w.data());
  for (size_t i = 0; i < w.size() * sizeof(float); ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

K::Sequential build_model(const TrainConfig& c, const std::vector<uint32_t>& sample_shape) {
  K::Sequential model;
  model.add(K::Input(sample_shape));
  const uint64_t layers = c.uint("layers", 0);
  for (uint64_t i = 0; i < layers; ++i) model.add(layer_from(c, i));
  return model;
}

std::vector<std::string> metrics(const TrainConfig& c) {
  std::vector<std::string> out;
  const std::string m = c.get("metrics", "accuracy");
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

  // One fit of a grid search: "fold=K;name=value;...".
  std::string task(std::string_view input, uint32_t slot) override {
    std::map<std::string, std::string> values;
    for (size_t b = 0; b <= input.size();) {
      const size_t e = std::min(input.find(';', b), input.size());
      const std::string_view item = input.substr(b, e - b);
      const size_t eq = item.find('=');
      if (eq == std::string_view::npos || eq == 0) throw Error("train: a grid-search task reads 'fold=K;name=value;...', got '" + std::string(input) + "'", SF_ERR_INVALID);
      values[std::string(item.substr(0, eq))] = std::string(item.substr(eq + 1));
      b = e + 1;
    }
    const auto fold_text = values.find("fold");
    if (fold_text == values.end()) throw Error("train: a grid-search task names no fold: '" + std::string(input) + "'", SF_ERR_INVALID);
    const uint64_t fold = std::strtoull(fold_text->second.c_str(), nullptr, 10);
    values.erase(fold_text);
    const uint64_t folds = std::strtoull(host().config("search.cv").value_or("0").c_str(), nullptr, 10);
    const uint64_t split_seed = std::strtoull(host().config("search.seed").value_or("0").c_str(), nullptr, 10);
    if (folds < 2 || fold >= folds) throw Error("train: fold " + std::to_string(fold) + " of search.cv = " + std::to_string(folds), SF_ERR_INVALID);
    const TrainConfig c(host(), std::move(values));

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
    co.seed = c.uint("seed", split_seed);
    co.threads = static_cast<uint32_t>(c.uint("threads", 1));  // one core per slot unless [train] threads says
    model.compile(optimizer_from(c), c.get("loss", "sparse_categorical_crossentropy"), metrics(c), co);
    K::FitOptions fo;
    fo.epochs = static_cast<uint32_t>(c.uint("epochs", 1));
    fo.batch_size = static_cast<uint32_t>(c.uint("batch_size", 32));
    fo.shuffle = c.boolean("shuffle", true);
    fo.steps_per_epoch = c.uint("steps_per_epoch", 0);
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

    const std::string dataset = c.get("dataset", "fashion-mnist");
    const std::string dir = c.get("data_dir", default_data_dir(dataset));
    auto [train, test] = skyforge::datasets::load_fashion_mnist(dir);  // the same IDX layout for MNIST

    K::Sequential model = build_model(c, train.sample_shape);

    K::CompileOptions co;
    co.backend = K::Backend(host().compute_backend());
    if (data_parallel) co.communicator = host().communicator();
    co.seed = seed;
    co.threads = static_cast<uint32_t>(c.uint("threads", 0));
    model.compile(optimizer_from(c), c.get("loss", "sparse_categorical_crossentropy"), metrics(c), co);

    // Without DataParallel every node is a rank 0 of its own: only the head writes files.
    const bool writer = data_parallel || info.is_head;
    if (info.is_head) {
      std::printf("%s", model.summary().c_str());
      std::printf("%s on %u node%s (%s), backend %s, seed %llu, global batch %llu\n", dataset.c_str(),
                  info.total_nodes, info.total_nodes == 1 ? "" : "s",
                  data_parallel ? "data-parallel" : "independent replicas",
                  host().config("compute.backend").value_or("?").c_str(), static_cast<unsigned long long>(seed),
                  static_cast<unsigned long long>(c.uint("batch_size", 32)));
      std::fflush(stdout);
    }

    K::FitOptions fo;
    fo.epochs = static_cast<uint32_t>(c.uint("epochs", 1));
    fo.batch_size = static_cast<uint32_t>(c.uint("batch_size", 32));
    fo.shuffle = c.boolean("shuffle", true);
    fo.data = K::Data::replicated;
    fo.steps_per_epoch = c.uint("steps_per_epoch", 0);
    fo.verbose = writer ? 1 : 0;
    if (writer) {
      fo.callbacks.csv = c.get("history", "");
      fo.callbacks.tensorboard = c.get("tensorboard", "");
      fo.callbacks.checkpoint_dir = c.get("checkpoint", "");
      // [train] checkpoint_every: "epoch" (the default) or N steps (then after every epoch too).
      if (const std::string every = c.get("checkpoint_every", "epoch"); every != "epoch")
        fo.callbacks.checkpoint_every_steps = std::strtoull(every.c_str(), nullptr, 10);
    }
    // [train] resume, `skyforge run --resume` (job.resume) or a restart after a lost node
    // (job.restart, [job] max_restarts): go on from the last checkpoint, when there is one. The
    // data order and dropout masks are functions of seed and step, so the run ends with the
    // weights it would have had without the interruption.
    const bool resume = c.boolean("resume", false) || host().config("job.resume").value_or("") == "true" ||
                        !host().config("job.restart").value_or("").empty();
    fo.callbacks.resume = resume && !c.get("checkpoint", "").empty();
    if (fo.callbacks.resume && !writer) {  // reads the head's checkpoint, writes and locks nothing
      fo.callbacks.checkpoint_dir = c.get("checkpoint", "");
      fo.callbacks.checkpoint_read_only = true;
    }
    // The writer holds the checkpoint directory's lock while it trains: another run there fails
    // at once. A restart or `run --resume` waits a while for it instead: the previous attempt's
    // worker may still be on its way out (its lock goes with its process).
    if (host().config("job.resume").value_or("") == "true" || !host().config("job.restart").value_or("").empty())
      fo.callbacks.checkpoint_lock_wait_s = 30;

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
    if (c.boolean("evaluate", true)) {
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
           ", \"weights_fnv1a64\": \"" + hex(fnv1a64(model.get_weights())) + "\"}";
    return out;
  }

 private:
  // The training set, loaded once per node for every slot's fits.
  std::shared_ptr<const skyforge::datasets::ByteDataset> training_set(const TrainConfig& c) {
    std::lock_guard<std::mutex> lock(data_mu_);
    if (!train_set_) {
      const std::string dataset = c.get("dataset", "fashion-mnist");
      auto [train, test] = skyforge::datasets::load_fashion_mnist_bytes(c.get("data_dir", default_data_dir(dataset)));
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
    if (auto s = c.find("seed")) return c.uint("seed", 0);
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
