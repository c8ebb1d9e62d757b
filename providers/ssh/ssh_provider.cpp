#include "ssh_provider.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "node_session.hpp"
#include "spawn.hpp"

namespace skyforge::ssh {

namespace fs = std::filesystem;
using namespace providers;
using Clock = std::chrono::steady_clock;

namespace {

Error invalid(const std::string& what) { return Error("ssh provider: " + what, SF_ERR_INVALID); }

// A log for the master's output, unlinked at once (nothing is left whatever way this process ends).
struct Log {
  Fd write, read;
};
Log anonymous_log() {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/skyforge-ssh-log-XXXXXX";
  Fd w(::mkostemp(path.data(), O_CLOEXEC | O_APPEND));
  if (!w) throw Error("ssh provider: cannot make a log file in " + path + ": " + std::strerror(errno));
  Fd r(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ::unlink(path.c_str());
  if (!r) throw Error("ssh provider: cannot read " + path + ": " + std::strerror(errno));
  return {std::move(w), std::move(r)};
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (off_t off = 0;;) {
    ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n <= 0) return out;
    out.append(buf, size_t(n));
    off += n;
  }
}

std::string sha256_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw Error("ssh provider: cannot read " + path + ": " + std::strerror(errno));
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) throw Error("ssh provider: sha256 unavailable");
  std::vector<unsigned char> buf(1 << 16);
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error("ssh provider: cannot read " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    EVP_DigestUpdate(ctx.get(), buf.data(), size_t(n));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

// "2.36" < "2.38"; non-numeric parts compare as 0.
bool version_less(const std::string& a, const std::string& b) {
  std::istringstream x(a), y(b);
  for (;;) {
    std::string p, q;
    bool more_a = bool(std::getline(x, p, '.')), more_b = bool(std::getline(y, q, '.'));
    if (!more_a && !more_b) return false;
    long u = more_a ? std::strtol(p.c_str(), nullptr, 10) : 0, v = more_b ? std::strtol(q.c_str(), nullptr, 10) : 0;
    if (u != v) return u < v;
  }
}

// Why ssh could not reach the host, from what it wrote.
std::string connect_failure(const std::string& log, int status) {
  const std::string line = last_line(log);
  auto has = [&](const char* s) { return log.find(s) != std::string::npos; };
  if (has("REMOTE HOST IDENTIFICATION HAS CHANGED"))
    return "its host key has changed: known_hosts holds another key for it (a reinstalled host, or someone in "
           "between), so ssh refused to connect";
  if (has("Host key verification failed"))
    return "its host key is not in known_hosts (strict_host_keys = \"yes\"; \"accept-new\" records a new host's "
           "key on first contact)";
  if (has("Permission denied")) return "the host refused the key (" + line + ")";
  if (has("Connection refused") || has("timed out") || has("No route to host") || has("Could not resolve") ||
      has("Network is unreachable"))
    return "unreachable (" + line + ")";
  return line.empty() ? "ssh exited with status " + std::to_string(status) : line;
}

std::string octal_mode(mode_t m) {
  char b[8];
  std::snprintf(b, sizeof b, "0%o", unsigned(m & 07777));
  return b;
}

std::string kind_of(mode_t m) {
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISREG(m)) return "a regular file";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "a device";
}

// Room ssh needs past a control path: it binds "<path>.<16 random characters>" and links it.
constexpr size_t kSocketPathRoom = sizeof(sockaddr_un{}.sun_path) - 1 - 17;

}  // namespace

