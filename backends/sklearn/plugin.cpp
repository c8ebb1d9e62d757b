// The `sklearn` task backend: GridSearchCV for the built-in train job ([search], docs/training.md).
// plan() makes one task per candidate and fold; the joblib policy hands them out one per batch
// and one batch per slot (each fit has a core to itself), longest first: every candidate's first
// fold goes out first, and its fit time orders the candidates' other folds (LPT scheduling, so
// that no slot is left with a long fit while the others idle); report() prints cv_results and
// the best params and writes the CSV.
#include <skyforge/sdk.hpp>

#include <cstdio>
#include <cstdlib>
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
    cost_ns_.assign(grid_.candidates(), 0);
    reorder();
  }
  std::vector<uint64_t> next_batch(uint32_t node, size_t cap) override { return policy_.next_batch(node, cap); }
  void completed(uint32_t node, const skyforge::TaskOutcomes& outcomes, uint64_t elapsed_ns) override {
    policy_.completed(node, outcomes, elapsed_ns);
    // A candidate's cost is its fit's own time (the answer's fit_seconds): the task's wall time
    // would also count a node's first task loading the dataset, which says nothing of the candidate.
    bool learned = false;
    for (const skyforge::TaskOutcome r : outcomes) {
      if (!r.ok || r.task / grid_.cv >= cost_ns_.size()) continue;
      uint64_t& c = cost_ns_[r.task / grid_.cv];
      if (c != 0) continue;
      const std::string fit = skyforge::grid::json_number(std::string(r.value), "fit_seconds");
      const double secs = fit.empty() ? 0 : std::strtod(fit.c_str(), nullptr);
      c = secs > 0 ? std::max<uint64_t>(1, uint64_t(secs * 1e9)) : std::max<uint64_t>(1, elapsed_ns / outcomes.size());
      learned = true;
    }
    if (learned) reorder();
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

  void reorder() {
    policy_.reorder([this](uint64_t a, uint64_t b) { return skyforge::grid::dispatch_before(grid_.cv, cost_ns_, a, b); });
  }

  skyforge::joblib::Policy policy_;
  skyforge::grid::Grid grid_;
  std::vector<uint64_t> cost_ns_;  // per candidate: what its first finished fold took; 0: not yet
};

}  // namespace

SKYFORGE_PLUGIN(GridSearch, "sklearn", "0.1.0", "GridSearchCV for the built-in train job: a fit per candidate and fold")
