// End-to-end: the real `skyforge` binary, real workers on the local provider, the framework
// plugins from the build tree. Each command prints its environment (`env | sort`-style) and the
// tests check what every node's command really got. Each test runs under its own TMPDIR.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include "../support/env_map.hpp"
#include "fw_e2e.hpp"

using namespace skyforge::test;
using namespace skyforge::test::fw_e2e;

namespace {

TEST_F(FrameworkE2E, TorchGivesEveryNodeItsRankAndOneSharedMaster) {
  Output o = run(write("torch.toml", manifest(3, "[[plugins]]\nname = \"torch\"\n", kEnvSort)));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  auto envs = node_envs(o.out);
  ASSERT_EQ(envs.size(), 3u) << o.out;
  const std::string port = envs[0]["MASTER_PORT"];
  ASSERT_TRUE(is_port(port)) << port;
  const std::string pool = envs[0]["TORCHELASTIC_RUN_ID"];
  EXPECT_FALSE(pool.empty());
  for (int n = 0; n < 3; ++n) {
    auto& e = envs[n];
    const std::string r = std::to_string(n);
    SCOPED_TRACE("node " + r);
    expect_vars(e, {
        {"RANK", r},
        {"WORLD_SIZE", "3"},
        {"NODE_RANK", r},
        {"GROUP_RANK", r},
        {"GROUP_WORLD_SIZE", "3"},
        {"ROLE_RANK", r},
        {"ROLE_WORLD_SIZE", "3"},
        {"ROLE_NAME", "default"},
    });
    EXPECT_EQ(e["LOCAL_RANK"], r) << "three nodes share this machine";
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(e["MASTER_ADDR"], envs[0]["MASTER_ADDR"]);
    EXPECT_FALSE(e["MASTER_ADDR"].empty());
    expect_vars(e, {
        {"MASTER_PORT", port},
        {"TORCHELASTIC_RUN_ID", pool},
        {"TORCHELASTIC_RESTART_COUNT", "0"},
        {"TORCHELASTIC_MAX_RESTARTS", "0"},
        {"TORCHELASTIC_USE_AGENT_STORE", "False"},
        {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
        {"PET_NNODES", "3"},
        {"PET_NODE_RANK", r},
        {"PET_NPROC_PER_NODE", "1"},
        {"PET_MASTER_ADDR", e["MASTER_ADDR"]},
        {"PET_MASTER_PORT", port},
        {"PET_RDZV_BACKEND", "static"},
        {"PET_RDZV_ENDPOINT", e["MASTER_ADDR"] + ":" + port},
        {"PET_RDZV_ID", pool},
        {"SKYFORGE_TORCH_BACKEND", "gloo"},
    });
  }
}

TEST_F(FrameworkE2E, TorchNprocPerNodeStartsThatManyRanksPerNode) {
  Output o = run(write("nproc.toml",
                       manifest(2, "[[plugins]]\nname = \"torch\"\nnproc_per_node = 3\n",
                                R"(["sh", "-c", "echo rank=$RANK local=$LOCAL_RANK/$LOCAL_WORLD_SIZE world=$WORLD_SIZE proc=$SKYFORGE_LOCAL_PROC omp=$OMP_NUM_THREADS"])")));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::set<std::string> got;
  for (int n = 0; n < 2; ++n)
    for (const auto& l : node_lines(o.out, n)) got.insert("node" + std::to_string(n) + " " + l);
  const std::set<std::string> want = {
      "node0 rank=0 local=0/6 world=6 proc=0 omp=1", "node0 rank=1 local=1/6 world=6 proc=1 omp=1",
      "node0 rank=2 local=2/6 world=6 proc=2 omp=1", "node1 rank=3 local=3/6 world=6 proc=0 omp=1",
      "node1 rank=4 local=4/6 world=6 proc=1 omp=1", "node1 rank=5 local=5/6 world=6 proc=2 omp=1",
  };
  EXPECT_EQ(got, want) << o.out;
}

TEST_F(FrameworkE2E, TorchNprocPerNodeFailureOfOneRankFailsTheNode) {
  Output o = run(write("fail.toml", manifest(2, "[[plugins]]\nname = \"torch\"\nnproc_per_node = 2\n",
                                             R"(["sh", "-c", "if [ $RANK = 3 ]; then exit 9; fi; sleep 0.2"])")));
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("node 1"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("exit 9"), std::string::npos) << o.err;
}

TEST_F(FrameworkE2E, JaxGivesEveryProcessTheCoordinatorAndItsId) {
  Output o = run(write("jax.toml", manifest(3, "[[plugins]]\nname = \"jax\"\n", kEnvSort)));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  auto envs = node_envs(o.out);
  ASSERT_EQ(envs.size(), 3u) << o.out;
  std::smatch m;
  const std::string coord = envs[0]["JAX_COORDINATOR_ADDRESS"];
  ASSERT_TRUE(std::regex_match(coord, m, std::regex(R"(.+:(\d+))"))) << coord;
  for (int n = 0; n < 3; ++n) {
    auto& e = envs[n];
    expect_vars(e, {
        {"JAX_COORDINATOR_ADDRESS", coord},
        {"JAX_NUM_PROCESSES", "3"},
        {"JAX_PROCESS_ID", std::to_string(n)},
        {"JAX_LOCAL_DEVICE_COUNT", "1"},
    });
    EXPECT_NE(e["PYTHONPATH"].find(".skyforge/jax"), std::string::npos) << e["PYTHONPATH"];
  }
}

// Real JAX (the venv .ci/setup-venv makes): scripts/jax_allsum.py calls a bare
// jax.distributed.initialize(), asserts jax.process_count() == 2 and sums index + 1 across the
// processes with a collective (process_allgather): 1 + 2 = 3 on both.
TEST_F(FrameworkE2E, JaxBareInitializeFormsTheWorld) {
  if (auto why = cannot_import(kVenvPython, "jax"); !why.empty()) GTEST_SKIP() << why << " (run .ci/setup-venv)";
  Output o = run(write("jaxinit.toml", manifest(2, "[[plugins]]\nname = \"jax\"\n",
                                                toml_array({kVenvPython, std::string(FW_TEST_SCRIPTS) + "/jax_allsum.py"}))),
                 150);
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  for (int n = 0; n < 2; ++n) {
    SCOPED_TRACE("node " + std::to_string(n));
    std::vector<std::string> lines;  // the script's own lines (JAX's Gloo logs its connections too)
    for (const auto& l : node_lines(o.out, n))
      if (l.rfind("index=", 0) == 0 || l.rfind("gathered=", 0) == 0) lines.push_back(l);
    const std::vector<std::string> want = {"index=" + std::to_string(n) + " count=2 devices=2", "gathered=1,2 sum=3"};
    EXPECT_EQ(lines, want) << o.out << o.err;
  }
}

// TF_CONFIG as TensorFlow reads it: scripts/tf_config_check.py json.loads it on every node,
// reports its schema and binds a listener on the node's own worker entry (as the TF server of
// that task would). TensorFlow itself is not installed (too big for CI).
TEST_F(FrameworkE2E, TensorflowEveryNodeListsTheWholeClusterAndItsOwnIndex) {
  Output o = run(write("tf.toml", manifest(3, "[[plugins]]\nname = \"tensorflow\"\n",
                                           toml_array({"/usr/bin/python3", std::string(FW_TEST_SCRIPTS) + "/tf_config_check.py"}))));
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  auto envs = node_envs(o.out);
  ASSERT_EQ(envs.size(), 3u) << o.out;
  std::regex cfg(R"(\{"cluster":\{"worker":\[("[^"]+:\d+"),("[^"]+:\d+"),("[^"]+:\d+")\]\},"task":\{"type":"worker","index":(\d)\}\})");
  std::string workers, parsed_workers;
  for (int n = 0; n < 3; ++n) {
    SCOPED_TRACE("node " + std::to_string(n));
    std::smatch m;
    const std::string tf = envs[n]["TF_CONFIG"];
    ASSERT_TRUE(std::regex_match(tf, m, cfg)) << tf;
    EXPECT_EQ(m[4], std::to_string(n));
    std::string list = m[1].str() + m[2].str() + m[3].str();
    if (n == 0) workers = list;
    EXPECT_EQ(list, workers) << "every node lists the same cluster in the same order";
    std::set<std::string> ports;
    for (int i = 1; i <= 3; ++i) ports.insert(m[i].str());
    EXPECT_EQ(ports.size(), 3u) << "nodes sharing a machine need distinct ports: " << tf;

    // What json.loads made of it on the node.
    auto lines = node_lines(o.out, n);
    auto has = [&](const std::string& l) { return std::find(lines.begin(), lines.end(), l) != lines.end(); };
    EXPECT_TRUE(has("tf_keys=cluster,task|worker|index,type")) << o.out;
    EXPECT_TRUE(has("tf_task=worker " + std::to_string(n) + " int")) << "index == the node's rank\n" << o.out;
    EXPECT_TRUE(has("tf_types=list str")) << o.out;
    const std::string pw = envs[n]["tf_workers"];
    if (n == 0) parsed_workers = pw;
    EXPECT_EQ(pw, parsed_workers) << "identical cluster list on every node";
    EXPECT_EQ(pw, "[" + m[1].str() + ", " + m[2].str() + ", " + m[3].str() + "]");
    // Every worker's host is its node's address: node i listens on entry i (host and port), and
    // entry 0 (the head) is the pool's head address.
    const std::string want_own = m[n + 1].str().substr(1, m[n + 1].length() - 2);
    EXPECT_TRUE(has("tf_own=" + want_own + " listening")) << o.out << o.err;
    const std::string hosts = envs[n]["tf_hosts"];
    ASSERT_FALSE(envs[n]["HEAD_ADDR"].empty());
    EXPECT_EQ(hosts.substr(0, hosts.find(',')), envs[n]["HEAD_ADDR"]) << "worker 0 is the head: " << hosts;
  }
}

