#include <skyforge/sdk.hpp>

class Noop : public skyforge::App {
 public:
  using App::App;
  std::string run() override { return {}; }
  std::string task(std::string_view, uint32_t) override { return {}; }
};

SKYFORGE_PLUGIN(Noop, "noop", "0.1.0", "empty run() and task()")
