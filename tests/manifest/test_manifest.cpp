// Manifest parsing: schema, defaults, positions and error messages.
#include "manifest.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "problems.hpp"

namespace fs = std::filesystem;
using namespace skyforge;
using namespace skyforge::test;

namespace {

const std::string kData = SKYFORGE_TEST_DATA;

// The single problem of a manifest text.
std::string problem_of(const std::string& text) {
  auto p = problems_of(text);
  EXPECT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  return p.empty() ? "" : p.front();
}

const std::string kJob = "[job]\napp = \"hello\"\n";

// A manifest text and the one problem it is refused with.
struct Refusal {
  std::string text, problem;
};

// Each text of `cases` is refused with exactly its problem.
void expect_refused(const std::vector<Refusal>& cases) {
  for (const auto& [text, problem] : cases) EXPECT_EQ(problem_of(text), problem) << ::testing::PrintToString(text);
}

}  // namespace

TEST(SourcePos, Formats) {
  EXPECT_EQ((SourcePos{"job.toml", 3, 9}).str(), "job.toml:3:9");
  EXPECT_EQ((SourcePos{"job.toml", 0, 0}).str(), "job.toml");
}

// The suggestion's edit distance stops as soon as a candidate cannot be within the budget. It
// must still suggest exactly what the full optimal-string-alignment table would.
namespace {
size_t full_osa(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string reference_suggestion(const std::string& word, const std::vector<std::string>& candidates) {
  const size_t budget = std::clamp<size_t>(word.size() / 3, 1, 3);
  const std::string* best = nullptr;
  size_t best_d = budget + 1;
  for (const auto& c : candidates) {
    const size_t d = full_osa(word, c);
    if (d < best_d) best_d = d, best = &c;
  }
  if (!best || best_d == 0) return "";
  return " (did you mean '" + *best + "'?)";
}
}  // namespace

TEST(DidYouMean, SuggestsTheNearestCandidateWithinTheBudget) {
  const std::vector<std::string> known = {"torch", "jax", "keras", "tensorflow", "huggingface"};
  EXPECT_EQ(detail::did_you_mean("troch", known), " (did you mean 'torch'?)");  // a transposition
  EXPECT_EQ(detail::did_you_mean("kears", known), " (did you mean 'keras'?)");
  EXPECT_EQ(detail::did_you_mean("tensorflw", known), " (did you mean 'tensorflow'?)");
  EXPECT_EQ(detail::did_you_mean("keras", known), "");  // a known word needs no suggestion
  EXPECT_EQ(detail::did_you_mean("pytorch-lightning", known), "");
  EXPECT_EQ(detail::did_you_mean(std::string(4000, 'k'), known), "");
}

TEST(DidYouMean, AgreesWithTheFullTableOnRandomWords) {
  // Words over a 3-letter alphabet so that near misses (and transpositions) are common.
  std::mt19937 rng(20261126);
  auto word = [&](size_t max_len) {
    std::string w(rng() % (max_len + 1), 'a');
    for (char& c : w) c = static_cast<char>('a' + rng() % 3);
    return w;
  };
  for (int round = 0; round < 20000; ++round) {
    std::vector<std::string> candidates(1 + rng() % 6);
    for (auto& c : candidates) c = word(10);
    const std::string w = word(12);
    ASSERT_EQ(detail::did_you_mean(w, candidates), reference_suggestion(w, candidates)) << "word '" << w << "'";
  }
}

TEST(OutputPolicy, Names) {
  EXPECT_STREQ(to_string(OutputPolicy::All), "all");
  EXPECT_STREQ(to_string(OutputPolicy::Head), "head");
  EXPECT_STREQ(to_string(OutputPolicy::None), "none");
}

TEST(ManifestError, JoinsProblemsOnePerLine) {
  ManifestError e(std::vector<std::string>{"a:1:1: x", "a:2:1: y"});
  EXPECT_STREQ(e.what(), "a:1:1: x\na:2:1: y");
  ASSERT_EQ(e.problems().size(), 2u);
}

TEST(Manifest, MinimalGetsDefaults) {
  Manifest m = load_manifest(kData + "/manifests/minimal.toml");
  EXPECT_EQ(m.path, fs::path(kData + "/manifests/minimal.toml").lexically_normal().string());
  EXPECT_EQ(m.dir, fs::path(kData + "/manifests").lexically_normal().string());
  EXPECT_EQ(m.pool.provider, "local");
  EXPECT_EQ(m.pool.nodes, 1u);
  EXPECT_EQ(m.pool.concurrency, 1u);
  EXPECT_EQ(m.pool.accelerator, "");
  EXPECT_TRUE(m.pool.provider_options.empty());
  EXPECT_EQ(m.pool.provider_pos.str(), m.path.substr(0, 0) + kData + "/manifests/minimal.toml:1:1");
  EXPECT_TRUE(m.image.apt.empty());
  EXPECT_TRUE(m.image.pip.empty());
  EXPECT_TRUE(m.image.env.empty());
  EXPECT_TRUE(m.image.files.empty());
  EXPECT_TRUE(m.plugins.empty());
  EXPECT_EQ(m.job.command, (std::vector<std::string>{"python3", "train.py"}));
  EXPECT_EQ(m.job.app, "");
  EXPECT_EQ(m.job.mode, JobMode::broadcast);
  EXPECT_FALSE(m.job.has_tasks);
  EXPECT_EQ(m.job.tasks, 0u);
  EXPECT_EQ(m.job.task_backend, "joblib");
  EXPECT_TRUE(m.job.task_options.empty());
  EXPECT_EQ(m.job.stdout_policy, OutputPolicy::All);
  EXPECT_EQ(m.job.stderr_policy, OutputPolicy::All);
  EXPECT_EQ(m.job.timeout_s, 0.0);
  EXPECT_TRUE(m.job.plugin_path.empty());
}

TEST(Manifest, FullManifestRoundTrip) {
  const std::string file = kData + "/manifests/full.toml";
  Manifest m = load_manifest(file);
  const std::string dir = fs::path(kData + "/manifests").lexically_normal().string();
  EXPECT_EQ(m.dir, dir);

  EXPECT_EQ(m.pool.provider, "local");
  EXPECT_EQ(m.pool.provider_pos.str(), file + ":3:12");
  EXPECT_EQ(m.pool.nodes, 4u);
  EXPECT_EQ(m.pool.concurrency, 2u);
  EXPECT_EQ(m.pool.accelerator, "A100:1");
  EXPECT_EQ(m.pool.accelerator_count, 1u);
  ASSERT_EQ(m.pool.provider_options, (OptionList{{"isolation", "netns"}}));
  EXPECT_EQ(m.pool.provider_option_types, (std::vector<std::string>{"string"}));
  ASSERT_EQ(m.pool.provider_option_pos.size(), 1u);
  EXPECT_EQ(m.pool.provider_option_pos[0].str(), file + ":9:13");

  EXPECT_EQ(m.image.apt, (std::vector<std::string>{"curl", "libgomp1=12.2.0-14"}));
  EXPECT_EQ(m.image.pip, (std::vector<std::string>{"numpy==1.26", "torch>=2.1"}));
  EXPECT_EQ(m.image.env, (std::map<std::string, std::string>{{"FOO", "bar"}, {"OMP_NUM_THREADS", "4"}}));
  ASSERT_EQ(m.image.files.size(), 1u);
  EXPECT_EQ(m.image.files[0].source, dir + "/data/x.csv");
  EXPECT_EQ(m.image.files[0].target, "inputs/x.csv");
  EXPECT_EQ(m.image.files[0].pos.line, 15);

  ASSERT_EQ(m.plugins.size(), 2u);
  EXPECT_EQ(m.plugins[0].name, "torch");
  EXPECT_EQ(m.plugins[0].pos.str(), file + ":18:8");
  EXPECT_EQ(m.plugins[0].options, (OptionList{{"backend", "nccl"}, {"port", "29400"}}));
  EXPECT_EQ(m.plugins[0].option_types, (std::vector<std::string>{"string", "integer"}));
  ASSERT_EQ(m.plugins[0].option_pos.size(), 2u);
  EXPECT_EQ(m.plugins[0].option_pos[0].str(), file + ":19:11");
  EXPECT_EQ(m.plugins[0].option_pos[1].str(), file + ":20:8");
  EXPECT_EQ(m.plugins[1].name, "cpu");
  EXPECT_TRUE(m.plugins[1].options.empty());

  EXPECT_EQ(m.job.app, "hello");
  EXPECT_EQ(m.job.app_pos.str(), file + ":26:7");
  EXPECT_TRUE(m.job.command.empty());
  EXPECT_EQ(m.job.mode, JobMode::map);
  EXPECT_FALSE(m.job.has_tasks);
  EXPECT_EQ(m.job.inputs, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(m.job.task_backend, "threads");
  EXPECT_EQ(m.job.task_options, (OptionList{{"batch_size", "16"}}));
  EXPECT_EQ(m.job.task_option_types, (std::vector<std::string>{"integer"}));
  EXPECT_EQ(m.job.stdout_policy, OutputPolicy::Head);
  EXPECT_EQ(m.job.stderr_policy, OutputPolicy::None);
  EXPECT_DOUBLE_EQ(m.job.timeout_s, 2.5);
  EXPECT_EQ(m.job.plugin_path,
            (std::vector<std::string>{fs::path(kData + "/plugins_a").lexically_normal().string(), "/opt/skyforge/plugins"}));
}

TEST(Manifest, LoadAndParseAgree) {
  const std::string file = kData + "/manifests/full.toml";
  Manifest a = load_manifest(file);
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Manifest b = parse_manifest(text, file);
  EXPECT_EQ(a.path, b.path);
  EXPECT_EQ(a.plugins[0].options, b.plugins[0].options);
  EXPECT_EQ(a.job.inputs, b.job.inputs);
}

TEST(Manifest, MissingFile) {
  try {
    load_manifest(kData + "/manifests/does-not-exist.toml");
    FAIL() << "accepted a missing file";
  } catch (const ManifestError& e) {
    EXPECT_NE(std::string(e.what()).find("does-not-exist.toml: cannot read manifest: No such file or directory"),
              std::string::npos)
        << e.what();
  }
}

TEST(Manifest, DirectoryIsNotAManifest) {
  EXPECT_THROW(load_manifest(kData + "/manifests"), ManifestError);
}

TEST(Manifest, SyntaxErrorKeepsTomlPosition) {
  std::string p = problem_of("[job]\napp = \n");
  EXPECT_EQ(p.rfind("job.toml:2:", 0), 0u) << p;
  EXPECT_NE(p.find("TOML syntax error"), std::string::npos) << p;
  EXPECT_NE(p.find("missing value"), std::string::npos) << p;
  EXPECT_EQ(p.find('\n'), std::string::npos) << "one line per problem: " << p;

  p = problem_of("[job]\napp = \"x\"\napp = \"y\"\n");
  EXPECT_EQ(p.rfind("job.toml:3:", 0), 0u) << p;
  EXPECT_NE(p.find("already exists"), std::string::npos) << p;

  p = problem_of("[job]\ncommand = [\"a\",\n");
  EXPECT_EQ(p.rfind("job.toml:", 0), 0u) << p;
}

TEST(Manifest, NodesZero) {
  EXPECT_EQ(problem_of("[pool]\nprovider = \"local\"\nnodes = 0\n" + kJob),
            "job.toml:3:9: [pool] nodes: expected an integer >= 1, got 0");
}

TEST(Manifest, WrongTypesNameExpectedAndActual) {
  expect_refused({
      {"[pool]\nnodes = \"4\"\n" + kJob, "job.toml:2:9: [pool] nodes: expected an integer >= 1, got a string (\"4\")"},
      {"[pool]\nconcurrency = 1.5\n" + kJob,
       "job.toml:2:15: [pool] concurrency: expected an integer >= 1, got a float (1.5)"},
      {"[pool]\nprovider = 3\n" + kJob,
       "job.toml:2:12: [pool] provider: expected a non-empty string, got an integer (3)"},
      {"[pool]\naccelerator = true\n" + kJob,
       "job.toml:2:15: [pool] accelerator: expected a string, got a boolean (true)"},
      {"pool = 3\n" + kJob, "job.toml:1:8: pool: expected a table ([pool]), got an integer (3)"},
  });
}

TEST(Manifest, AcceleratorSpecIsCheckedAtItsLine) {
  expect_refused({
      {"[pool]\naccelerator = \"A100:0\"\n" + kJob,
       "job.toml:2:15: [pool] accelerator 'A100:0': count '0' is not a positive integer (expected NAME, "
       "NAME:COUNT per node or NAME(mig=PROFILE), e.g. \"A100:2\")"},
      {"[pool]\naccelerator = \"A100(foo=1)\"\n" + kJob,
       "job.toml:2:15: [pool] accelerator 'A100(foo=1)': unknown parameter 'foo' (known: mig) (expected NAME, "
       "NAME:COUNT per node or NAME(mig=PROFILE), e.g. \"A100:2\")"},
  });
}

TEST(Manifest, IntegerOverflowIsRefused) {
  auto p = problem_of("[pool]\nnodes = 99999999999999999999\n" + kJob);
  EXPECT_EQ(p, "job.toml:2:9: [pool] nodes: expected an integer >= 1, got an integer out of the 64-bit range");
  p = problem_of("[pool]\nnodes = 4294967296\n" + kJob);
  EXPECT_EQ(p, "job.toml:2:9: [pool] nodes: expected an integer between 1 and 4294967295, got 4294967296");
  // INT64_MAX itself is read exactly (toml11 saturates silently; the literal is read again), and
  // then refused by the task ceiling with its true value; one more is out of range.
  expect_refused({
      {"[job]\napp = \"a\"\nmode = \"map\"\ntasks = 9_223_372_036_854_775_807\n",
       "job.toml:4:9: [job] tasks: expected an integer between 1 and 10000000, got 9223372036854775807"},
      {"[job]\napp = \"a\"\nmode = \"map\"\ntasks = 9_223_372_036_854_775_808\n",
       "job.toml:4:9: [job] tasks: expected an integer >= 1, got an integer out of the 64-bit range"},
  });
}

TEST(Manifest, UnknownKeyPointsAtKeyAndListsKnown) {
  auto lines = problems_of("[job]\napp = \"hello\"\nstdot = \"all\"\n");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "job.toml:3:1: unknown key 'stdot' in [job] (known: app, command, mode, tasks, inputs, batch, stdout, "
            "stderr, timeout, plugin_path, options, max_restarts, collective_timeout, outputs, outputs_dir, outputs_max_bytes) "
            "(did you mean 'stdout'?)");
  EXPECT_EQ(problem_of("[pool]\n  nods = 2\n" + kJob),
            "job.toml:2:3: unknown key 'nods' in [pool] (known: provider, nodes, concurrency, accelerator) (did you "
            "mean 'nodes'?)");
  // Quoted keys point at the opening quote.
  EXPECT_EQ(problem_of("[image]\n\"weird key\" = 1\n" + kJob).substr(0, 14), "job.toml:2:1: ");
  // A sub-table of a known table points at its header.
  EXPECT_EQ(problem_of("[job]\napp = \"x\"\n[job.extra]\na = 1\n").substr(0, 14), "job.toml:3:1: ");
  EXPECT_EQ(problem_of("[image]\nfiles = [{ source = \"a\", target = \"b\", mode = 1 }]\n" + kJob),
            "job.toml:2:40: unknown key 'mode' in [image] files[0] (known: source, target)");
}

TEST(Manifest, UnknownTopLevelTablesAndKeys) {
  expect_refused({
      {kJob + "[jbo]\nx = 1\n",
       "job.toml:3:1: unknown table [jbo] (known: pool, provider, image, plugins, job, tasks, train, search) (did you "
       "mean 'job'?)"},
      {"nodes = 4\n" + kJob,
       "job.toml:1:1: unknown key 'nodes' at top level (known tables: pool, provider, image, plugins, job, tasks, "
       "train, search)"},
  });
}

TEST(Manifest, MissingJob) {
  expect_refused({
      {"[pool]\nnodes = 2\n",
       "job.toml:1:1: missing [job] table: a manifest needs [job] with 'app' or 'command', or a [train] table"},
      {"", "job.toml:1:1: missing [job] table: a manifest needs [job] with 'app' or 'command', or a [train] table"},
  });
}

TEST(Manifest, CollectsAllProblemsInSourceOrder) {
  const std::string text =
      "[pool]\n"               // 1
      "nodes = 0\n"            // 2
      "concurrency = -1\n"     // 3
      "colour = \"red\"\n"     // 4
      "[image]\n"              // 5
      "apt = [\"-y\"]\n"       // 6
      "[job]\n"                // 7
      "app = \"a\"\n"          // 8
      "command = [\"b\"]\n"    // 9
      "stdout = \"some\"\n"    // 10
      "timeout = -3\n";        // 11
  auto lines = problems_of(text);
  ASSERT_EQ(lines.size(), 7u) << ::testing::PrintToString(lines);
  EXPECT_EQ(lines[0].substr(0, 12), "job.toml:2:9");
  EXPECT_EQ(lines[1].substr(0, 14), "job.toml:3:15:");
  EXPECT_EQ(lines[2].substr(0, 13), "job.toml:4:1:");
  EXPECT_EQ(lines[3].substr(0, 13), "job.toml:6:8:");
  EXPECT_EQ(lines[4], "job.toml:9:1: [job]: 'app' and 'command' are mutually exclusive (app is set at job.toml:8:7)");
  EXPECT_EQ(lines[5], "job.toml:10:10: [job] stdout: expected one of \"all\", \"head\", \"none\", got a string (\"some\")");
  EXPECT_EQ(lines[6],
            "job.toml:11:11: [job] timeout: expected a number of seconds >= 0 (0 = no timeout), got an integer (-3)");
}

TEST(Manifest, JobNeedsAppOrCommand) {
  expect_refused({
      {"[job]\nmode = \"single\"\n",
       "job.toml:1:1: [job]: expected exactly one of 'app' (a native app plugin) or 'command' (an array: "
       "program and arguments)"},
      {"[job]\ncommand = []\n",
       "job.toml:2:11: [job] command: expected a non-empty array of strings, got an empty array"},
      {"[job]\ncommand = [\"python3\", 3]\n", "job.toml:2:23: [job] command[1]: expected a string, got an integer (3)"},
      {"[job]\ncommand = [\"\"]\n", "job.toml:2:12: [job] command[0]: the program must not be an empty string"},
      {"[job]\napp = \"\"\n", "job.toml:2:7: [job] app: expected a non-empty string, got a string (\"\")"},
      {"[job]\napp = \"a b\"\n",
       "job.toml:2:7: [job] app: \"a b\" is not a valid plugin name (letters, digits, '_', '-', '.')"},
  });
}

TEST(Manifest, Modes) {
  Manifest m = parse_manifest("[job]\ncommand = [\"x\"]\nmode = \"single\"\n", "job.toml");
  EXPECT_EQ(m.job.mode, JobMode::single);

  m = parse_manifest("[job]\napp = \"sq\"\nmode = \"map\"\ntasks = 1000\n", "job.toml");
  EXPECT_TRUE(m.job.has_tasks);
  EXPECT_EQ(m.job.tasks, 1000u);
  EXPECT_TRUE(m.job.inputs.empty());

  expect_refused({
      {"[job]\napp = \"a\"\nmode = \"scatter\"\ntasks = 3\n",
       "job.toml:3:8: [job] mode: expected one of \"broadcast\", \"single\", \"map\", got a string (\"scatter\")"},
      {"[job]\ncommand = [\"x\"]\nmode = \"map\"\ntasks = 3\n",
       "job.toml:3:8: [job] mode: \"map\" needs 'app' (a native app exporting a task function); a command "
       "cannot be mapped"},
      {"[job]\napp = \"a\"\nmode = \"map\"\n",
       "job.toml:3:8: [job] mode: \"map\" needs 'tasks' (a count) or 'inputs' (an array of strings)"},
      {"[job]\napp = \"a\"\nmode = \"map\"\ntasks = 2\ninputs = [\"x\"]\n",
       "job.toml:5:1: [job]: 'tasks' and 'inputs' are mutually exclusive (tasks is set at job.toml:4:9)"},
      {"[job]\napp = \"a\"\nmode = \"map\"\ntasks = 0\n", "job.toml:4:9: [job] tasks: expected an integer >= 1, got 0"},
      {"[job]\napp = \"a\"\nmode = \"map\"\ninputs = []\n",
       "job.toml:4:10: [job] inputs: expected a non-empty array of strings, got an empty array"},
  });
  // Batching is the task backend's: [job] batch says where it went.
  EXPECT_EQ(problem_of("[job]\napp = \"a\"\nmode = \"map\"\ntasks = 2\nbatch = 4\n"),
            "job.toml:5:1: [job] batch: a map job's batching is its task backend's: write it as [tasks] batch_size = 4 "
            "(0 = automatic)");
  // tasks / inputs (and [tasks]) only in map mode (broadcast is the default mode).
  auto lines = problems_of("[job]\napp = \"a\"\ntasks = 2\ninputs = [\"x\"]\n[tasks]\nbatch_size = 4\n");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "job.toml:3:1: [job] tasks: only allowed with mode = \"map\" (mode is \"broadcast\")");
  EXPECT_EQ(lines[1].substr(0, 13), "job.toml:4:1:");
  EXPECT_EQ(lines[2], "job.toml:5:1: [tasks]: only a map job has a task backend ([job] mode = \"map\"; mode is \"broadcast\")");
}