TEST_F(FrameworkE2E, HuggingfaceIsTheTorchEnvironmentPlusAccelerateOptions) {
  Output o = run(write("hf.toml", manifest(2,
                                           "[[plugins]]\nname = \"huggingface\"\nmixed_precision = \"bf16\"\n"
                                           "gradient_accumulation_steps = 4\noffline = true\nhf_home = \"hf\"\n"
                                           "accelerate_env = \"ACCELERATE_USE_FSDP=true\"\n",
                                           kEnvSort)));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  auto envs = node_envs(o.out);
  ASSERT_EQ(envs.size(), 2u) << o.out;
  for (int n = 0; n < 2; ++n) {
    auto& e = envs[n];
    EXPECT_EQ(e["RANK"], std::to_string(n));
    EXPECT_EQ(e["WORLD_SIZE"], "2");
    EXPECT_TRUE(is_port(e["MASTER_PORT"]));
    expect_vars(e, {
        {"MASTER_PORT", envs[0]["MASTER_PORT"]},
        {"PET_NNODES", "2"},
        {"ACCELERATE_MIXED_PRECISION", "bf16"},
        {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4"},
        {"ACCELERATE_USE_FSDP", "true"},
        {"HF_HUB_OFFLINE", "1"},
        {"HF_DATASETS_OFFLINE", "1"},
        {"TRANSFORMERS_OFFLINE", "1"},
    });
    EXPECT_TRUE(e["HF_HOME"].size() > 3 && e["HF_HOME"].substr(e["HF_HOME"].size() - 3) == "/hf") << e["HF_HOME"];
    EXPECT_EQ(e["HF_HOME"].front(), '/');
  }
}

TEST_F(FrameworkE2E, TorchAndHuggingfaceSideBySideAgreeOnTheMasterPort) {
  Output o = run(write("both.toml", manifest(2, "[[plugins]]\nname = \"torch\"\n[[plugins]]\nname = \"huggingface\"\n",
                                             R"(["sh", "-c", "echo MASTER_PORT=$MASTER_PORT"])")));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  auto envs = node_envs(o.out);
  EXPECT_TRUE(is_port(envs[0]["MASTER_PORT"]));
  EXPECT_EQ(envs[0]["MASTER_PORT"], envs[1]["MASTER_PORT"]);
}

class MigE2E : public FrameworkE2E {
 protected:
  // A stand-in nvidia-smi printing a recorded listing.
  std::string fake_nvidia_smi(const std::string& listing) {
    fs::path p = write("nvidia-smi-" + listing, "#!/bin/sh\n[ \"$1\" = -L ] || exit 2\ncat '" +
                                                     std::string(FW_TEST_DATA) + "/" + listing + "'\n");
    ::chmod(p.c_str(), 0755);
    return p.string();
  }
};

TEST_F(MigE2E, OneProcessPerMigDeviceEachWithItsOwnUuid) {
  const std::string smi = fake_nvidia_smi("a100_80gb_2x3g.40gb.txt");
  Output o = run(write("mig.toml", manifest(1, "[[plugins]]\nname = \"mig\"\nnvidia_smi = \"" + smi + "\"\n",
                                            R"(["sh", "-c", "echo proc=$SKYFORGE_LOCAL_PROC cuda=$CUDA_VISIBLE_DEVICES"])",
                                            "accelerator = \"A100(mig=3g.40gb)\"\n")));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  auto lines = node_lines(o.out, 0);
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()),
            (std::set<std::string>{"proc=0 cuda=MIG-d23f0824-128b-4f33-8c5c-7fd0a6a3a450",
                                   "proc=1 cuda=MIG-9531985d-5d9d-49f8-9818-e811892f902b"}))
      << o.out;
}