ControlSocketCheck check_control_socket(const std::string& path, uid_t uid) {
  ControlSocketCheck c;
  const std::string dir = fs::path(path).parent_path().string();
  const std::string refused = " (refused: another user may be trying to take over the connection)";
  struct stat d {};
  if (::lstat(dir.c_str(), &d) != 0) {
    c.problem = "the control sockets' directory " + dir + " cannot be examined: " + std::strerror(errno);
    return c;
  }
  if (!S_ISDIR(d.st_mode)) c.problem = "the control sockets' directory " + dir + " is " + kind_of(d.st_mode) + ", not a directory";
  else if (d.st_uid != uid)
    c.problem = "the control sockets' directory " + dir + " belongs to uid " + std::to_string(d.st_uid) +
                ", not to this user (uid " + std::to_string(uid) + ")";
  else if ((d.st_mode & 07777) != 0700)
    c.problem = "the control sockets' directory " + dir + " has mode " + octal_mode(d.st_mode) + ", not 0700";
  if (!c.problem.empty()) {
    c.problem += refused;
    return c;
  }
  struct stat sb {};
  if (::lstat(path.c_str(), &sb) != 0) {
    if (errno != ENOENT) c.problem = "the control socket " + path + " cannot be examined: " + std::strerror(errno);
    return c;
  }
  c.exists = true;
  if (!S_ISSOCK(sb.st_mode)) c.problem = "the control socket " + path + " is " + kind_of(sb.st_mode) + ", not a socket";
  else if (sb.st_uid != uid)
    c.problem = "the control socket " + path + " belongs to uid " + std::to_string(sb.st_uid) + ", not to this user (uid " +
                std::to_string(uid) + ")";
  else if (sb.st_mode & 077)
    c.problem = "the control socket " + path + " has mode " + octal_mode(sb.st_mode) + ": others may use it";
  if (!c.problem.empty()) c.problem += refused;
  return c;
}

std::string make_control_dir(const std::string& parent) {
  std::string dir = parent + "/skyforge-ssh-XXXXXX";
  if (dir.size() + 7 > kSocketPathRoom)  // "/h" and up to 5 digits
    throw Error("ssh provider: TMPDIR (" + parent + ") is too long for the control sockets' paths (at most " +
                std::to_string(kSocketPathRoom - 27) + " characters): set a shorter TMPDIR");
  // In a directory others may write without the sticky bit, another user could rename ours away
  // and put one of theirs in its place between our check of a socket and ssh's connect to it.
  struct stat ps {};
  if (::stat(parent.c_str(), &ps) != 0)
    throw Error("ssh provider: TMPDIR " + parent + ": " + std::strerror(errno));
  if ((ps.st_mode & (S_IWGRP | S_IWOTH)) && !(ps.st_mode & S_ISVTX))
    throw Error("ssh provider: TMPDIR " + parent + " is writable by other users and not sticky (mode 0" + std::to_string((ps.st_mode >> 6) & 7) +
                std::to_string((ps.st_mode >> 3) & 7) + std::to_string(ps.st_mode & 7) +
                "): another user could replace the control sockets' directory; use a private TMPDIR or a 1777 one");
  if (!::mkdtemp(dir.data()))
    throw Error("ssh provider: cannot make a private directory for the control sockets in " + parent + ": " +
                std::strerror(errno));
  if (auto c = check_control_socket(dir + "/h0", ::geteuid()); !c.problem.empty() || c.exists) {
    ::rmdir(dir.c_str());
    throw Error("ssh provider: " + (c.problem.empty() ? dir + " is not empty" : c.problem));
  }
  return dir;
}

// ---- configuration ----------------------------------------------------------------------------

HostSpec parse_host(const std::string& text) {
  HostSpec h;
  h.text = text;
  auto bad = [&](const std::string& why) {
    return invalid("option 'hosts': entry \"" + text + "\": " + why +
                   " (expected \"[user@]host[:port]\", \"[user@][ipv6]:port\" for IPv6)");
  };
  if (text.empty() || text.find_first_of(" \t\r\n'\"") != std::string::npos) throw bad("empty or with spaces or quotes");
  std::string rest = text;
  if (auto at = rest.rfind('@'); at != std::string::npos) {
    h.user = rest.substr(0, at);
    rest = rest.substr(at + 1);
    if (h.user.empty() || h.user[0] == '-') throw bad("bad user name");
  }
  std::string port;
  if (!rest.empty() && rest[0] == '[') {
    auto close = rest.find(']');
    if (close == std::string::npos) throw bad("'[' without ']'");
    h.host = rest.substr(1, close - 1);
    std::string after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') throw bad("text after ']'");
      port = after.substr(1);
      if (port.empty()) throw bad("':' without a port");
    }
  } else if (std::count(rest.begin(), rest.end(), ':') == 1) {
    auto colon = rest.find(':');
    h.host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (port.empty()) throw bad("':' without a port");
  } else {
    h.host = rest;  // a name, an IPv4 address or a bare IPv6 address
  }
  if (h.host.empty()) throw bad("no host");
  if (h.host[0] == '-') throw bad("a host cannot start with '-'");
  if (!port.empty()) {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit)) throw bad("port '" + port + "' is not a number");
    h.port = std::stoi(port);
    if (h.port < 1 || h.port > 65535) throw bad("port " + port + " is not from 1 to 65535");
  }
  return h;
}

