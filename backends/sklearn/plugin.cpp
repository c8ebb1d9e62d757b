// The `sklearn` task backend: GridSearchCV for the built-in train job ([search], docs/training.md).
// plan() makes one task per candidate and fold; the joblib policy hands them out one per batch
// and one batch per slot (each fit has a core to itself); report() prints cv_results and the
// best params and writes the CSV.
#include <skyforge/sdk.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "grid_search.hpp"
#include "joblib_policy.hpp"

namespace {

using skyforge::Error;

class GridSearch : public skyforge::TaskBackend {
 public:
  explicit GridSearch(const skyforge::Context& ctx) : TaskBackend(ctx), policy_(options_from(ctx.options)) {}

  std::vector<std::string> plan(const std::vector<std::string>& manifest_inputs) override {
    if (!manifest_inputs.empty())
      throw Error("the sklearn backend makes its own tasks from [search]; the job lists " +
                      std::to_string(manifest_inputs.size()) + " (drop [job] tasks/inputs)",
                  SF_ERR_INVALID);
    grid_ = skyforge::grid::Grid::from([this](const std::string& k) { return host().config(k); });
    if (grid_.candidates() == 0)
      throw Error("the sklearn backend needs a [search] table with a param_grid (docs/training.md)", SF_ERR_INVALID);
    host().info("grid search: " + std::to_string(grid_.candidates()) + " candidates x " + std::to_string(grid_.cv) +
                " folds = " + std::to_string(grid_.candidates() * grid_.cv) + " fits");
    return grid_.task_inputs();
  }
  void begin(const skyforge::TaskJob& job) override {
    skyforge::TaskJob one_per_slot = job;
    one_per_slot.pipeline = 1;  // a fit holds its slot's core: none waits queued behind it
    policy_.begin(one_per_slot);
  }
  std::vector<uint64_t> next_batch(uint32_t node, size_t cap) override { return policy_.next_batch(node, cap); }
  void completed(uint32_t node, const skyforge::TaskOutcomes& outcomes, uint64_t elapsed_ns) override {
    policy_.completed(node, outcomes, elapsed_ns);
  }
  void node_lost(uint32_t node) override { policy_.node_lost(node); }
  skyforge::TasksState state(std::string& why) override { return policy_.state(why); }

  std::vector<std::string> report(const skyforge::TaskOutcomes& results) override {
    std::vector<std::string> answers;
    for (const skyforge::TaskOutcome r : results) answers.emplace_back(r.value);
    const auto rows = skyforge::grid::cv_results(grid_, answers);
    std::vector<std::string> lines = skyforge::grid::table(grid_, rows);
    if (!grid_.csv.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(grid_.csv).parent_path(), ec);
      std::ofstream f(grid_.csv, std::ios::trunc);
      f << skyforge::grid::csv(grid_, rows);
      if (!f.flush()) throw Error("cannot write the grid search's CSV to " + grid_.csv);
      lines.push_back("cv_results written to " + grid_.csv);
    }
    return lines;
  }

 private:
  static skyforge::joblib::Options options_from(const skyforge::Options& o) {
    skyforge::joblib::Options r;
    r.batch_size = 1;  // a fit per batch
    const int64_t n = o.get_int("retries", 0);
    if (n < 0 || n > 1000) throw Error("option 'retries': expected 0 to 1000, got " + std::to_string(n), SF_ERR_INVALID);
    r.retries = uint32_t(n);
    return r;
  }

  skyforge::joblib::Policy policy_;
  skyforge::grid::Grid grid_;
};

}  // namespace

SKYFORGE_PLUGIN(GridSearch, "sklearn", "0.1.0", "GridSearchCV for the built-in train job: a fit per candidate and fold")
