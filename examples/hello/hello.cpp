// `hello`: the smallest useful native app.
//   broadcast/single: run() prints where it runs and returns it as the node's result;
//   map:              task("7") returns "7^2=49"; task("boom") fails on purpose (the error
//                     path: the host reports the task, node, slot and message); other inputs
//                     are echoed back.
#include <skyforge/sdk.hpp>

#include <unistd.h>

#include <charconv>
#include <climits>
#include <iostream>
#include <string>

namespace {

std::string hostname() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

class Hello : public skyforge::App {
 public:
  using App::App;

  std::string run() override {
    const skyforge::InstanceInfo i = instance_info();
    std::cout << "hello from node " << i.node << " of " << i.total_nodes << (i.is_head ? " (head)" : "") << std::endl;
    return "node " + std::to_string(i.node) + "/" + std::to_string(i.total_nodes) + " host=" + hostname() +
           " ip=" + i.private_ip + " head=" + i.head_addr + " pid=" + std::to_string(::getpid());
  }

  std::string task(std::string_view input, uint32_t /*slot*/) override {
    if (input == "boom") throw skyforge::Error("boom: this task fails on purpose");
    long long n = 0;
    auto [end, ec] = std::from_chars(input.data(), input.data() + input.size(), n);
    if (ec != std::errc() || end != input.data() + input.size() || input.empty()) return std::string(input);
    long long square = 0;
    if (__builtin_mul_overflow(n, n, &square))
      throw skyforge::Error(std::string(input) + "^2 does not fit in 64 bits", SF_ERR_INVALID);
    return std::string(input) + "^2=" + std::to_string(square);
  }
};

}  // namespace

SKYFORGE_PLUGIN(Hello, "hello", "0.1.0", "Example native app: instance info per node, squares as tasks")
