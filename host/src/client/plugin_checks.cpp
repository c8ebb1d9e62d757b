// The plugin checks of `validate` and `run`, in a child process (plugin_checks.hpp).
#include "plugin_checks.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <memory>

#include "crash_context.hpp"
#include "loader.hpp"
#include "services.hpp"

namespace skyforge {
namespace {

// Where a plugin's own refusal of its options points: at the option its message names (as a
// whole word), else at the plugin's entry.
SourcePos refusal_pos(const std::string& message, const OptionList& options, const std::vector<SourcePos>& option_pos,
                      const SourcePos& entry) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t i = 0; i < options.size() && i < option_pos.size(); ++i) {
    const std::string& key = options[i].first;
    for (size_t at = message.find(key); at != std::string::npos; at = message.find(key, at + 1)) {
      const size_t end = at + key.size();
      if ((at == 0 || !word(message[at - 1])) && (end == message.size() || !word(message[end]))) return option_pos[i];
    }
  }
  return entry;
}

bool write_all(int fd, const std::string& data) {
  for (size_t off = 0; off < data.size();) {
    const ssize_t w = ::write(fd, data.data() + off, data.size() - off);
    if (w > 0) off += static_cast<size_t>(w);
    else if (w < 0 && errno == EINTR) continue;
    else return false;
  }
  return true;
}

std::string run_check(const IsolatedCheck& c) {
  try {
    return c.run();
  } catch (const std::exception& e) {
    return c.where + ": " + e.what();
  }
}

}  // namespace

// Runs `checks` in order in a child process (fork, no exec) and returns their problems. A plugin
// that crashes there (SIGSEGV in its create()) or ends the process costs only the child: the
// crash reporter's line comes back through a pipe and becomes the problem of the check it hit —
// "job.toml:5:1: [[plugins]] foo: plugin 'foo' (libfoo.so) crashed in create() with SIGSEGV
// (signal 11)" — and the checks after it are not run. Where no child can be made, runs them here.
std::vector<std::string> run_isolated(const std::vector<IsolatedCheck>& checks) {
  std::vector<std::string> problems;
  auto here = [&] {
    for (const auto& c : checks)
      if (std::string p = run_check(c); !p.empty()) problems.push_back(std::move(p));
    return problems;
  };
  if (checks.empty()) return problems;
  int res[2], crash[2];
  if (::pipe2(res, O_CLOEXEC) != 0) return here();
  if (::pipe2(crash, O_CLOEXEC) != 0) {
    ::close(res[0]), ::close(res[1]);
    return here();
  }
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(res[0]), ::close(res[1]), ::close(crash[0]), ::close(crash[1]);
    return here();
  }
  if (pid == 0) {
    // Each check's result as "<length>\n<problems>", so that the parent knows how far it got.
    ::close(res[0]), ::close(crash[0]);
    set_crash_report_fd(crash[1]);
    for (const auto& c : checks) {
      const std::string p = run_check(c);
      if (!write_all(res[1], std::to_string(p.size()) + "\n" + p)) ::_exit(1);
    }
    ::_exit(0);
  }
  ::close(res[1]), ::close(crash[1]);
  // Read until the child is gone (not until EOF: something a plugin started may hold the pipes).
  std::string out, crashed;
  pollfd fds[2] = {{res[0], POLLIN, 0}, {crash[0], POLLIN, 0}};
  std::string* into[2] = {&out, &crashed};
  for (pollfd& f : fds) ::fcntl(f.fd, F_SETFL, ::fcntl(f.fd, F_GETFL) | O_NONBLOCK);
  auto drain = [&] {
    for (int i = 0; i < 2; ++i) {
      char buf[4096];
      for (ssize_t r; fds[i].fd >= 0;) {
        r = ::read(fds[i].fd, buf, sizeof buf);
        if (r > 0) into[i]->append(buf, static_cast<size_t>(r));
        else if (r < 0 && errno == EINTR) continue;
        else {
          if (r == 0) fds[i].fd = -1;  // EOF: poll ignores it from here on
          break;
        }
      }
    }
  };
  int status = 0;
  bool reaped = false;
  for (;;) {
    ::poll(fds, 2, 50);
    drain();
    // Both pipes at EOF: the child is ending (or closed them itself): wait for it.
    const pid_t r = ::waitpid(pid, &status, fds[0].fd < 0 && fds[1].fd < 0 ? 0 : WNOHANG);
    if (r == pid) reaped = true;
    if (r == pid || (r < 0 && errno != EINTR)) break;
  }
  drain();
  ::close(res[0]), ::close(crash[0]);
  size_t done = 0;
  for (size_t at = 0;;) {
    const size_t nl = out.find('\n', at);
    if (nl == std::string::npos || nl == at || out.find_first_not_of("0123456789", at) != nl) break;
    const size_t len = std::stoul(out.substr(at, nl - at));
    if (out.size() - (nl + 1) < len) break;
    if (len) problems.push_back(out.substr(nl + 1, len));
    ++done;
    at = nl + 1 + len;
  }
  if (done < checks.size()) {
    // The child ended in checks[done]: say how, in the crash reporter's words when it spoke.
    std::string how = crashed.substr(0, crashed.find('\n'));
    if (const std::string prefix = "skyforge: "; how.rfind(prefix, 0) == 0) how.erase(0, prefix.size());
    if (how.empty()) {
      if (reaped && WIFSIGNALED(status))
        how = std::string("the check died of ") + fatal_signal_name(WTERMSIG(status)) + " (signal " +
              std::to_string(WTERMSIG(status)) + ")";
      else if (reaped && WIFEXITED(status))
        how = "a plugin ended the process (exit status " + std::to_string(WEXITSTATUS(status)) + ") during the check";
      else
        how = "the check's process was lost";
    }
    problems.push_back(checks[done].where + ": " + how + " (nothing was started)");
  }
  return problems;
}

