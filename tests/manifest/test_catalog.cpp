// Plugin catalogue: plugin.toml parsing, search-path precedence, and manifest validation
// against the catalogue (kinds, options, defaults, positions).
#include "catalog.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "problems.hpp"

namespace fs = std::filesystem;
using namespace skyforge;
using namespace skyforge::test;

namespace {

const std::string kData = fs::path(SKYFORGE_TEST_DATA).lexically_normal().string();
const std::string kA = kData + "/plugins_a";
const std::string kB = kData + "/plugins_b";

bool contains(const std::vector<std::string>& lines, const std::string& needle) {
  for (const auto& l : lines)
    if (l.find(needle) != std::string::npos) return true;
  return false;
}

std::vector<std::string> names(const Catalog& c) {
  std::vector<std::string> out;
  for (const auto& p : c.plugins()) out.push_back(p.name);
  return out;
}

// Problems validate_against reports for `text` (fails the test when it passes).
std::vector<std::string> validation_problems(const std::string& text, const Catalog& c) {
  Manifest m = parse_manifest(text, "job.toml");
  return problems_refusing([&] { validate_against(m, c); }, "manifest passed validation:\n" + text);
}

std::string validation_problem(const std::string& text, const Catalog& c) {
  auto p = validation_problems(text, c);
  EXPECT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  return p.empty() ? "" : p.front();
}

// A manifest text and the one problem validate_against finds in it.
struct Refusal {
  std::string text, problem;
};

// Each text of `cases` fails validation against `c` with exactly its problem.
void expect_refused(const Catalog& c, const std::vector<Refusal>& cases) {
  for (const auto& [text, problem] : cases)
    EXPECT_EQ(validation_problem(text, c), problem) << ::testing::PrintToString(text);
}

// Restores an environment variable on scope exit.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST(PluginToml, ParsesEveryField) {
  PluginInfo p = parse_plugin_toml(kA + "/torch/plugin.toml");
  EXPECT_EQ(p.name, "torch");
  EXPECT_EQ(p.kind, "framework");
  EXPECT_EQ(p.library, kA + "/torch/libskyforge_torch.so");
  EXPECT_EQ(p.abi_major, 1);
  EXPECT_EQ(p.abi_minor, 0);
  EXPECT_EQ(p.version, "0.1.0");
  EXPECT_EQ(p.description, "PyTorch distributed environment");
  EXPECT_EQ(p.manifest_path, kA + "/torch/plugin.toml");
  EXPECT_EQ(p.name_pos.str(), kA + "/torch/plugin.toml:1:8");
  ASSERT_EQ(p.options.size(), 5u);  // in the order written
  EXPECT_EQ(p.options[0].name, "backend");
  EXPECT_EQ(p.options[0].type, "string");
  EXPECT_EQ(p.options[0].default_value, "gloo");
  EXPECT_EQ(p.options[0].choices, (std::vector<std::string>{"gloo", "nccl"}));
  EXPECT_FALSE(p.options[0].required);
  EXPECT_EQ(p.options[0].description, "process group backend");
  EXPECT_EQ(p.options[1].name, "port");
  EXPECT_EQ(p.options[1].default_value, "29500");
  EXPECT_EQ(p.options[2].name, "scale");
  EXPECT_EQ(p.options[2].default_value, "1.5");
  EXPECT_EQ(p.options[3].name, "verbose");
  EXPECT_EQ(p.options[3].default_value, "false");
  EXPECT_EQ(p.options[4].name, "tag");
  EXPECT_FALSE(p.options[4].default_value.has_value());
  ASSERT_NE(p.option("port"), nullptr);
  EXPECT_EQ(p.option("nope"), nullptr);

  PluginInfo local = parse_plugin_toml(kA + "/local/plugin.toml");
  EXPECT_EQ(local.library, kData + "/plugins_a/lib/libskyforge_local.so");  // "../lib/..." normalised
  EXPECT_EQ(local.abi_minor, 2);
}

