// End-to-end with the real frameworks, not stand-ins: the real `skyforge` binary on the local
// provider runs real PyTorch (Debian's python3-torch under /usr/bin/python3; it does not import
// under any other Python) and real Keras 3 (the .venv .ci/setup-venv makes, with jax) through the
// framework plugins, and the tests compare what every node printed. A test whose Python cannot
// import its framework is skipped, saying why. Also here: `skyforge env` and `skyforge validate`'s
// refusal of a plugin order the plugins forbid. (The real JAX run and TF_CONFIG's schema are
// tested in test_framework_e2e.cpp; `stdout = "head"` in tests/e2e,
// E2E.StderrIsStreamedAndHeadPolicyKeepsOnlyTheHead.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "fw_e2e.hpp"

using namespace skyforge::test;
using namespace skyforge::test::fw_e2e;

namespace {

// The real-framework runs (the fixture only names them apart from the env-only cases).
class RealFrameworkE2E : public FrameworkE2E {};

// ---- PyTorch: DDP over gloo, env:// ----------------------------------------------------------

// scripts/torch_ddp.py: init_process_group("gloo", init_method="env://") on 2 nodes, an
// all_reduce of rank + 1, then 5 DDP steps of a small model from one fixed seed on rank-dependent
// data. Both ranks must report world size 2, the sum 3, the same initial weights, different first
// losses (their data differs) and identical trained weights that differ from the initial ones.
TEST_F(RealFrameworkE2E, TorchDdpOverGlooTrainsIdenticalWeightsOnBothNodes) {
  if (auto why = cannot_import(kSystemPython, "torch"); !why.empty())
    GTEST_SKIP() << why << " (Debian: apt-get install python3-torch)";
  Output o = run(write("ddp.toml", manifest(2, "[[plugins]]\nname = \"torch\"\n",
                                            toml_array({kSystemPython, std::string(FW_TEST_SCRIPTS) + "/torch_ddp.py"}))),
                 170);
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  auto envs = node_envs(o.out);
  ASSERT_EQ(envs.size(), 2u) << o.out;
  for (int n = 0; n < 2; ++n) {
    SCOPED_TRACE("node " + std::to_string(n));
    auto& e = envs[n];
    const std::string r = std::to_string(n);
    EXPECT_EQ(e["world"], r + "/2 env_rank=" + r + " env_world=2") << "rank and world size from env://\n" << o.out;
    EXPECT_EQ(e["allreduce"], "3") << "all_reduce(rank + 1) over 2 ranks\n" << o.out;
    EXPECT_TRUE(std::regex_match(e["init"], std::regex("[0-9a-f]{64}"))) << e["init"];
    EXPECT_TRUE(std::regex_match(e["weights"], std::regex("[0-9a-f]{64}"))) << e["weights"];
    EXPECT_NE(e["weights"], e["init"]) << "training changed the weights";
  }
  EXPECT_EQ(envs[0]["init"], envs[1]["init"]) << "one fixed seed: the same initial weights";
  EXPECT_FALSE(envs[0]["loss0"].empty());
  EXPECT_NE(envs[0]["loss0"], envs[1]["loss0"]) << "each rank trains on its own data";
  EXPECT_EQ(envs[0]["weights"], envs[1]["weights"]) << "DDP averaged the gradients: identical weights\n" << o.out;
}

// ---- Keras 3: KERAS_BACKEND and the pool-wide seed -------------------------------------------

// The manifest lists the framework's plugin, then keras with backend = <it>; every node's
// `import keras` must come up on that backend. (Keras' own default, tensorflow, is not
// installed in the venv, so keras imports at all only when KERAS_BACKEND reached the node.)
class KerasBackendE2E : public RealFrameworkE2E {
 protected:
  // `without`: why the venv may lack the backend's framework, for the skip message.
  void every_node_runs_keras_on(const std::string& backend, const std::string& without) {
    if (auto why = cannot_import(kVenvPython, backend); !why.empty()) GTEST_SKIP() << why << " (" << without << ")";
    if (auto why = cannot_import(kVenvPython, "keras", {{"KERAS_BACKEND", backend}}); !why.empty())
      GTEST_SKIP() << why << " (run .ci/setup-venv)";
    Output o = run(write("keras.toml",
                         manifest(2,
                                  "[[plugins]]\nname = \"" + backend + "\"\n[[plugins]]\nname = \"keras\"\nbackend = \"" +
                                      backend + "\"\n",
                                  toml_array({kVenvPython, "-c",
                                              "import keras; print('keras-backend', keras.backend.backend())"}))),
                   170);
    ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
    for (int n = 0; n < 2; ++n) {
      auto lines = node_lines(o.out, n);
      EXPECT_EQ(std::count(lines.begin(), lines.end(), "keras-backend " + backend), 1)
          << "node " << n << "\n" << o.out << o.err;
    }
  }
};

TEST_F(KerasBackendE2E, EveryNodeRunsKerasOnJax) { every_node_runs_keras_on("jax", "run .ci/setup-venv"); }

// Runs where the venv has a torch >= 2.1; CI's has none, so there it skips, saying why.
TEST_F(KerasBackendE2E, EveryNodeRunsKerasOnTorch) {
  every_node_runs_keras_on(
      "torch",
      "Keras 3 needs torch >= 2.1 (Keras 3.15 reads torch.float8_e4m3fn): Debian 12's python3-torch is 1.13.1, "
      "and PyPI's torch (2.15: a 539 MB wheel) brings 17 NVIDIA CUDA wheels, GBs, more than CI's time allows; "
      "install torch >= 2.1 in the venv to run this");
}

const std::string kKerasEnv =
    R"(["sh", "-c", "echo SKYFORGE_SEED=$SKYFORGE_SEED; echo KERAS_BACKEND=$KERAS_BACKEND; echo SKYFORGE_DATA_PARALLEL=$SKYFORGE_DATA_PARALLEL"])";

std::string keras_plugins(const std::string& seed_line) {
  return "[[plugins]]\nname = \"jax\"\n[[plugins]]\nname = \"keras\"\nbackend = \"jax\"\n" + seed_line;
}

// seed = -1 (the default, here written out): the head draws a seed and every node gets it; a
// second run draws another.
TEST_F(RealFrameworkE2E, KerasSeedMinusOneIsDrawnOnceAndSharedByEveryNode) {
  const fs::path m = write("seed.toml", manifest(3, keras_plugins("seed = -1\n"), kKerasEnv));
  std::string first;
  for (int attempt = 0; attempt < 2; ++attempt) {
    Output o = run(m);
    ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
    auto envs = node_envs(o.out);
    ASSERT_EQ(envs.size(), 3u) << o.out;
    const std::string seed = envs[0]["SKYFORGE_SEED"];
    ASSERT_TRUE(std::regex_match(seed, std::regex(R"(\d{1,19})"))) << seed;
    for (int n = 0; n < 3; ++n) {
      SCOPED_TRACE("node " + std::to_string(n));
      EXPECT_EQ(envs[n]["SKYFORGE_SEED"], seed) << o.out;
      EXPECT_EQ(envs[n]["KERAS_BACKEND"], "jax");
      EXPECT_EQ(envs[n]["SKYFORGE_DATA_PARALLEL"], "1") << "3 nodes: data-parallel";
    }
    if (attempt == 0) {
      first = seed;
    } else {
      EXPECT_NE(seed, first) << "each pool draws its own seed (a 63-bit draw repeating is a bug)";
    }
  }
}

TEST_F(RealFrameworkE2E, KerasSeedOptionIsEveryNodesSeed) {
  Output o = run(write("seed42.toml", manifest(2, keras_plugins("seed = 42\n"), kKerasEnv)));
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  auto envs = node_envs(o.out);
  ASSERT_EQ(envs.size(), 2u) << o.out;
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(envs[n]["SKYFORGE_SEED"], "42") << "node " << n << "\n" << o.out;
    EXPECT_EQ(envs[n]["KERAS_BACKEND"], "jax");
  }
}

