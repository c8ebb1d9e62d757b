// The torch plugin through its C ABI, as a worker drives it: dlopen the built .so, create it
// with options, and call around_app_enter for every node of a pool against an in-memory
// rendezvous store. Checks the automatic MASTER_PORT protocol and option validation.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <skyforge/abi.h>

#include "../support/env_map.hpp"

namespace {

using Env = std::map<std::string, std::string>;
using skyforge::test::expect_vars;

// The head's rendezvous store, shared by every node of the test pool.
struct Store {
  std::mutex m;
  std::condition_variable cv;
  std::map<std::string, std::string> values;
  std::map<std::string, int64_t> counters;
  int sets = 0;
};

thread_local std::string t_service_error;

sf_host_services services_for(Store& store) {
  sf_host_services s{};
  s.struct_size = sizeof s;
  s.abi_major = SKYFORGE_ABI_MAJOR;
  s.abi_minor = SKYFORGE_ABI_MINOR;
  s.ctx = &store;
  s.log = [](void*, int32_t, const char*) {};
  s.instance_info = [](void*) -> const sf_instance_info* { return nullptr; };
  s.kv_set = [](void* ctx, const char* key, const char* value, size_t size) -> sf_status {
    auto& st = *static_cast<Store*>(ctx);
    std::lock_guard lock(st.m);
    st.values[key] = std::string(value, size);
    ++st.sets;
    st.cv.notify_all();
    return SF_OK;
  };
  s.kv_get = [](void* ctx, const char* key, int64_t timeout_ms, sf_sink out) -> sf_status {
    auto& st = *static_cast<Store*>(ctx);
    std::unique_lock lock(st.m);
    if (!st.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return st.values.count(key) != 0; })) {
      t_service_error = std::string("timed out waiting for ") + key;
      return SF_ERR_TIMEOUT;
    }
    const std::string& v = st.values[key];
    out.write(out.ctx, v.data(), v.size());
    return SF_OK;
  };
  s.kv_add = [](void* ctx, const char* key, int64_t delta, int64_t* result) -> sf_status {
    auto& st = *static_cast<Store*>(ctx);
    std::lock_guard lock(st.m);
    *result = st.counters[key] += delta;
    return SF_OK;
  };
  s.config = [](void*, const char*) -> const char* { return nullptr; };
  s.last_error = [](void*) -> const char* { return t_service_error.c_str(); };
  return s;
}

const sf_plugin_descriptor* torch_plugin() {
  static const sf_plugin_descriptor* d = [] {
    void* so = ::dlopen(SKYFORGE_TORCH_PLUGIN, RTLD_NOW | RTLD_LOCAL);  // never closed, like the host
    EXPECT_NE(so, nullptr) << ::dlerror();
    if (!so) return static_cast<const sf_plugin_descriptor*>(nullptr);
    auto entry = reinterpret_cast<sf_entry_fn>(::dlsym(so, SKYFORGE_ENTRY_SYMBOL));
    EXPECT_NE(entry, nullptr);
    return entry ? entry(nullptr, SKYFORGE_ABI_MAJOR, SKYFORGE_ABI_MINOR) : nullptr;
  }();
  return d;
}

struct Node {
  uint32_t node = 0, nodes = 1, local_rank = 0, local_world_size = 1, accelerators = 0;
  std::string pool_id = "pool-1";
};