TEST(Manifest, TasksTableNamesTheBackendAndKeepsItsOptions) {
  Manifest m = parse_manifest("[job]\napp = \"a\"\nmode = \"map\"\ntasks = 9\n", "job.toml");
  EXPECT_EQ(m.job.task_backend, "joblib");  // the default
  EXPECT_EQ(m.job.task_backend_pos.str(), "job.toml:3:8");
  m = parse_manifest("[job]\napp = \"a\"\nmode = \"map\"\ntasks = 9\n[tasks]\nbackend = \"mine\"\nretries = 2\n"
                     "retry_failed = true\n",
                     "job.toml");
  EXPECT_EQ(m.job.task_backend, "mine");
  EXPECT_EQ(m.job.task_backend_pos.str(), "job.toml:6:11");
  EXPECT_EQ(m.job.task_options, (OptionList{{"retries", "2"}, {"retry_failed", "true"}}));
  EXPECT_EQ(m.job.task_option_pos[1].str(), "job.toml:8:16");
  EXPECT_EQ(problem_of("[job]\napp = \"a\"\nmode = \"map\"\ntasks = 9\n[tasks]\nbackend = \"no way\"\n"),
            "job.toml:6:11: [tasks] backend: \"no way\" is not a valid plugin name (letters, digits, '_', '-', '.')");
}

