"""Large NumPy arguments on a real local pool (docs/python.md, "Large arrays"): a node on the
caller's machine maps the caller's file (the task sees it in /proc/self/maps, and no frame of the
array's size crosses the wire), gets the same dtype, shape, order and values as pickle gives,
read-only; the files are private and gone when the call ends, when the pool closes, after an
exception and after Ctrl-C; a node that cannot see them, or Parallel(max_nbytes=None), gets the
array over the wire, once per node; what a crashed caller left is swept."""
import os
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

joblib = pytest.importorskip("joblib")
from joblib import Parallel, delayed  # noqa: E402

import skyforge  # noqa: E402
from skyforge import _shm  # noqa: E402
from test_joblib_pool import pool_env  # noqa: E402,F401 - the fixture: TMPDIR checked empty after

MB = 1 << 20


def frames_sent(pool):
    """Every frame the pool sends to its nodes from now on: (node, what, bytes)."""
    sent = []
    for n in pool.nodes:
        def send(msg, n=n, send=n.send):
            what = msg[0] if isinstance(msg, tuple) else "task"
            size = len(msg[2]) if what == "put" else len(msg) if what == "task" else 0
            sent.append((n.index, what, size))
            return send(msg)
        n.send = send
    return sent


def seen(x):
    """What a task sees of its argument, and whether its process maps the caller's file."""
    with open("/proc/self/maps") as f:
        mapped = _shm.PREFIX in f.read()
    return (x.dtype.str, x.dtype.descr, x.shape, x.strides, x.flags.c_contiguous, x.flags.f_contiguous,
            x.flags.writeable, x.tobytes(order="A"), mapped)


def expected(x, mapped):
    """What a task sees of x: x's dtype, shape and values, read-only; its strides when they are
    an order of its axes (C, Fortran, a transpose), else C order's (a strided or reversed view),
    as pickle makes it (numpy >= 2 for a transpose: 1.x's pickle makes that C too)."""
    dense = all(s > 0 for s in x.strides) and x.transpose(np.argsort(x.strides)[::-1]).flags.c_contiguous
    y = x if dense else np.ascontiguousarray(x)
    return (x.dtype.str, x.dtype.descr, x.shape, y.strides, y.flags.c_contiguous, y.flags.f_contiguous, False,
            y.tobytes(order="A"), mapped)