SshConfig SshConfig::from(const Options& o) {
  SshConfig c;
  for (const auto& h : o.get_list("hosts")) c.hosts.push_back(parse_host(h));
  if (c.hosts.empty()) throw invalid("option 'hosts' is required: a list of \"[user@]host[:port]\" entries");
  c.user = o.get("user", "");
  c.identity_file = o.get("identity_file", "");
  c.ssh_config = o.get("ssh_config", "");
  c.known_hosts_file = o.get("known_hosts_file", "");
  int64_t slots = o.get_int("slots_per_host", 1);
  if (slots < 1 || slots > 1024) throw invalid("option 'slots_per_host': expected 1 to 1024, got " + std::to_string(slots));
  c.slots_per_host = uint32_t(slots);
  c.remote_dir = o.get("remote_dir", "~/.skyforge");
  if (trim(c.remote_dir).empty() || trim(c.remote_dir) == "/" || trim(c.remote_dir) == "~")
    throw invalid("option 'remote_dir': expected a directory of its own (\"~/.skyforge\"), got \"" + c.remote_dir + "\"");
  c.control_address = o.get("control_address", "");
  c.strict_host_keys = o.get("strict_host_keys", "yes");
  if (c.strict_host_keys != "yes" && c.strict_host_keys != "accept-new")
    throw invalid("option 'strict_host_keys': expected \"yes\" or \"accept-new\", got \"" + c.strict_host_keys + "\"");
  int64_t t = o.get_int("connect_timeout", 15);
  if (t < 1 || t > 3600) throw invalid("option 'connect_timeout': expected 1 to 3600 seconds, got " + std::to_string(t));
  c.connect_timeout_s = int(t);
  return c;
}

std::string remote_path_words(const std::string& path) {
  if (path == "~") return "\"$HOME\"";
  if (path.rfind("~/", 0) == 0) return "\"$HOME\"/" + shell_quote(path.substr(2));
  if (!path.empty() && path[0] == '/') return shell_quote(path);
  return "\"$HOME\"/" + shell_quote(path);
}

Platform local_platform() {
  utsname u{};
  ::uname(&u);
  return Platform{u.machine, ::gnu_get_libc_version()};
}

std::string platform_mismatch(const Platform& here, const Platform& there) {
  const std::string both = "the host is " + there.machine + " with glibc " + there.glibc + ", this machine (whose " +
                           "skyforge-worker and plugins are copied there) is " + here.machine + " with glibc " +
                           here.glibc;
  if (there.machine != here.machine) return both + ": a different architecture";
  if (there.glibc.empty() || version_less(there.glibc, here.glibc)) return both + ": the host's glibc is older";
  return "";
}

// ---- the provider ------------------------------------------------------------------------------

SshProvider::SshProvider(const Context& ctx) : SshProvider(ctx, SshConfig::from(ctx.options)) {}

SshProvider::SshProvider(const Context& ctx, SshConfig config)
    : SessionProvider(ctx, "ssh provider"), config_(std::move(config)) {
  ssh_ = providers::find_program("ssh");
  if (ssh_.empty()) throw Error("ssh provider: no `ssh` program on PATH (Debian: openssh-client)", SF_ERR_UNSUPPORTED);
}

SshProvider::~SshProvider() {
  try {
    terminate({});
  } catch (...) {
  }
}

std::string SshProvider::describe(const Host& h) const { return "ssh host '" + h.spec.text + "'"; }

std::string SshProvider::where(const Node& n) const { return describe(*n.host) + ": " + n.id; }

// ssh's own 255: the connection, not the worker, ended.
std::string SshProvider::session_lost(const Node& n) const {
  return "the ssh connection to host '" + n.host->spec.text + "' ended (the host, its sshd or the network went away)";
}

std::string SshProvider::pool_words() const {
  return remote_path_words(config_.remote_dir) + "/pools/" + shell_quote(pool_id_);
}

std::string SshProvider::node_dir_words(const std::string& node_id) const {
  return pool_words() + "/" + shell_quote(node_id);
}

size_t SshProvider::files_copied() const {
  std::lock_guard<std::mutex> lock(mu_);
  return copied_;
}

