// Shared by the end-to-end tests of the framework plugins (test_framework_e2e.cpp,
// test_real_frameworks.cpp, test_examples.cpp): the fixture that gives each test its own TMPDIR and
// checks that the run left no process and no file behind, the Pythons that have the frameworks,
// and the helpers that read the nodes' output.
#pragma once

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "process.hpp"
#include "run_fixture.hpp"

namespace skyforge::test::fw_e2e {

using NodeEnv = std::map<std::string, std::string>;

// Debian's python3-torch imports under this Python only.
inline const std::string kSystemPython = "/usr/bin/python3";
// .ci/setup-venv's: jax, keras; and beside it tensorflow-cpu (with its own keras).
inline const std::string kVenvPython = std::string(SKYFORGE_VENV) + "/bin/python";
inline const std::string kTfVenvPython = std::string(SKYFORGE_VENV) + "-tf/bin/python";

// The last `n` characters of `s`, "..." before them where it was longer (a skip message's error).
inline std::string tail_of(const std::string& s, size_t n) {
  return s.size() > n ? "..." + s.substr(s.size() - n) : s;
}

class FrameworkE2E : public SkyforgeRunTest {
 protected:
  FrameworkE2E() : SkyforgeRunTest("skyforge-fw-e2e") {}
  std::unique_ptr<Child> start(const fs::path& manifest) { return start_skyforge({"run", manifest.string()}); }
  Output run(const fs::path& manifest, double timeout_s = 120) { return start(manifest)->wait(timeout_s); }
  // Any `skyforge` command line (validate, env, ...), under this test's TMPDIR.
  Output skyforge(const std::vector<std::string>& args, double timeout_s = 120) {
    return SkyforgeRunTest::skyforge(args, timeout_s);
  }
  // Any program, under this test's TMPDIR (python probes and JSON checks).
  Output exec(const std::vector<std::string>& argv, double timeout_s = 60) { return Child(argv, env()).wait(timeout_s); }
  // Empty when `python` imports `module`; else why not (for GTEST_SKIP).
  std::string cannot_import(const std::string& python, const std::string& module,
                            const std::map<std::string, std::string>& env_extra = {}) {
    if (::access(python.c_str(), X_OK) != 0) return "no " + python;
    auto e = env();
    e.insert(env_extra.begin(), env_extra.end());
    Output o = Child({python, "-c", "import " + module}, e).wait(120);
    if (o.exit_code == 0) return "";
    return python + " cannot import " + module + ": " + tail_of(o.err, 400);
  }
};

// "[node N] KEY=VALUE" lines -> per-node maps (only lines that look like KEY=VALUE).
inline std::map<int, NodeEnv> node_envs(const std::string& out) {
  std::map<int, NodeEnv> envs;
  std::regex line(R"(^\[node (\d+)\] ([A-Za-z_][A-Za-z0-9_]*)=(.*)$)");
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_match(l, m, line)) envs[std::stoi(m[1])][m[2]] = m[3];
  }
  return envs;
}

// Lines of node n's output, prefix removed.
inline std::vector<std::string> node_lines(const std::string& out, int n) {
  std::vector<std::string> v;
  const std::string prefix = "[node " + std::to_string(n) + "] ";
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);)
    if (l.rfind(prefix, 0) == 0) v.push_back(l.substr(prefix.size()));
  return v;
}

inline std::string manifest(int nodes, const std::string& plugins, const std::string& command,
                            const std::string& pool_extra = "") {
  return "[pool]\nprovider = \"local\"\nnodes = " + std::to_string(nodes) + "\n" + pool_extra + "\n" + plugins +
         "\n[job]\ncommand = " + command + "\n";
}

// A TOML array of basic strings: {"a", "b"} -> ["a", "b"] (paths here have no quote or backslash).
inline std::string toml_array(const std::vector<std::string>& words) {
  std::string s = "[";
  for (size_t i = 0; i < words.size(); ++i) s += (i ? ", \"" : "\"") + words[i] + "\"";
  return s + "]";
}

inline const std::string kEnvSort = R"(["sh", "-c", "env | sort"])";

inline bool is_port(const std::string& s) {
  return std::regex_match(s, std::regex(R"(\d{1,5})")) && std::stoi(s) > 0 && std::stoi(s) < 65536;
}

}  // namespace skyforge::test::fw_e2e