TEST(PluginToml, ReportsEveryProblemWithPosition) {
  const std::string file = kData + "/plugins_bad/schema/plugin.toml";
  try {
    parse_plugin_toml(file);
    FAIL() << "accepted";
  } catch (const ManifestError& e) {
    const auto& p = e.problems();
    ASSERT_EQ(p.size(), 5u) << e.what();
    EXPECT_EQ(p[0], file + ":2:8: kind: expected one of framework, provider, app, task_backend, compute_backend "
                           "(did you mean 'framework'?), got a string (\"framwork\")");
    EXPECT_EQ(p[1], file + ":4:7: abi: expected a version string \"major.minor\" such as \"1.0\", got a string (\"one\")");
    EXPECT_EQ(p[2], file + ":5:1: unknown key 'colour' in plugin.toml (known: name, kind, library, abi, version, "
                           "description, options, after, max_nodes)");
    EXPECT_EQ(p[3], file + ":9:11: [options.a] default: expected an integer (the option's type), got a string (\"ten\")");
    EXPECT_EQ(p[4], file + ":12:8: [options.b] type: expected one of string, integer, float, boolean, string_array, got a string (\"text\")");
  }
}

TEST(PluginToml, SyntaxErrorAndMissingFile) {
  try {
    parse_plugin_toml(kData + "/plugins_bad/broken/plugin.toml");
    FAIL() << "accepted";
  } catch (const ManifestError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(kData + "/plugins_bad/broken/plugin.toml:2:", 0), 0u) << e.what();
  }
  EXPECT_THROW(parse_plugin_toml(kData + "/nowhere/plugin.toml"), ManifestError);
}

TEST(PluginToml, OptionSchemaRules) {
  const fs::path dir = fs::temp_directory_path() / ("skyforge-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& body) {
    std::ofstream(dir / "plugin.toml") << "name = \"p\"\nkind = \"framework\"\nlibrary = \"l.so\"\nabi = \"1.0\"\n" << body;
    return (dir / "plugin.toml").string();
  };
  auto problems = [&](const std::string& body) -> std::vector<std::string> {
    try {
      parse_plugin_toml(write(body));
    } catch (const ManifestError& e) {
      return e.problems();
    }
    return {};
  };
  EXPECT_TRUE(contains(problems("[options.x]\ntype = \"string\"\ndefault = \"c\"\nchoices = [\"a\", \"b\"]\n"),
                       "[options.x] default: \"c\" is not one of the choices (a, b)"));
  EXPECT_TRUE(contains(problems("[options.x]\ntype = \"integer\"\nrequired = true\ndefault = 3\n"),
                       "[options.x]: a required option cannot have a default"));
  EXPECT_TRUE(contains(problems("[options.x]\ntype = \"integer\"\nchoices = [1, \"2\"]\n"),
                       "[options.x] choices[1]: expected an integer, got a string (\"2\")"));
  EXPECT_TRUE(contains(problems("[options.x]\ndefault = 1\n"), "[options.x]: missing 'type'"));
  EXPECT_TRUE(contains(problems("[options.x]\ntype = \"string\"\nhelp = \"?\"\n"), "unknown key 'help' in [options.x]"));
  // A float option takes an integer default, stored as a float.
  PluginInfo p = parse_plugin_toml(write("[options.lr]\ntype = \"float\"\ndefault = 1\n"));
  ASSERT_EQ(p.options.size(), 1u);
  EXPECT_EQ(p.options[0].default_value, "1");
  fs::remove_all(dir);
}