void SshProvider::require_safe_socket(const Host& h) const {
  if (auto c = check_control_socket(h.control_path, ::geteuid()); !c.problem.empty())
    throw Error(describe(h) + ": " + c.problem);
}

// A client (master = false) checks the host's control socket first: it is used only when it is
// ours (check_control_socket); when it is not there, ssh connects by itself.
std::vector<std::string> SshProvider::ssh_args(const Host& h, bool master) const {
  if (!master) require_safe_socket(h);
  std::string control_path;  // ssh expands '%' tokens in it
  for (char ch : h.control_path) control_path += ch == '%' ? std::string("%%") : std::string(1, ch);
  std::vector<std::string> a = {ssh_};
  if (!config_.ssh_config.empty()) a.insert(a.end(), {"-F", config_.ssh_config});
  a.insert(a.end(), {"-o", "BatchMode=yes", "-o", "ConnectTimeout=" + std::to_string(config_.connect_timeout_s), "-o",
                     "StrictHostKeyChecking=" + config_.strict_host_keys, "-o", "ServerAliveInterval=5", "-o",
                     "ServerAliveCountMax=3", "-o", "LogLevel=ERROR", "-o", "ControlPath=" + control_path});
  if (master)
    a.insert(a.end(), {"-M", "-N", "-o", "ControlMaster=yes", "-o", "ControlPersist=no"});
  else
    a.insert(a.end(), {"-o", "ControlMaster=no", "-T"});
  if (!config_.known_hosts_file.empty()) a.insert(a.end(), {"-o", "UserKnownHostsFile=" + config_.known_hosts_file});
  if (!config_.identity_file.empty()) a.insert(a.end(), {"-i", config_.identity_file, "-o", "IdentitiesOnly=yes"});
  const std::string& user = h.spec.user.empty() ? config_.user : h.spec.user;
  if (!user.empty()) a.insert(a.end(), {"-l", user});
  if (h.spec.port) a.insert(a.end(), {"-p", std::to_string(h.spec.port)});
  a.push_back(h.spec.host);
  return a;
}

std::string SshProvider::remote_sh(const Host& h, const std::string& script, const std::string& what) const {
  auto argv = ssh_args(h, false);
  argv.push_back("sh -s");
  CommandOptions o;
  o.input = script;
  o.timeout = std::chrono::seconds(config_.connect_timeout_s + 120);
  CommandResult r = providers::run_command(argv, o);
  if (r.timed_out) throw Error(describe(h) + ": " + what + " did not finish within " +
                               std::to_string(config_.connect_timeout_s + 120) + " s");
  if (r.status == 255) throw Error(describe(h) + ": " + what + ": " + connect_failure(r.err, r.status));
  if (r.status != 0) {
    std::string why = last_line(r.err);
    if (why.empty()) why = last_line(r.out);
    throw Error(describe(h) + ": " + what + " failed (exit status " + std::to_string(r.status) + ")" +
                (why.empty() ? "" : ": " + why));
  }
  return r.out;
}

