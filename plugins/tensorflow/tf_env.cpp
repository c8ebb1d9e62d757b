#include "tf_env.hpp"

#include <nlohmann/json.hpp>

#include <stdexcept>

namespace skyforge::tensorflow {

std::string tf_config(const std::vector<std::string>& workers, uint32_t index) {
  if (index >= workers.size())
    throw std::invalid_argument("worker " + std::to_string(index) + " is outside a cluster of " +
                                std::to_string(workers.size()));
  for (size_t i = 0; i < workers.size(); ++i)
    if (workers[i].empty()) throw std::invalid_argument("worker " + std::to_string(i) + " has no address");
  const nlohmann::ordered_json cfg = {{"cluster", {{"worker", workers}}},
                                      {"task", {{"type", "worker"}, {"index", index}}}};
  return cfg.dump();
}

std::string worker_key(std::string_view pool, uint32_t node) {
  return "tensorflow/" + std::string(pool) + "/worker/" + std::to_string(node);
}

}  // namespace skyforge::tensorflow
