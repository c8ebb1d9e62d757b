#include "tf_env.hpp"

#include <cstdio>
#include <stdexcept>

namespace skyforge::tensorflow {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

std::string tf_config(const std::vector<std::string>& workers, uint32_t index) {
  if (index >= workers.size())
    throw std::invalid_argument("worker " + std::to_string(index) + " is outside a cluster of " +
                                std::to_string(workers.size()));
  std::string list;
  for (size_t i = 0; i < workers.size(); ++i) {
    if (workers[i].empty()) throw std::invalid_argument("worker " + std::to_string(i) + " has no address");
    list += (i ? ", " : "") + json_string(workers[i]);
  }
  return "{\"cluster\": {\"worker\": [" + list + "]}, \"task\": {\"type\": \"worker\", \"index\": " +
         std::to_string(index) + "}}";
}

std::string worker_key(std::string_view pool, uint32_t node) {
  return "tensorflow/" + std::string(pool) + "/worker/" + std::to_string(node);
}

}  // namespace skyforge::tensorflow
