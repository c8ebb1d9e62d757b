#!/usr/bin/env bash
# Installs skyforge into a temporary prefix, builds every template (framework plugin, app,
# compute backend, task backend, provider) out of tree against it exactly as their READMEs say,
# and runs their jobs with the installed host. Also checks that the installed host finds its own
# plugins (local, torch), plugins named by $SKYFORGE_PLUGIN_PATH and a plugin installed with no
# --prefix; that no run leaves anything in its TMPDIR, nor a provider a worker; and that an
# `abi` of another major stops the configure and takes the configured plugin.toml with it.
#
# usage: test_install.sh --build-dir DIR --source-dir DIR [--cmake PATH] [--generator NAME] [--cxx PATH]
set -euo pipefail

build_dir="" source_dir="" cmake_bin=cmake generator="" cxx=""
while (($#)); do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --source-dir) source_dir=$2; shift 2 ;;
    --cmake) cmake_bin=$2; shift 2 ;;
    --generator) generator=$2; shift 2 ;;
    --cxx) cxx=$2; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "test_install.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n $build_dir && -n $source_dir ]] || { echo "test_install.sh: --build-dir and --source-dir are required" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/skyforge-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

prefix=$work/prefix
run_tmp=$work/tmp   # TMPDIR of every skyforge run: must be empty again after each
mkdir -p "$run_tmp"
unset SKYFORGE_PLUGIN_PATH   # the installed host must find its plugins on its own

step() { echo "== $*"; }
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
show() {  # show NAME: what a captured command printed
  echo "--- stdout of $1:" >&2
  cat "$work/$1.out" >&2
  echo "--- stderr of $1:" >&2
  cat "$work/$1.err" >&2
}

# capture NAME CMD...: runs CMD with stdout/stderr to $work/NAME.{out,err}; sets $rc.
capture() {
  local name=$1
  shift
  set +e
  "$@" >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
  set -e
}

# skyforge NAME ARGS...: the installed host, with a time limit, in the checked TMPDIR.
skyforge() {
  local name=$1
  shift
  capture "$name" env TMPDIR="$run_tmp" timeout --kill-after=10 120 "$prefix/bin/skyforge" "$@"
  local left
  left=$(ls -A "$run_tmp")
  [[ -z $left ]] || { show "$name"; fail "skyforge $* left files in its TMPDIR: $left"; }
}

expect_ok() {
  [[ $rc -eq 0 ]] || { show "$1"; fail "$1: exit code $rc, expected 0"; }
}
expect_line() {  # expect_line NAME LINE: stdout of NAME has exactly this line
  grep -qxF -- "$2" "$work/$1.out" || { show "$1"; fail "$1: no output line '$2'"; }
}
expect_match() {  # expect_match NAME ERE: stdout of NAME has a line matching the extended regex
  grep -qE -- "$2" "$work/$1.out" || { show "$1"; fail "$1: no output line matching /$2/"; }
}

# ---- 1. install ------------------------------------------------------------------------------
step "cmake --install $build_dir --prefix $prefix"
capture install "$cmake_bin" --install "$build_dir" --prefix "$prefix"
expect_ok install
for f in bin/skyforge bin/skyforge-worker include/skyforge/abi.h include/skyforge/sdk.hpp; do
  [[ -e $prefix/$f ]] || fail "the install has no $f"
done
config=$(find "$prefix" -path '*/cmake/skyforge/skyforgeConfig.cmake' -print -quit)
[[ -n $config ]] || fail "the install has no lib/cmake/skyforge/skyforgeConfig.cmake"

# ---- 2. build each template out of tree, as its README says ----------------------------------
configure_args=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo)
[[ -n $generator ]] && configure_args+=(-G "$generator")
[[ -n $cxx ]] && configure_args+=(-DCMAKE_CXX_COMPILER="$cxx")

