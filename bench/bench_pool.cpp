// bench_pool — the pool's own overheads, measured through the real `skyforge` binary on the
// local provider, with joblib (loky, n_jobs=2) measured in the same run as the peer for
// map throughput.
//
//   build/bin/bench_pool [--runs N] [--tasks N]
//
// Figures:
//   startup    `skyforge run` start -> all 8 workers ready (plugins loaded, hooks entered)
//   rtt        one empty task's round trip on a 1-node pool (batch = 1, one in flight)
//   throughput 100,000 empty map tasks over 2 nodes, automatic batching, vs joblib
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <regex>

#include "process.hpp"

using namespace skyforge::test;

namespace {

struct Timings {
  std::map<std::string, double> v;
  double get(const std::string& k) const {
    auto it = v.find(k);
    if (it == v.end()) throw std::runtime_error("no '" + k + "' in skyforge --timings output");
    return it->second;
  }
};

Timings parse_timings(const std::string& err) {
  auto pos = err.find("timings:");
  if (pos == std::string::npos) throw std::runtime_error("skyforge printed no timings:\n" + err);
  std::string line = err.substr(pos, err.find('\n', pos) - pos);
  Timings t;
  std::regex kv(R"((\w+)=([0-9.]+))");
  for (std::sregex_iterator it(line.begin(), line.end(), kv), end; it != end; ++it)
    t.v[(*it)[1]] = std::stod((*it)[2]);
  return t;
}

double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

class Bench {
 public:
  Bench() {
    char tmpl[] = "/tmp/skyforge-bench-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp");
    dir_ = tmpl;
  }
  ~Bench() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path manifest(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }
  Output skyforge(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SKYFORGE_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    Child c(argv, {});
    Output o = c.wait(600);
    if (o.exit_code != 0) throw std::runtime_error("skyforge failed (" + std::to_string(o.exit_code) + "):\n" + o.err);
    return o;
  }

 private:
  fs::path dir_;
};

}  // namespace

int main(int argc, char** argv) {
  int runs = 10;
  long tasks = 100000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--runs") runs = std::atoi(argv[i + 1]);
    else if (a == "--tasks") tasks = std::atol(argv[i + 1]);
  }
  try {
    Bench b;
    // 1. startup to 8 workers ready
    auto m8 = b.manifest("startup.toml", "[pool]\nnodes = 8\n[job]\napp = \"noop\"\n");
    std::vector<double> ready, joined, total;
    for (int r = 0; r < runs; ++r) {
      Output o = b.skyforge({"run", "--timings", m8.string()});
      Timings t = parse_timings(o.err);
      ready.push_back(t.get("ready"));
      joined.push_back(t.get("joined"));
      total.push_back(o.seconds * 1000);
    }
    std::printf("startup, 8 local workers (%d runs): run->ready p50 %.1f ms (min %.1f, max %.1f); "
                "run->joined p50 %.1f ms; whole run incl. teardown p50 %.1f ms   [target < 300 ms]\n",
                runs, pct(ready, 0.5), pct(ready, 0), pct(ready, 1), pct(joined, 0.5), pct(total, 0.5));

    // 2. empty task round trip, 1 node, one task in flight
    auto m1 = b.manifest("rtt.toml",
                         "[pool]\nnodes = 1\n[job]\napp = \"noop\"\nmode = \"map\"\ntasks = 5000\nbatch = 1\n");
    Timings t = parse_timings(b.skyforge({"run", "--timings", "--quiet-results", "--pipeline", "1", m1.string()}).err);
    std::printf("empty task round trip, 1 node (%ld tasks, batch 1, 1 in flight): p50 %.1f us, p99 %.1f us   "
                "[target p50 < 50 us]\n",
                5000L, t.get("batch_rtt_p50_us"), t.get("batch_rtt_p99_us"));

    // 3. throughput of empty map tasks over 2 nodes, auto batching, beside joblib
    auto m2 = b.manifest("map.toml", "[pool]\nnodes = 2\n[job]\napp = \"noop\"\nmode = \"map\"\ntasks = " +
                                         std::to_string(tasks) + "\n");
    Output o = b.skyforge({"run", "--timings", "--quiet-results", m2.string()});
    t = parse_timings(o.err);
    double map_s = (t.get("ran") - t.get("ready")) / 1000.0;
    double sky_rate = tasks / map_s;
    std::printf("map throughput, %ld empty tasks over 2 nodes, auto batching (%g batches): skyforge %.0f tasks/s "
                "(map phase %.4f s; whole run incl. pool start/teardown %.3f s)\n",
                tasks, t.v.count("batches") ? t.v["batches"] : 0.0, sky_rate, map_s, o.seconds);
    Child py({"/usr/bin/python3", JOBLIB_PEER, std::to_string(tasks)}, {});
    Output p = py.wait(600);
    std::smatch mm;
    if (p.exit_code == 0 && std::regex_search(p.out, mm, std::regex(R"(joblib_tasks_per_s=([0-9.]+))"))) {
      double jl = std::stod(mm[1]);
      std::printf("peer: joblib loky n_jobs=2, warm pool, same tasks: %.0f tasks/s  -> skyforge/joblib = %.1fx\n", jl,
                  sky_rate / jl);
    } else {
      std::printf("peer: joblib unavailable (%s)\n", p.err.substr(0, 200).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pool: %s\n", e.what());
    return 1;
  }
  return 0;
}
