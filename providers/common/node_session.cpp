#include "node_session.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace skyforge::providers {

using Clock = std::chrono::steady_clock;

namespace {

// A log for a child's output that leaves nothing behind, whatever way this process ends: made in
// TMPDIR, opened for appending (the child's) and for reading (ours), then unlinked at once.
void anonymous_log(Fd& write, Fd& read) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/skyforge-session-XXXXXX";
  write.reset(::mkostemp(path.data(), O_CLOEXEC | O_APPEND));
  if (!write) throw std::runtime_error("cannot make a log file in " + path + ": " + std::strerror(errno));
  read.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  int err = errno;
  ::unlink(path.c_str());
  if (!read) throw std::runtime_error("cannot read " + path + ": " + std::strerror(err));
}

off_t log_size(int fd) {
  struct stat sb {};
  return fd >= 0 && ::fstat(fd, &sb) == 0 ? sb.st_size : 0;
}

// A log from `start` to `end` (its end when negative), at most the last 64 KiB of that.
std::string read_log(int fd, off_t start, off_t end = -1) {
  if (end < 0) end = log_size(fd);
  if (fd < 0 || end <= start) return "";
  off_t from = std::max<off_t>(start, end > 65536 ? end - 65536 : 0);
  std::string out(size_t(end - from), '\0');
  ssize_t n = ::pread(fd, out.data(), out.size(), from);
  out.resize(n > 0 ? size_t(n) : 0);
  return out;
}

void write_all(int fd, const std::string& text) {
  size_t off = 0;
  while (off < text.size()) {
    ssize_t k = ::write(fd, text.data() + off, text.size() - off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw SessionGone(std::string("the session is gone: ") + std::strerror(errno));
    off += size_t(k);
  }
}

}  // namespace

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  std::ifstream("/dev/urandom", std::ios::binary).read(raw.data(), std::streamsize(bytes));
  std::string s;
  for (unsigned char c : raw) {
    s += "0123456789abcdef"[c >> 4];
    s += "0123456789abcdef"[c & 15];
  }
  return s;
}

std::string session_marker() { return "SKYFORGE-BOOTSTRAP-" + random_hex(6); }

