// bench_pool — the pool's own overheads, measured through the real `skyforge` binary on the
// local provider, with joblib (loky, n_jobs=2) measured in the same run as the peer for
// map throughput.
//
//   build/bin/bench_pool [--runs N] [--tasks N] [--no-grid] [--baseline OTHER_SKYFORGE [--rounds N]]
//
// --baseline: the round trip and the map throughput again, alternating this build's `skyforge`
// with another one (an older build: what a change costs), `--rounds` times each (default 5),
// medians compared.
//
// Figures:
//   startup    `skyforge run` start -> all 8 workers ready (plugins loaded, hooks entered)
//   rtt        one empty task's round trip on a 1-node pool (batch = 1, one in flight)
//   throughput 100,000 empty map tasks over 2 nodes, automatic batching, vs joblib
//   grid       [search] of the main job's MLP, 4 candidates x cv 3 = 12 fits: 2 nodes against 1
//              node running them one after another (one core per fit either way); skipped
//              without Debian's Fashion-MNIST
#include <arpa/inet.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

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

// The floor under any task round trip: two processes ping-ponging 20 bytes over loopback TCP
// (TCP_NODELAY, blocking reads), measured on this machine in this run. Returns {p50, p99} in us.
std::pair<double, double> tcp_ping_pong_us(int rounds) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(lfd, 1) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error("ping-pong: cannot listen on loopback");
  int one = 1;
  pid_t pid = fork();
  if (pid == 0) {
    ::close(lfd);
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(c, reinterpret_cast<sockaddr*>(&addr), len) != 0) _exit(1);
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char buf[64];
    for (;;) {
      ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0 || ::send(c, buf, static_cast<size_t>(n), 0) != n) _exit(0);
    }
  }
  int s = ::accept(lfd, nullptr, nullptr);
  ::close(lfd);
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<double> us;
  char msg[20] = {0}, buf[64];
  for (int i = 0; i < rounds; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (::send(s, msg, sizeof msg, 0) != sizeof msg) break;
    size_t got = 0;
    while (got < sizeof msg) {
      ssize_t n = ::recv(s, buf, sizeof buf, 0);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  ::close(s);
  waitpid(pid, nullptr, 0);
  if (us.empty()) throw std::runtime_error("ping-pong failed");
  return {pct(us, 0.5), pct(us, 0.99)};
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
  Output skyforge(const std::vector<std::string>& args, const std::string& bin = SKYFORGE_BIN) {
    std::vector<std::string> argv = {bin};
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
  int runs = 10, rounds = 5;
  long tasks = 100000;
  std::string baseline;
  bool grid = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--no-grid") {
      grid = false;
      continue;
    }
    if (i + 1 >= argc) break;
    if (a == "--runs") runs = std::atoi(argv[i + 1]);
    else if (a == "--tasks") tasks = std::atol(argv[i + 1]);
    else if (a == "--baseline") baseline = argv[i + 1];
    else if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    ++i;
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
                         "[pool]\nnodes = 1\n[job]\napp = \"noop\"\nmode = \"map\"\ntasks = 5000\n[tasks]\nbatch_size = 1\n");
    Timings t = parse_timings(b.skyforge({"run", "--timings", "--quiet-results", "--pipeline", "1", m1.string()}).err);
    std::printf("empty task round trip, 1 node (%ld tasks, batch 1, 1 in flight): p50 %.1f us, p99 %.1f us   "
                "[target p50 < 50 us]\n",
                5000L, t.get("batch_rtt_p50_us"), t.get("batch_rtt_p99_us"));
    auto [pp50, pp99] = tcp_ping_pong_us(5000);
    std::printf("peer: raw loopback TCP ping-pong between two processes, 20 bytes: p50 %.1f us, p99 %.1f us  "
                "-> skyforge task round trip / raw ping-pong = %.2fx (p50)\n",
                pp50, pp99, t.get("batch_rtt_p50_us") / pp50);

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

    // 4. grid search: 12 fits on 2 nodes vs the same 12 one after another on 1 node
    if (!grid) {
      std::printf("grid search: skipped (--no-grid)\n");
    } else if (::access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) == 0) {
      auto grid = [&](int nodes) {
        return b.manifest("grid" + std::to_string(nodes) + ".toml",
                          "[pool]\nnodes = " + std::to_string(nodes) +
                              "\n[train]\nbatch_size = 64\nepochs = 1\nseed = 42\n"
                              "[[train.layers]]\ntype = \"flatten\"\n[[train.layers]]\ntype = \"dense\"\nunits = 128\n"
                              "activation = \"relu\"\n[[train.layers]]\ntype = \"dense\"\nunits = 10\n"
                              "[search]\nparam_grid = { learning_rate = [1e-3, 3e-4], \"layers.1.units\" = [64, 128] }\n"
                              "cv = 3\ncsv = \"grid" + std::to_string(nodes) + ".csv\"\n");
      };
      const auto m_one = grid(1), m_two = grid(2);
      std::vector<double> one, two, one_all, two_all;
      for (int r = 0; r < 3; ++r)
        for (int nodes : {2, 1}) {
          Timings tt = parse_timings(b.skyforge({"run", "--timings", (nodes == 1 ? m_one : m_two).string()}).err);
          (nodes == 1 ? one : two).push_back(tt.get("ran") - tt.get("ready"));
          (nodes == 1 ? one_all : two_all).push_back(tt.get("torn_down"));
        }
      std::printf("grid search, 4 candidates x cv 3 = 12 fits of the main job's MLP (1 epoch of a fold's 40,000 samples "
                  "each, 1 core per fit), 3 alternating rounds, medians: search (ready->ran) 2 nodes %.0f ms, 1 node one "
                  "after another %.0f ms -> speedup %.2fx [target >= 1.8x]; whole run %.0f vs %.0f ms -> %.2fx\n",
                  pct(two, 0.5), pct(one, 0.5), pct(one, 0.5) / pct(two, 0.5), pct(two_all, 0.5), pct(one_all, 0.5),
                  pct(one_all, 0.5) / pct(two_all, 0.5));
    } else {
      std::printf("grid search: skipped (no /usr/share/datasets/fashion-mnist: apt-get install dataset-fashion-mnist)\n");
    }

    // 5. the same round trip and map, this build against another one, alternating
    if (!baseline.empty()) {
      std::vector<double> mine, theirs, rtt_mine, rtt_theirs;
      for (int r = 0; r < rounds; ++r)
        for (int which = 0; which < 2; ++which) {
          const std::string& bin = which ? baseline : std::string(SKYFORGE_BIN);
          Timings tt = parse_timings(b.skyforge({"run", "--timings", "--quiet-results", m2.string()}, bin).err);
          (which ? theirs : mine).push_back(tasks / ((tt.get("ran") - tt.get("ready")) / 1000.0));
          Timings tr = parse_timings(
              b.skyforge({"run", "--timings", "--quiet-results", "--pipeline", "1", m1.string()}, bin).err);
          (which ? rtt_theirs : rtt_mine).push_back(tr.get("batch_rtt_p50_us"));
        }
      std::printf("map throughput, this build vs %s, %ld empty tasks over 2 nodes, %d alternating rounds: "
                  "median %.0f vs %.0f tasks/s (this/baseline = %.2f; this build's range %.0f-%.0f, baseline's %.0f-%.0f)\n",
                  baseline.c_str(), tasks, rounds, pct(mine, 0.5), pct(theirs, 0.5), pct(mine, 0.5) / pct(theirs, 0.5),
                  pct(mine, 0), pct(mine, 1), pct(theirs, 0), pct(theirs, 1));
      std::printf("empty task round trip p50, this build vs %s, 1 node, batch 1, 1 in flight, %d alternating rounds: "
                  "median %.1f vs %.1f us (this/baseline = %.2f; this build's range %.1f-%.1f, baseline's %.1f-%.1f)\n",
                  baseline.c_str(), rounds, pct(rtt_mine, 0.5), pct(rtt_theirs, 0.5),
                  pct(rtt_mine, 0.5) / pct(rtt_theirs, 0.5), pct(rtt_mine, 0), pct(rtt_mine, 1), pct(rtt_theirs, 0),
                  pct(rtt_theirs, 1));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pool: %s\n", e.what());
    return 1;
  }
  return 0;
}