void SshProvider::start_master(Host& h) {
  Log log = anonymous_log();
  providers::SpawnSpec s;
  s.argv = ssh_args(h, true);
  s.env = providers::environment_with({{"LC_ALL", "C"}});
  s.stdout_fd = log.write.get();
  s.parent_death_signal = SIGTERM;  // a killed host takes its connections along
  {
    std::lock_guard<std::mutex> lock(mu_);
    h.master = spawner_.spawn(s);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(config_.connect_timeout_s + 5);
  for (;;) {
    // ssh binds it once the session is authenticated; only a socket of ours, in our private
    // directory, is taken for it.
    const auto c = check_control_socket(h.control_path, ::geteuid());
    if (!c.problem.empty()) {
      ::kill(h.master, SIGTERM);
      reap_within(h.master, std::chrono::milliseconds(500));
      std::lock_guard<std::mutex> lock(mu_);
      h.master = -1;
      throw Error(describe(h) + ": " + c.problem);
    }
    if (c.exists) return;
    int st = 0;
    pid_t r = ::waitpid(h.master, &st, WNOHANG);
    if (r == h.master) {
      std::lock_guard<std::mutex> lock(mu_);
      h.master = -1;
      throw Error(describe(h) + ": " + connect_failure(read_all(log.read.get()), providers::exit_code(st)));
    }
    if (Clock::now() >= deadline) {
      ::kill(h.master, SIGTERM);
      reap_within(h.master, std::chrono::milliseconds(500));
      std::lock_guard<std::mutex> lock(mu_);
      h.master = -1;
      throw Error(describe(h) + ": no connection within connect_timeout (" + std::to_string(config_.connect_timeout_s) +
                  " s)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void SshProvider::check_host(Host& h, const Platform& here) {
  // One round trip: what the host runs, the address it was reached at, and which of the files to
  // stage its store lacks already.
  // remote_dir and what is in it are this user's alone: 0700 (an older run's 0755 too), files
  // made under umask 077, and a directory of another user's (a planted /tmp path) refused.
  std::string script = "umask 077\nR=" + remote_path_words(config_.remote_dir) +
                       "\nuname -m; getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>&1 | head -n 1\n"
                       "echo \"$SSH_CONNECTION\"\n"
                       "mkdir -p \"$R/store\" \"$R/pools\" && chmod 700 \"$R\" \"$R/store\" \"$R/pools\" &&\n"
                       "  [ -O \"$R\" ] && [ -O \"$R/store\" ] && [ -O \"$R/pools\" ] ||\n"
                       "  { echo \"remote_dir $R: cannot make it this user's own (mode 0700, owned by $(id -un))\" >&2; exit 1; }\n"
                       "cd \"$R/store\" || exit 1\nfor k in";
  std::set<std::string> keys;
  for (const auto& f : stage_)
    if (keys.insert(f.key).second) script += " " + f.key;
  script += "; do [ -e \"$k\" ] || echo \"missing $k\"; done\n";
  const auto lines = lines_of(remote_sh(h, script, "checking the host"));
  if (lines.size() < 3) throw Error(describe(h) + ": checking the host: unexpected answer to uname/getconf");
  Platform there{lines[0], ""};
  {
    std::istringstream words(lines[1]);
    for (std::string w; words >> w;)
      if (!w.empty() && std::isdigit(static_cast<unsigned char>(w[0]))) there.glibc = w;  // the last version-like word
  }
  if (std::string why = platform_mismatch(here, there); !why.empty())
    throw Error(describe(h) + ": " + why, SF_ERR_UNSUPPORTED);
  std::istringstream conn(lines[2]);  // client_ip client_port server_ip server_port
  std::string cip, cport, sip;
  conn >> cip >> cport >> sip;
  if (sip.empty()) throw Error(describe(h) + ": checking the host: no SSH_CONNECTION in its environment");
  h.address = sip;
  for (size_t i = 3; i < lines.size(); ++i)
    if (lines[i].rfind("missing ", 0) == 0) h.missing.insert(lines[i].substr(8));
}

Provisioned SshProvider::provision(const PoolSpec& spec) {
  const uint64_t capacity = uint64_t(config_.hosts.size()) * config_.slots_per_host;
  if (spec.nodes > capacity)
    throw invalid(std::to_string(spec.nodes) + " nodes asked for, but `hosts` lists " +
                  std::to_string(config_.hosts.size()) + " host(s) with slots_per_host = " +
                  std::to_string(config_.slots_per_host) + ": room for " + std::to_string(capacity));
  pool_id_ = spec.pool_id;
  ensure_control_dir();
  const size_t used = (spec.nodes + config_.slots_per_host - 1) / config_.slots_per_host;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < used; ++i) {
      auto h = std::make_unique<Host>();
      h->index = i;
      h->spec = config_.hosts[i];
      // The master removes it when it ends, on SIGTERM too (its parent-death signal).
      h->control_path = control_path(i);
      hosts_.push_back(std::move(h));
    }
  }
  // What will be copied, named by content (while the hosts connect), then on every host at once:
  // connect, check what it runs and what its store lacks.
  std::vector<std::future<void>> connects;
  for (auto& h : hosts_) connects.push_back(std::async(std::launch::async, [this, &h] { start_master(*h); }));
  std::exception_ptr failure;
  try {
    for (const auto& path : spec.stage_files) {
      struct stat sb {};
      if (::stat(path.c_str(), &sb) != 0) throw Error("ssh provider: cannot stage " + path + ": " + std::strerror(errno));
      StageFile f{path, "", unsigned(sb.st_mode & 07777)};
      char mode[8];
      std::snprintf(mode, sizeof mode, "%o", f.mode);
      f.key = sha256_file(path) + "-" + mode;
      stage_.push_back(std::move(f));
    }
  } catch (...) {
    failure = std::current_exception();
  }
  const Platform here = local_platform();
  std::vector<std::future<void>> checks;
  const bool hashed = !failure;
  for (size_t i = 0; i < hosts_.size(); ++i)
    checks.push_back(std::async(std::launch::async, [this, i, &connects, &here, hashed] {
      connects[i].get();
      if (hashed) check_host(*hosts_[i], here);
    }));
  for (auto& c : checks) {
    try {
      c.get();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);

  Provisioned out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t i = 0; i < spec.nodes; ++i) {
      Node& n = add_node_locked(i);
      n.host = hosts_[i / config_.slots_per_host].get();
      out.nodes.push_back({n.id, n.host->address});
    }
  }
  out.control_address = config_.control_address;
  if (out.control_address.empty()) out.control_address = providers::route_source(hosts_[0]->address);
  if (out.control_address.empty())
    throw Error("ssh provider: no route from this machine to " + hosts_[0]->address + " (" + describe(*hosts_[0]) +
                "); set `control_address` to the address the hosts reach this machine at");
  return out;
}

std::string SshProvider::control_path(size_t host_index) const {
  return control_dir_ + "/h" + std::to_string(host_index);
}

// The private directory of the control sockets, and its cleaner: a shell that waits on a pipe
// from this process. Told "done" at teardown (this process removes the directory), it leaves; at
// end of file (this process killed: the masters get SIGTERM and remove their sockets) it removes
// the directory itself.
void SshProvider::ensure_control_dir() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!control_dir_.empty()) return;
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = make_control_dir(tmp && *tmp ? tmp : "/tmp");
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    const int err = errno;
    ::rmdir(dir.c_str());
    throw Error(std::string("ssh provider: pipe2: ") + std::strerror(err));
  }
  Fd r(p[0]), w(p[1]);
  providers::SpawnSpec s;
  s.argv = {"/bin/sh", "-c", "IFS= read -r x; [ \"$x\" = done ] && exit 0; sleep 1; rm -rf -- \"$1\"",
            "skyforge-ssh-cleaner", dir};
  s.env = providers::environment_with({});
  s.stdin_fd = r.get();
  try {
    cleaner_pid_ = spawner_.spawn(s);
  } catch (const std::exception& e) {
    ::rmdir(dir.c_str());
    throw Error(std::string("ssh provider: cannot start the control directory's cleaner: ") + e.what());
  }
  cleaner_ = std::move(w);
  control_dir_ = dir;
}