std::string agent_script(const std::string& dir_words, const std::string& stage_words, const std::string& marker) {
  // What the agent makes (the directory, setup.sh, bootstrap.sh, .stage, the pid files) is the
  // user's alone: umask 077, the directory 0700. bootstrap.sh and the workers get the login's
  // umask back: what they make elsewhere (apt, pip, a job's outputs) keeps its usual modes.
  return "set -u\nU=$(umask)\numask 077\nD=" + dir_words + "\nP=$(dirname \"$D\")\nSTAGE=" + stage_words + "\n" +
         R"(hup=0
trap 'hup=1' HUP
gone() { cd / && rm -rf "$D"; rmdir "$P" 2>/dev/null; }
mkdir -p "$D" && chmod 700 "$D" && [ -O "$D" ] && cd "$D" || { echo "cannot make $D this user's own directory, mode 0700"; exit 97; }
echo $$ > agent.pid
read_setup() { local LC_ALL=C; IFS= read -r n && IFS= read -r -d '' -N "$n" setup; }
read_setup || { gone; exit 98; }
printf '%s' "$setup" > setup.sh
D="$D" sh ./setup.sh 2>&1 && ( umask "$U"; SKYFORGE_STAGE_ROOT="$STAGE" exec bash --norc --noprofile ./bootstrap.sh < /dev/null 2>&1 )
status=$?
trap '' PIPE
echo ")" + marker + R"( $status"
rc=0
# Workers, one after another (a restart sends the next one), until stdin closes.
while :; do
  got=0; envs=(); lease=
  while IFS= read -r kv; do
    if [ -z "$kv" ]; then got=1; break; fi
    envs+=("$kv")
    case $kv in SKYFORGE_LEASE_FILE=*) lease=${kv#*=} ;; esac
  done
  [ $got = 1 ] && [ $hup = 0 ] || break
  got=0; args=()
  while IFS= read -r a; do if [ "$a" = . ]; then got=1; break; fi; args+=("${a:1}"); done
  [ $got = 1 ] && [ $hup = 0 ] && [ ${#args[@]} -gt 0 ] || break
  export SKYFORGE_STAGE_ROOT="$STAGE"
  w0=${args[0]}
  [ -e "$SKYFORGE_STAGE_ROOT$w0" ] && w0=$SKYFORGE_STAGE_ROOT$w0
  # The environment is exported in a subshell, by a builtin: it stays out of every argv, and
  # the next worker starts from the agent's own. SKYFORGE_NODE_AGENT: the node's directory is this
  # agent's, which removes it when the host is gone and keeps it for the next worker until then.
  ( umask "$U"; [ ${#envs[@]} -gt 0 ] && export "${envs[@]}"; export SKYFORGE_NODE_AGENT=1; exec setsid "$w0" "${args[@]:1}" < /dev/null ) &
  w=$!
  echo "$w" > worker.pid
  lost=0
  while kill -0 "$w" 2>/dev/null; do
    IFS= read -r -t 0.1 _; r=$?
    if [ $hup = 1 ] || { [ $r -ne 0 ] && [ $r -le 128 ]; }; then
      kill -TERM -- -"$w" 2>/dev/null
      for i in $(seq 50); do kill -0 "$w" 2>/dev/null || break; sleep 0.1; done
      kill -KILL -- -"$w" 2>/dev/null
      # The host's session is gone: a machine-level dead-man switch acts now (SKYFORGE_LEASE_FILE, aws).
      [ -n "$lease" ] && touch -d @0 "$lease" 2>/dev/null
      lost=1
      break
    fi
  done
  wait "$w"; rc=$?
  rm -f worker.pid
  [ $lost = 1 ] && break
  printf '\n%s %s\n' ")" + marker + R"(-exit" "$rc"
done
gone
exit $rc
)";
}

std::string bootstrap_file(const std::string& script) {
  const std::string eof = "SKYFORGE_BOOTSTRAP_" + random_hex(8);
  return "cat > \"$D/bootstrap.sh\" <<'" + eof + "'\n" + script +
         (script.empty() || script.back() == '\n' ? "" : "\n") + eof + "\n";
}

void NodeSession::start(Spawner& spawner, const std::vector<std::string>& argv) {
  Fd log_w, log_r;
  anonymous_log(log_w, log_r);
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  Fd in_r(p[0]), in_w(p[1]);
  SpawnSpec s;
  s.argv = argv;
  s.env = environment_with({{"LC_ALL", "C"}});
  s.stdin_fd = in_r.get();
  s.stdout_fd = log_w.get();
  s.parent_death_signal = SIGKILL;  // this machine gone: the session's input closes, the agent acts
  std::lock_guard<std::mutex> lock(mu_);
  if (pid_ > 0) throw std::runtime_error("the node's session was started already");
  pid_ = spawner.spawn(s);
  input_ = std::move(in_w);
  log_ = std::move(log_r);
}

std::optional<int> NodeSession::run_bootstrap(const std::string& setup, const std::string& marker,
                                              const std::function<void(std::string_view)>& on_line, std::string& tail) {
  int in, log;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in = input_.get();
    log = log_.get();
  }
  // The setup may exceed the pipe's buffer: written beside the reading below.
  std::thread writer([in, text = std::to_string(setup.size()) + "\n" + setup] {
    try {
      write_all(in, text);
    } catch (const std::exception&) {  // the session is gone: the reading below says so
    }
  });
  std::string pending;
  std::optional<int> status;
  bool ended = false;
  char buf[4096];
  for (;;) {
    ssize_t k = ::read(log, buf, sizeof buf);
    if (k > 0) {
      pending.append(buf, size_t(k));
      size_t nl;
      while (!status && (nl = pending.find('\n')) != std::string::npos) {
        std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        if (line.rfind(marker + " ", 0) == 0) {
          status = std::atoi(line.c_str() + marker.size() + 1);
          std::lock_guard<std::mutex> lock(mu_);
          marker_ = marker;
          worker_output_ = ::lseek(log, 0, SEEK_CUR) - off_t(pending.size());  // the worker's begins here
        } else {
          tail = line;
          on_line(line);
        }
      }
      if (status) break;
      continue;
    }
    if (ended) break;  // everything it wrote has been read
    {
      std::lock_guard<std::mutex> lock(mu_);
      reap_locked(false);
      ended = reaped_;
    }
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  writer.join();
  if (!status && !pending.empty()) tail = trim(pending);
  return status;
}

void NodeSession::start_worker(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  if (argv.empty()) throw std::invalid_argument("start_worker: empty command");
  std::string text;
  for (const auto& [k, v] : env) {
    if (k.empty() || k.find_first_of("=\n") != std::string::npos || v.find('\n') != std::string::npos)
      throw std::invalid_argument("start_worker: environment variable '" + k + "' cannot be sent (a '=' or newline in it)");
    text += k + "=" + v + "\n";
  }
  text += "\n";
  for (const auto& a : argv) {
    if (a.find('\n') != std::string::npos) throw std::invalid_argument("start_worker: a newline in argument '" + a + "'");
    text += "+" + a + "\n";
  }
  text += ".\n";
  std::lock_guard<std::mutex> lock(mu_);
  if (!input_ || marker_.empty()) throw std::runtime_error("the node has no session (bootstrap first)");
  reap_locked(false);
  if (reaped_) throw SessionGone("the session is gone (exit status " + std::to_string(exit_code(status_)) + ")");
  scan_locked();
  if (worker_started_ && !worker_exit_) throw std::runtime_error("a worker still runs there");
  if (worker_started_) worker_output_ = log_size(log_.get());  // the next worker's output begins here
  worker_started_ = true;
  worker_exit_.reset();
  worker_end_ = -1;
  scan_ = line_start_ = worker_output_;
  line_head_.clear();
  write_all(input_.get(), text);  // a few hundred bytes: the pipe takes them at once
}

// The agent's exit line begins a line ("\n<marker>-exit STATUS\n"): only each line's first
// bytes are kept while scanning, however long the worker's own lines are.
void NodeSession::scan_locked() {
  if (!worker_started_ || worker_exit_) return;
  const std::string prefix = marker_ + "-exit ";
  const size_t keep = prefix.size() + 12;
  const off_t end = log_size(log_.get());
  char buf[8192];
  while (scan_ < end && !worker_exit_) {
    ssize_t k = ::pread(log_.get(), buf, size_t(std::min<off_t>(end - scan_, sizeof buf)), scan_);
    if (k <= 0) return;
    for (ssize_t i = 0; i < k; ++i) {
      if (buf[i] != '\n') {
        if (line_head_.size() < keep) line_head_ += buf[i];
        continue;
      }
      if (line_head_.rfind(prefix, 0) == 0) {
        worker_exit_ = std::atoi(line_head_.c_str() + prefix.size());
        worker_end_ = line_start_;
      }
      line_start_ = scan_ + i + 1;
      line_head_.clear();
      if (worker_exit_) break;
    }
    scan_ += k;
  }
}

void NodeSession::reap_locked(bool block) {
  if (pid_ <= 0 || reaped_) return;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, block ? 0 : WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    status_ = st;
  }
}

int NodeSession::alive() {
  std::lock_guard<std::mutex> lock(mu_);
  if (pid_ <= 0) return -1;
  reap_locked(false);
  scan_locked();
  return reaped_ || worker_exit_ ? 0 : 1;
}

std::optional<int> NodeSession::exit_status() {
  std::lock_guard<std::mutex> lock(mu_);
  reap_locked(false);
  scan_locked();
  if (worker_exit_) return worker_exit_;
  if (!reaped_) return std::nullopt;
  return exit_code(status_);
}

std::string NodeSession::last_words() {
  int log;
  off_t from, to;
  {
    std::lock_guard<std::mutex> lock(mu_);
    scan_locked();
    log = log_.get();
    from = worker_output_;
    to = worker_end_;
  }
  return last_line(read_log(log, from, to));
}

void NodeSession::stop(std::chrono::milliseconds grace) {
  pid_t pid;
  {
    std::lock_guard<std::mutex> lock(mu_);
    input_.reset();
    pid = reaped_ ? -1 : pid_;
  }
  if (pid <= 0) return;
  ::kill(-pid, SIGTERM);
  int st = reap_within(pid, grace);
  std::lock_guard<std::mutex> lock(mu_);
  reaped_ = true;
  status_ = st;
}

// ---- shared helpers ------------------------------------------------------------------------------

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(trim(l));
  return out;
}

std::string first_line(const std::string& text) {
  for (const auto& l : lines_of(text))
    if (!l.empty()) return l;
  return "";
}

std::string last_line(const std::string& text) {
  auto lines = lines_of(text);
  for (auto it = lines.rbegin(); it != lines.rend(); ++it)
    if (!it->empty() && it->rfind("Warning: Permanently added", 0) != 0) return *it;
  return "";
}

std::string route_source(const std::string& peer) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_flags = AI_NUMERICHOST;
  hints.ai_socktype = SOCK_DGRAM;
  if (::getaddrinfo(peer.c_str(), "9", &hints, &res) != 0 || !res) return "";
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, ::freeaddrinfo);
  Fd s(::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s || ::connect(s.get(), res->ai_addr, res->ai_addrlen) != 0) return "";  // a UDP connect sends nothing
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = {};
  const void* a = local.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                                               : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
  return ::inet_ntop(local.ss_family, a, buf, sizeof buf) ? buf : "";
}

int reap_within(pid_t pid, std::chrono::milliseconds grace) {
  int st = 0;
  const auto deadline = Clock::now() + grace;
  for (;;) {
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return st;
    if (Clock::now() >= deadline) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      return st;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace skyforge::providers
