// The aws end-to-end tests' hypervisor: moto's instances are records, not machines, so this
// harness makes a machine for each one moto reports running -- a network namespace of its own at
// the private address moto assigned (in a VPC subnet the test owns), on a bridge of the test's
// namespace, running the instance's user data as root (as cloud-init would) and an OpenSSH
// server that takes the instance's key pair (as EC2's metadata would). A power-off inside the
// machine becomes TerminateInstances when the instance's shutdown behaviour says terminate; an
// instance moto calls terminated loses its machine (every process in its namespace killed).
// Each machine has its own /run/skyforge (a private mount), where the dead-man switch's lease
// file lives.
//
// Everything runs inside the test's own network namespace (test_aws_e2e.cpp's main): loopback
// and this bridge only, so an address moto hands out that is not a machine here is unreachable.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <openssl/evp.h>

#include "ec2_client.hpp"
#include "ec2_pool.hpp"
#include "spawn.hpp"

namespace skyforge::aws::testing {

class Ec2Hypervisor {
 public:
  static constexpr const char* kSubnetPrefix = "10.213.7.";

  Ec2Hypervisor(ResolvedAws aws, std::filesystem::path dir)
      : ec2_(aws, quick()), dir_(std::move(dir)), tag_(std::to_string(::getpid() % 100000)) {
    std::filesystem::create_directories(dir_);
    std::filesystem::create_directories("/run/sshd");
    std::filesystem::create_directories("/run/skyforge");  // each machine binds its own over it
    auto vpc = ec2_.call("CreateVpc", {{"CidrBlock", "10.213.0.0/16"}});
    vpc_ = vpc.select_node("//vpc/vpcId").node().child_value();
    auto sub = ec2_.call("CreateSubnet", {{"VpcId", vpc_}, {"CidrBlock", std::string(kSubnetPrefix) + "0/24"}});
    subnet_ = sub.select_node("//subnet/subnetId").node().child_value();
    bridge_ = "sfhv" + tag_;
    ip({"link", "add", "name", bridge_, "type", "bridge"});
    ip({"addr", "add", std::string(kSubnetPrefix) + "1/24", "dev", bridge_});
    ip({"link", "set", bridge_, "up"});
    thread_ = std::thread([this] { loop(); });
  }
  ~Ec2Hypervisor() {
    stop_ = true;
    thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, m] : machines_) destroy(m);
    providers::run_command({"ip", "link", "del", bridge_});
  }

  const std::string& subnet() const { return subnet_; }
  // Machines come up this long after moto reports their instance running (moto has no pending
  // phase; a real machine takes a while to boot).
  void set_boot_delay(std::chrono::milliseconds d) { boot_delay_ = d; }
  // The cloud takes an instance away (a spot interruption).
  void interrupt(const std::string& instance_id) { ec2_.call("TerminateInstances", {{"InstanceId.1", instance_id}}); }
  // Instances that have a machine now.
  std::vector<std::string> machines() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (auto& [id, m] : machines_)
      if (m.up) out.push_back(id);
    return out;
  }
  std::vector<std::string> powered_off() {
    std::lock_guard<std::mutex> lock(mu_);
    return powered_off_;
  }
  // Network namespaces of this harness that still exist.
  std::vector<std::string> namespaces() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (auto& e : std::filesystem::directory_iterator("/run/netns", ec))
      if (e.path().filename().string().rfind("sfhv-" + tag_ + "-", 0) == 0) out.push_back(e.path().filename());
    return out;
  }

 private:
  struct Machine {
    std::string id, ip, ns, veth;
    std::filesystem::path dir;
    pid_t init = -1;
    std::string ns_inode;
    bool up = false;
    std::chrono::steady_clock::time_point seen;
  };

  static ClientOptions quick() {
    ClientOptions o;
    o.backoff_base = std::chrono::milliseconds(20);
    o.backoff_cap = std::chrono::milliseconds(200);
    return o;
  }
  static void ip(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"ip"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = providers::run_command(argv);
    if (r.status != 0) throw std::runtime_error("ip " + args[0] + " " + args[1] + ": " + r.err);
  }
  static std::string netns_inode_of(pid_t pid) {
    std::error_code ec;
    auto t = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/ns/net", ec);
    return ec ? "" : t.string();
  }
  static std::string b64decode(const std::string& b64) {
    std::string out(b64.size(), '\0');
    int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                            reinterpret_cast<const unsigned char*>(b64.data()), int(b64.size()));
    out.resize(n > 0 ? size_t(n) : 0);
    size_t pad = 0;
    for (auto it = b64.rbegin(); it != b64.rend() && *it == '='; ++it) ++pad;
    out.resize(out.size() - std::min(pad, out.size()));
    return out;
  }

  void loop() {
    while (!stop_) {
      try {
        step();
      } catch (const std::exception& e) {
        // The API may be down on purpose (a test); try again. Kept for a failing test's reader.
        std::ofstream(dir_ / "harness.log", std::ios::app) << e.what() << "\n";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  void step() {
    auto doc = ec2_.call("DescribeInstances", {{"Filter.1.Name", "subnet-id"}, {"Filter.1.Value.1", subnet_}});
    std::map<std::string, std::pair<std::string, std::string>> state;  // id -> (state, key name)
    std::map<std::string, std::string> ips;
    for (auto x : doc.select_nodes("//instancesSet/item[instanceId]")) {
      pugi::xml_node n = x.node();
      state[n.child_value("instanceId")] = {n.child("instanceState").child_value("name"), n.child_value("keyName")};
      ips[n.child_value("instanceId")] = n.child_value("privateIpAddress");
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, sk] : state) {
      auto it = machines_.find(id);
      if (sk.first == "running" && it == machines_.end()) {
        Machine m;
        m.id = id;
        m.ip = ips[id];
        m.seen = std::chrono::steady_clock::now();
        machines_[id] = m;
        continue;
      }
      if (it == machines_.end()) continue;
      Machine& m = it->second;
      if (sk.first == "running" && !m.up && std::chrono::steady_clock::now() - m.seen >= boot_delay_.load()) boot(m, sk.second);
      if (m.up && std::filesystem::exists(m.dir / "powered-off")) {
        powered_off_.push_back(id);
        auto attr = ec2_.call("DescribeInstanceAttribute",
                              {{"InstanceId", id}, {"Attribute", "instanceInitiatedShutdownBehavior"}});
        const std::string behaviour = attr.select_node("//instanceInitiatedShutdownBehavior/value").node().child_value();
        ec2_.call(behaviour == "terminate" ? "TerminateInstances" : "StopInstances", {{"InstanceId.1", id}});
        destroy(m);
      }
      if ((sk.first == "terminated" || sk.first == "shutting-down" || sk.first == "stopped") && m.up) destroy(m);
    }
  }

  void boot(Machine& m, const std::string& key_name) {
    const int n = next_machine_++;
    m.ns = "sfhv-" + tag_ + "-" + std::to_string(n);
    m.veth = "sfhv" + tag_ + "v" + std::to_string(n);
    if (m.veth.size() > 15) m.veth = "sfv" + std::to_string(::getpid() % 1000) + "x" + std::to_string(n);
    m.dir = dir_ / m.id;
    std::filesystem::create_directories(m.dir / "run");
    std::filesystem::create_directories(m.dir / "bin");
    // The network: a namespace at the address moto assigned, on the bridge.
    ip({"netns", "add", m.ns});
    ip({"link", "add", m.veth, "type", "veth", "peer", "name", m.veth + "p"});
    ip({"link", "set", m.veth + "p", "netns", m.ns});
    ip({"link", "set", m.veth, "master", bridge_, "up"});
    ip({"-n", m.ns, "link", "set", "lo", "up"});
    ip({"-n", m.ns, "link", "set", m.veth + "p", "name", "eth0"});
    ip({"-n", m.ns, "addr", "add", m.ip + "/24", "dev", "eth0"});
    ip({"-n", m.ns, "link", "set", "eth0", "up"});
    ip({"-n", m.ns, "route", "add", "default", "via", std::string(kSubnetPrefix) + "1"});
    // What EC2 hands the machine: its key pair's public key, its user data.
    auto keys = ec2_.call("DescribeKeyPairs", {{"KeyName.1", key_name}, {"IncludePublicKey", "true"}});
    std::ofstream(m.dir / "authorized_keys") << keys.select_node("//keySet/item/publicKey").node().child_value() << "\n";
    auto ud = ec2_.call("DescribeInstanceAttribute", {{"InstanceId", m.id}, {"Attribute", "userData"}});
    std::ofstream(m.dir / "user-data") << b64decode(ud.select_node("//userData/value").node().child_value());
    // poweroff, as the machine's: it tells the hypervisor.
    std::ofstream(m.dir / "bin" / "poweroff") << "#!/bin/sh\ntouch '" << (m.dir / "powered-off").string() << "'\n";
    ::chmod((m.dir / "bin" / "poweroff").c_str(), 0755);
    auto r = providers::run_command({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", (m.dir / "host_key").string()});
    if (r.status != 0) throw std::runtime_error("ssh-keygen: " + r.err);
    std::ofstream(m.dir / "sshd.conf") << "ListenAddress " << m.ip << "\nHostKey " << (m.dir / "host_key").string()
                                       << "\nPidFile none\nAuthorizedKeysFile " << (m.dir / "authorized_keys").string()
                                       << "\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                                          "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel ERROR\n";
    // Boot: a private /run/skyforge, the user data (cloud-init's first boot), then sshd.
    const std::string script = "set -e\nmount --bind '" + (m.dir / "run").string() +
                               "' /run/skyforge\nsh '" + (m.dir / "user-data").string() + "' > '" +
                               (m.dir / "user-data.log").string() + "' 2>&1\nexec /usr/sbin/sshd -D -e -f '" +
                               (m.dir / "sshd.conf").string() + "'\n";
    providers::Fd log(::open((m.dir / "init.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    providers::SpawnSpec s;
    s.argv = {"ip", "netns", "exec", m.ns, "unshare", "-m", "--propagation", "private", "sh", "-c", script};
    s.env = providers::environment_with({{"PATH", (m.dir / "bin").string() + ":/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}});
    s.stdout_fd = log.get();
    m.init = providers::spawn(s);
    for (int i = 0; i < 100 && m.ns_inode.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::string inode = netns_inode_of(m.init);
      if (!inode.empty() && inode != netns_inode_of(::getpid())) m.ns_inode = inode;
    }
    m.up = true;
  }

  void destroy(Machine& m) {
    if (!m.up) return;
    m.up = false;
    // Every process on the machine: those in its network namespace.
    for (int round = 0; round < 3; ++round) {
      for (const auto& e : std::filesystem::directory_iterator("/proc")) {
        const std::string name = e.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        if (!m.ns_inode.empty() && netns_inode_of(std::stoi(name)) == m.ns_inode) ::kill(std::stoi(name), SIGKILL);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (m.init > 0) ::waitpid(m.init, nullptr, 0);
    m.init = -1;
    providers::run_command({"ip", "link", "del", m.veth});
    providers::run_command({"ip", "netns", "del", m.ns});
  }

  Ec2Client ec2_;
  std::filesystem::path dir_;
  std::string tag_, vpc_, subnet_, bridge_;
  std::atomic<std::chrono::milliseconds> boot_delay_{std::chrono::milliseconds(0)};
  std::mutex mu_;
  std::map<std::string, Machine> machines_;
  std::vector<std::string> powered_off_;
  int next_machine_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace skyforge::aws::testing