TEST(PluginToml, RequiredFields) {
  const fs::path dir = fs::temp_directory_path() / ("skyforge-test-req-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "plugin.toml") << "version = \"1\"\n";
  try {
    parse_plugin_toml((dir / "plugin.toml").string());
    FAIL() << "accepted";
  } catch (const ManifestError& e) {
    EXPECT_EQ(e.problems().size(), 4u) << e.what();
    EXPECT_TRUE(contains(e.problems(), ":1:1: missing 'name'"));
    EXPECT_TRUE(contains(e.problems(), ":1:1: missing 'kind'"));
    EXPECT_TRUE(contains(e.problems(), ":1:1: missing 'library'"));
    EXPECT_TRUE(contains(e.problems(), ":1:1: missing 'abi'"));
  }
  fs::remove_all(dir);
}

TEST(Catalog, PrecedenceAndShadowing) {
  Catalog c({kA, kB});
  EXPECT_EQ(c.search_dirs(), (std::vector<std::string>{kA, kB}));
  EXPECT_EQ(names(c), (std::vector<std::string>{"cpu", "hello", "local", "needy", "torch", "threads"}));
  ASSERT_NE(c.find("torch"), nullptr);
  EXPECT_EQ(c.find("torch")->version, "0.1.0");  // plugins_b's 9.9.9 is shadowed
  EXPECT_EQ(c.find("threads")->kind, "task_backend");
  EXPECT_EQ(c.find("nope"), nullptr);
  EXPECT_TRUE(c.problems().empty()) << ::testing::PrintToString(c.problems());

  Catalog reversed({kB, kA});
  EXPECT_EQ(reversed.find("torch")->version, "9.9.9");
  EXPECT_EQ(reversed.plugins().front().name, "threads");
}

TEST(Catalog, DuplicateNameInOneDirectory) {
  Catalog c({kData + "/plugins_dup"});
  EXPECT_EQ(names(c), (std::vector<std::string>{"same"}));
  EXPECT_EQ(c.find("same")->library, kData + "/plugins_dup/a/liba.so");
  ASSERT_EQ(c.problems().size(), 1u);
  const std::string& p = c.problems()[0];
  EXPECT_EQ(p.rfind(kData + "/plugins_dup/b/plugin.toml:1:8: plugin name 'same' is also claimed by ", 0), 0u) << p;
  EXPECT_NE(p.find(kData + "/plugins_dup/a/plugin.toml"), std::string::npos) << p;
}

TEST(Catalog, BadPluginTomlIsAProblemNotAFailure) {
  Catalog c({kData + "/plugins_bad", kA});
  EXPECT_NE(c.find("good"), nullptr);
  EXPECT_NE(c.find("torch"), nullptr);
  EXPECT_EQ(c.find("broken"), nullptr);
  EXPECT_EQ(c.find("schema"), nullptr);
  EXPECT_EQ(c.problems().size(), 6u) << ::testing::PrintToString(c.problems());  // 1 syntax + 5 schema
  EXPECT_TRUE(contains(c.problems(), kData + "/plugins_bad/broken/plugin.toml:2:"));
  EXPECT_TRUE(contains(c.problems(), kData + "/plugins_bad/schema/plugin.toml:2:8: kind"));
}

TEST(Catalog, PluginTomlDirectlyInSearchDir) {
  Catalog c({kData + "/plugins_flat"});
  ASSERT_EQ(names(c), (std::vector<std::string>{"flat"}));
  EXPECT_EQ(c.find("flat")->library, kData + "/plugins_flat/libflat.so");
  EXPECT_EQ(c.find("flat")->abi_minor, 3);
}

TEST(Catalog, MissingDirectoriesAndDuplicatesAreFine) {
  Catalog c({kData + "/nowhere", kA + "/", kData + "/plugins_a/../plugins_a", ""});
  EXPECT_EQ(c.search_dirs(), (std::vector<std::string>{kData + "/nowhere", kA}));
  EXPECT_EQ(c.plugins().size(), 5u);
  EXPECT_TRUE(c.problems().empty());
  Catalog empty({});
  EXPECT_TRUE(empty.plugins().empty());
}

TEST(Catalog, DefaultSearchDirs) {
  ScopedEnv env("SKYFORGE_PLUGIN_PATH", (kB + "::" + kA + "/:relative/dir").c_str());
  auto dirs = Catalog::default_search_dirs({kA, "/opt/p"});
  ASSERT_EQ(dirs.size(), 5u) << ::testing::PrintToString(dirs);
  EXPECT_EQ(dirs[0], kA);
  EXPECT_EQ(dirs[1], "/opt/p");
  EXPECT_EQ(dirs[2], kB);
  EXPECT_EQ(dirs[3], fs::current_path().string() + "/relative/dir");
  const fs::path exe = fs::read_symlink("/proc/self/exe");
#ifdef SKYFORGE_PLUGIN_SUBDIR
  const std::string subdir = SKYFORGE_PLUGIN_SUBDIR;
#else
  const std::string subdir = "lib/skyforge/plugins";
#endif
  EXPECT_EQ(dirs[4], (exe.parent_path().parent_path() / subdir).lexically_normal().string());

  ScopedEnv unset("SKYFORGE_PLUGIN_PATH", nullptr);
  EXPECT_EQ(Catalog::default_search_dirs({}).size(), 1u);
}

TEST(Validate, FillsDefaultsAndCoercesTypes) {
  Catalog c({kA, kB});
  Manifest m = load_manifest(kData + "/manifests/full.toml");
  validate_against(m, c);
  EXPECT_EQ(m.pool.provider_options, (OptionList{{"isolation", "netns"}}));
  ASSERT_EQ(m.plugins.size(), 2u);
  EXPECT_EQ(m.plugins[0].options,
            (OptionList{{"backend", "nccl"}, {"port", "29400"}, {"scale", "1.5"}, {"verbose", "false"}}));
  EXPECT_EQ(m.plugins[0].option_types, (std::vector<std::string>{"string", "integer", "float", "boolean"}));
  ASSERT_EQ(m.plugins[0].option_pos.size(), 4u);
  EXPECT_EQ(m.plugins[0].option_pos[2].line, m.plugins[0].pos.line);  // defaults point at the plugin's name
  EXPECT_TRUE(m.plugins[1].options.empty());

  // Provider defaults; an integer given for a float option becomes a float.
  Manifest m2 = parse_manifest("[[plugins]]\nname = \"torch\"\nscale = 2\n[job]\ncommand = [\"x\"]\n", "job.toml");
  validate_against(m2, c);
  EXPECT_EQ(m2.pool.provider_options, (OptionList{{"isolation", "none"}}));
  EXPECT_EQ(m2.plugins[0].options[0], (std::pair<std::string, std::string>{"scale", "2"}));
  EXPECT_EQ(m2.plugins[0].option_types[0], "float");
}

TEST(Validate, MissingPluginListsSearchedDirectories) {
  Catalog c({kA, kB});
  expect_refused(c, {
      {"[pool]\nprovider = \"slurmm\"\n[job]\ncommand = [\"x\"]\n",
       "job.toml:2:12: [pool] provider: no plugin named 'slurmm' (searched: " + kA + ", " + kB + ")"},
      {"[[plugins]]\nname = \"troch\"\n[job]\ncommand = [\"x\"]\n",
       "job.toml:2:8: [[plugins]] name: no plugin named 'troch' (searched: " + kA + ", " + kB +
           ") (did you mean 'torch'?)"},
      {"[job]\napp = \"nope\"\n",
       "job.toml:2:7: [job] app: no plugin named 'nope' (searched: " + kA + ", " + kB + ")"},
  });
  // The default provider, when missing, is reported at the top of the file.
  Catalog empty({kData + "/nowhere"});
  EXPECT_EQ(validation_problem("[job]\ncommand = [\"x\"]\n", empty),
            "job.toml:1:1: [pool] provider: no plugin named 'local' (searched: " + kData + "/nowhere)");
  // Broken plugin.toml files in the path are mentioned, since one may be the plugin meant.
  Catalog bad({kData + "/plugins_bad", kA});
  EXPECT_NE(validation_problem("[job]\napp = \"broken\"\n", bad).find("6 plugin.toml problem(s) in the search path"),
            std::string::npos);
}

// A manifest asking a provider for more nodes than its plugin.toml max_nodes is refused at the
// `nodes` line (nodes = 100000 on local used to try 100,000 bootstraps).
TEST(Validate, NodesAboveTheProvidersMaximumAreRefused) {
  Catalog c({kA, kB});
  EXPECT_EQ(validation_problem("[pool]\nnodes = 65\n[job]\ncommand = [\"x\"]\n", c),
            "job.toml:2:9: [pool] nodes: the 'local' provider makes at most 64 nodes, got 65 (max_nodes in " + kA +
                "/local/plugin.toml)");
  Manifest m = parse_manifest("[pool]\nnodes = 64\n[job]\ncommand = [\"x\"]\n", "job.toml");
  EXPECT_NO_THROW(validate_against(m, c));
}

TEST(Validate, KindsMustMatch) {
  Catalog c({kA, kB});
  auto p = validation_problem("[pool]\nprovider = \"torch\"\n[job]\ncommand = [\"x\"]\n", c);
  EXPECT_EQ(p, "job.toml:2:12: [pool] provider: plugin 'torch' (" + kA +
                   "/torch/plugin.toml) is a framework plugin, expected provider (framework plugins go in [[plugins]])");
  p = validation_problem("[job]\napp = \"cpu\"\n", c);
  EXPECT_EQ(p, "job.toml:2:7: [job] app: plugin 'cpu' (" + kA + "/cpu/plugin.toml) is a compute_backend plugin, expected app");
  p = validation_problem("[[plugins]]\nname = \"local\"\n[job]\ncommand = [\"x\"]\n", c);
  EXPECT_EQ(p, "job.toml:2:8: [[plugins]] name: plugin 'local' (" + kA +
                   "/local/plugin.toml) is a provider plugin, expected framework or compute_backend (a task backend is "
                   "named in [tasks] backend)");
  // Compute backends are accepted in [[plugins]]; a task backend is a map job's [tasks] backend.
  Manifest m = parse_manifest("[[plugins]]\nname = \"cpu\"\n[job]\napp = \"hello\"\n", "job.toml");
  EXPECT_NO_THROW(validate_against(m, c));
  p = validation_problem("[[plugins]]\nname = \"threads\"\n[job]\ncommand = [\"x\"]\n", c);
  EXPECT_NE(p.find("is a task_backend plugin, expected framework or compute_backend"), std::string::npos) << p;
  m = parse_manifest("[job]\napp = \"hello\"\nmode = \"map\"\ntasks = 4\n[tasks]\nbackend = \"threads\"\n", "job.toml");
  validate_against(m, c);
  EXPECT_EQ(m.job.task_options, (OptionList{{"batch_size", "0"}}));  // its default filled in
  p = validation_problem("[job]\napp = \"hello\"\nmode = \"map\"\ntasks = 4\n[tasks]\nbackend = \"cpu\"\n", c);
  EXPECT_EQ(p, "job.toml:6:11: [tasks] backend: plugin 'cpu' (" + kA +
                   "/cpu/plugin.toml) is a compute_backend plugin, expected task_backend");
  p = validation_problem("[job]\napp = \"hello\"\nmode = \"map\"\ntasks = 4\n[tasks]\nbackend = \"threads\"\nbatch = 3\n", c);
  EXPECT_NE(p.find("job.toml:7:9: [tasks]: unknown option 'batch' for plugin 'threads'"), std::string::npos) << p;
  // The default backend must be installed for a map job.
  p = validation_problem("[job]\napp = \"hello\"\nmode = \"map\"\ntasks = 4\n", c);
  EXPECT_NE(p.find("job.toml:3:8: [tasks] backend: no plugin named 'joblib'"), std::string::npos) << p;
}

TEST(Validate, PluginListedTwice) {
  Catalog c({kA});
  EXPECT_EQ(validation_problem("[[plugins]]\nname = \"cpu\"\n[[plugins]]\nname = \"cpu\"\n[job]\ncommand = [\"x\"]\n", c),
            "job.toml:4:8: [[plugins]] name: plugin 'cpu' is listed twice (first at job.toml:2:8)");
}

TEST(Validate, OptionErrors) {
  Catalog c({kA});
  expect_refused(c, {
      {"[[plugins]]\nname = \"torch\"\nbakend = \"nccl\"\n[job]\ncommand = [\"x\"]\n",
       "job.toml:3:10: [[plugins]] torch: unknown option 'bakend' for plugin 'torch' (known: backend, port, "
       "scale, verbose, tag) (did you mean 'backend'?)"},
      {"[[plugins]]\nname = \"cpu\"\nthreads = 4\n[job]\ncommand = [\"x\"]\n",
       "job.toml:3:11: [[plugins]] cpu: unknown option 'threads' for plugin 'cpu' (it takes no options)"},
      {"[[plugins]]\nname = \"torch\"\nport = \"29400\"\n[job]\ncommand = [\"x\"]\n",
       "job.toml:3:8: [[plugins]] torch port: expected an integer, got a string (\"29400\")"},
      {"[[plugins]]\nname = \"torch\"\nport = 1.5\n[job]\ncommand = [\"x\"]\n",
       "job.toml:3:8: [[plugins]] torch port: expected an integer, got a float (1.5)"},
      {"[[plugins]]\nname = \"torch\"\nverbose = 1\n[job]\ncommand = [\"x\"]\n",
       "job.toml:3:11: [[plugins]] torch verbose: expected a boolean, got an integer (1)"},
      {"[[plugins]]\nname = \"torch\"\nbackend = \"mpi\"\n[job]\ncommand = [\"x\"]\n",
       "job.toml:3:11: [[plugins]] torch backend: 'mpi' is not one of: gloo, nccl"},
      {"[[plugins]]\nname = \"needy\"\nlevel = 5\ntoken = \"t\"\n[job]\ncommand = [\"x\"]\n",
       "job.toml:3:9: [[plugins]] needy level: '5' is not one of: 1, 2, 3"},
      {"[[plugins]]\nname = \"needy\"\n[job]\ncommand = [\"x\"]\n",
       "job.toml:2:8: [[plugins]] needy: missing required option 'token' of plugin 'needy' (string: access token)"},
      {"[provider]\nisolation = \"vm\"\n[job]\ncommand = [\"x\"]\n",
       "job.toml:2:13: [provider] isolation: 'vm' is not one of: none, netns"},
      {"[provider]\nisolaton = \"netns\"\n[job]\ncommand = [\"x\"]\n",
       "job.toml:2:12: [provider]: unknown option 'isolaton' for plugin 'local' (known: isolation) (did you mean "
       "'isolation'?)"},
  });
}

TEST(Validate, CollectsAllProblemsInSourceOrder) {
  Catalog c({kA});
  auto p = validation_problems(
      "[pool]\n"                  // 1
      "provider = \"nope\"\n"     // 2
      "[provider]\n"              // 3
      "anything = 1\n"            // 4  (not checked: the provider is unknown)
      "[[plugins]]\n"             // 5
      "name = \"torch\"\n"        // 6
      "backend = 3\n"             // 7
      "extra = true\n"            // 8
      "[[plugins]]\n"             // 9
      "name = \"needy\"\n"        // 10
      "[image]\n"                 // 11
      "files = [{ source = \"missing.csv\", target = \"m.csv\" }]\n"  // 12
      "[job]\n"                   // 13
      "app = \"torch\"\n",        // 14
      c);
  ASSERT_EQ(p.size(), 6u) << ::testing::PrintToString(p);
  EXPECT_EQ(p[0].substr(0, 14), "job.toml:2:12:");
  EXPECT_EQ(p[1].substr(0, 14), "job.toml:7:11:");
  EXPECT_EQ(p[2].substr(0, 13), "job.toml:8:9:");
  EXPECT_EQ(p[3].substr(0, 14), "job.toml:10:8:");
  EXPECT_EQ(p[4], "job.toml:12:21: [image] files source: " + fs::current_path().string() + "/missing.csv does not exist");
  EXPECT_EQ(p[5].substr(0, 14), "job.toml:14:7:");
}

// Array options (plugin.toml type = "string_array"): what a provider's `hosts = [...]` needs.
// They cross the ABI joined by '\n'; the SDK's Options::get_list splits them (tests/sdk).
TEST(Validate, StringArrayOptions) {
  const fs::path dir = fs::temp_directory_path() / ("skyforge-arrays-" + std::to_string(::getpid()));
  fs::create_directories(dir / "lister");
  std::ofstream(dir / "lister" / "plugin.toml")
      << "name = \"lister\"\nkind = \"framework\"\nlibrary = \"liblister.so\"\nabi = \"1.0\"\n"
         "[options.hosts]\ntype = \"string_array\"\nrequired = true\n"
         "[options.tags]\ntype = \"string_array\"\ndefault = [\"a\", \"b c\"]\n";
  Catalog c({dir.string(), kA});  // kA: the local provider
  Manifest m = parse_manifest("[[plugins]]\nname = \"lister\"\nhosts = [\"h1\", \"user@h2:2222\"]\n[job]\ncommand = [\"x\"]\n",
                              "job.toml");
  validate_against(m, c);
  EXPECT_EQ(m.plugins[0].options, (OptionList{{"hosts", "h1\nuser@h2:2222"}, {"tags", "a\nb c"}}));
  EXPECT_EQ(m.plugins[0].option_types[0], "string_array");
  auto parse_problem = [](const std::string& text) -> std::string {
    try {
      parse_manifest(text, "job.toml");
    } catch (const ManifestError& e) {
      return e.problems().empty() ? "" : e.problems().front();
    }
    return "(parsed)";
  };
  EXPECT_EQ(parse_problem("[[plugins]]\nname = \"lister\"\nhosts = [\"h1\", 2]\n[job]\ncommand = [\"x\"]\n"),
            "job.toml:3:16: [[plugins]] lister hosts[1]: expected a string (an array option holds strings), got an "
            "integer (2)");
  EXPECT_EQ(parse_problem("[[plugins]]\nname = \"lister\"\nhosts = [\"\"]\n[job]\ncommand = [\"x\"]\n"),
            "job.toml:3:10: [[plugins]] lister hosts[0]: an element of an array option must be a non-empty string "
            "without a newline");
  EXPECT_EQ(validation_problem("[[plugins]]\nname = \"lister\"\nhosts = \"h1\"\n[job]\ncommand = [\"x\"]\n", c),
            "job.toml:3:9: [[plugins]] lister hosts: expected a string_array, got a string (\"h1\")");
  // An array given for a scalar option is refused, naming both.
  std::ofstream(dir / "lister" / "plugin.toml", std::ios::app) << "[options.port]\ntype = \"integer\"\ndefault = 22\n";
  Catalog c2({dir.string(), kA});
  EXPECT_EQ(validation_problem("[[plugins]]\nname = \"lister\"\nhosts = [\"h\"]\nport = [\"22\"]\n[job]\ncommand = [\"x\"]\n",
                               c2),
            "job.toml:4:8: [[plugins]] lister port: expected an integer, got a string_array ([\"22\"])");
  // A string_array option takes no choices.
  std::ofstream(dir / "lister" / "plugin.toml", std::ios::app) << "[options.z]\ntype = \"string_array\"\nchoices = [[\"a\"]]\n";
  try {
    parse_plugin_toml((dir / "lister" / "plugin.toml").string());
    ADD_FAILURE() << "choices on a string_array were accepted";
  } catch (const ManifestError& e) {
    EXPECT_NE(std::string(e.what()).find("[options.z] choices: a string_array option takes no choices"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}