// The checks only a plugin can make: create() the provider, every [[plugins]] entry and a map
// job's task backend with their options, on the client, as `run` will, and destroy them again.
// A refusal is a manifest problem at the option it names. (Constructors validate; they start
// nothing.) They run in a child process (run_isolated): a plugin that crashes is a problem too.
void check_plugins_accept_their_options(const Manifest& m, const Catalog& catalog) {
  std::vector<IsolatedCheck> checks;
  // Built in the child: one loader (and services) for every check, as before.
  auto loader = std::make_shared<std::unique_ptr<Loader>>();
  auto services = std::make_shared<std::unique_ptr<Services>>();
  auto check = [&](const std::string& name, const OptionList& options, const std::vector<SourcePos>& option_pos,
                   const SourcePos& entry, const std::string& where) {
    const PluginInfo* info = catalog.find(name);
    if (!info) return;  // validate_against reported it
    checks.push_back(IsolatedCheck{
        entry.str() + ": " + where, [=, &options, &option_pos]() -> std::string {
          if (!*loader) {
            *services = std::make_unique<Services>([](int32_t, const std::string&) {});
            *loader = std::make_unique<Loader>((*services)->table());
          }
          try {
            (*loader)->create((*loader)->load(info->library, info->name), options);
          } catch (const PluginError& e) {
            return refusal_pos(e.what(), options, option_pos, entry).str() + ": " + where + ": " + e.what();
          } catch (const LoadError& e) {
            return entry.str() + ": " + where + ": " + e.what();
          }
          return "";
        }});
  };
  check(m.pool.provider, m.pool.provider_options, m.pool.provider_option_pos, m.pool.provider_pos, "[provider]");
  for (const auto& use : m.plugins) check(use.name, use.options, use.option_pos, use.pos, "[[plugins]] " + use.name);
  if (m.job.mode == JobMode::map)
    check(m.job.task_backend, m.job.task_options, m.job.task_option_pos, m.job.task_backend_pos, "[tasks]");
  std::vector<std::string> problems = run_isolated(checks);
  if (!problems.empty()) throw ManifestError(std::move(problems));
}

}  // namespace skyforge
