#!/usr/bin/env bash
# run_pytest.sh PYTHON TESTS_DIR [PACKAGE_DIR]: pytest under PYTHON (with PACKAGE_DIR on
# PYTHONPATH when given: an interpreter the package is not installed in); exit 77 (CTest:
# skipped) with the reason when the interpreter, pytest or the package is missing
# (.ci/setup-venv and .ci/setup-deps install them).
set -u
py=$1 tests=$2
if [ $# -ge 3 ]; then export PYTHONPATH="$3${PYTHONPATH:+:$PYTHONPATH}"; fi
if [ ! -x "$py" ]; then echo "skipped: no $py (run .ci/setup-venv)"; exit 77; fi
if ! "$py" -c "import pytest, skyforge" 2>/dev/null; then
  echo "skipped: $py lacks pytest or the skyforge package (run .ci/setup-venv / .ci/setup-deps)"; exit 77
fi
"$py" -c "import joblib, sys; print('pytest under', sys.executable, 'with joblib', joblib.__version__)" 2>/dev/null
exec "$py" -m pytest -q -p no:cacheprovider "$tests"