// Creates a plugin instance with `options`, runs around_app_enter for `n`; returns the status
// and fills `env` (or `error`).
// With `cmd`, also runs the launcher hook on it (after around_app_enter, as the worker does).
sf_status enter(Store& store, const std::vector<std::pair<std::string, std::string>>& options, const Node& n, Env& env,
                std::string& error, std::vector<std::string>* cmd = nullptr) {
  const sf_plugin_descriptor* d = torch_plugin();
  if (!d) return SF_ERR;
  sf_host_services host = services_for(store);
  std::vector<sf_kv> kv;
  for (const auto& [k, v] : options) kv.push_back({k.c_str(), v.c_str()});
  void* self = nullptr;
  sf_status st = d->create(&host, kv.data(), kv.size(), &self);
  if (st != SF_OK) {
    error = d->last_error(nullptr);
    return st;
  }
  sf_instance_info info{};
  info.struct_size = sizeof info;
  info.node = n.node;
  info.total_nodes = n.nodes;
  info.is_head = n.node == 0;
  info.head_addr = "127.0.0.1";
  info.private_ip = "127.0.0.1";
  info.local_rank = n.local_rank;
  info.local_world_size = n.local_world_size;
  info.accelerators = n.accelerators;
  info.accelerator = "";
  info.concurrency = 1;
  info.pool_id = n.pool_id.c_str();
  info.store_addr = "127.0.0.1:1";
  info.work_dir = "/tmp";
  sf_env e{&env,
           [](void* ctx, const char* k, const char* v) { (*static_cast<Env*>(ctx))[k] = v; },
           [](void* ctx, const char* k) -> const char* {
             auto& m = *static_cast<Env*>(ctx);
             auto it = m.find(k);
             return it == m.end() ? nullptr : it->second.c_str();
           }};
  auto* hooks = static_cast<const sf_framework_hooks*>(d->hooks);
  st = hooks->around_app_enter(self, &info, &e);
  if (st != SF_OK) error = d->last_error(self);
  if (st == SF_OK && cmd) {
    std::vector<const char*> in;
    for (auto& a : *cmd) in.push_back(a.c_str());
    sf_argv cin{in.size(), in.data()};
    std::vector<std::string> out;
    sf_sink sink{&out, [](void* ctx, const char* data, size_t size) {
                   static_cast<std::vector<std::string>*>(ctx)->emplace_back(data, size);
                 }};
    if (hooks->launcher) {
      st = hooks->launcher(self, &info, &cin, sink);
      if (st == SF_OK) *cmd = out;
      else error = d->last_error(self);
    }
  }
  d->destroy(self);
  return st;
}

