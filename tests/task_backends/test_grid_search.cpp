// The `sklearn` task backend's grid and report (backends/sklearn/grid_search.hpp), as
// scikit-learn's GridSearchCV makes them.
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "grid_search.hpp"

using namespace skyforge::grid;

namespace {

Grid grid(std::map<std::string, std::string> config) {
  return Grid::from([&](const std::string& k) -> std::optional<std::string> {
    auto it = config.find(k);
    return it == config.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

const Grid kGrid = grid({{"search.params", "a\nb"},
                         {"search.param_grid.a", "1\n2"},
                         {"search.param_grid.b", "x\ny\nz"},
                         {"search.cv", "2"},
                         {"search.csv", "/tmp/out.csv"}});

std::string answer(double acc, double secs = 0.5) {
  return "{\"fold\": 0, \"accuracy\": " + std::to_string(acc) + ", \"loss\": 0.3, \"fit_seconds\": " + std::to_string(secs) + "}";
}

TEST(GridSearch, CandidatesInParameterGridOrderAndOneTaskPerFold) {
  EXPECT_EQ(kGrid.candidates(), 6u);
  EXPECT_EQ(kGrid.candidate(0), (std::vector<std::string>{"1", "x"}));
  EXPECT_EQ(kGrid.candidate(1), (std::vector<std::string>{"1", "y"}));  // the last name varies fastest
  EXPECT_EQ(kGrid.candidate(3), (std::vector<std::string>{"2", "x"}));
  const auto in = kGrid.task_inputs();
  ASSERT_EQ(in.size(), 12u);
  EXPECT_EQ(in[0], "fold=0;a=1;b=x");
  EXPECT_EQ(in[1], "fold=1;a=1;b=x");
  EXPECT_EQ(in[2], "fold=0;a=1;b=y");
  EXPECT_EQ(grid({}).candidates(), 0u);
}

// The tasks are in the one [search] task format (config_keys.hpp) that the train app parses.
TEST(GridSearch, TaskInputsReadBackAsTheTrainAppReadsThem) {
  const auto in = kGrid.task_inputs();
  for (size_t task = 0; task < in.size(); ++task) {
    const skyforge::config::SearchTask t = skyforge::config::parse_search_task(in[task]);
    EXPECT_EQ(t.fold, task % kGrid.cv);
    const std::vector<std::string> values = kGrid.candidate(task / kGrid.cv);
    EXPECT_EQ(t.values, (std::vector<std::pair<std::string, std::string>>{{"a", values[0]}, {"b", values[1]}}));
  }
}

TEST(GridSearch, MeanPopulationStdAndMinRankAsScikitLearn) {
  std::vector<std::string> answers;
  const double scores[6][2] = {{0.5, 0.7}, {0.9, 0.7}, {0.8, 0.8}, {0.1, 0.2}, {0.6, 0.62}, {0.79, 0.81}};
  for (const auto& s : scores)
    for (double v : s) answers.push_back(answer(v));
  const auto rows = cv_results(kGrid, answers);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_DOUBLE_EQ(rows[0].mean, 0.6);
  EXPECT_NEAR(rows[0].stdev, 0.1, 1e-12);  // numpy.std, ddof = 0
  EXPECT_DOUBLE_EQ(rows[1].mean, 0.8);
  // Ties share the lowest rank (scipy's rankdata method="min"): three candidates at 0.8.
  EXPECT_EQ(rows[1].rank, 1u);
  EXPECT_EQ(rows[2].rank, 1u);
  EXPECT_EQ(rows[5].rank, 1u);
  EXPECT_EQ(rows[4].rank, 4u);
  EXPECT_EQ(rows[0].rank, 5u);
  EXPECT_EQ(rows[3].rank, 6u);
  EXPECT_DOUBLE_EQ(rows[0].mean_fit_seconds, 0.5);
  const auto lines = table(kGrid, rows);
  EXPECT_EQ(lines[0], "cv_results (2-fold, validation accuracy):");
  EXPECT_EQ(lines[1], "a  b  mean_accuracy  std_accuracy  rank");
  EXPECT_EQ(lines[2], "1  x  0.6000         0.1000        5");
  EXPECT_EQ(lines.back(), "best params: a = 1, b = y (mean accuracy 0.8000)");  // the first of the best
  const std::string c = csv(kGrid, rows);
  EXPECT_EQ(c.substr(0, c.find('\n')),
            "param_a,param_b,split0_test_score,split1_test_score,mean_test_score,std_test_score,rank_test_score,mean_fit_time");
  EXPECT_NE(c.find("\n1,x,0.5,0.7,0.6,0.09999999999999998,5,0.5\n"), std::string::npos) << c;
}

TEST(GridSearch, AnswersMustCarryAnAccuracy) {
  std::vector<std::string> answers(12, answer(0.5));
  answers[7] = "{\"fold\": 1}";
  EXPECT_THROW(cv_results(kGrid, answers), std::runtime_error);
  EXPECT_THROW(cv_results(kGrid, std::vector<std::string>(11, answer(0.5))), std::runtime_error);
}

}  // namespace

// Longest first: every candidate's first fold goes out first (in order), then the other folds
// of the costliest candidates, unmeasured ones counting as the costliest.
TEST(GridDispatch, FirstFoldsThenLongestCandidatesFirst) {
  const uint32_t cv = 3;  // 4 candidates: tasks 0-2, 3-5, 6-8, 9-11
  std::vector<uint64_t> cost = {100, 300, 0, 200};
  std::vector<uint64_t> order(12);
  for (uint64_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](uint64_t a, uint64_t b) { return dispatch_before(cv, cost, a, b); });
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 3, 6, 9, 7, 8, 4, 5, 10, 11, 1, 2}));
  cost[2] = 50;
  std::stable_sort(order.begin(), order.end(), [&](uint64_t a, uint64_t b) { return dispatch_before(cv, cost, a, b); });
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 3, 6, 9, 4, 5, 10, 11, 1, 2, 7, 8}));
}
