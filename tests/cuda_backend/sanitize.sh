#!/bin/bash
# compute-sanitizer over 20 steps of the main job on the cuda backend, every process of the pool
# tracked (the workers are the skyforge host's children): memcheck (out-of-bounds and misaligned
# accesses, leaks of device memory), initcheck (reads of device memory never written) or
# racecheck (shared-memory hazards between a block's threads). Exit 77 (CTest: skipped) without
# a usable GPU or without the sanitizer; 1 on any error the tool reports.
# Usage: sanitize.sh memcheck|initcheck|racecheck <skyforge binary> <examples/fashion-mnist.toml>
set -euo pipefail
tool=$1 skyforge=$2 example=$3
[[ $tool =~ ^(memcheck|initcheck|racecheck)$ ]] || { echo "sanitize.sh: unknown tool '$tool'" >&2; exit 2; }
sanitizer=$(command -v compute-sanitizer || true)
for c in /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda/bin/compute-sanitizer; do
  [[ -z $sanitizer && -x $c ]] && sanitizer=$c
done
[[ -n $sanitizer ]] || { echo "skipped: compute-sanitizer is not installed"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/skyforge-$tool.XXXXXX")
trap 'rm -rf "$work"' EXIT
sed -e 's/backend = "cpu"/backend = "cuda"/' -e 's/^nodes = .*/nodes = 1/' -e 's/^epochs = .*/epochs = 1\nsteps_per_epoch = 20/' \
    -e '/^\(history\|tensorboard\|checkpoint\) = /d' "$example" > "$work/job.toml"
set +e
"$skyforge" validate "$work/job.toml" >/dev/null || exit 1
"$sanitizer" --tool "$tool" --target-processes all --error-exitcode 1 "$skyforge" run "$work/job.toml" >"$work/out" 2>&1
rc=$?
set -e
if grep -q "cannot run on this machine" "$work/out"; then
  echo "skipped: no usable GPU"; grep "cannot run" "$work/out"; exit 77
fi
cat "$work/out"
exit $rc