void SshProvider::remove_control_dir() {
  std::string dir;
  Fd w;
  pid_t pid;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dir = std::exchange(control_dir_, "");
    w = std::move(cleaner_);
    pid = std::exchange(cleaner_pid_, -1);
  }
  if (w) {
    (void)!::write(w.get(), "done\n", 5);
    w.reset();
  }
  if (pid > 0) reap_within(pid, std::chrono::milliseconds(2000));
  if (!dir.empty()) {
    std::error_code ec;
    fs::remove_all(dir, ec);  // ours alone (0700): the sockets of masters SIGKILLed after the grace
  }
}

void SshProvider::add_host(const std::string& text) {
  HostSpec h = parse_host(text);
  std::lock_guard<std::mutex> lock(mu_);
  config_.hosts.push_back(std::move(h));
}

std::string SshProvider::replace_node(const std::string& node_id) {
  Node& old = require(node_id, "replace_node");
  Host* spare = nullptr;
  std::unique_ptr<Host> fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old.host->lost = true;
    std::map<const Host*, uint32_t> taken;
    for (const auto& n : nodes_)
      if (!n->gone && n.get() != &old) ++taken[n->host];
    for (auto& h : hosts_)
      if (!h->lost && taken[h.get()] < config_.slots_per_host) {
        spare = h.get();
        break;
      }
    if (!spare) {
      std::set<size_t> in_pool;
      for (const auto& h : hosts_) in_pool.insert(h->index);
      for (size_t k = 0; k < config_.hosts.size() && !fresh; ++k)
        if (!in_pool.count(k)) {
          fresh = std::make_unique<Host>();
          fresh->index = k;
          fresh->spec = config_.hosts[k];
          fresh->control_path = control_path(k);
        }
    }
  }
  if (!spare && !fresh)
    throw Error("ssh provider: " + node_id + "'s host (" + describe(*old.host) + ") is gone, and no other host in `hosts` has a free slot (" +
                    std::to_string(config_.hosts.size()) + " host(s) x slots_per_host = " +
                    std::to_string(config_.slots_per_host) + "): list a spare host to have a lost one replaced",
                SF_ERR_UNSUPPORTED);
  old.session.stop(std::chrono::milliseconds(2000));
  if (fresh) {
    Host* h = fresh.get();
    {
      std::lock_guard<std::mutex> lock(mu_);
      hosts_.push_back(std::move(fresh));  // so teardown ends its connection, whatever happens next
    }
    try {
      start_master(*h);
      check_host(*h, local_platform());
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      h->lost = true;
      throw;
    }
    spare = h;
  }
  std::lock_guard<std::mutex> lock(mu_);
  replace_node_locked(old).host = spare;
  return spare->address;
}

