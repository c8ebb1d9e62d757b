// Shared by the end-to-end tests of the providers that reach other hosts (ssh, slurm): reading
// the runs' results, the examples with another [pool], and finding what a run left running.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../support/read_text.hpp"

namespace skyforge::test {

// Processes (but this one) whose command line mentions `text`: the ssh clients name their
// control socket, srun its job; both lie in or name the test's TMPDIR or pool.
inline std::vector<pid_t> processes_mentioning(const std::string& text) {
  std::vector<pid_t> found;
  for (auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string name = e.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0])) || std::stoi(name) == ::getpid()) continue;
    std::ifstream f(e.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (cmd.find(text) != std::string::npos) found.push_back(std::stoi(name));
  }
  return found;
}

// The "key": value of node `node`'s JSON result line ("weights_fnv1a64", "test_accuracy").
inline std::string json_field(const std::string& out, int node, const std::string& key) {
  std::regex re("\\[node " + std::to_string(node) + "\\] => \\{.*\"" + key + "\": \"?([^\",}]*)");
  std::smatch m;
  return std::regex_search(out, m, re) ? m[1].str() : "";
}

// "[node N] key=value" of node `node` ("allreduce", "weights": the torch DDP script's lines).
inline std::string node_value(const std::string& out, int node, const std::string& key) {
  std::smatch m;
  std::regex re("\\[node " + std::to_string(node) + "\\] " + key + "=(.*)");
  return std::regex_search(out, m, re) ? m[1].str() : "";
}

// examples/<file> with its [pool] table replaced by `pool` and its ../runs/ outputs under `runs`.
inline std::string example_manifest(const std::string& file, const std::string& pool, const std::filesystem::path& runs) {
  std::string text = read_text(std::filesystem::path(SKYFORGE_SOURCE_DIR) / "examples" / file);
  auto begin = text.find("[pool]");
  auto end = text.find("\n[", begin + 1);
  text = text.substr(0, begin) + pool + text.substr(end + 1);
  return std::regex_replace(text, std::regex(R"(\.\./runs/)"), runs.string() + "/");
}

}  // namespace skyforge::test
