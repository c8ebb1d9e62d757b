// A framework plugin: around_app_enter runs on every node before the app or command starts
// and sets its environment; around_app_exit runs after it, in reverse manifest order, also
// when the app failed. The other hooks (transform_image, bootstrap, around_client_*, launcher)
// are optional: override only what you need.
#include <skyforge/sdk.hpp>

#include <string>

class MyFramework : public skyforge::Framework {
 public:
  explicit MyFramework(const skyforge::Context& ctx) : Framework(ctx) {
    greeting_ = options().get("greeting", "hello");  // validated against plugin.toml by the host
    if (greeting_.empty()) throw skyforge::Error("my_framework: greeting must not be empty", SF_ERR_INVALID);
  }

  void around_app_enter(const skyforge::InstanceInfo& info, const skyforge::Env& env) override {
    env.set("MY_FRAMEWORK_GREETING", greeting_ + " from node " + std::to_string(info.node) + " of " +
                                         std::to_string(info.total_nodes));
    env.set("MY_FRAMEWORK_HEAD", info.head_addr);
  }

  void around_app_exit(const skyforge::InstanceInfo& info, bool ok) override {
    host().log(SF_LOG_DEBUG, "my_framework: node " + std::to_string(info.node) + (ok ? " succeeded" : " failed"));
  }

 private:
  std::string greeting_;
};

SKYFORGE_PLUGIN(MyFramework, "my_framework", "0.1.0", "Template framework plugin")