TEST(Manifest, OutputPoliciesAndTimeout) {
  Manifest m = parse_manifest("[job]\napp = \"a\"\nstdout = \"none\"\nstderr = \"head\"\ntimeout = 30\n", "job.toml");
  EXPECT_EQ(m.job.stdout_policy, OutputPolicy::None);
  EXPECT_EQ(m.job.stderr_policy, OutputPolicy::Head);
  EXPECT_DOUBLE_EQ(m.job.timeout_s, 30.0);
  expect_refused({
      {"[job]\napp = \"a\"\nstderr = 1\n",
       "job.toml:3:10: [job] stderr: expected one of \"all\", \"head\", \"none\", got an integer (1)"},
      {"[job]\napp = \"a\"\ntimeout = \"10s\"\n",
       "job.toml:3:11: [job] timeout: expected a number of seconds >= 0 (0 = no timeout), got a string (\"10s\")"},
      {"[job]\napp = \"a\"\ntimeout = inf\n",
       "job.toml:3:11: [job] timeout: expected a number of seconds >= 0 (0 = no timeout), got a float (inf)"},
  });
}

TEST(Manifest, RelativePathsResolveAgainstManifestDirectory) {
  const std::string cwd = fs::current_path().string();
  Manifest m = parse_manifest(
      "[image]\nfiles = [{ source = \"../data/x.csv\", target = \"./a//b.csv\" }]\n"
      "[job]\napp = \"a\"\nplugin_path = [\"plugins\", \"/abs/dir/\"]\n",
      "sub/dir/job.toml");
  EXPECT_EQ(m.path, cwd + "/sub/dir/job.toml");
  EXPECT_EQ(m.dir, cwd + "/sub/dir");
  ASSERT_EQ(m.image.files.size(), 1u);
  EXPECT_EQ(m.image.files[0].source, cwd + "/sub/data/x.csv");
  EXPECT_EQ(m.image.files[0].target, "a/b.csv");
  EXPECT_EQ(m.job.plugin_path, (std::vector<std::string>{cwd + "/sub/dir/plugins", "/abs/dir"}));
}

