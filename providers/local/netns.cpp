#include "netns.hpp"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <skyforge/sdk.hpp>

#include "node_session.hpp"

namespace skyforge::local {

namespace {

constexpr const char* kNetnsDir = "/run/netns";

// An IPv4 network: address and prefix length.
struct Net {
  uint32_t addr = 0;
  int prefix = 32;
};

bool parse_net(const std::string& text, Net& out) {
  std::string a = text;
  int prefix = 32;
  auto slash = text.find('/');
  if (slash != std::string::npos) {
    a = text.substr(0, slash);
    try {
      prefix = std::stoi(text.substr(slash + 1));
    } catch (const std::exception&) {
      return false;
    }
    if (prefix < 0 || prefix > 32) return false;
  }
  in_addr ia{};
  if (::inet_pton(AF_INET, a.c_str(), &ia) != 1) return false;
  out.addr = ntohl(ia.s_addr);
  out.prefix = prefix;
  return true;
}

uint32_t mask(int prefix) { return prefix == 0 ? 0 : ~uint32_t(0) << (32 - prefix); }

bool overlaps(const Net& a, const Net& b) {
  uint32_t m = mask(std::min(a.prefix, b.prefix));
  return (a.addr & m) == (b.addr & m);
}

std::vector<std::string> split_ws(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> t;
  for (std::string w; in >> w;) t.push_back(w);
  return t;
}

// Effective capability bits of this process.
uint64_t effective_caps() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("CapEff:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  return 0;
}

uint32_t fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

std::string hex(uint32_t v, int width) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%0*x", width, v);
  return buf;
}

// The machine-wide lock serialising subnet leases. Every skyforge process on the machine
// computes the same path.
std::string lock_path() {
  struct stat sb {};
  if (::stat("/run/lock", &sb) == 0 && S_ISDIR(sb.st_mode)) return "/run/lock/skyforge-netns.lock";
  return "/run/skyforge-netns.lock";
}

bool gone_message(const std::string& err) {
  return err.find("Cannot find device") != std::string::npos ||
         err.find("No such file or directory") != std::string::npos ||
         err.find("does not exist") != std::string::npos;
}

}  // namespace

void NetnsPool::check_supported() {
  constexpr int kCapNetAdmin = 12, kCapSysAdmin = 21;
  uint64_t caps = effective_caps();
  if (!(caps & (uint64_t(1) << kCapNetAdmin)) || !(caps & (uint64_t(1) << kCapSysAdmin)))
    throw Error(
        "local provider: isolation = \"netns\" needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network "
        "namespaces, a bridge and veth pairs; run as root, or use isolation = \"none\" (every node on 127.0.0.1)",
        SF_ERR_UNSUPPORTED);
  if (find_program("ip").empty())
    throw Error(
        "local provider: isolation = \"netns\" needs iproute2's `ip` (apt-get install iproute2), which is not in "
        "PATH, /usr/sbin or /sbin; or use isolation = \"none\"",
        SF_ERR_UNSUPPORTED);
}

NetnsPool::NetnsPool(std::string pool_id)
    : pool_id_(std::move(pool_id)), ip_path_(find_program("ip")), tag_(link_prefix(pool_id_)) {}

std::string NetnsPool::link_prefix(const std::string& pool_id) { return "sf" + hex(fnv1a(pool_id) & 0xffff, 4); }

std::string NetnsPool::gateway() const { return "10.200." + std::to_string(octet_) + ".1"; }
std::string NetnsPool::subnet() const { return "10.200." + std::to_string(octet_) + ".0/24"; }
std::string NetnsPool::node_address(uint32_t i) const {
  return "10.200." + std::to_string(octet_) + "." + std::to_string(2 + i);
}
std::string NetnsPool::bridge_name() const { return tag_ + hex(uint32_t(octet_), 2) + "-br"; }
std::string NetnsPool::veth_name(uint32_t i) const { return tag_ + hex(uint32_t(octet_), 2) + "-" + std::to_string(i); }
std::string NetnsPool::netns_name(uint32_t i) const { return "skyforge-" + pool_id_ + "-node-" + std::to_string(i); }

CommandResult NetnsPool::ip(const std::vector<std::string>& args) const {
  std::vector<std::string> argv{ip_path_};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv);
}

void NetnsPool::ip_or_throw(const std::vector<std::string>& args, const std::string& what) const {
  CommandResult r = ip(args);
  if (r.status == 0) return;
  std::string cmd = "ip";
  for (const auto& a : args) cmd += " " + a;
  std::string err = r.err.empty() ? r.out : r.err;
  while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
  throw Error("local provider: " + what + " failed (`" + cmd + "`, exit status " + std::to_string(r.status) +
              "): " + err);
}