build_template() {  # build_template DIR PLUGIN
  local dir=$1 plugin=$2
  step "build templates/$dir"
  cp -r "$source_dir/templates/$dir" "$work/$dir"
  rm -rf "$work/$dir/build"  # a user's own build of the template in the source tree
  capture "configure-$dir" "$cmake_bin" -S "$work/$dir" -B "$work/$dir/build" "${configure_args[@]}"
  expect_ok "configure-$dir"
  capture "build-$dir" "$cmake_bin" --build "$work/$dir/build" -j2
  expect_ok "build-$dir"
  local lib=$work/$dir/build/plugins/$plugin/lib$plugin.so
  [[ -f $lib ]] || fail "templates/$dir built no $lib"
  grep -qx "library = \"lib$plugin.so\"" "$work/$dir/build/plugins/$plugin/plugin.toml" ||
    fail "templates/$dir: plugin.toml beside the library does not name lib$plugin.so"
  # docs/plugins.md: a plugin exports one symbol, its entry. Instantiations of namespace std
  # templates keep libstdc++'s default visibility and are left out of this check.
  local exported
  exported=$(nm -D --defined-only "$lib" | awk '{print $NF}' | grep -vE '^_Z(Z|N|K|V|r|T[ISV]|GV)*St' || true)
  [[ $exported == skyforge_plugin_entry ]] || fail "$lib must export only skyforge_plugin_entry, exports: $(echo $exported)"
}
build_template framework-plugin my_framework
build_template app my_app
build_template compute-backend my_backend
build_template task-backend my_tasks
build_template provider my_provider

# ---- 3. run their jobs with the installed host -----------------------------------------------
step "skyforge run templates/framework-plugin/job.toml"
skyforge run-framework run "$work/framework-plugin/job.toml"
expect_ok run-framework
expect_line run-framework "[node 0] hi from node 0 of 2"
expect_line run-framework "[node 1] hi from node 1 of 2"

step "skyforge run templates/app/job.toml"
skyforge run-app run "$work/app/job.toml"
expect_ok run-app
expect_line run-app "[node 0] => my_app on node 0 of 2 (head)"
expect_line run-app "[node 1] => my_app on node 1 of 2"

# The same app from any manifest through $SKYFORGE_PLUGIN_PATH, as a map over every slot.
step "SKYFORGE_PLUGIN_PATH=... skyforge run (map over my_app)"
cat >"$work/map.toml" <<'TOML'
[pool]
nodes = 2
concurrency = 2

[job]
app = "my_app"
mode = "map"
inputs = ["abc", "skyforge", "x", "12345"]
TOML
plugin_path="$work/framework-plugin/build/plugins:$work/app/build/plugins"
SKYFORGE_PLUGIN_PATH=$plugin_path skyforge run-map run "$work/map.toml"
expect_ok run-map
expect_line run-map "[task 0] => cba"
expect_line run-map "[task 1] => egrofyks"
expect_line run-map "[task 2] => x"
expect_line run-map "[task 3] => 54321"

# Configured with no install prefix, a plugin project installs into the prefix of the skyforge it
# was built against, where that skyforge needs no plugin_path at all. (Checked before installing:
# the default would write to /usr/local.)
step "cmake --install templates/app with no --prefix; skyforge plugins, run (map over my_app, no plugin path)"
grep -qxF "CMAKE_INSTALL_PREFIX:PATH=$prefix" "$work/app/build/CMakeCache.txt" ||
  fail "templates/app configured with no prefix installs to $(grep '^CMAKE_INSTALL_PREFIX:' "$work/app/build/CMakeCache.txt"), not skyforge's prefix $prefix"
capture install-app "$cmake_bin" --install "$work/app/build"
expect_ok install-app
installed=$(find "$prefix" -path '*/skyforge/plugins/my_app/libmy_app.so' -print -quit)
[[ -n $installed && -f $(dirname "$installed")/plugin.toml ]] ||
  { show install-app; fail "cmake --install of templates/app put no my_app/{libmy_app.so,plugin.toml} in the plugin directory"; }
skyforge plugins-installed plugins
expect_ok plugins-installed
expect_match plugins-installed "^\s*app\s+my_app\s.*$prefix/"
skyforge run-map-installed run "$work/map.toml"
expect_ok run-map-installed
expect_line run-map-installed "[task 1] => egrofyks"

# The template compute backend passes the conformance suite (what it has no kernels for is
# skipped), agrees with the installed cpu backend, and trains the main job's MLP on 2 nodes.
step "skyforge backend-check my_backend"
skyforge backend-check backend-check my_backend --plugin-path "$work/compute-backend/build/plugins"
expect_ok backend-check
expect_match backend-check '^PASS  layer dense: 40 of 53 parameters'"'"' gradients agree with finite differences'
expect_match backend-check '^PASS  data parallel: replicas bit-identical'
expect_match backend-check '^PASS  agrees with cpu: after 10 steps, mlp: same initial weights, loss '
expect_match backend-check '^PASS  checkpoint with cpu: mlp: resumes to cpu '
expect_match backend-check '^[0-9]+ passed, [0-9]+ skipped, 0 failed$'