TEST(Manifest, ImageValidation) {
  expect_refused({
      {"[image]\napt = [\"curl\", \"-o Dpkg::x\"]\n" + kJob,
       "job.toml:2:16: [image] apt[1]: package \"-o Dpkg::x\" must not start with '-'"},
      {"[image]\napt = [\"curl; rm -rf /\"]\n" + kJob,
       "job.toml:2:8: [image] apt[0]: package \"curl; rm -rf /\" contains ';' (a Debian package name, "
       "optionally =version or :arch)"},
      {"[image]\npip = [\"--index-url=x\"]\n" + kJob,
       "job.toml:2:8: [image] pip[0]: requirement \"--index-url=x\" must not start with '-' (pip options are "
       "not accepted)"},
      {"[image]\npip = \"numpy\"\n" + kJob,
       "job.toml:2:7: [image] pip: expected an array of strings, got a string (\"numpy\")"},
      {"[image]\nenv = { 1BAD = \"x\" }\n" + kJob,
       "job.toml:2:9: [image] env: \"1BAD\" is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)"},
      {"[image]\nenv = { N = 4 }\n" + kJob, "job.toml:2:13: [image] env.N: expected a string, got an integer (4)"},
      {"[image.env]\nA = \"1\"\nB = false\n" + kJob,
       "job.toml:3:5: [image] env.B: expected a string, got a boolean (false)"},
      {"[image]\nfiles = [{ source = \"x\", target = \"/etc/passwd\" }]\n" + kJob,
       "job.toml:2:35: [image] files[0] target: expected a path relative to the node's work directory, got "
       "\"/etc/passwd\""},
      {"[image]\nfiles = [{ source = \"x\", target = \"a/../../b\" }]\n" + kJob,
       "job.toml:2:35: [image] files[0] target: must not contain '..', got \"a/../../b\""},
      {"[image]\nfiles = [{ target = \"b\" }]\n" + kJob,
       "job.toml:2:10: [image] files[0]: missing 'source' (a path relative to the manifest's directory)"},
      {"[image]\nfiles = [\"x\"]\n" + kJob,
       "job.toml:2:10: [image] files[0]: expected a table { source = \"...\", target = \"...\" }, got a string "
       "(\"x\")"},
  });
  // [[image.files]] works as well as the inline form.
  Manifest m = parse_manifest("[[image.files]]\nsource = \"s\"\ntarget = \"t\"\n" + kJob, "/tmp/job.toml");
  ASSERT_EQ(m.image.files.size(), 1u);
  EXPECT_EQ(m.image.files[0].source, "/tmp/s");
}