// keras' plugin.toml says `after = ["jax", "torch", "tensorflow"]` (KERAS_BACKEND needs that
// framework's environment first). tests/manifest (Train.AfterOrderIsEnforced) checks the rule
// against a stand-in plugin.toml; this checks the installed keras plugin's own plugin.toml through
// the real CLI: `validate` and `run` refuse, naming both positions, and start nothing.
TEST_F(RealFrameworkE2E, KerasListedBeforeJaxIsRefusedNamingTheOrder) {
  const std::string body =
      "[pool]\nprovider = \"local\"\nnodes = 2\n\n"
      "[[plugins]]\nname = \"keras\"\nbackend = \"jax\"\n"  // lines 5-7
      "[[plugins]]\nname = \"jax\"\n\n"                      // lines 8-10
      "[job]\ncommand = [\"true\"]\n";
  const fs::path bad = write("order.toml", body);
  const std::string want = bad.string() + ":6:8: [[plugins]] keras: must come after 'jax' (listed at " + bad.string() +
                           ":9:8); move it below";
  Output v = skyforge({"validate", bad.string()});
  EXPECT_EQ(v.exit_code, 2) << v.out << v.err;
  EXPECT_NE(v.err.find(want), std::string::npos) << v.err;
  Output r = skyforge({"run", bad.string()});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("[node"), std::string::npos) << "nothing ran: " << r.out;

  const fs::path good = write("order-ok.toml", manifest(2, keras_plugins(""), R"(["true"])"));
  Output ok = skyforge({"validate", good.string()});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("valid"), std::string::npos) << ok.out;
}

// ---- skyforge env ------------------------------------------------------------------------------

class EnvCommandE2E : public RealFrameworkE2E {
 protected:
  fs::path torch_pool() {
    return write("env.toml", manifest(2, "[[plugins]]\nname = \"torch\"\n", R"(["sh", "-c", "exit 3"])"));
  }
};

// "NAME=value" lines -> (name, value) in order; the names of continuation lines (a value with a
// newline) are not names.
std::vector<std::pair<std::string, std::string>> env_lines(const std::string& out) {
  std::vector<std::pair<std::string, std::string>> v;
  std::regex line(R"(^([A-Za-z_][A-Za-z0-9_]*)=(.*)$)");
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_match(l, m, line)) v.emplace_back(m[1], m[2]);
  }
  return v;
}