TEST_F(MigE2E, TwoNodesOnTheMachineShareItsMigDevicesAndTorchCountsThem) {
  const std::string smi = fake_nvidia_smi("a100_mixed_3gpu.txt");
  // 7 x 1g.10gb over 2 nodes: 3 processes each (one device unused); torch, listed after mig
  // with nproc_per_node = 0, makes them ranks 0..5 of a world of 6.
  Output o = run(write("mig2.toml",
                       manifest(2,
                                "[[plugins]]\nname = \"mig\"\nnvidia_smi = \"" + smi +
                                    "\"\n[[plugins]]\nname = \"torch\"\nnproc_per_node = 0\n",
                                R"(["sh", "-c", "echo rank=$RANK world=$WORLD_SIZE cuda=$CUDA_VISIBLE_DEVICES"])",
                                "accelerator = \"A100(mig=1g.10gb)\"\n")));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::set<std::string> cudas, ranks;
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(node_lines(o.out, n).size(), 3u) << o.out;
    for (const auto& l : node_lines(o.out, n)) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(l, m, std::regex(R"(rank=(\d+) world=6 cuda=(MIG-[0-9a-f-]+))"))) << l;
      EXPECT_EQ(std::stoi(m[1]) / 3, n) << l;
      EXPECT_TRUE(ranks.insert(m[1]).second) << "rank given twice: " << m[1];
      EXPECT_TRUE(cudas.insert(m[2]).second) << "device given twice: " << m[2];
    }
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2", "3", "4", "5"})) << o.out;
  EXPECT_NE(o.err.find("1 stay unused"), std::string::npos) << o.err;
}

