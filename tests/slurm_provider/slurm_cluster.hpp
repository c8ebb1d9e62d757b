// A real Slurm cluster for the slurm provider's tests: Debian's munge, slurmctld and slurmd
// (22.05), started here as root without systemd — munged with a key made here, slurmctld in this
// machine's namespace on the bridge's address, one slurmd per node in a network namespace of its
// own (the local provider's NetnsPool; slurmd is started with nsenter, which keeps /sys and its
// cgroup mount, where `ip netns exec` would remount it). ProctrackType=proctrack/linuxproc,
// TaskPlugin=task/none, no accounting. SLURM_CONF is set in this process for the tests.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <sstream>
#include <thread>
#include <vector>

#include "netns.hpp"
#include "node_session.hpp"
#include "spawn.hpp"

namespace skyforge::test {

class SlurmCluster {
 public:
  static std::string unavailable() {
    if (::geteuid() != 0) return "not root: slurmd, munged and network namespaces need root";
    for (const char* p : {"munged", "slurmctld", "slurmd", "sbatch", "srun", "sbcast", "nsenter"})
      if (providers::find_program(p).empty())
        return std::string("no ") + p + " (Debian: apt-get install slurmctld slurmd slurm-client munge)";
    try {
      local::NetnsPool::check_supported();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }

  SlurmCluster(const std::filesystem::path& dir, uint32_t nodes)
      : dir_(dir), net_("slurm-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++)) {
    namespace fs = std::filesystem;
    fs::create_directories(dir_ / "munge");
    fs::create_directories(dir_ / "state");
    fs::create_directories(dir_ / "spool");
    for (auto p = dir_; p != p.root_path(); p = p.parent_path()) ::chmod(p.c_str(), 0755);  // munge's socket: o+x
    {
      std::ofstream key(dir_ / "munge.key", std::ios::binary);
      std::ifstream rnd("/dev/urandom", std::ios::binary);
      std::string k(1024, '\0');
      rnd.read(k.data(), 1024);
      key << k;
    }
    ::chmod((dir_ / "munge.key").c_str(), 0400);
    daemon({"munged", "--force", "--key-file=" + (dir_ / "munge.key").string(), "--socket=" + socket(),
         "--pid-file=" + (dir_ / "munged.pid").string(), "--log-file=" + (dir_ / "munged.log").string(),
         "--seed-file=" + (dir_ / "munge.seed").string()});
    net_.create_bridge(nodes);
    const std::string tag = "sf" + std::to_string(::getpid() % 100000) + "x" + std::to_string(counter());
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string shorthost = std::string(host).substr(0, std::string(host).find('.'));
    const int ctld_port = free_port(), d_port = free_port();
    std::ofstream conf(this->conf());
    conf << "ClusterName=skyforgetest\nSlurmctldHost=" << shorthost << "(" << net_.gateway() << ")\n"
         << "SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nAuthInfo=socket=" << socket()
         << "\nCryptoType=crypto/munge\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "SelectType=select/cons_tres\nReturnToService=2\nMessageTimeout=5\nKillWait=2\n"
            // A node that stops answering is DOWN after 10 s (Slurm's default: 300 s), so a job
            // that lost one completes within the test.
            "SlurmdTimeout=10\n"
         << "SlurmctldPort=" << ctld_port << "\nSlurmdPort=" << d_port << "\nSlurmdSpoolDir=" << (dir_ / "spool").string()
         << "/%n\nStateSaveLocation=" << (dir_ / "state").string() << "\nSlurmctldPidFile=" << (dir_ / "slurmctld.pid").string()
         << "\nSlurmdPidFile=" << (dir_ / "slurmd-%n.pid").string() << "\nSlurmctldLogFile=" << (dir_ / "slurmctld.log").string()
         << "\nSlurmdLogFile=" << (dir_ / "slurmd-%n.log").string() << "\n";
    for (uint32_t i = 0; i < nodes; ++i) {
      net_.add_node(i);
      names_.push_back(tag + "n" + std::to_string(i));
      conf << "NodeName=" << names_[i] << " NodeHostname=" << names_[i] << " NodeAddr=" << net_.node_address(i)
           << " CPUs=1\n";
    }
    conf << "PartitionName=test Nodes=ALL Default=YES State=UP MaxTime=INFINITE\n";
    conf.close();
    ::setenv("SLURM_CONF", this->conf().c_str(), 1);
    daemon({"slurmctld", "-f", this->conf().string(), "-i"});
    for (uint32_t i = 0; i < nodes; ++i)
      daemon({"nsenter", "--net=/var/run/netns/" + net_.netns_name(i), "slurmd", "-f", this->conf().string(), "-N", names_[i]});
    // Every node idle before the tests submit anything.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      auto r = providers::run_command({"sinfo", "-h", "-o", "%t %D"});
      if (r.status == 0 && r.out.find("idle " + std::to_string(nodes)) != std::string::npos) break;
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("slurm nodes not idle within 30 s: " + r.out + r.err);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~SlurmCluster() {
    providers::run_command({"scancel", "--full", "-u", "root"});
    for (const auto& n : names_) stop(dir_ / ("slurmd-" + n + ".pid"));
    stop(dir_ / "slurmctld.pid");
    stop(dir_ / "munged.pid");
    for (uint32_t i = 0; i < names_.size(); ++i) net_.remove_node(i);
    net_.remove_bridge();
    ::unsetenv("SLURM_CONF");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::filesystem::path conf() const { return dir_ / "slurm.conf"; }
  const std::vector<std::string>& node_names() const { return names_; }
  std::vector<std::string> addresses() const {
    std::vector<std::string> a;
    for (uint32_t i = 0; i < names_.size(); ++i) a.push_back(net_.node_address(i));
    return a;
  }
  // Slurm node i's machine gone: every process in its network namespace (its slurmd, the steps'
  // slurmstepd and what they run) SIGKILLed.
  void kill_node(uint32_t i) {
    std::istringstream pids(providers::run_command({"ip", "netns", "pids", net_.netns_name(i)}).out);
    for (pid_t p; pids >> p;) ::kill(p, SIGKILL);
  }
  // The jobs in the queue (any state), as `squeue -h -o %i` lists them.
  std::string queue() const { return providers::run_command({"squeue", "-h", "-o", "%i %T %j"}).out; }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string socket() const { return (dir_ / "munge" / "munge.socket").string(); }
  // Starts a daemon that forks into the background: its output into a file (a pipe would stay
  // open in the daemon), and the parent's exit status awaited.
  void daemon(const std::vector<std::string>& argv) {
    const auto log = dir_ / ("start-" + std::to_string(started_++) + ".log");
    providers::Fd out(::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    providers::SpawnSpec s;
    s.argv = argv;
    s.env = providers::environment_with({});
    s.stdout_fd = out.get();
    pid_t pid = providers::spawn(s);
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (providers::exit_code(st) != 0) {
      std::ifstream in(log);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      throw std::runtime_error(argv[0] + " failed to start (" + providers::describe_status(st) + "): " + text);
    }
  }
  static int free_port() {
    providers::Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len);
    return ntohs(a.sin_port);
  }
  // The daemon whose pid file this is: SIGTERM, then SIGKILL once 2 s have passed.
  static void stop(const std::filesystem::path& pidfile) {
    std::ifstream in(pidfile);
    pid_t pid = 0;
    if (!(in >> pid) || pid <= 0) return;
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 40 && ::kill(pid, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::kill(pid, SIGKILL);
  }

  std::filesystem::path dir_;
  int started_ = 0;
  local::NetnsPool net_;
  std::vector<std::string> names_;
};

}  // namespace skyforge::test