// The manifest's own command (exit 3) does not run: `env` runs instead and node 1's environment
// comes out as sorted NAME=value lines, the torch plugin's values in it.
TEST_F(EnvCommandE2E, PrintsNodeOnesEnvironmentSorted) {
  Output o = skyforge({"env", torch_pool().string(), "--node", "1"});
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  EXPECT_EQ(o.out.find("[node"), std::string::npos) << "only the environment on stdout:\n" << o.out;
  auto lines = env_lines(o.out);
  ASSERT_GT(lines.size(), 10u) << o.out;
  std::map<std::string, std::string> vars;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(lines[i - 1].first, lines[i].first) << "sorted, each name once";
    }
    vars[lines[i].first] = lines[i].second;
  }
  EXPECT_EQ(vars["RANK"], "1");
  EXPECT_EQ(vars["WORLD_SIZE"], "2");
  EXPECT_EQ(vars["NODE_RANK"], "1");
  EXPECT_EQ(vars["SKYFORGE_NODE"], "1");
  EXPECT_EQ(vars["SKYFORGE_TOTAL_NODES"], "2");
  EXPECT_TRUE(is_port(vars["MASTER_PORT"])) << vars["MASTER_PORT"];
  EXPECT_FALSE(vars["MASTER_ADDR"].empty());
  EXPECT_EQ(vars["PET_RDZV_ENDPOINT"], vars["MASTER_ADDR"] + ":" + vars["MASTER_PORT"]);
  // The interface that holds the node's pool address (the local provider's: loopback), NCCL's
  // named exactly ("=lo"), since NCCL reads a bare name as a prefix.
  ASSERT_EQ(vars["SKYFORGE_PRIVATE_IP"], "127.0.0.1");
  if (!std::getenv("GLOO_SOCKET_IFNAME")) EXPECT_EQ(vars["GLOO_SOCKET_IFNAME"], "lo");
  if (!std::getenv("NCCL_SOCKET_IFNAME")) EXPECT_EQ(vars["NCCL_SOCKET_IFNAME"], "=lo");
}

// --json: one JSON object (parsed by Python's json module) with string values and the same
// variables as the text form; its keys sorted too.
TEST_F(EnvCommandE2E, JsonIsOneObjectWithTheSameVariables) {
  if (::access(kSystemPython.c_str(), X_OK) != 0) GTEST_SKIP() << "no " << kSystemPython << " to parse the JSON";
  const fs::path m = torch_pool();
  Output text = skyforge({"env", m.string(), "--node", "1"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  Output o = skyforge({"env", m.string(), "--node", "1", "--json"});
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  const fs::path json = write("env.json", o.out);
  Output p = exec({kSystemPython, "-c",
                   "import json, sys\n"
                   "d = json.load(open(sys.argv[1]))\n"
                   "assert isinstance(d, dict), type(d)\n"
                   "assert all(isinstance(v, str) for v in d.values())\n"
                   "print('keys=' + ','.join(d))\n"
                   "for k in ('RANK', 'WORLD_SIZE', 'NODE_RANK', 'SKYFORGE_NODE', 'MASTER_ADDR', 'MASTER_PORT'):\n"
                   "    print(k + '=' + d[k])\n",
                   json.string()});
  ASSERT_EQ(p.exit_code, 0) << "not a JSON object of strings:\n" << o.out << p.err;
  std::map<std::string, std::string> got;
  for (auto& [k, v] : env_lines(p.out)) got[k] = v;
  EXPECT_EQ(got["RANK"], "1");
  EXPECT_EQ(got["WORLD_SIZE"], "2");
  EXPECT_EQ(got["NODE_RANK"], "1");
  EXPECT_EQ(got["SKYFORGE_NODE"], "1");
  EXPECT_TRUE(is_port(got["MASTER_PORT"])) << got["MASTER_PORT"];  // each pool picks its own port
  std::vector<std::string> keys;
  std::stringstream ks(got["keys"]);
  for (std::string k; std::getline(ks, k, ',');) keys.push_back(k);
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end())) << got["keys"];
  std::vector<std::string> text_keys;
  std::map<std::string, std::string> text_vars;
  for (auto& [k, v] : env_lines(text.out)) {
    text_keys.push_back(k);
    text_vars[k] = v;
  }
  EXPECT_EQ(keys, text_keys) << "the same variables as the NAME=value form";
  EXPECT_EQ(got["MASTER_ADDR"], text_vars["MASTER_ADDR"]);
}

TEST_F(EnvCommandE2E, ANodeOutsideThePoolIsRefusedNamingThePoolSize) {
  Output o = skyforge({"env", torch_pool().string(), "--node", "5"});
  EXPECT_EQ(o.exit_code, 2) << "non-zero: a usage error, like a bad manifest";
  EXPECT_NE(o.err.find("--node 5"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("the pool has 2 nodes"), std::string::npos) << o.err;
  EXPECT_TRUE(o.out.empty()) << o.out;
}

}  // namespace
