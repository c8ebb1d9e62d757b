// A grid search's candidates and its report, as scikit-learn's GridSearchCV makes them
// (docs/training.md, "Grid search"): ParameterGrid's order (names sorted, the last varying
// fastest), one task per candidate and fold (config_keys.hpp's SearchTask), and cv_results_ with
// mean and population standard deviation of the folds' scores and rank by mean (ties share the
// lowest rank, as scipy's rankdata(method="min")).
#pragma once

#include <skyforge/config_keys.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace skyforge::grid {

struct Grid {
  std::vector<std::string> names;                 // sorted
  std::vector<std::vector<std::string>> values;   // per name, in the manifest's order
  uint32_t cv = 5;
  std::string csv;                                // where the table is written; empty: nowhere

  // From the job's config (config_keys.hpp): search.params, search.param_grid.<name>, search.cv,
  // search.csv; `config` is a lookup (const std::string& key) -> std::optional<std::string>.
  template <class Lookup>
  static Grid from(const Lookup& lookup);
  uint64_t candidates() const;
  std::vector<std::string> candidate(uint64_t c) const;  // its value of each name
  std::vector<std::string> task_inputs() const;          // candidate-major, fold fastest
};

struct Row {
  std::vector<std::string> params;
  std::vector<double> split_scores;  // per fold
  double mean = 0, stdev = 0, mean_fit_seconds = 0;
  uint32_t rank = 0;
};

// One row per candidate from the tasks' answers (JSON with "accuracy" and "fit_seconds"), in
// task order. Throws std::runtime_error for an answer without an accuracy.
std::vector<Row> cv_results(const Grid& g, const std::vector<std::string>& answers);
// The table a run prints, and the best candidate's line.
std::vector<std::string> table(const Grid& g, const std::vector<Row>& rows);
// cv_results as CSV (scikit-learn's column names).
std::string csv(const Grid& g, const std::vector<Row>& rows);
// The dispatch order of a search's tasks (task = candidate * cv + fold), longest first: every
// candidate's first fold ahead of the other folds (each measures its candidate), then the other
// folds by their candidate's cost, largest first (a candidate not measured yet, cost 0, counts
// as the largest), then input order. Longest-processing-time-first keeps a long fit from being
// the last one left while the other slots idle. `cost` holds one value per candidate.
bool dispatch_before(uint32_t cv, const std::vector<uint64_t>& cost, uint64_t a, uint64_t b);
// A JSON number's text after "key": in a one-line object; empty when absent.
std::string json_number(const std::string& json, const std::string& key);

template <class Lookup>
Grid Grid::from(const Lookup& lookup) {
  namespace keys = skyforge::config::keys;
  Grid g;
  g.names = keys::search_params.find(lookup).value_or(std::vector<std::string>{});
  for (const auto& n : g.names) g.values.push_back(skyforge::config::split_lines(lookup(keys::search_param_grid(n)).value_or("")));
  g.cv = uint32_t(keys::search_cv.get(lookup));
  g.csv = keys::search_csv.find(lookup).value_or("");
  return g;
}

}  // namespace skyforge::grid