step "skyforge run templates/compute-backend/job.toml"
skyforge run-backend run "$work/compute-backend/job.toml"
expect_ok run-backend
expect_match run-backend '^\[node 0\] Test loss: [0-9.]+ - test accuracy: 0\.[6-9][0-9]* \(10000 samples\)$'
hashes=$(sed -nE 's/^\[node [01]\] => .*"weights_fnv1a64": "([0-9a-f]+)".*$/\1/p' "$work/run-backend.out" | sort -u)
[[ $(echo "$hashes" | wc -l) -eq 1 && -n $hashes ]] || { show run-backend; fail "my_backend's replicas differ: $hashes"; }

# The template task backend schedules a map of the installed `hello` app: its report replaces
# the line per task's default, and the results come back whole.
step "skyforge run templates/task-backend/job.toml"
skyforge run-tasks run "$work/task-backend/job.toml"
expect_ok run-tasks
expect_line run-tasks "my_tasks: node 0 ran tasks 0 to 4"
expect_line run-tasks "my_tasks: node 1 ran tasks 5 to 9"
expect_line run-tasks "[task 0] => 0^2=0"
expect_line run-tasks "[task 9] => 9^2=81"

# The template provider makes the nodes of a command job and of a map job; teardown leaves no
# worker (their pids, printed by the command, are gone) and no directory (the TMPDIR check).
step "skyforge run templates/provider/job.toml"
skyforge run-provider run "$work/provider/job.toml"
expect_ok run-provider
expect_match run-provider '^\[node 0\] node 0 of 2 in node-0, worker pid [0-9]+$'
expect_match run-provider '^\[node 1\] node 1 of 2 in node-1, worker pid [0-9]+$'
for pid in $(sed -nE 's/^\[node [01]\] .*, worker pid ([0-9]+)$/\1/p' "$work/run-provider.out"); do
  ! kill -0 "$pid" 2>/dev/null || { show run-provider; fail "my_provider left worker $pid running"; }
done

step "skyforge run templates/provider/map.toml"
skyforge run-provider-map run "$work/provider/map.toml"
expect_ok run-provider-map
expect_line run-provider-map "[task 0] => 0^2=0"
expect_line run-provider-map "[task 7] => 7^2=49"

step "skyforge plugins"
SKYFORGE_PLUGIN_PATH=$plugin_path skyforge plugins plugins
expect_ok plugins
expect_match plugins '^\s*provider\s+local\s'
expect_match plugins '^\s*framework\s+torch\s'
expect_match plugins '^\s*framework\s+my_framework\s'
expect_match plugins '^\s*app\s+my_app\s'

# The installed plugins work too: the torch plugin's environment on 2 nodes.
step "skyforge run examples/command.toml (installed torch plugin)"
skyforge run-torch run "$source_dir/examples/command.toml"
expect_ok run-torch
expect_match run-torch '^\[node 0\] rank=0 world=2 master=[^:]+:[0-9]+$'
expect_match run-torch '^\[node 1\] rank=1 world=2 master=[^:]+:[0-9]+$'
masters=$(sed -nE 's/^\[node [01]\] rank=[01] world=2 master=(.*)$/\1/p' "$work/run-torch.out" | sort -u | wc -l)
[[ $masters -eq 1 ]] || { show run-torch; fail "the ranks disagree on MASTER_ADDR:MASTER_PORT"; }

# abi = "2.0" builds against no 1.x SDK: the configure fails at the line, and the plugin.toml an
# earlier configure put beside the library goes (a reconfigure of the app's build: seconds).
step "templates/app with abi = \"2.0\": cmake refuses it"
sed -i 's/^abi = .*/abi = "2.0"/' "$work/app/plugin.toml"
abi_line=$(grep -n '^abi = ' "$work/app/plugin.toml" | cut -d: -f1)
capture configure-abi2 "$cmake_bin" -S "$work/app" -B "$work/app/build"
[[ $rc -ne 0 ]] || { show configure-abi2; fail "a plugin.toml with abi = \"2.0\" configured"; }
message=$(tr -s ' \n' ' ' <"$work/configure-abi2.err")
for part in "$work/app/plugin.toml:$abi_line: plugin 'my_app': abi = \"2.0\": plugin ABI major 2" \
            "expected abi = \"1.N\""; do
  [[ $message == *"$part"* ]] || { show configure-abi2; fail "configure with abi = \"2.0\" does not say: $part"; }
done
[[ ! -e $work/app/build/plugins/my_app/plugin.toml ]] || fail "a failed configure left build/plugins/my_app/plugin.toml"

echo "PASS: installed SDK builds the five templates and the installed host runs them"
