"""Shared helpers: the C++ oracle (tests/python/data_oracle) and the skyforge binary, from CTest's
environment; a test that needs one skips, saying so, when it is not given."""
import os
import subprocess

import pytest


def _tool(var):
    path = os.environ.get(var, "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"${var} does not name a built program (CTest sets it: ctest -R python)")
    return path


@pytest.fixture
def oracle():
    path = _tool("SKYFORGE_DATA_ORACLE")

    def ask(*args):
        out = subprocess.run([path, *map(str, args)], check=True, capture_output=True, text=True).stdout
        return [int(x) for x in out.split()]

    return ask


@pytest.fixture
def skyforge_bin():
    return _tool("SKYFORGE_BIN")


def processes_of(pattern, tmpdir):
    """The pids of processes whose command line matches `pattern` (pgrep -f) and whose $TMPDIR is
    `tmpdir`: this test's own, not those of other tests sharing the machine."""
    pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    mine = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        if f"TMPDIR={tmpdir}".encode() in env:
            mine.append(pid)
    return mine
