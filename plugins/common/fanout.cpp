#include "fanout.hpp"

#include <algorithm>

namespace skyforge::fw {

namespace {

// Read fanout.hpp first. Notes on the shell:
//  - each copy writes "up i" once it runs with the default SIGTERM action, and its monitor
//    writes "exit i status" when it ends, to a pipe a reader drains; the reader stops the others on the first
//    failure, once every copy is up (a process forked after the signal would miss it). The
//    copies' own stdout is the node's stdout (fd 3).
//  - `kill -TERM 0` reaches the whole process group the worker started the command in; every
//    shell of the launcher traps TERM (a trap, not an ignore: exec'd programs get the default
//    action back), so the launcher survives to report the status of the first failure.
//  - dash-compatible: no arrays, no `wait -n`, no `local`.
const char* const kScript = R"SH(n=${SKYFORGE_FANOUT_NPROC:-1}
case $n in
  ''|*[!0-9]*|0) echo "skyforge-fanout: SKYFORGE_FANOUT_NPROC must be a positive count, got '$n'" >&2; exit 2 ;;
esac
if [ "$#" -eq 0 ]; then echo "skyforge-fanout: no command to run" >&2; exit 2; fi
set -f
for _v in ${SKYFORGE_FANOUT_ADD-}; do
  case $_v in
    [!A-Za-z_]*|*[!A-Za-z0-9_]*) echo "skyforge-fanout: '$_v' is not a variable name" >&2; exit 2 ;;
  esac
  eval "_x=\${$_v-}"
  case $_x in
    ''|*[!0-9]*) echo "skyforge-fanout: $_v='$_x' is not a number" >&2; exit 2 ;;
  esac
done
_nth() { _k=$1; shift; [ "$#" -gt 0 ] || return 0; shift $((_k % $#)); printf '%s' "$1"; }
# Stopping the others is `kill 0`: only safe when this shell leads its own process group (the
# worker starts every command so); elsewhere a failure just waits for the others.
_third() { printf '%s' "$3"; }
_leader=0
if [ -r "/proc/$$/stat" ]; then
  _st=$(cat "/proc/$$/stat")
  _st=${_st##*") "}
  [ "$(_third $_st)" = "$$" ] && _leader=1
fi
trap : TERM
exec 3>&1
_rc=$(
  trap : TERM
  {
    _i=0
    while [ "$_i" -lt "$n" ]; do
      (
        # The monitor of copy _i survives SIGTERM (trap) to report; the copy itself is a
        # subshell with the default action from its birth, that execs the program.
        trap : TERM
        (
          # "up" from the copy itself: by now its SIGTERM action is the default, so a SIGTERM
          # the reader sends after every "up" cannot be lost between fork and exec.
          echo "up $_i"
          _dev=$(_nth "$_i" ${SKYFORGE_FANOUT_DEVICES-})
          export SKYFORGE_LOCAL_PROC="$_i"
          for _v in ${SKYFORGE_FANOUT_ADD-}; do eval "export $_v=\$(( $_v + _i ))"; done
          if [ -n "$_dev" ]; then export CUDA_VISIBLE_DEVICES="$_dev"; fi
          exec "$@" >&3 3>&-
        ) &
        _p=$!
        # A trapped signal makes `wait` return early: wait again while the copy still runs.
        while :; do
          wait "$_p"
          _s=$?
          kill -0 "$_p" 2>/dev/null || break
        done
        echo "exit $_i $_s"
      ) &
      _i=$((_i + 1))
    done
  } | {
    trap : TERM
    _r=0
    _k=0
    _up=0
    _stop=0
    while [ "$_k" -lt "$n" ] && read -r _what _who _s; do
      case $_what in
        up) _up=$((_up + 1)) ;;
        exit)
          _k=$((_k + 1))
          if [ "$_s" -ne 0 ] && [ "$_r" -eq 0 ]; then
            _r=$_s
            if [ "$_leader" = 1 ]; then
              echo "skyforge-fanout: process $_who of $n exited with status $_s; stopping the others" >&2
              _stop=1
            else
              echo "skyforge-fanout: process $_who of $n exited with status $_s; waiting for the others" >&2
            fi
          fi
          ;;
      esac
      # Stop the others once every copy exists (a copy forked after the signal would miss it).
      if [ "$_stop" = 1 ] && [ "$_up" -ge "$n" ]; then
        _stop=2
        kill -TERM 0 2>/dev/null
        # SIGKILL 30 s later, unless the launcher ($$, the main shell) has exited by then.
        sh -c 'i=0; while [ $i -lt 30 ]; do sleep 1; kill -0 "$1" 2>/dev/null || exit 0; i=$((i+1)); done
               kill -KILL 0' skyforge-fanout-kill "$$" </dev/null >/dev/null 2>&1 3>&- &
      fi
    done
    if [ "$_k" -lt "$n" ] && [ "$_r" -eq 0 ]; then _r=1; fi
    echo "$_r"
  }
)
exit "${_rc:-1}"
)SH";

std::string_view basename(std::string_view p) {
  auto slash = p.rfind('/');
  return slash == std::string_view::npos ? p : p.substr(slash + 1);
}

bool is_python(std::string_view p) { return basename(p).rfind("python", 0) == 0; }

}  // namespace

const std::string& fanout_script() {
  static const std::string s = kScript;
  return s;
}

bool is_fanout(const std::vector<std::string>& argv) {
  return argv.size() >= 4 && argv[0] == "sh" && argv[1] == "-c" && argv[2] == fanout_script() &&
         argv[3] == kFanoutName;
}

std::vector<std::string> fanout_argv(std::vector<std::string> argv) {
  if (is_fanout(argv)) return argv;
  std::vector<std::string> out = {"sh", "-c", fanout_script(), kFanoutName};
  out.insert(out.end(), std::make_move_iterator(argv.begin()), std::make_move_iterator(argv.end()));
  return out;
}

std::vector<std::string> unwrap_fanout(const std::vector<std::string>& argv) {
  if (!is_fanout(argv)) return argv;
  return std::vector<std::string>(argv.begin() + 4, argv.end());
}

bool is_torchrun(const std::vector<std::string>& argv0) {
  const auto argv = unwrap_fanout(argv0);
  if (argv.empty()) return false;
  if (basename(argv[0]) == "torchrun") return true;
  return argv.size() >= 3 && is_python(argv[0]) && argv[1] == "-m" &&
         (argv[2] == "torch.distributed.run" || argv[2] == "torch.distributed.launch");
}

bool is_accelerate_launch(const std::vector<std::string>& argv0) {
  const auto argv = unwrap_fanout(argv0);
  if (argv.size() >= 2 && basename(argv[0]) == "accelerate" && argv[1] == "launch") return true;
  return argv.size() >= 3 && is_python(argv[0]) && argv[1] == "-m" && argv[2] == "accelerate.commands.launch";
}

std::vector<std::string> split_words(std::string_view list) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < list.size()) {
    while (i < list.size() && (list[i] == ' ' || list[i] == '\t')) ++i;
    size_t j = i;
    while (j < list.size() && list[j] != ' ' && list[j] != '\t') ++j;
    if (j > i) out.emplace_back(list.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string add_words(std::string_view list, const std::vector<std::string>& words) {
  std::vector<std::string> all = split_words(list);
  for (const auto& w : words)
    if (std::find(all.begin(), all.end(), w) == all.end()) all.push_back(w);
  std::string out;
  for (const auto& w : all) out += (out.empty() ? "" : " ") + w;
  return out;
}

}  // namespace skyforge::fw
