// Test helpers: run the real `skyforge` binary, capture its output, and look for anything a
// run left behind (processes, directories) under the test's own TMPDIR.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace skyforge::test {

namespace fs = std::filesystem;

struct Output {
  int exit_code = -1;  // 128+sig when killed
  std::string out, err;
  double seconds = 0;
};

// Starts argv[0] (a path) with this process's environment plus `env_extra`, its stdout and
// stderr the write ends of two new pipes; returns its pid and the read ends in out_fd/err_fd.
inline pid_t spawn_with_pipes(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env_extra,
                              int& out_fd, int& err_fd) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC)) throw std::runtime_error("pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  std::vector<std::string> envs;
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string s(*e);
    auto eq = s.find('=');
    if (eq != std::string::npos) env[s.substr(0, eq)] = s.substr(eq + 1);
  }
  for (auto& [k, v] : env_extra) env[k] = v;
  for (auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> cenv, cargv;
  for (auto& e : envs) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  std::vector<std::string> a = argv;
  for (auto& s : a) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(out[0]);
    close(err[0]);
    throw std::runtime_error("posix_spawn " + argv[0]);
  }
  out_fd = out[0];
  err_fd = err[0];
  return pid;
}

// A child process with its stdout/stderr drained into strings.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env_extra) {
    start_ = std::chrono::steady_clock::now();
    pid_ = spawn_with_pipes(argv, env_extra, out_fd_, err_fd_);
    reader_ = std::thread([this] { drain(); });
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      wait(30);
    }
    if (reader_.joinable()) reader_.join();
  }
  pid_t pid() const { return pid_; }
  void signal(int sig) { ::kill(pid_, sig); }

  // Waits for exit (up to timeout_s, then SIGKILL and records -1).
  Output wait(double timeout_s) {
    auto deadline = start_ + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    int status = 0;
    Output o;
    for (;;) {
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    reaped_ = true;
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (reader_.joinable()) reader_.join();
    o.out = out_;
    o.err = err_;
    if (status == -1) o.exit_code = -1;
    else if (WIFEXITED(status)) o.exit_code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) o.exit_code = 128 + WTERMSIG(status);
    return o;
  }

  // What it wrote to stderr so far.
  std::string err_so_far() {
    std::lock_guard<std::mutex> l(mu_);
    return err_;
  }

  // Waits until stdout contains `needle` (true) or timeout.
  bool wait_for_output(const std::string& needle, double timeout_s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (out_.find(needle) != std::string::npos || err_.find(needle) != std::string::npos) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

 private:
  void drain() {
    pollfd p[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    int open_fds = 2;
    char buf[65536];
    while (open_fds > 0) {
      if (poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      for (int i = 0; i < 2; ++i) {
        if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = read(p[i].fd, buf, sizeof buf);
        if (n <= 0) {
          close(p[i].fd);
          p[i].fd = -1;
          --open_fds;
          continue;
        }
        std::lock_guard<std::mutex> l(mu_);
        (i == 0 ? out_ : err_).append(buf, static_cast<size_t>(n));
      }
    }
  }
  pid_t pid_ = -1;
  bool reaped_ = false;
  int out_fd_ = -1, err_fd_ = -1;
  std::mutex mu_;
  std::string out_, err_;
  std::thread reader_;
  std::chrono::steady_clock::time_point start_;
};

// Processes whose working directory lies under `dir` (what a pool under that TMPDIR started).
inline std::vector<pid_t> processes_under(const fs::path& dir) {
  std::vector<pid_t> found;
  std::string prefix = fs::weakly_canonical(dir).string();
  for (auto& e : fs::directory_iterator("/proc")) {
    std::string name = e.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::error_code ec;
    auto cwd = fs::read_symlink(e.path() / "cwd", ec);
    if (ec) continue;
    std::string c = cwd.string();
    if (c.rfind(prefix, 0) == 0) found.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return found;
}

inline std::string comm_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/comm");
  std::string s;
  std::getline(f, s);
  return s;
}

// Waits up to timeout_s for every process under `dir` to be gone; returns those left.
inline std::vector<pid_t> wait_no_processes_under(const fs::path& dir, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  for (;;) {
    auto left = processes_under(dir);
    if (left.empty() || std::chrono::steady_clock::now() > deadline) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

inline std::vector<std::string> entries_of(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename().string());
  return out;
}

}  // namespace skyforge::test
