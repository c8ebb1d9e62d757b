// A native app: it runs inside each node's skyforge-worker process.
//   broadcast / single mode: run() once per node; its result is printed as `[node N] => ...`.
//   map mode:                task(input, slot) once per input, across every slot of the pool;
//                            results are printed in input order as `[task I] => ...`.
// Throw skyforge::Error to fail: the host reports the node (and task) with your message.
#include <skyforge/sdk.hpp>

#include <iostream>
#include <string>

class MyApp : public skyforge::App {
 public:
  using App::App;

  std::string run() override {
    const skyforge::InstanceInfo info = instance_info();
    std::cout << "my_app starting on " << info.private_ip << std::endl;  // streamed as [node N] ...
    return "my_app on node " + std::to_string(info.node) + " of " + std::to_string(info.total_nodes) +
           (info.is_head ? " (head)" : "");
  }

  std::string task(std::string_view input, uint32_t /*slot*/) override {
    if (input.empty()) throw skyforge::Error("my_app: empty input", SF_ERR_INVALID);
    return std::string(input.rbegin(), input.rend());
  }
};

SKYFORGE_PLUGIN(MyApp, "my_app", "0.1.0", "Template native app")