void SshProvider::stage_host(Host& h) {
  const std::string store = remote_path_words(config_.remote_dir) + "/store";
  std::set<std::string>& missing = h.missing;  // check_host asked
  size_t copied = 0;
  for (const auto& f : stage_) {
    if (!missing.erase(f.key)) continue;
    Fd in(::open(f.path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!in) throw Error("ssh provider: cannot read " + f.path + ": " + std::strerror(errno));
    char mode[8];
    std::snprintf(mode, sizeof mode, "%o", f.mode);
    // Into a temporary name, then renamed: a concurrent run never sees half a file.
    auto argv = ssh_args(h, false);
    argv.push_back("umask 077 && cd " + store + " && t=$(mktemp .in.XXXXXX) && { cat > \"$t\" && chmod " + mode + " \"$t\" && mv -f \"$t\" " +
                   f.key + " || { rm -f \"$t\"; exit 1; }; }");
    CommandOptions o;
    o.stdin_fd = in.get();
    CommandResult r = providers::run_command(argv, o);
    if (r.status != 0)
      throw Error(describe(h) + ": copying " + f.path + " failed: " +
                  (r.status == 255 ? connect_failure(r.err, r.status) : last_line(r.err)));
    ++copied;
  }
  std::lock_guard<std::mutex> lock(mu_);
  copied_ += copied;
}

// The node's one session, from bootstrap to teardown (every session pays the remote login shell's
// start, so a node opens one): the agent below reads from stdin, in turn,
//   1. a length line and that many bytes: a script that makes the node's directory (the host's
//      files under their absolute paths) and writes bootstrap.sh; it runs that, then bootstrap.sh,
//      and prints the marker line with the exit status;
//   2. the worker's environment, "KEY=VALUE" lines and an empty line (the pool secret never
//      appears on a command line or in a log), and its argv, "+word" lines and a "." line;
// then runs the worker in a session of its own under a watchdog: when stdin closes (this client
// killed, this machine gone, the connection lost, terminate) the worker's group is stopped. Any
// way the agent ends, the node's directory goes with it.
void SshProvider::bootstrap(const std::string& node_id, const std::string& script, sf_sink log) {
  Node& n = require(node_id, "bootstrap");
  Host& h = *n.host;
  {
    std::lock_guard<std::mutex> lock(h.stage_mu);  // the first node of a host copies; the others wait
    if (!h.staged) {
      stage_host(h);
      h.staged = true;
    }
  }
  // The node's directory: the host's files under their absolute paths (links into the store),
  // and bootstrap.sh.
  const std::string store = remote_path_words(config_.remote_dir) + "/store";
  std::string setup = "set -e\nmkdir -p \"$D/.stage\"\ncd \"$D/.stage\"\n";
  std::set<std::string> dirs;
  for (const auto& f : stage_) {
    std::string rel = fs::path(f.path).relative_path().parent_path().string();
    if (!rel.empty()) dirs.insert(rel);
  }
  if (!dirs.empty()) {
    setup += "mkdir -p";
    for (const auto& d : dirs) setup += " " + shell_quote(d);
    setup += "\n";
  }
  for (const auto& f : stage_)
    setup += "ln -sfn " + store + "/" + f.key + " " + shell_quote(fs::path(f.path).relative_path().string()) + "\n";
  setup += providers::bootstrap_file(script);

  const std::string marker = providers::session_marker();
  auto args = ssh_args(h, false);
  args.push_back("exec bash --norc --noprofile -c " +
                 shell_quote(providers::agent_script(node_dir_words(node_id), "\"$D/.stage\"", marker)));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (n.gone) throw Error("ssh provider: bootstrap: node " + node_id + " was terminated");
  }
  try {
    n.session.start(spawner_, args);
  } catch (const std::runtime_error& e) {
    throw Error("ssh provider: " + std::string(e.what()));
  }
  std::string tail;
  auto status = n.session.run_bootstrap(setup, marker, [&](std::string_view line) { log.write(log.ctx, line.data(), line.size()); }, tail);
  if (!status) {
    const int code = n.session.exit_status().value_or(-1);
    throw Error(describe(h) + ": " + node_id + "'s bootstrap: " +
                (code == 255 ? connect_failure(tail, code) : "the session ended (exit status " + std::to_string(code) + ")" +
                                                                 (tail.empty() ? "" : ": " + tail)));
  }
  if (*status != 0)
    throw Error(describe(h) + ": " + node_id + "'s bootstrap exited with status " + std::to_string(*status) +
                (tail.empty() ? "" : ": " + tail));
}

