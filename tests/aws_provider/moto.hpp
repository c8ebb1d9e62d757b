// A real EC2 API for the aws tests: moto's server (PyPI `moto[server]`, in the project's .venv),
// started on loopback by the test, with signature checks on: the first requests make an IAM
// user with an allow-all policy and its access key, every later request must be signed with it.
// Everything the tests send goes to 127.0.0.1 only.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "ec2_client.hpp"
#include "spawn.hpp"

namespace skyforge::aws::testing {

// A TCP socket on a free port of loopback (SO_REUSEADDR), listening with `backlog` when that is
// above 0; `port` is its port.
inline int loopback_socket(int& port, int backlog = 0) {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  if (backlog > 0) ::listen(s, backlog);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return s;
}

inline int free_loopback_port() {
  int port = 0;
  ::close(loopback_socket(port));
  return port;
}

inline bool connects(int port) {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

inline std::string moto_server_path() { return MOTO_SERVER; }
inline bool moto_available() { return std::filesystem::exists(moto_server_path()); }
// Why the moto tests skip here ("" when they can run).
inline std::string moto_missing() {
  return moto_available() ? "" : "no moto_server at " + moto_server_path() + " (run .ci/setup-venv: it installs moto[server] into .venv)";
}

class MotoServer {
 public:
  MotoServer() {
    port_ = free_loopback_port();
    log_ = std::filesystem::temp_directory_path() / ("skyforge-moto-" + std::to_string(::getpid()) + "-" +
                                                     std::to_string(port_) + ".log");
    int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    providers::SpawnSpec spec;
    spec.argv = {moto_server_path(), "-H", "127.0.0.1", "-p", std::to_string(port_)};
    spec.env = providers::environment_with({{"PYTHONUNBUFFERED", "1"}});
    spec.stdout_fd = fd;
    spec.parent_death_signal = SIGKILL;
    pid_ = providers::spawn(spec);
    ::close(fd);
    for (int i = 0; i < 300 && !connects(port_); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!connects(port_)) throw std::runtime_error("moto_server did not listen on port " + std::to_string(port_));
    make_signing_user();
  }
  ~MotoServer() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
    std::error_code ec;
    std::filesystem::remove(log_, ec);
  }
  MotoServer(const MotoServer&) = delete;
  MotoServer& operator=(const MotoServer&) = delete;

  int port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // The IAM user's key: every request signed otherwise fails.
  const Credentials& credentials() const { return credentials_; }
  ResolvedAws aws(const std::string& region = "us-east-1") const {
    ResolvedAws a;
    a.credentials = credentials_;
    a.region = region;
    a.endpoint = endpoint();
    a.profile = "test";
    return a;
  }

 private:
  void make_signing_user() {
    // POST /moto-api/reset-auth with the number of requests let through unchecked.
    ResolvedAws bootstrap;
    bootstrap.credentials = {"AKIDBOOTSTRAP", "bootstrap-secret-unchecked", "", "the test's bootstrap"};
    bootstrap.region = "us-east-1";
    bootstrap.endpoint = endpoint();
    reset_auth(3);
    ClientOptions iam_opts;
    iam_opts.service = "iam";
    iam_opts.api_version = "2010-05-08";
    iam_opts.max_attempts = 1;
    Ec2Client iam(bootstrap, iam_opts);
    iam.call("CreateUser", {{"UserName", "skyforge-test"}});
    iam.call("PutUserPolicy", {{"UserName", "skyforge-test"},
                               {"PolicyName", "all"},
                               {"PolicyDocument",
                                R"({"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]})"}});
    auto doc = iam.call("CreateAccessKey", {{"UserName", "skyforge-test"}});
    credentials_.access_key_id = doc.select_node("//AccessKeyId").node().child_value();
    credentials_.secret_access_key = doc.select_node("//SecretAccessKey").node().child_value();
    credentials_.source = "the test's IAM user";
    if (credentials_.access_key_id.empty()) throw std::runtime_error("moto: CreateAccessKey gave no key");
  }

  void reset_auth(int unchecked) {
    int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("moto: connect");
    std::string body = std::to_string(unchecked);
    std::string req = "POST /moto-api/reset-auth HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
                      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    ::send(s, req.data(), req.size(), MSG_NOSIGNAL);
    std::string reply;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(s, buf, sizeof buf, 0)) > 0) reply.append(buf, size_t(n));
    ::close(s);
    if (reply.find(" 200 ") == std::string::npos) throw std::runtime_error("moto: reset-auth failed: " + reply);
  }

  int port_ = 0;
  pid_t pid_ = -1;
  std::filesystem::path log_;
  Credentials credentials_;
};

}  // namespace skyforge::aws::testing