TEST(Manifest, PluginsKeepOptionsInWrittenOrderAsCanonicalText) {
  Manifest m = parse_manifest(
      "[[plugins]]\n"
      "name = \"torch\"\n"
      "zeta = \"text\"\n"
      "alpha = 0x10\n"
      "mid = 2.50\n"
      "big = 1e300\n"
      "flag = true\n"
      "[[plugins]]\n"
      "name = \"jax\"\n" +
          kJob,
      "job.toml");
  ASSERT_EQ(m.plugins.size(), 2u);
  EXPECT_EQ(m.plugins[0].options,
            (OptionList{{"zeta", "text"}, {"alpha", "16"}, {"mid", "2.5"}, {"big", "1e+300"}, {"flag", "true"}}));
  EXPECT_EQ(m.plugins[0].option_types, (std::vector<std::string>{"string", "integer", "float", "float", "boolean"}));
  ASSERT_EQ(m.plugins[0].option_pos.size(), 5u);
  EXPECT_EQ(m.plugins[0].option_pos[3].str(), "job.toml:6:7");
  EXPECT_EQ(m.plugins[1].name, "jax");
  EXPECT_EQ(m.plugins[1].pos.str(), "job.toml:9:8");
}

TEST(Manifest, PluginsErrors) {
  expect_refused({
      {"[[plugins]]\nbackend = \"gloo\"\n" + kJob,
       "job.toml:1:1: [[plugins]] #1: missing 'name' (the framework plugin to use)"},
      {"plugins = [\"torch\"]\n" + kJob,
       "job.toml:1:12: [[plugins]] #1: expected a table with 'name' and the plugin's options, got a string "
       "(\"torch\")"},
      {"plugins = { name = \"torch\" }\n" + kJob,
       "job.toml:1:11: plugins: expected an array of tables ([[plugins]]), got a table"},
  });
  // Arrays of strings are options too (plugin.toml type = "string_array"); of anything else, not.
  expect_refused({
      {"[[plugins]]\nname = \"torch\"\nhosts = [1]\n" + kJob,
       "job.toml:3:10: [[plugins]] torch hosts[0]: expected a string (an array option holds strings), got an "
       "integer (1)"},
      {"[[plugins]]\nname = \"../evil\"\n" + kJob,
       "job.toml:2:8: [[plugins]] name: \"../evil\" is not a valid plugin name (letters, digits, '_', '-', '.')"},
  });
}

