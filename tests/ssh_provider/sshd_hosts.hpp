// Real hosts for the ssh provider's tests: one network namespace per host on a bridge of its own
// (the local provider's NetnsPool), each running Debian's OpenSSH server as root without systemd
// (`sshd -D -e -f <config>`), with host keys, a user key, known_hosts and a client configuration
// made here. Traffic between the hosts and this machine is real TCP between distinct addresses,
// on the bridge only: nothing is routed anywhere else.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "netns.hpp"
#include "spawn.hpp"

namespace skyforge::test {

class SshdHosts {
 public:
  // "" when real hosts can be made here; otherwise why not (the tests skip, naming it).
  static std::string unavailable() {
    if (::geteuid() != 0) return "not root: sshd and network namespaces need root";
    if (::access(kSshd, X_OK) != 0) return std::string("no ") + kSshd + " (Debian: apt-get install openssh-server)";
    if (providers::find_program("ssh").empty() || providers::find_program("ssh-keygen").empty())
      return "no ssh or ssh-keygen (Debian: apt-get install openssh-client)";
    try {
      local::NetnsPool::check_supported();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }

  // `n` hosts; their files under `dir`.
  SshdHosts(const std::filesystem::path& dir, uint32_t n)
      : dir_(dir), net_("ssh-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++)) {
    std::filesystem::create_directories(dir_);
    std::filesystem::create_directories("/run/sshd");  // sshd's privilege separation directory
    ::chmod("/run/sshd", 0755);
    keygen(identity());
    std::filesystem::copy_file(identity().string() + ".pub", dir_ / "authorized_keys");
    net_.create_bridge(n);
    std::ofstream known(known_hosts());
    for (uint32_t i = 0; i < n; ++i) {
      net_.add_node(i);
      const std::string addr = net_.node_address(i);
      addresses_.push_back(addr);
      const auto key = dir_ / ("host" + std::to_string(i));
      keygen(key);
      known << addr << " " << first_two_words(key.string() + ".pub") << "\n";
      const auto conf = dir_ / ("sshd" + std::to_string(i) + ".conf");
      std::ofstream(conf) << "ListenAddress " << addr << "\nHostKey " << key.string()
                          << "\nPidFile none\nAuthorizedKeysFile " << (dir_ / "authorized_keys").string()
                          << "\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                             "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel ERROR\n";
      sshd_.push_back(start_sshd(i, conf));
    }
    known.close();
    std::ofstream(ssh_config()) << "Host *\n  UserKnownHostsFile " << known_hosts().string() << "\n  IdentityFile "
                                << identity().string() << "\n  IdentitiesOnly yes\n  User root\n";
    for (uint32_t i = 0; i < n; ++i) wait_listening(addresses_[i]);
  }
  ~SshdHosts() {
    for (uint32_t i = 0; i < sshd_.size(); ++i) stop_sshd(i);
    for (uint32_t i = 0; i < addresses_.size(); ++i) net_.remove_node(i);
    net_.remove_bridge();
  }

  const std::vector<std::string>& addresses() const { return addresses_; }
  std::string gateway() const { return net_.gateway(); }
  std::filesystem::path ssh_config() const { return dir_ / "ssh_config"; }
  std::filesystem::path known_hosts() const { return dir_ / "known_hosts"; }
  std::filesystem::path identity() const { return dir_ / "id_ed25519"; }
  // A TOML array of the hosts: ["10.200.7.2", ...].
  std::string hosts_toml() const {
    std::string s = "[";
    for (size_t i = 0; i < addresses_.size(); ++i) s += (i ? ", \"" : "\"") + addresses_[i] + "\"";
    return s + "]";
  }
  // A key of the same kind that no host accepts.
  std::filesystem::path stranger_key() {
    auto k = dir_ / "stranger_ed25519";
    if (!std::filesystem::exists(k)) keygen(k);
    return k;
  }

  // Stops host i's OpenSSH server: the listener and every session it runs (sshd processes in the
  // host's namespace), as when a host's sshd is killed.
  void stop_sshd(uint32_t i) {
    if (i >= sshd_.size() || sshd_[i] <= 0) return;
    ::kill(sshd_[i], SIGKILL);
    ::waitpid(sshd_[i], nullptr, 0);
    sshd_[i] = -1;
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream comm(e.path() / "comm");
      std::string c;
      std::getline(comm, c);
      if (c == "sshd" && netns_of(std::stoi(name)) == ns_inode_[i]) ::kill(std::stoi(name), SIGKILL);
    }
  }

 private:
  static constexpr const char* kSshd = "/usr/sbin/sshd";
  static int& counter() {
    static int c = 0;
    return c;
  }
  static void keygen(const std::filesystem::path& key) {
    auto r = providers::run_command({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "skyforge-test", "-f", key.string()});
    if (r.status != 0) throw std::runtime_error("ssh-keygen: " + r.err);
  }
  static std::string first_two_words(const std::filesystem::path& pub) {
    std::ifstream in(pub);
    std::string a, b;
    in >> a >> b;
    return a + " " + b;
  }
  static std::string netns_of(pid_t pid) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/ns/net", ec);
    return ec ? "" : target.string();
  }
  pid_t start_sshd(uint32_t i, const std::filesystem::path& conf) {
    providers::Fd ns = net_.open_netns(i);
    providers::Fd log(::open((dir_ / ("sshd" + std::to_string(i) + ".log")).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    providers::SpawnSpec s;
    s.argv = {kSshd, "-D", "-e", "-f", conf.string()};
    s.env = providers::environment_with({});
    s.netns_fd = ns.get();
    s.stdout_fd = log.get();
    pid_t pid = providers::spawn(s);
    ns_inode_.push_back(netns_of(pid));
    return pid;
  }
  static void wait_listening(const std::string& addr) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      providers::Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(22);
      ::inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
      if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw std::runtime_error("sshd on " + addr + " did not start listening within 10 s");
  }

  std::filesystem::path dir_;
  local::NetnsPool net_;
  std::vector<std::string> addresses_;
  std::vector<pid_t> sshd_;
  std::vector<std::string> ns_inode_;
};

}  // namespace skyforge::test
