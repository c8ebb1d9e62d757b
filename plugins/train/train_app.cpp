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
#include <skyforge/datasets.hpp>
#include <skyforge/keras.hpp>
#include <skyforge/layer_schema.hpp>
#include <skyforge/sdk.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace K = skyforge::keras;

namespace {

using skyforge::Error;

// Typed access to the host's train.* config keys.
class TrainConfig {
 public:
  explicit TrainConfig(const skyforge::Host& host) : host_(host) {}

  std::optional<std::string> find(const std::string& key) const { return host_.config("train." + key); }
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

class Train : public skyforge::App {
 public:
  using App::App;

  std::string run() override {
    const skyforge::InstanceInfo info = instance_info();
    const TrainConfig c(host());
    const bool data_parallel = info.total_nodes > 1 && env_flag("SKYFORGE_DATA_PARALLEL", true);
    const uint64_t seed = pool_seed(c, info);

    const std::string dataset = c.get("dataset", "fashion-mnist");
    const std::string dir = c.get("data_dir", default_data_dir(dataset));
    auto [train, test] = skyforge::datasets::load_fashion_mnist(dir);  // the same IDX layout for MNIST

    K::Sequential model;
    model.add(K::Input(train.sample_shape));
    const uint64_t layers = c.uint("layers", 0);
    for (uint64_t i = 0; i < layers; ++i) model.add(layer_from(c, i));

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
    }
    fo.callbacks.resume = c.boolean("resume", false) && !c.get("checkpoint", "").empty();
    if (fo.callbacks.resume && !writer) fo.callbacks.checkpoint_dir = c.get("checkpoint", "");

    const auto t0 = std::chrono::steady_clock::now();
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
    out += ", \"train_seconds\": " + K::format_double(train_s) +
           ", \"samples_per_second\": " + K::format_double(train_s > 0 ? static_cast<double>(samples) / train_s : 0) +
           ", \"weights_fnv1a64\": \"" + hex(fnv1a64(model.get_weights())) + "\"}";
    return out;
  }

 private:
  static std::vector<std::string> metrics(const TrainConfig& c) {
    std::vector<std::string> out;
    const std::string m = c.get("metrics", "accuracy");
    for (size_t b = 0; b < m.size();) {
      const size_t e = std::min(m.find(',', b), m.size());
      if (e > b) out.push_back(m.substr(b, e - b));
      b = e + 1;
    }
    return out;
  }

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