std::string SshProvider::cleanup_script(const std::vector<const Node*>& nodes) const {
  std::string s = "P=" + pool_words() + "\nfor d in";
  for (const Node* n : nodes) s += " " + shell_quote(n->id);
  s +=
      "; do for f in \"$P/$d\"/*.pid; do [ -f \"$f\" ] && kill -TERM -- -\"$(cat \"$f\")\" 2>/dev/null; done; done\n"
      "for i in $(seq 50); do\n"
      "  alive=0\n"
      "  for f in \"$P\"/*/*.pid; do [ -f \"$f\" ] && kill -0 -- -\"$(cat \"$f\")\" 2>/dev/null && alive=1; done\n"
      "  [ $alive = 0 ] && break; sleep 0.1\n"
      "done\n"
      "for d in";
  for (const Node* n : nodes) s += " " + shell_quote(n->id);
  s +=
      "; do for f in \"$P/$d\"/*.pid; do [ -f \"$f\" ] && kill -KILL -- -\"$(cat \"$f\")\" 2>/dev/null; done;"
      " rm -rf \"$P/$d\"; done\n"
      "rmdir \"$P\" 2>/dev/null\n"
      "exit 0\n";
  return s;
}

void SshProvider::terminate(const std::vector<std::string>& node_ids) {
  std::vector<Node*> doomed;
  std::vector<Host*> hosts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    doomed = take_nodes_locked(node_ids);
    for (auto& h : hosts_) hosts.push_back(h.get());
  }
  std::vector<std::string> problems;
  std::mutex problems_mu;
  // On each host at once: the nodes' process groups stopped, their directories removed.
  std::vector<std::future<void>> jobs;
  for (Host* h : hosts) {
    std::vector<const Node*> mine;
    for (Node* n : doomed)
      if (n->host == h) mine.push_back(n);
    if (mine.empty()) continue;
    if (auto c = check_control_socket(h->control_path, ::geteuid()); !c.problem.empty()) {
      std::lock_guard<std::mutex> lock(problems_mu);
      problems.push_back(describe(*h) + ": " + c.problem + " (its workers leave when their lease runs out)");
      continue;
    } else if (!c.exists) {
      continue;  // its master is gone
    }
    jobs.push_back(std::async(std::launch::async, [&, h, mine] {
      try {
        remote_sh(*h, cleanup_script(mine), "tearing down");
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(problems_mu);
        problems.push_back(std::string(e.what()) + " (its workers leave when their lease runs out)");
      }
    }));
  }
  for (auto& j : jobs) j.get();
  // This machine's side: the nodes' sessions, then the connections no node uses any more.
  for (Node* n : doomed) n->session.stop(std::chrono::milliseconds(2000));
  bool all_gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all_gone = all_gone_locked();
  }
  if (all_gone) {
    for (Host* h : hosts) {
      pid_t master;
      {
        std::lock_guard<std::mutex> lock(mu_);
        master = std::exchange(h->master, -1);
      }
      if (master > 0) {
        ::kill(master, SIGTERM);  // ssh closes its sessions and removes the control socket
        reap_within(master, std::chrono::milliseconds(2000));
      }
    }
    remove_control_dir();  // with any socket a master SIGKILLed after the grace could not remove
  }
  if (!problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    throw Error("ssh provider: " + all);
  }
}

}  // namespace skyforge::ssh