bool port_is_bindable(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

TEST(TorchPlugin, EveryNodeAgreesOnAnAutomaticFreePortThatTheHeadPublished) {
  Store store;
  const uint32_t nodes = 4;
  std::vector<Env> envs(nodes);
  std::vector<std::string> errors(nodes);
  std::vector<sf_status> status(nodes, SF_ERR);
  std::vector<std::thread> threads;
  // Non-head nodes first: they must wait for the head rather than fail.
  for (uint32_t i = nodes; i-- > 0;) {
    threads.emplace_back([&, i] {
      status[i] = enter(store, {}, Node{.node = i, .nodes = nodes, .local_rank = i, .local_world_size = nodes},
                        envs[i], errors[i]);
    });
    if (i == nodes - 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& t : threads) t.join();
  std::set<std::string> ports;
  for (uint32_t i = 0; i < nodes; ++i) {
    ASSERT_EQ(status[i], SF_OK) << errors[i];
    EXPECT_EQ(envs[i]["RANK"], std::to_string(i));
    EXPECT_EQ(envs[i]["WORLD_SIZE"], "4");
    EXPECT_EQ(envs[i]["LOCAL_RANK"], std::to_string(i));
    EXPECT_EQ(envs[i]["NODE_RANK"], std::to_string(i));
    EXPECT_EQ(envs[i]["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(envs[i]["MASTER_PORT"], envs[i]["PET_MASTER_PORT"]);
    EXPECT_EQ(envs[i]["TORCHELASTIC_RUN_ID"], "pool-1");
    EXPECT_EQ(envs[i]["SKYFORGE_TORCH_BACKEND"], "gloo");
    ports.insert(envs[i]["MASTER_PORT"]);
  }
  ASSERT_EQ(ports.size(), 1u);
  int port = std::stoi(*ports.begin());
  EXPECT_GT(port, 0);
  EXPECT_TRUE(port_is_bindable(port)) << "the published port must be free for rank 0's store";
  EXPECT_EQ(store.sets, 1) << "exactly one publication per pool";
  EXPECT_EQ(store.values.at("torch/pool-1/master_port"), *ports.begin());
}

TEST(TorchPlugin, TwoPoolsOnOneMachineGetTheirOwnPorts) {
  Store store;  // even sharing one store, pools are keyed by their id
  Env a, b;
  std::string err;
  ASSERT_EQ(enter(store, {}, Node{.node = 0, .nodes = 2, .pool_id = "pool-a"}, a, err), SF_OK) << err;
  // Pool a's rank 0 would hold its port by now; pool b must not pick the same one.
  int held = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(std::stoi(a["MASTER_PORT"])));
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(held, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(held, 1), 0);
  ASSERT_EQ(enter(store, {}, Node{.node = 0, .nodes = 2, .pool_id = "pool-b"}, b, err), SF_OK) << err;
  ::close(held);
  EXPECT_NE(a["MASTER_PORT"], b["MASTER_PORT"]);
  EXPECT_EQ(b["TORCHELASTIC_RUN_ID"], "pool-b");
}

TEST(TorchPlugin, ExplicitPortAndBackendOptionsWinWithoutTheStore) {
  Store store;
  Env env;
  std::string err;
  ASSERT_EQ(enter(store, {{"master_port", "29510"}, {"backend", "nccl"}}, Node{.node = 1, .nodes = 2}, env, err), SF_OK)
      << err;
  expect_vars(env, {
      {"MASTER_PORT", "29510"},
      {"PET_MASTER_PORT", "29510"},
      {"SKYFORGE_TORCH_BACKEND", "nccl"},
  });
  EXPECT_TRUE(store.values.empty());
  EXPECT_TRUE(store.counters.empty());
}

TEST(TorchPlugin, AutoBackendIsNcclOnNodesWithAccelerators) {
  Store store;
  Env env;
  std::string err;
  ASSERT_EQ(enter(store, {{"master_port", "29511"}}, Node{.node = 0, .nodes = 1, .accelerators = 8}, env, err), SF_OK)
      << err;
  EXPECT_EQ(env["SKYFORGE_TORCH_BACKEND"], "nccl");
}

TEST(TorchPlugin, BadOptionsFailAtCreateWithAClearMessage) {
  Store store;
  Env env;
  std::string err;
  EXPECT_EQ(enter(store, {{"master_port", "70000"}}, Node{}, env, err), SF_ERR_INVALID);
  EXPECT_NE(err.find("master_port"), std::string::npos) << err;
  EXPECT_EQ(enter(store, {{"backend", "mpi"}}, Node{}, env, err), SF_ERR_INVALID);
  EXPECT_NE(err.find("backend"), std::string::npos) << err;
  EXPECT_EQ(enter(store, {{"rendezvous_timeout", "0"}}, Node{}, env, err), SF_ERR_INVALID);
  EXPECT_NE(err.find("rendezvous_timeout"), std::string::npos) << err;
}

TEST(TorchPlugin, ANodeWhoseHeadNeverPublishesTimesOutNamingTheKey) {
  Store store;
  Env env;
  std::string err;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(enter(store, {{"rendezvous_timeout", "1"}}, Node{.node = 1, .nodes = 2}, env, err), SF_ERR_TIMEOUT);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_NE(err.find("torch/pool-1/master_port"), std::string::npos) << err;
  EXPECT_TRUE(env.empty()) << "nothing is set when the hook fails";
}

TEST(TorchPlugin, SeveralProcessesPerNodeWrapAPlainCommandInTheFanoutLauncher) {
  Store store;
  Env env;
  std::string err;
  std::vector<std::string> cmd = {"python", "train.py"};
  ASSERT_EQ(enter(store, {{"master_port", "29512"}, {"nproc_per_node", "4"}}, Node{.node = 1, .nodes = 2}, env, err, &cmd),
            SF_OK)
      << err;
  expect_vars(env, {
      {"WORLD_SIZE", "8"},
      {"RANK", "4"},
      {"LOCAL_RANK", "0"},
      {"LOCAL_WORLD_SIZE", "4"},
      {"PET_NPROC_PER_NODE", "4"},
      {"SKYFORGE_FANOUT_NPROC", "4"},
      {"SKYFORGE_FANOUT_ADD", "RANK LOCAL_RANK ROLE_RANK"},
      {"OMP_NUM_THREADS", "1"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
  });
  ASSERT_GE(cmd.size(), 6u);
  EXPECT_EQ(cmd[0], "sh");
  EXPECT_EQ(cmd[3], "skyforge-fanout");
  EXPECT_EQ(std::vector<std::string>(cmd.end() - 2, cmd.end()), (std::vector<std::string>{"python", "train.py"}));
}

TEST(TorchPlugin, TorchrunAndSingleProcessCommandsAreLeftAlone) {
  Store store;
  Env env;
  std::string err;
  std::vector<std::string> torchrun = {"torchrun", "train.py"};
  ASSERT_EQ(enter(store, {{"master_port", "29513"}, {"nproc_per_node", "2"}}, Node{}, env, err, &torchrun), SF_OK)
      << err;
  EXPECT_EQ(torchrun, (std::vector<std::string>{"torchrun", "train.py"}));
  Env env2;
  std::vector<std::string> accelerate = {"accelerate", "launch", "train.py"};
  ASSERT_EQ(enter(store, {{"master_port", "29513"}, {"nproc_per_node", "2"}}, Node{}, env2, err, &accelerate), SF_OK)
      << err;
  EXPECT_EQ(accelerate, (std::vector<std::string>{"accelerate", "launch", "train.py"}));
  Env env1;
  std::vector<std::string> plain = {"python", "train.py"};
  ASSERT_EQ(enter(store, {{"master_port", "29513"}}, Node{}, env1, err, &plain), SF_OK) << err;
  EXPECT_EQ(plain, (std::vector<std::string>{"python", "train.py"}));
  EXPECT_EQ(env1.count("SKYFORGE_FANOUT_NPROC"), 0u);
}

TEST(TorchPlugin, ExistingSettingsWinOverTorchrunsDefaults) {
  Store store;
  Env env = {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}, {"OMP_NUM_THREADS", "8"}, {"SKYFORGE_FANOUT_ADD", "JAX_PROCESS_ID"}};
  std::string err;
  ASSERT_EQ(enter(store, {{"master_port", "29514"}, {"nproc_per_node", "2"}}, Node{}, env, err), SF_OK) << err;
  expect_vars(env, {
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"},
      {"OMP_NUM_THREADS", "8"},
      {"SKYFORGE_FANOUT_ADD", "JAX_PROCESS_ID RANK LOCAL_RANK ROLE_RANK"},
  });
}

TEST(TorchPlugin, NprocZeroFollowsTheMigPluginsDeviceCount) {
  Store store;
  Env env = {{"SKYFORGE_LOCAL_DEVICES", "3"}};
  std::string err;
  ASSERT_EQ(enter(store, {{"master_port", "29515"}, {"nproc_per_node", "0"}}, Node{.node = 1, .nodes = 2}, env, err),
            SF_OK)
      << err;
  EXPECT_EQ(env["WORLD_SIZE"], "6");
  EXPECT_EQ(env["RANK"], "3");
  EXPECT_EQ(enter(store, {{"nproc_per_node", "-1"}}, Node{}, env, err), SF_ERR_INVALID);
  EXPECT_NE(err.find("nproc_per_node"), std::string::npos) << err;
}

}  // namespace