void NetnsPool::create_bridge(uint32_t nodes) {
  if (bridge_made_) return;
  if (ip_path_.empty()) check_supported();
  if (nodes > kMaxNodes)
    throw Error("local provider: isolation = \"netns\" gives each pool a /24, so at most " +
                    std::to_string(kMaxNodes) + " nodes; " + std::to_string(nodes) + " were asked for",
                SF_ERR_INVALID);

  std::string path = lock_path();
  Fd lock(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock) throw Error("local provider: cannot open the subnet lock " + path + ": " + std::strerror(errno));
  while (::flock(lock.get(), LOCK_EX) != 0)
    if (errno != EINTR) throw Error("local provider: cannot lock " + path + ": " + std::strerror(errno));

  // Everything the machine already uses.
  std::vector<Net> used;
  CommandResult addrs = ip({"-o", "-4", "addr", "show"});
  if (addrs.status != 0) throw Error("local provider: `ip -o -4 addr show` failed: " + addrs.err);
  {
    std::istringstream in(addrs.out);
    for (std::string line; std::getline(in, line);) {
      auto t = split_ws(line);
      for (size_t k = 0; k + 1 < t.size(); ++k)
        if (t[k] == "inet") {
          Net n;
          if (parse_net(t[k + 1], n)) used.push_back(n);
        }
    }
  }
  CommandResult routes = ip({"-4", "route", "show", "table", "all"});
  if (routes.status == 0) {
    static const std::set<std::string> kTypes = {"unicast", "local",  "broadcast",   "anycast", "multicast",
                                                 "blackhole", "unreachable", "prohibit", "throw", "nat"};
    std::istringstream in(routes.out);
    for (std::string line; std::getline(in, line);) {
      auto t = split_ws(line);
      size_t k = 0;
      if (k < t.size() && kTypes.count(t[k])) ++k;
      Net n;
      if (k < t.size() && t[k] != "default" && parse_net(t[k], n)) used.push_back(n);
    }
  }
  std::set<std::string> links;
  CommandResult ls = ip({"-o", "link", "show"});
  if (ls.status != 0) throw Error("local provider: `ip -o link show` failed: " + ls.err);
  {
    std::istringstream in(ls.out);
    for (std::string line; std::getline(in, line);) {
      auto t = split_ws(line);
      if (t.size() < 2) continue;
      std::string name = t[1];
      name = name.substr(0, name.find_first_of("@:"));
      links.insert(name);
    }
  }

  int chosen = -1;
  for (int o = 0; o < 256 && chosen < 0; ++o) {
    Net candidate;
    parse_net("10.200." + std::to_string(o) + ".0/24", candidate);
    bool clash = false;
    for (const auto& u : used)
      if (overlaps(candidate, u)) clash = true;
    octet_ = o;
    if (!clash && links.count(bridge_name())) clash = true;
    for (uint32_t i = 0; i < nodes && !clash; ++i)
      if (links.count(veth_name(i))) clash = true;
    if (!clash) chosen = o;
  }
  if (chosen < 0) {
    octet_ = -1;
    throw Error(
        "local provider: no free /24 left in 10.200.0.0/16 for a network-isolated pool (each running pool holds "
        "one; bridges left by crashed pools hold theirs: `ip -o link show type bridge | grep ' sf'` and "
        "`ip link del <name>`)");
  }
  octet_ = chosen;

  arm_reaper(nodes);
  // The lease becomes visible to other allocators the moment the address is on the bridge.
  ip_or_throw({"link", "add", "name", bridge_name(), "type", "bridge"}, "creating bridge " + bridge_name());
  bridge_made_ = true;
  ip_or_throw({"addr", "add", gateway() + "/24", "dev", bridge_name()}, "addressing bridge " + bridge_name());
  ip_or_throw({"link", "set", bridge_name(), "up"}, "bringing up bridge " + bridge_name());
}