TEST_F(MigE2E, PlainMultiGpuNodeOneProcessPerGpu) {
  const std::string smi = fake_nvidia_smi("h100_8gpu.txt");
  Output o = run(write("gpus.toml", manifest(1, "[[plugins]]\nname = \"mig\"\nnvidia_smi = \"" + smi + "\"\n",
                                             R"(["sh", "-c", "echo $CUDA_VISIBLE_DEVICES"])", "accelerator = \"H100:8\"\n")));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  auto lines = node_lines(o.out, 0);
  std::set<std::string> got(lines.begin(), lines.end());
  EXPECT_EQ(got.size(), 8u) << o.out;
  for (const auto& l : got) EXPECT_TRUE(std::regex_match(l, std::regex(R"(GPU-[0-9a-f-]{36})"))) << l;
}

TEST_F(MigE2E, AMissingProfileFailsNamingWhatTheMachineHas) {
  const std::string smi = fake_nvidia_smi("h100_8gpu.txt");
  Output o = run(write("bad.toml", manifest(1, "[[plugins]]\nname = \"mig\"\nnvidia_smi = \"" + smi + "\"\n", kEnvSort,
                                            "accelerator = \"H100(mig=1g.10gb)\"\n")));
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE(o.err.find("no MIG device of profile 1g.10gb"), std::string::npos) << o.err;
}

