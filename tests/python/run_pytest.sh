#!/usr/bin/env bash
# run_pytest.sh VENV_PYTHON TESTS_DIR: pytest in the project's venv; exit 77 (CTest: skipped)
# with the reason when the venv, pytest or the package is missing (.ci/setup-venv makes them).
set -u
py=$1 tests=$2
if [ ! -x "$py" ]; then echo "skipped: no $py (run .ci/setup-venv)"; exit 77; fi
if ! "$py" -c "import pytest, skyforge" 2>/dev/null; then
  echo "skipped: $py lacks pytest or the skyforge package (run .ci/setup-venv)"; exit 77
fi
exec "$py" -m pytest -q -p no:cacheprovider "$tests"