def test_a_local_node_maps_the_array_and_no_copy_crosses_the_wire(pool_env):
    big = np.random.default_rng(1).random(4 * MB // 8 * 8)  # 32 MB
    with skyforge.joblib_pool(nodes=2, concurrency=1) as pool:
        sent = frames_sent(pool)
        got = Parallel(n_jobs=-1, batch_size=1)(delayed(seen)(big) for _ in range(8))
        assert all(g == expected(big, True) for g in got)
        assert sorted((n, what) for n, what, _ in sent if what == "put") == [(0, "put"), (1, "put")]
        assert sum(size for _, _, size in sent) < MB, sent  # probes, tasks and two paths: no array
        assert os.listdir(pool._shm.path) == [_shm.PROBE]  # the call's file went with the call
        assert all(not n.shared for n in pool.nodes)


LAYOUTS = {  # each over 1 MiB

    "C float32": lambda: np.arange(MB, dtype=np.float32).reshape(1024, -1),
    "Fortran int16": lambda: np.asfortranarray(np.arange(2 * MB, dtype=np.int16).reshape(512, -1)),
    "big-endian": lambda: np.arange(MB // 4, dtype=">f8"),
    "structured": lambda: np.zeros(MB // 8, dtype=[("a", "<i4"), ("b", "<f8"), ("c", "S4")]),
    "a strided view": lambda: np.arange(2 * MB, dtype=np.float64).reshape(1024, -1)[:, ::2],
    "a transposed 3-d": lambda: np.arange(MB, dtype=np.int32).reshape(64, 128, -1).transpose(1, 2, 0),
    "reversed": lambda: np.arange(MB // 4, dtype=np.float64)[::-1],
    "a transposed strided view": lambda: np.arange(MB, dtype=np.float64).reshape(1024, -1)[::2].T,
}


def test_every_layout_arrives_with_its_dtype_shape_strides_and_values(pool_env):
    arrays = {name: make() for name, make in LAYOUTS.items()}
    with skyforge.joblib_pool(nodes=1, concurrency=1):
        got = Parallel(n_jobs=2)(delayed(seen)(a) for a in arrays.values())
    for (name, a), g in zip(arrays.items(), got):
        assert a.nbytes > MB
        assert g == expected(a, True), name


def write(x):
    x[0] = 42


def write_a_copy(x):
    y = np.array(x)
    y[0] = 42
    return y[0]


def test_a_task_cannot_change_the_callers_array(pool_env):
    big = np.zeros(2 * MB)
    with skyforge.joblib_pool(nodes=2, concurrency=1):
        for max_nbytes in ("1M", None):  # through memory; over the wire: the same rule
            with pytest.raises(ValueError, match="read-only"):
                Parallel(n_jobs=-1, max_nbytes=max_nbytes)(delayed(write)(big) for _ in range(4))
            assert Parallel(n_jobs=-1, max_nbytes=max_nbytes)(delayed(write_a_copy)(big) for _ in range(4)) == [42] * 4
    assert not big.any()


def test_max_nbytes_none_sends_the_array_over_the_wire_once_per_node(pool_env):
    big = np.arange(4_000_000, dtype=np.float64)  # 32 MB
    with skyforge.joblib_pool(nodes=2, concurrency=1) as pool:
        sent = frames_sent(pool)
        got = Parallel(n_jobs=-1, batch_size=1, max_nbytes=None)(delayed(seen)(big) for _ in range(20))
        assert all(g == expected(big, False) for g in got)
        puts = sorted((n, size) for n, what, size in sent if what == "put")
        assert [n for n, _ in puts] == [0, 1] and all(size >= big.nbytes for _, size in puts)
        assert all(not n.shared for n in pool.nodes)


def test_a_node_that_cannot_see_the_callers_files_gets_the_array_over_the_wire(pool_env):
    big = np.arange(4_000_000, dtype=np.float64)
    with skyforge.joblib_pool(nodes=2, concurrency=1) as pool:
        pool._shm.open()
        pool._shm.token = b"not what the probe file holds"  # as a node on another machine answers
        sent = frames_sent(pool)
        got = Parallel(n_jobs=-1, batch_size=1)(delayed(seen)(big) for _ in range(4))
        assert all(g == expected(big, False) for g in got)
        assert [size >= big.nbytes for _, what, size in sent if what == "put"] == [True, True]


class Boom(Exception):
    pass


def fail(x):
    raise Boom("no")


def test_the_files_are_private_and_gone_after_a_failed_call_and_an_exception(pool_env):
    big = np.ones(2 * MB)
    with pytest.raises(Boom, match="in the block"):
        with skyforge.joblib_pool(nodes=2, concurrency=1) as pool:
            with pytest.raises(Boom, match="no"):
                Parallel(n_jobs=-1)(delayed(fail)(big) for _ in range(4))
            where = pool._shm.path
            assert os.listdir(where) == [_shm.PROBE]  # the failed call's file is gone
            assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
            assert stat.S_IMODE(os.stat(os.path.join(where, _shm.PROBE)).st_mode) == 0o600
            raise Boom("in the block")
    assert not os.path.exists(where)


CTRL_C = """
import time
import numpy as np
import skyforge

with skyforge.joblib_pool(nodes=1, concurrency=1) as pool:
    pool.share(1, np.ones(1 << 18))  # a file in the shared directory, as during a call
    print(pool._shm.path, flush=True)
    time.sleep(60)
"""


def test_ctrl_c_removes_the_shared_directory(pool_env, tmp_path):
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in [os.path.dirname(os.path.dirname(skyforge.__file__)), os.environ.get("PYTHONPATH", "")] if p))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    where = proc.stdout.readline().strip()
    assert where and sorted(os.listdir(where)) == ["1.npy", _shm.PROBE], proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    assert not os.path.exists(where)


# ---- the shared directory without a pool ------------------------------------------------------

def test_a_crashed_callers_directory_is_swept_and_a_live_ones_is_not(tmp_path, monkeypatch):
    monkeypatch.setattr(_shm, "_bases", lambda: iter([str(tmp_path)]))
    monkeypatch.setattr(_shm, "_STALE_AGE", 0.0)
    crash = ("import sys, os, time; sys.path.insert(0, sys.argv[1]); from skyforge import _shm; "
             "_shm._bases = lambda: iter([sys.argv[2]]); d = _shm.SharedDir(); print(d.open(), flush=True); "
             "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", crash, os.path.dirname(os.path.dirname(_shm.__file__)),
                             str(tmp_path)], stdout=subprocess.PIPE, text=True)
    crashed = proc.stdout.readline().strip()
    live = _shm.SharedDir()
    assert live.open() and os.path.isdir(crashed)  # its holder alive: kept
    proc.kill()
    proc.wait()
    _shm.sweep(str(tmp_path))
    assert not os.path.exists(crashed) and os.path.isdir(live.path)
    live.close()
    assert os.listdir(tmp_path) == []


def test_a_node_opens_only_a_private_file_of_a_shared_directory(tmp_path):
    d = tmp_path / (_shm.PREFIX + "x")
    d.mkdir(mode=0o700)
    good = d / "12.npy"
    good.write_bytes(b"x")
    good.chmod(0o600)
    os.close(_shm._open_checked(str(good)))
    (d / "13.npy").symlink_to(good)
    loose = d / "14.npy"
    loose.write_bytes(b"x")
    loose.chmod(0o644)
    for path in ["/etc/passwd", str(d / ".." / (_shm.PREFIX + "x") / "12.npy"), str(d / "other"),
                 "12.npy", str(d / "13.npy"), str(loose)]:
        with pytest.raises(OSError):
            _shm._open_checked(path)
