// The loader against one real fixture .so per failure mode (docs/plugins.md, "The ABI").
#include <gtest/gtest.h>

#include <cstddef>
#include <skyforge/sdk.hpp>

#include <string>
#include <thread>
#include <vector>

#include "../support/contains.hpp"
#include "env.hpp"
#include "lent.hpp"
#include "loader.hpp"
#include "services.hpp"

using namespace skyforge;
using skyforge::test::contains;

namespace {

std::string fixture(const std::string& name) { return std::string(FIXTURES) + "/" + name + "/lib" + name + ".so"; }

class LoaderTest : public ::testing::Test {
 protected:
  Services services{[this](int32_t, const std::string& m) { logs.push_back(m); }};
  Loader loader{services.table()};
  std::vector<std::string> logs;

  // Calls `inst`'s around_app_enter, if it has one, with a fresh environment; the environment.
  static EnvMap enter(const PluginInstance& inst, bool& called) {
    EnvMap env;
    sf_env e = env.c_view();
    sf_instance_info info{};
    info.struct_size = sizeof info;
    called = inst.call_optional(&sf_framework_hooks::around_app_enter, "around_app_enter", &info, &e);
    return env;
  }

  // The LoadError's message for loading `name` (fails the test if it loads).
  std::string load_error(const std::string& path, const std::string& expected_name = "",
                         std::optional<sf_kind> kind = std::nullopt,
                         std::optional<std::pair<int, int>> abi = std::nullopt) {
    try {
      loader.load(path, expected_name, kind, abi);
    } catch (const LoadError& e) {
      return e.what();
    }
    ADD_FAILURE() << path << " loaded, but should not have";
    return "";
  }
};

TEST_F(LoaderTest, FrozenV1_0PluginLoadsAndItsHookRuns) {
  const LoadedPlugin& p = loader.load(fixture("ok_v1_0"), "ok_v1_0", SF_KIND_FRAMEWORK);
  EXPECT_EQ(p.name, "ok_v1_0");
  EXPECT_EQ(p.abi_major, 1);
  EXPECT_EQ(p.abi_minor, 0);
  auto inst = loader.create(p, {});
  ASSERT_NE(inst->hooks<sf_framework_hooks>()->around_app_enter, nullptr);
  bool called = false;
  EnvMap env = enter(*inst, called);
  EXPECT_TRUE(called);
  ASSERT_NE(env.get("FIXTURE"), nullptr);
  EXPECT_STREQ(env.get("FIXTURE"), "ok_v1_0");
}

// An older plugin's shorter table is adapted to this host's struct at load: a hook past the
// plugin's struct_size reads as NULL even when the bytes there hold a live pointer, and the host
// never calls it (NCCL's ncclNet_vN -> ncclNet_t).
TEST_F(LoaderTest, AShorterHookTableIsAdaptedAndItsMissingHooksAreNull) {
  const LoadedPlugin& p = loader.load(fixture("short_table"), "short_table", SF_KIND_FRAMEWORK);
  EXPECT_EQ(p.hooks_size, offsetof(sf_framework_hooks, around_app_enter));
  auto inst = loader.create(p, {});
  const sf_framework_hooks* h = inst->hooks<sf_framework_hooks>();
  EXPECT_EQ(h->struct_size, sizeof(sf_framework_hooks));
  EXPECT_EQ(h->around_app_enter, nullptr);
  EXPECT_EQ(h->launcher, nullptr);
  bool called = true;
  EnvMap env = enter(*inst, called);
  EXPECT_FALSE(called);
  EXPECT_EQ(env.get("FIXTURE"), nullptr);
  EXPECT_EQ(inst->hooks<sf_provider_hooks>(), nullptr);  // not its kind
  EXPECT_THROW(inst->call(&sf_provider_hooks::terminate, "terminate", nullptr, size_t{0}), std::logic_error);
}

TEST_F(LoaderTest, MajorMismatchQuotesBothVersionsAndTheFile) {
  std::string e = load_error(fixture("abi_major_mismatch"));
  EXPECT_TRUE(contains(e, fixture("abi_major_mismatch")));
  EXPECT_TRUE(contains(e, std::to_string(SKYFORGE_ABI_MAJOR + 1) + "." + std::to_string(SKYFORGE_ABI_MINOR)));
  EXPECT_TRUE(contains(e, std::to_string(SKYFORGE_ABI_MAJOR) + "." + std::to_string(SKYFORGE_ABI_MINOR)));
}

TEST_F(LoaderTest, MinorTooNewQuotesBothVersions) {
  std::string e = load_error(fixture("abi_minor_too_new"));
  EXPECT_TRUE(contains(e, fixture("abi_minor_too_new")));
  EXPECT_TRUE(contains(e, std::to_string(SKYFORGE_ABI_MAJOR) + "." + std::to_string(SKYFORGE_ABI_MINOR + 1)));
  EXPECT_TRUE(contains(
      e, "newer than host ABI " + std::to_string(SKYFORGE_ABI_MAJOR) + "." + std::to_string(SKYFORGE_ABI_MINOR)));
}

TEST_F(LoaderTest, MissingRequiredHookIsNamed) {
  std::string e = load_error(fixture("missing_required_hook"));
  EXPECT_TRUE(contains(e, fixture("missing_required_hook")));
  EXPECT_TRUE(contains(e, "'terminate'"));
}

TEST_F(LoaderTest, DescriptorTooSmallIsRefusedBeforeAnyFieldPastTheVersion) {
  std::string e = load_error(fixture("descriptor_too_small"));
  EXPECT_TRUE(contains(e, fixture("descriptor_too_small")));
  EXPECT_TRUE(contains(e, "descriptor too small (16 bytes)"));
}

TEST_F(LoaderTest, DescriptorWithoutANameIsRefused) {
  std::string e = load_error(fixture("no_name"));
  EXPECT_TRUE(contains(e, fixture("no_name")));
  EXPECT_TRUE(contains(e, "has no name"));
}

TEST_F(LoaderTest, DescriptorWithoutCreateIsRefusedNamingThePlugin) {
  std::string e = load_error(fixture("no_create"));
  EXPECT_TRUE(contains(e, fixture("no_create")));
  EXPECT_TRUE(contains(e, "plugin 'no_create' is missing create/destroy/last_error"));
}

TEST_F(LoaderTest, PluginTomlAbiMustBeTheOneTheLibraryDeclares) {
  // skyforge_add_plugin() compiled plugin.toml's abi ("1.0") into the fixture.
  EXPECT_EQ(loader.load(fixture("dup_a"), "dup", std::nullopt, std::make_pair(1, 0)).abi_minor, 0);
  // So does the SDK's SKYFORGE_PLUGIN(): a C++ plugin that asks for 1.0 would load in a 1.0 host.
  EXPECT_EQ(loader.load(fixture("sdk_app"), "sdk_app", SF_KIND_APP, std::make_pair(1, 0)).abi_minor, 0);
  std::string e = load_error(fixture("init_fails"), "init_fails", std::nullopt, std::make_pair(1, 1));
  EXPECT_TRUE(contains(e, fixture("init_fails")));
  EXPECT_TRUE(contains(e, "plugin.toml says abi \"1.1\" but the library declares ABI 1.0"));
}

// A plugin.toml of another major (a library built before skyforge_add_plugin() refused it) is
// not the library's mistake: rebuilding cannot fix it, and the message says what can.
TEST_F(LoaderTest, PluginTomlOfAnotherMajorSaysItWasWrittenForAnotherSdk) {
  const int major = SKYFORGE_ABI_MAJOR + 1;
  std::string e = load_error(fixture("init_fails"), "init_fails", std::nullopt, std::make_pair(major, 0));
  EXPECT_TRUE(contains(e, fixture("init_fails")));
  EXPECT_TRUE(contains(e, "plugin.toml says abi \"" + std::to_string(major) +
                              ".0\": the plugin was written for another skyforge SDK major"));
  EXPECT_FALSE(contains(e, "rebuild"));
}

TEST_F(LoaderTest, ComputeBackendMissingItsHooksIsRefusedAtLoad) {
  std::string e = load_error(fixture("compute_without_hooks"));
  EXPECT_TRUE(contains(e, fixture("compute_without_hooks")));
  EXPECT_TRUE(contains(e, "compute_backend plugin 'compute_without_hooks' lacks the required hook 'engine_create'"));
}

// Bound data (ABI 1.8): a caller that finds bind_data uses the other four, so a table with some
// of them is refused at load, naming the five.
TEST_F(LoaderTest, ComputeBackendWithSomeBoundDataHooksIsRefusedAtLoad) {
  std::string e = load_error(fixture("compute_partial_bound"));
  EXPECT_TRUE(contains(e, fixture("compute_partial_bound")));
  EXPECT_TRUE(contains(e,
                       "compute_backend plugin 'compute_partial_bound' has some of the bound-data hooks (ABI 1.8) but "
                       "not all: bind_data, release_data, train_step_indexed, eval_step_indexed and take_results go "
                       "together"));
}

TEST_F(LoaderTest, TaskBackendsHaveTheirHooksFromAbi1_5) {
  const LoadedPlugin& ok = loader.load(fixture("task_backend_ok"), "task_backend_ok", SF_KIND_TASK_BACKEND);
  ASSERT_NE(std::get_if<sf_task_hooks>(&ok.table), nullptr);
  EXPECT_NE(std::get<sf_task_hooks>(ok.table).next_batch, nullptr);
  EXPECT_EQ(std::get<sf_task_hooks>(ok.table).plan, nullptr);  // optional, absent
  std::string e = load_error(fixture("task_without_state"));
  EXPECT_TRUE(contains(e, "task_backend plugin 'task_without_state' lacks the required hook 'state'"));
  // Before 1.5 the kind existed without hooks: such a library can run no job.
  e = load_error(fixture("task_backend_v1_4"));
  EXPECT_TRUE(contains(e, fixture("task_backend_v1_4")));
  EXPECT_TRUE(contains(e, "declares ABI 1.4; task backends have hooks from ABI 1.5 on"));
}

TEST_F(LoaderTest, InitFailureCarriesThePluginsMessage) {
  const LoadedPlugin& p = loader.load(fixture("init_fails"));
  try {
    loader.create(p, {});
    FAIL() << "create succeeded";
  } catch (const PluginError& e) {
    EXPECT_EQ(e.status(), SF_ERR_INVALID);
    EXPECT_NE(std::string(e.what()).find("no licence server"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(fixture("init_fails")), std::string::npos) << e.what();
  }
}

TEST_F(LoaderTest, TwoLibrariesClaimingOneNameAreBothNamed) {
  loader.load(fixture("dup_a"));
  std::string e = load_error(fixture("dup_b"));
  EXPECT_TRUE(contains(e, "'dup'"));
  EXPECT_TRUE(contains(e, fixture("dup_a")));
  EXPECT_TRUE(contains(e, fixture("dup_b")));
}

TEST_F(LoaderTest, NotAPluginAtAll) {
  std::string path = std::string(FIXTURES) + "/not_a_plugin/libnot_a_plugin.so";
  std::string e = load_error(path);
  EXPECT_TRUE(contains(e, path));
  EXPECT_TRUE(contains(e, "not a skyforge plugin"));
}

TEST_F(LoaderTest, MissingFileAndNonLibrary) {
  std::string e = load_error(std::string(FIXTURES) + "/nope/libnope.so");
  EXPECT_TRUE(contains(e, "not found"));
  e = load_error(std::string(FIXTURES) + "/ok_v1_0/plugin.toml");
  EXPECT_TRUE(contains(e, "cannot load shared library"));
}

TEST_F(LoaderTest, EntryReturningNullIsRefused) {
  std::string e = load_error(fixture("entry_returns_null"));
  EXPECT_TRUE(contains(e, "no descriptor"));
}

TEST_F(LoaderTest, NameAndKindMustMatchWhatPluginTomlSays) {
  std::string e = load_error(fixture("ok_v1_0"), "something_else");
  EXPECT_TRUE(contains(e, "something_else"));
  Loader other(services.table());
  try {
    other.load(fixture("ok_v1_0"), "ok_v1_0", SF_KIND_PROVIDER);
    FAIL();
  } catch (const LoadError& err) {
    EXPECT_NE(std::string(err.what()).find("expected a provider plugin"), std::string::npos) << err.what();
  }
}

TEST_F(LoaderTest, SdkAppRunsAndTaskErrorsComeBackAsStatusAndMessage) {
  const LoadedPlugin& p = loader.load(fixture("sdk_app"), "sdk_app", SF_KIND_APP);
  EXPECT_EQ(p.version, "1.2.3");
  auto inst = loader.create(p, {{"greeting", "hi"}});
  auto* h = inst->hooks<sf_app_hooks>();
  std::string out;
  sf_sink sink{&out, [](void* c, const char* d, size_t n) { static_cast<std::string*>(c)->append(d, n); }};
  ASSERT_EQ(h->run(inst->self(), sink), SF_OK);
  EXPECT_EQ(out, "ran with greeting=hi");
  out.clear();
  ASSERT_EQ(h->task(inst->self(), "x", 1, 3, sink), SF_OK);
  EXPECT_EQ(out, "x@3");
  EXPECT_EQ(h->task(inst->self(), "boom", 4, 0, sink), SF_ERR_INVALID);
  EXPECT_STREQ(p.descriptor->last_error(inst->self()), "boom on purpose");
  EXPECT_EQ(h->task(inst->self(), "std", 3, 0, sink), SF_ERR);
  EXPECT_STREQ(p.descriptor->last_error(inst->self()), "std exception on purpose");
}

TEST_F(LoaderTest, InstanceInfoOnATaskThreadNamesItsSlot) {
  msg::Job job;
  job.id.node = 1;
  job.id.total_nodes = 2;
  job.id.concurrency = 4;
  services.set_instance(job.id, "/tmp");
  const LoadedPlugin& p = loader.load(fixture("sdk_app"), "sdk_app", SF_KIND_APP);
  auto inst = loader.create(p, {});
  auto* h = inst->hooks<sf_app_hooks>();
  auto task = [&](uint32_t slot) {
    std::string out;
    sf_sink sink{&out, [](void* c, const char* d, size_t n) { static_cast<std::string*>(c)->append(d, n); }};
    EXPECT_EQ(h->task(inst->self(), "slot", 4, slot, sink), SF_OK);
    return out;
  };
  EXPECT_EQ(task(0), "0/0") << "outside a slot's thread: the node's record";
  for (uint32_t slot : {1u, 3u}) {
    std::string got;
    std::thread([&] {
      Services::SlotScope in_slot(slot);
      got = task(slot);
    }).join();
    EXPECT_EQ(got, std::to_string(slot) + "/" + std::to_string(slot));
  }
  EXPECT_EQ(services.instance()->slot, 0u);
  EXPECT_EQ(services.instance()->node, 1u);
}

TEST(LentCallbacks, AThrowingHostCallbackReturnsNormallyAndTheHookCallerReportsIt) {
  // The services table's log calls the host's log functor; this one throws, as a full disk or
  // an exhausted heap would make it.
  Services throwing{[](int32_t, const std::string&) { throw std::runtime_error("log sink is full"); }};
  const sf_host_services* t = throwing.table();
  t->log(t->ctx, SF_LOG_ERROR, "hello");  // from the plugin's side: a plain C call that returns
  EXPECT_EQ(take_lent_failure(), "log sink is full");
  EXPECT_EQ(take_lent_failure(), "") << "taken once";
  // A failure left by a callback surfaces as the hook's failure in PluginInstance::check.
  Services quiet{[](int32_t, const std::string&) {}};
  Loader loader(quiet.table());
  auto inst = loader.create(loader.load(fixture("sdk_app"), "sdk_app", SF_KIND_APP), {});
  t->log(t->ctx, SF_LOG_ERROR, "again");
  try {
    inst->check(SF_OK, "run");
    FAIL() << "check() let a callback failure pass";
  } catch (const PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("plugin 'sdk_app' run: a host callback it called failed: log sink is full"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(inst->check(SF_OK, "run"));
}

TEST_F(LoaderTest, ThrowingHookBecomesAStatusAndTheHostSurvives) {
  const LoadedPlugin& p = loader.load(fixture("throwing_framework"));
  auto inst = loader.create(p, {});
  auto* h = inst->hooks<sf_framework_hooks>();
  ASSERT_NE(h->around_app_enter, nullptr);
  EXPECT_EQ(h->around_client_enter, nullptr) << "hooks a plugin does not override stay NULL";
  EnvMap env;
  sf_env e = env.c_view();
  sf_instance_info info{};
  info.struct_size = sizeof info;
  sf_status st = h->around_app_enter(inst->self(), &info, &e);
  EXPECT_EQ(st, SF_ERR);
  try {
    inst->check(st, "around_app_enter");
    FAIL();
  } catch (const PluginError& err) {
    EXPECT_NE(std::string(err.what()).find("around_app_enter exploded"), std::string::npos) << err.what();
  }
}

TEST_F(LoaderTest, LoadingTwiceReturnsTheSamePlugin) {
  const LoadedPlugin& a = loader.load(fixture("ok_v1_0"));
  const LoadedPlugin& b = loader.load(fixture("ok_v1_0"));
  EXPECT_EQ(&a, &b);
}

}  // namespace

// A string_array option reaches the plugin as its elements joined by '\n' (docs/plugins.md).
TEST(SdkOptions, GetListSplitsAStringArrayOption) {
  const sf_kv kv[] = {{"hosts", "h1\nuser@h2:2222\nh3"}, {"one", "solo"}, {"none", ""}};
  skyforge::Options o(kv, 3);
  EXPECT_EQ(o.get_list("hosts"), (std::vector<std::string>{"h1", "user@h2:2222", "h3"}));
  EXPECT_EQ(o.get_list("one"), (std::vector<std::string>{"solo"}));
  EXPECT_TRUE(o.get_list("none").empty());
  EXPECT_TRUE(o.get_list("absent").empty());
}