TEST(Manifest, ProviderOptions) {
  Manifest m = parse_manifest("[pool]\nprovider = \"ssh\"\n[provider]\nhosts = \"a,b\"\nport = 22\n" + kJob, "job.toml");
  EXPECT_EQ(m.pool.provider, "ssh");
  EXPECT_EQ(m.pool.provider_pos.str(), "job.toml:2:12");
  EXPECT_EQ(m.pool.provider_options, (OptionList{{"hosts", "a,b"}, {"port", "22"}}));
  EXPECT_EQ(problem_of("[provider]\nnet = { a = 1 }\n" + kJob),
            "job.toml:2:7: [provider] net: expected a string, integer, float, boolean or array of strings, got a table");
  // Without a `provider` key, the provider's position is the [pool] header.
  m = parse_manifest("\n[pool]\nnodes = 2\n" + kJob, "job.toml");
  EXPECT_EQ(m.pool.provider_pos.str(), "job.toml:2:1");
}

// toml11 copies a value's line for every value: a long line is refused (with its line number)
// before it can take minutes; the same array one element per line is accepted.
TEST(Manifest, LongLinesAndHugeDocumentsAreRefusedBeforeParsing) {
  std::string one_line = "[job]\napp = \"hello\"\nmode = \"map\"\ninputs = [";
  std::string per_line = one_line + "\n";
  for (int i = 0; i < 20000; ++i) {
    one_line += (i ? ",\"" : "\"") + std::to_string(i) + "\"";
    per_line += "  \"" + std::to_string(i) + "\",\n";
  }
  one_line += "]\n";
  per_line += "]\n";
  const std::string why = problem_of(one_line);
  EXPECT_EQ(why.rfind("job.toml:4:1: a line of " + std::to_string(one_line.size() - 1 - one_line.find("inputs")) +
                          " bytes; a manifest's lines are at most 4096 bytes",
                      0),
            0u)
      << why;
  EXPECT_NE(why.find("put an array's elements on lines of their own"), std::string::npos) << why;
  const Manifest m = parse_manifest(per_line, "job.toml");
  ASSERT_EQ(m.job.inputs.size(), 20000u);
  EXPECT_EQ(m.job.inputs.back(), "19999");
  // The last line counts too without a newline at its end; a line of exactly the limit is fine.
  EXPECT_NE(problem_of(kJob + "# " + std::string(5000, 'x')).find("job.toml:3:1: a line of 5002 bytes"), std::string::npos)
      << problem_of(kJob + "# " + std::string(5000, 'x'));
  EXPECT_NO_THROW(parse_manifest(kJob + "# " + std::string(4094, 'x') + "\n", "job.toml"));
  EXPECT_EQ(problem_of(std::string(2u << 20, '\n') + kJob), "job.toml: larger than 1 MiB");
}

