// Pool start → all workers ready, per provider, with `skyforge run --timings`' phases: the
// `hello` app on 4 nodes, on `local`, on `ssh` (4 real OpenSSH servers, one per network
// namespace, as tests/ssh_provider makes them) cold (an empty store on the hosts: every file
// copied) and warm (the store kept from the run before: nothing copied), and on `slurm` (a real
// slurmctld and 4 slurmd in network namespaces, as tests/slurm_provider makes them; sbcast
// copies every file each time). Median of --runs.
//
// Build: cmake --build build --target bench_providers ; run (root): build/bin/bench_providers [--runs 10]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "process.hpp"
#include "slurm_cluster.hpp"
#include "sshd_hosts.hpp"

namespace fs = std::filesystem;
using skyforge::test::Child;
using skyforge::test::Output;
using skyforge::test::SlurmCluster;
using skyforge::test::SshdHosts;

namespace {

const std::vector<std::string> kPhases = {"provisioned", "bootstrapped", "joined", "ready", "torn_down"};

std::map<std::string, double> timings(const std::string& err) {
  std::map<std::string, double> t;
  std::smatch m;
  if (!std::regex_search(err, m, std::regex("timings: (.*)"))) return t;
  std::string line = m[1];
  std::regex kv(R"((\w+)=([0-9.]+))");
  for (std::sregex_iterator it(line.begin(), line.end(), kv), e; it != e; ++it) t[(*it)[1]] = std::stod((*it)[2]);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Series {
  std::string name;
  std::map<std::string, std::vector<double>> phase;  // ms since `skyforge run` started
};

bool run_once(const fs::path& manifest, const fs::path& tmp, Series& s) {
  Output o = Child({SKYFORGE_BIN, "run", "--timings", manifest.string()}, {{"TMPDIR", tmp.string()}}).wait(120);
  auto t = timings(o.err);
  if (o.exit_code != 0 || !t.count("ready")) {
    std::fprintf(stderr, "%s: run failed (exit %d):\n%s\n", s.name.c_str(), o.exit_code, o.err.c_str());
    return false;
  }
  for (const auto& p : kPhases) s.phase[p].push_back(t[p]);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 10;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) runs = std::max(1, std::atoi(argv[++i]));
  for (const auto& why : {SshdHosts::unavailable(), SlurmCluster::unavailable()})
    if (!why.empty()) {
      std::fprintf(stderr, "bench_providers: %s\n", why.c_str());
      return 77;
    }
  char tmpl[] = "/tmp/skyforge-bench-providers-XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  const fs::path root = tmpl, tmp = root / "tmp";
  fs::create_directories(tmp);
  int rc = 0;
  {
    SshdHosts hosts(root / "hosts", 4);
    SlurmCluster cluster(root / "slurm", 4);  // sets SLURM_CONF here, which the runs inherit
    auto write = [&](const std::string& name, const std::string& text) {
      std::ofstream(root / name) << text;
      return root / name;
    };
    const std::string job = "\n[job]\napp = \"hello\"\nmode = \"broadcast\"\n";
    const fs::path local = write("local.toml", "[pool]\nprovider = \"local\"\nnodes = 4\n" + job);
    auto ssh = [&](const std::string& name, const fs::path& remote) {
      return write(name, "[pool]\nprovider = \"ssh\"\nnodes = 4\n\n[provider]\nhosts = " + hosts.hosts_toml() +
                             "\nssh_config = \"" + hosts.ssh_config().string() + "\"\nremote_dir = \"" + remote.string() +
                             "\"\n" + job);
    };
    Series l{"local", {}}, cold{"ssh, cold (empty store)", {}}, warm{"ssh, warm (store kept)", {}},
        sl{"slurm (sbcast every run)", {}};
    fs::create_directories(root / "nodes");
    const fs::path slurm = write("slurm.toml", "[pool]\nprovider = \"slurm\"\nnodes = 4\n\n[provider]\ntime_limit = \"10\"\n"
                                                 "stage_dir = \"" + (root / "nodes").string() + "\"\n" + job);
    const fs::path warm_manifest = ssh("warm.toml", root / "remote-warm");
    bool ok = run_once(warm_manifest, tmp, warm);  // fills the warm store; not counted
    warm.phase.clear();
    for (int r = 0; ok && r < runs; ++r) {
      ok = run_once(local, tmp, l) && run_once(warm_manifest, tmp, warm);
      const fs::path remote = root / ("remote-cold-" + std::to_string(r));
      ok = ok && run_once(ssh("cold.toml", remote), tmp, cold) && run_once(slurm, tmp, sl);
      fs::remove_all(remote);
    }
    if (!ok) {
      rc = 1;
    } else {
      std::printf("pool start → all 4 workers ready, `hello` on 4 nodes (ssh: 4 hosts, slurm: 4 nodes, 1 worker each), median of %d,\n"
                  "ms since `skyforge run` started, per phase (`skyforge run --timings`):\n\n",
                  runs);
      std::printf("| provider | provisioned | bootstrapped | joined | **ready** | torn down |\n|---|---|---|---|---|---|\n");
      for (const Series* s : {&l, &warm, &cold, &sl}) {
        std::printf("| %s |", s->name.c_str());
        for (const auto& p : kPhases)
          std::printf(p == "ready" ? " **%.0f** |" : " %.0f |", median(s->phase.at(p)));
        std::printf("\n");
      }
    }
  }
  std::error_code ec;
  fs::remove_all(root, ec);
  return rc;
}
