// Pure TF_CONFIG of the `tensorflow` framework plugin (no I/O, no SDK).
//
// tf.distribute.MultiWorkerMirroredStrategy reads TF_CONFIG:
//   {"cluster": {"worker": ["host0:port0", "host1:port1", ...]}, "task": {"type": "worker", "index": i}}
// Every node lists every node's address, in node order, and its own index; worker 0 is the
// chief (writes checkpoints/summaries), as MultiWorkerMirroredStrategy treats it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace skyforge::tensorflow {

// Compact JSON (nlohmann/json), keys in the order above. Throws std::invalid_argument when
// `index` is outside `workers` or a worker address is empty.
std::string tf_config(const std::vector<std::string>& workers, uint32_t index);

// The store key under which node `node` of pool `pool` publishes its "host:port".
std::string worker_key(std::string_view pool, uint32_t node);

}  // namespace skyforge::tensorflow
