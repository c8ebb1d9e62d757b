// Small helpers shared by the keras_sdk tests.
#pragma once

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("skyforge_keras_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path path;
};

// Exit status of a shell command (-1 when it did not exit normally).
inline int run_command(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  if (st == -1 || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

// The project's venv python when it exists and imports tensorboard; "" otherwise.
inline std::string& skip_reason() {
  static std::string reason;
  return reason;
}
inline std::string venv_python_or_skip() {
  const std::string py = VENV_PYTHON;
  std::string& reason = skip_reason();
  if (!std::filesystem::exists(py)) {
    reason = std::string("no ") + VENV_PYTHON +
             ": create it with `python3 -m venv .venv && .venv/bin/pip install tensorboard` in the source tree";
    return "";
  }
  if (run_command(py + " -c 'import tensorboard' >/dev/null 2>&1") != 0) {
    reason = py + " cannot import tensorboard: run `" + py + " -m pip install tensorboard`";
    return "";
  }
  return py;
}
