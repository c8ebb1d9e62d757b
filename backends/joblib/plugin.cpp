// Registers the `joblib` task backend (its policy lives in joblib_policy.cpp).
#include <skyforge/sdk.hpp>

#include "joblib_policy.hpp"

namespace {

class JoblibBackend : public skyforge::TaskBackend {
 public:
  explicit JoblibBackend(const skyforge::Context& ctx)
      : TaskBackend(ctx), policy_(skyforge::joblib::Options::from(ctx.options)) {}
  void begin(const skyforge::TaskJob& job) override { policy_.begin(job); }
  std::vector<uint64_t> next_batch(uint32_t node, size_t cap) override { return policy_.next_batch(node, cap); }
  void completed(uint32_t node, const skyforge::TaskOutcomes& outcomes, uint64_t elapsed_ns) override {
    policy_.completed(node, outcomes, elapsed_ns);
  }
  void node_lost(uint32_t node) override { policy_.node_lost(node); }
  skyforge::TasksState state(std::string& why) override { return policy_.state(why); }

 private:
  skyforge::joblib::Policy policy_;
};

}  // namespace

SKYFORGE_PLUGIN(JoblibBackend, "joblib", "0.1.0",
                "a map job's default policy: joblib's auto batching, input order, stop at the first failure, retries")