// Counts that would exhaust a node or the host are refused at their line (they used to abort
// the host or make a worker spawn threads until it died).
TEST(Manifest, ConcurrencyAndTaskCountsHaveCeilings) {
  expect_refused({
      {"[pool]\nconcurrency = 2147483648\n" + kJob,
       "job.toml:2:15: [pool] concurrency: expected an integer between 1 and 1024, got 2147483648"},
      {"[job]\napp = \"hello\"\nmode = \"map\"\ntasks = 1099511627776\n",
       "job.toml:4:9: [job] tasks: expected an integer between 1 and 10000000, got 1099511627776"},
  });
  const Manifest m = parse_manifest("[pool]\nconcurrency = 1024\n[job]\napp = \"hello\"\nmode = \"map\"\ntasks = 10000000\n",
                                    "job.toml");
  EXPECT_EQ(m.pool.concurrency, 1024u);
  EXPECT_EQ(m.job.tasks, 10000000u);
}

TEST(Manifest, MaxRestartsAndCollectiveTimeout) {
  const Manifest m = parse_manifest("[job]\napp = \"hello\"\nmax_restarts = 3\ncollective_timeout = 2.5\n", "job.toml");
  EXPECT_EQ(m.job.max_restarts, 3u);
  EXPECT_EQ(m.job.collective_timeout_s, 2.5);
  EXPECT_TRUE(m.job.collective_timeout_given);
  EXPECT_EQ(parse_manifest(kJob, "job.toml").job.collective_timeout_s, 60);
  expect_refused({
      {kJob + "collective_timeout = 0\n",
       "job.toml:3:22: [job] collective_timeout: expected a number of seconds from 0.1 to 86400, got an integer (0)"},
      {kJob + "max_restarts = 101\n",
       "job.toml:3:16: [job] max_restarts: expected an integer between 0 and 100, got 101"},
  });
  EXPECT_NE(problem_of("[job]\napp = \"hello\"\nmode = \"map\"\ntasks = 3\nmax_restarts = 1\n")
                .find("a map job survives a lost node through [tasks] retries = N"),
            std::string::npos);
}