void NetnsPool::add_node(uint32_t i) {
  if (!bridge_made_) throw Error("local provider: add_node before create_bridge");
  if (nodes_.size() <= i) nodes_.resize(i + 1);
  NodeNet& n = nodes_[i];
  std::string ns = netns_name(i), veth = veth_name(i), addr = node_address(i);
  if (!n.netns) {
    struct stat sb {};
    if (::lstat((std::string(kNetnsDir) + "/" + ns).c_str(), &sb) == 0)
      throw Error("local provider: network namespace " + ns +
                  " already exists (left over from an earlier pool with the same id?); remove it with `ip netns "
                  "del " +
                  ns + "`");
    ip_or_throw({"netns", "add", ns}, "creating network namespace " + ns);
    n.netns = true;
  }
  if (!n.veth) {
    ip_or_throw({"link", "add", "name", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
                "creating veth " + veth);
    n.veth = true;
  }
  ip_or_throw({"link", "set", veth, "master", bridge_name(), "up"}, "attaching " + veth + " to the bridge");
  ip_or_throw({"-n", ns, "link", "set", "lo", "up"}, "bringing up lo in " + ns);
  ip_or_throw({"-n", ns, "addr", "add", addr + "/24", "dev", "eth0"}, "addressing eth0 in " + ns);
  ip_or_throw({"-n", ns, "link", "set", "eth0", "up"}, "bringing up eth0 in " + ns);
  ip_or_throw({"-n", ns, "route", "add", "default", "via", gateway()}, "adding the default route in " + ns);
}

std::vector<std::string> NetnsPool::remove_node(uint32_t i) {
  std::vector<std::string> problems;
  if (i >= nodes_.size()) return problems;
  NodeNet& n = nodes_[i];
  if (n.veth) {
    // Deleting either end removes the pair; the namespace's deletion would too, but only once
    // no process is left in it, so do it explicitly.
    CommandResult r = ip({"link", "del", veth_name(i)});
    if (r.status == 0 || gone_message(r.err)) n.veth = false;
    else problems.push_back("veth " + veth_name(i) + ": " + r.err);
  }
  if (n.netns) {
    CommandResult r = ip({"netns", "del", netns_name(i)});
    if (r.status == 0 || gone_message(r.err)) n.netns = false;
    else problems.push_back("network namespace " + netns_name(i) + ": " + r.err);
  }
  return problems;
}

std::vector<std::string> NetnsPool::remove_bridge() {
  std::vector<std::string> problems;
  if (!bridge_made_) return problems;
  CommandResult r = ip({"link", "del", bridge_name()});
  if (r.status == 0 || gone_message(r.err)) bridge_made_ = false;
  else problems.push_back("bridge " + bridge_name() + ": " + r.err);
  const bool all_gone = !bridge_made_ && std::none_of(nodes_.begin(), nodes_.end(), [](const NodeNet& n) {
    return n.netns || n.veth;
  });
  if (all_gone) disarm_reaper(true);
  return problems;
}

NetnsPool::~NetnsPool() { disarm_reaper(false); }

void NetnsPool::arm_reaper(uint32_t nodes) {
  if (reaper_ > 0) return;
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw Error(std::string("local provider: pipe2: ") + std::strerror(errno));
  Fd in_r(p[0]), in_w(p[1]);
  auto q = [](const std::string& s) { return "'" + s + "'"; };  // names and paths hold no quote
  const std::string script =
      "IFS= read -r said; [ \"$said\" = done ] && exit 0\n"
      "ip=" + q(ip_path_) + "; i=0\n"
      "while [ $i -lt " + std::to_string(nodes) + " ]; do\n"
      "  \"$ip\" link del " + q(tag_ + hex(uint32_t(octet_), 2) + "-") + "$i; \"$ip\" netns del " +
      q("skyforge-" + pool_id_ + "-node-") + "$i; i=$((i+1))\n"
      "done 2>/dev/null\n"
      "\"$ip\" link del " + q(bridge_name()) + " 2>/dev/null\n"
      "exit 0\n";
  SpawnSpec s;
  s.argv = {"/bin/sh", "-c", script};
  s.env = environment_with({});
  s.cwd = "/";
  s.stdin_fd = in_r.get();
  s.new_session = true;  // a Ctrl-C on the terminal is the host's to handle, not the reaper's
  reaper_ = spawn(s);
  reaper_in_ = std::move(in_w);
}

// done: everything is removed, the reaper leaves as it is; otherwise it removes what is left.
void NetnsPool::disarm_reaper(bool done) {
  if (reaper_ <= 0) return;
  if (done) {
    static const char kDone[] = "done\n";
    [[maybe_unused]] ssize_t w = ::write(reaper_in_.get(), kDone, sizeof kDone - 1);
  }
  reaper_in_.reset();
  providers::reap_within(reaper_, std::chrono::seconds(10));
  reaper_ = -1;
}

Fd NetnsPool::open_netns(uint32_t i) const {
  std::string path = std::string(kNetnsDir) + "/" + netns_name(i);
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw Error("local provider: cannot open network namespace " + path + ": " + std::strerror(errno));
  return fd;
}

}  // namespace skyforge::local
