#include "grid_search.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace skyforge::grid {

uint64_t Grid::candidates() const {
  uint64_t n = 1;
  for (const auto& v : values) n *= v.size();
  return names.empty() ? 0 : n;
}

std::vector<std::string> Grid::candidate(uint64_t c) const {
  std::vector<std::string> out(names.size());
  for (size_t i = names.size(); i-- > 0;) {  // the last name varies fastest
    out[i] = values[i][c % values[i].size()];
    c /= values[i].size();
  }
  return out;
}

std::vector<std::string> Grid::task_inputs() const {
  std::vector<std::string> out;
  for (uint64_t c = 0; c < candidates(); ++c) {
    const std::vector<std::string> p = candidate(c);
    config::SearchTask t;
    for (size_t i = 0; i < names.size(); ++i) t.values.emplace_back(names[i], p[i]);
    for (t.fold = 0; t.fold < cv; ++t.fold) out.push_back(config::search_task_input(t));
  }
  return out;
}

bool dispatch_before(uint32_t cv, const std::vector<uint64_t>& cost, uint64_t a, uint64_t b) {
  const bool first_a = a % cv == 0, first_b = b % cv == 0;
  if (first_a != first_b) return first_a;
  if (first_a) return a < b;
  auto of = [&](uint64_t task) {
    const uint64_t c = task / cv < cost.size() ? cost[task / cv] : 0;
    return c ? c : UINT64_MAX;
  };
  const uint64_t ca = of(a), cb = of(b);
  return ca != cb ? ca > cb : a < b;
}

std::string json_number(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  size_t at = json.find(k);
  if (at == std::string::npos) return "";
  at += k.size();
  while (at < json.size() && json[at] == ' ') ++at;
  size_t end = at;
  while (end < json.size() && (std::isdigit(static_cast<unsigned char>(json[end])) || json[end] == '.' || json[end] == '-' ||
                               json[end] == '+' || json[end] == 'e' || json[end] == 'E'))
    ++end;
  return json.substr(at, end - at);
}

std::vector<Row> cv_results(const Grid& g, const std::vector<std::string>& answers) {
  std::vector<Row> rows(g.candidates());
  if (answers.size() != rows.size() * g.cv)
    throw std::runtime_error("grid search: " + std::to_string(answers.size()) + " answers for " +
                             std::to_string(rows.size()) + " candidates x cv " + std::to_string(g.cv));
  for (uint64_t c = 0; c < rows.size(); ++c) {
    Row& r = rows[c];
    r.params = g.candidate(c);
    double fit = 0;
    for (uint32_t k = 0; k < g.cv; ++k) {
      const std::string& a = answers[c * g.cv + k];
      const std::string acc = json_number(a, "accuracy");
      if (acc.empty()) throw std::runtime_error("grid search: a fit answered without an accuracy: " + a);
      r.split_scores.push_back(std::stod(acc));
      const std::string secs = json_number(a, "fit_seconds");
      fit += secs.empty() ? 0 : std::stod(secs);
    }
    double sum = 0;
    for (double s : r.split_scores) sum += s;
    r.mean = sum / g.cv;
    double sq = 0;
    for (double s : r.split_scores) sq += (s - r.mean) * (s - r.mean);
    r.stdev = std::sqrt(sq / g.cv);  // numpy.std's default (ddof = 0), as GridSearchCV
    r.mean_fit_seconds = fit / g.cv;
  }
  for (auto& r : rows)
    r.rank = 1 + uint32_t(std::count_if(rows.begin(), rows.end(), [&](const Row& o) { return o.mean > r.mean; }));
  return rows;
}

namespace {
std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
std::string shortest(double v) {  // the shortest text that reads back as v
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
}  // namespace

std::vector<std::string> table(const Grid& g, const std::vector<Row>& rows) {
  std::vector<std::string> header = g.names;
  header.insert(header.end(), {"mean_accuracy", "std_accuracy", "rank"});
  std::vector<std::vector<std::string>> cells;
  for (const auto& r : rows) {
    std::vector<std::string> line = r.params;
    line.insert(line.end(), {fixed(r.mean, 4), fixed(r.stdev, 4), std::to_string(r.rank)});
    cells.push_back(line);
  }
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) {
    width[i] = header[i].size();
    for (const auto& l : cells) width[i] = std::max(width[i], l[i].size());
  }
  auto format = [&](const std::vector<std::string>& l) {
    std::string s;
    for (size_t i = 0; i < l.size(); ++i) s += (i ? "  " : "") + l[i] + std::string(width[i] - l[i].size(), ' ');
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
  };
  std::vector<std::string> out = {"cv_results (" + std::to_string(g.cv) + "-fold, validation accuracy):", format(header)};
  for (const auto& l : cells) out.push_back(format(l));
  const auto best = std::min_element(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.rank < b.rank; });
  if (best != rows.end()) {
    std::string p;
    for (size_t i = 0; i < g.names.size(); ++i) p += (i ? ", " : "") + g.names[i] + " = " + best->params[i];
    out.push_back("best params: " + p + " (mean accuracy " + fixed(best->mean, 4) + ")");
  }
  return out;
}

std::string csv(const Grid& g, const std::vector<Row>& rows) {
  std::string out;
  for (const auto& n : g.names) out += "param_" + n + ",";
  for (uint32_t k = 0; k < g.cv; ++k) out += "split" + std::to_string(k) + "_test_score,";
  out += "mean_test_score,std_test_score,rank_test_score,mean_fit_time\n";
  for (const auto& r : rows) {
    for (const auto& p : r.params) out += p + ",";
    for (double s : r.split_scores) out += shortest(s) + ",";
    out += shortest(r.mean) + "," + shortest(r.stdev) + "," + std::to_string(r.rank) + "," + shortest(r.mean_fit_seconds) + "\n";
  }
  return out;
}

}  // namespace skyforge::grid