// TOML is UTF-8; toml11 3.7 reads past its buffer reporting a bad sequence inside a multi-line
// string (found by tests/fuzz/fuzz_manifest): every byte is checked before it parses.
TEST(Manifest, BytesThatAreNotUtf8AreRefusedBeforeParsing) {
  expect_refused({
      {kJob + "x = \'\'\'a\xff\'\'\'\n", "job.toml:3:9: not UTF-8 (byte 0xFF): a manifest is UTF-8 text"},
      {"# caf\xc3\n" + kJob, "job.toml:1:6: not UTF-8 (byte 0xC3): a manifest is UTF-8 text"},
  });
  EXPECT_EQ(problem_of(kJob + "x = \"\xed\xa0\x80\"\n"), "job.toml:3:6: not UTF-8 (byte 0xED): a manifest is UTF-8 text")
      << "a UTF-16 surrogate";
  EXPECT_EQ(problem_of(kJob + "x = \"\xc0\xaf\"\n"), "job.toml:3:6: not UTF-8 (byte 0xC0): a manifest is UTF-8 text")
      << "an overlong form";
  const Manifest m = parse_manifest("# caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x80\n" + kJob, "job.toml");
  EXPECT_EQ(m.job.app, "hello");
}

TEST(Manifest, DeepNestingIsRefusedBeforeParsing) {
  const std::string deep = "x = " + std::string(100000, '[') + std::string(100000, ']') + "\n" + kJob;
  EXPECT_EQ(problem_of(deep), "job.toml:1:69: arrays and inline tables nested deeper than 64 levels");
  // Brackets inside strings and comments do not count.
  const std::string brackets(200, '[');
  Manifest m = parse_manifest("# " + brackets + "\n[job]\ncommand = [\"" + brackets + "\", '" + brackets + "', \"\"\"\n" +
                                  brackets + "\n\"\"\"]\n",
                              "job.toml");
  ASSERT_EQ(m.job.command.size(), 3u);
  EXPECT_EQ(m.job.command[0], brackets);
}

TEST(Manifest, GarbageNeverCrashes) {
  // A few hostile inputs of the kind the fuzzer produces: each is refused with a ManifestError.
  for (const std::string& text :
       {std::string("\0\0\0", 3), std::string("[job]\napp = \"a\\u0000b\"\n"), std::string("[[job]]\napp=\"x\"\n"),
        std::string("job = []\n"), std::string("[job]\ncommand = [[\"a\"]]\n"), std::string("\xff\xfe[job]\n"),
        std::string("[job]\ntimeout = 1979-05-27T07:32:00Z\napp=\"x\"\n")}) {
    EXPECT_THROW(parse_manifest(text, "job.toml"), ManifestError) << ::testing::PrintToString(text);
  }
}