TEST_F(MigE2E, NoNvidiaSmiMeansNoChange) {
  Output o = run(write("nogpu.toml", manifest(1, "[[plugins]]\nname = \"mig\"\nnvidia_smi = \"/nonexistent/nvidia-smi\"\n",
                                              R"(["sh", "-c", "echo cuda=${CUDA_VISIBLE_DEVICES-unset}"])")));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(node_lines(o.out, 0), (std::vector<std::string>{"cuda=unset"})) << o.out;
}

// Two `skyforge run` at once on this machine: each pool's head holds its MASTER_PORT and its
// JAX coordinator port open (as rank 0's store and the coordinator would) while the other pool
// starts; both succeed and no port is shared.
TEST_F(FrameworkE2E, TwoPoolsAtOnceGetDistinctPortsAndBothSucceed) {
  const std::string hold =
      "import os, socket, time\n"
      "held = []\n"
      "if os.environ['RANK'] == '0':\n"
      "    for port in (os.environ['MASTER_PORT'], os.environ['JAX_COORDINATOR_ADDRESS'].rsplit(':', 1)[1]):\n"
      "        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
      "        s.bind(('', int(port)))\n"
      "        s.listen()\n"
      "        held.append(s)\n"
      "print('MASTER_PORT=' + os.environ['MASTER_PORT'], flush=True)\n"
      "print('JAX_COORDINATOR_ADDRESS=' + os.environ['JAX_COORDINATOR_ADDRESS'], flush=True)\n"
      "time.sleep(3)\n";
  write("hold.py", hold);
  const std::string plugins = "[[plugins]]\nname = \"torch\"\n[[plugins]]\nname = \"jax\"\npython_hook = false\n";
  const std::string cmd = "[\"python3\", \"" + (root_ / "hold.py").string() + "\"]";
  auto a = start(write("a.toml", manifest(2, plugins, cmd)));
  auto b = start(write("b.toml", manifest(2, plugins, cmd)));
  Output oa = a->wait(120), ob = b->wait(120);
  ASSERT_EQ(oa.exit_code, 0) << oa.err;
  ASSERT_EQ(ob.exit_code, 0) << ob.err;
  auto ea = node_envs(oa.out), eb = node_envs(ob.out);
  const std::string pa = ea[0]["MASTER_PORT"], pb = eb[0]["MASTER_PORT"];
  ASSERT_TRUE(is_port(pa) && is_port(pb)) << oa.out << ob.out;
  EXPECT_EQ(ea[1]["MASTER_PORT"], pa);
  EXPECT_EQ(eb[1]["MASTER_PORT"], pb);
  EXPECT_NE(pa, pb);
  const std::string ca = ea[0]["JAX_COORDINATOR_ADDRESS"], cb = eb[0]["JAX_COORDINATOR_ADDRESS"];
  EXPECT_EQ(ea[1]["JAX_COORDINATOR_ADDRESS"], ca);
  EXPECT_EQ(eb[1]["JAX_COORDINATOR_ADDRESS"], cb);
  EXPECT_NE(ca, cb);
  std::set<std::string> ports = {pa, pb, ca.substr(ca.rfind(':') + 1), cb.substr(cb.rfind(':') + 1)};
  EXPECT_EQ(ports.size(), 4u) << "no two listeners share a port";
}

}  // namespace
