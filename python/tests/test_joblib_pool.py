"""joblib and scikit-learn code, unchanged, on a real local skyforge pool (the `skyforge` binary
from $SKYFORGE_BIN, real worker processes): results, order, generators, errors with their type
and remote traceback, a worker that dies, nested parallelism, GridSearchCV identical to
n_jobs=1, and nothing left behind (large arguments: test_shared_arrays.py)."""
import os
import subprocess
import time

import numpy as np
import pytest

joblib = pytest.importorskip("joblib")
from joblib import Parallel, delayed  # noqa: E402

import skyforge  # noqa: E402
from conftest import processes_of  # noqa: E402

JOBLIB = tuple(int(x) for x in joblib.__version__.split(".")[:2])


@pytest.fixture
def pool_env(skyforge_bin, tmp_path, monkeypatch):
    monkeypatch.setenv("SKYFORGE_BIN", skyforge_bin)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # every node's directory: checked empty after
    yield tmp_path
    left = [p for p in os.listdir(tmp_path) if p.startswith("skyforge-")]
    assert not left, f"the pool left {left} behind"


class Boom(Exception):
    pass


def square(x):
    return x * x


def fail_at(x, bad):
    if x == bad:
        raise Boom(f"no {x}")
    return x


def where(_):
    # Long enough (10 ms) that every slot takes some of 40 tasks: free slots take them as they
    # come, and instant ones could all go to the slots that answer first.
    time.sleep(0.01)
    return os.environ["SKYFORGE_NODE"], os.environ["SKYFORGE_SLOT"], os.getpid()


def nested(n):
    # An estimator that itself uses joblib: runs sequentially inside the task.
    return sum(Parallel(n_jobs=-1)(delayed(square)(i) for i in range(n)))


def test_unchanged_parallel_code_runs_on_every_slot_in_input_order(pool_env):
    with skyforge.joblib_pool(nodes=2, concurrency=2) as pool:
        assert pool.slots == 4
        assert Parallel(n_jobs=-1)(delayed(square)(i) for i in range(2000)) == [i * i for i in range(2000)]
        seen = Parallel(n_jobs=-1, batch_size=1)(delayed(where)(i) for i in range(40))
        assert {(n, s) for n, s, _ in seen} == {("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")}
        pids = {p for _, _, p in seen}
        # The workers live as long as the pool: the next call finds the same processes.
        again = {p for _, _, p in Parallel(n_jobs=-1, batch_size=1)(delayed(where)(i) for i in range(40))}
        assert again == pids and len(pids) == 4
        assert Parallel(n_jobs=-1)(delayed(nested)(10) for _ in range(4)) == [285] * 4


@pytest.mark.skipif(JOBLIB < (1, 4), reason="return_as generators arrived in joblib 1.3 / 1.4")
def test_generators_stream_the_results(pool_env):
    with skyforge.joblib_pool(nodes=2, concurrency=1):
        gen = Parallel(n_jobs=-1, return_as="generator")(delayed(square)(i) for i in range(100))
        assert list(gen) == [i * i for i in range(100)]
        unordered = Parallel(n_jobs=-1, return_as="generator_unordered")(delayed(square)(i) for i in range(100))
        assert sorted(unordered) == [i * i for i in range(100)]


def test_an_exception_keeps_its_type_and_message_and_says_where(pool_env):
    with skyforge.joblib_pool(nodes=2, concurrency=1):
        with pytest.raises(Boom, match="no 13") as info:
            Parallel(n_jobs=-1, batch_size=1)(delayed(fail_at)(i, 13) for i in range(200))
        err = info.value
        assert "fail_at" in str(err.__cause__) and "raise Boom" in str(err.__cause__)  # the remote traceback
        assert any("raised on skyforge node" in n for n in getattr(err, "__notes__", [str(err.__cause__)]))
        # The pool is still good.
        assert Parallel(n_jobs=-1)(delayed(square)(i) for i in range(10)) == [i * i for i in range(10)]


def test_a_task_that_kills_its_worker_fails_the_call_and_the_pool_goes_on(pool_env):
    with skyforge.joblib_pool(nodes=2, concurrency=1):
        with pytest.raises(skyforge.WorkerLostError, match=r"node \d slot 0: its worker process exited with status 7") as info:
            Parallel(n_jobs=-1, batch_size=1)(delayed(os._exit)(7) for _ in range(1))
        assert "the batch: _exit(7)" in "".join(getattr(info.value, "__notes__", [])), info.value
        with pytest.raises(skyforge.WorkerLostError, match="killed by SIGSEGV"):
            Parallel(n_jobs=-1, batch_size=1)(delayed(os.kill)(0, 11) if False else delayed(_segv)() for _ in range(1))
        assert Parallel(n_jobs=-1)(delayed(square)(i) for i in range(10)) == [i * i for i in range(10)]


def _segv():
    import ctypes
    ctypes.string_at(0)


def test_parallel_config_names_the_backend(pool_env):
    with skyforge.joblib_backend(nodes=1, concurrency=2):
        with joblib.parallel_backend("skyforge"):  # joblib 1.2's spelling; parallel_config on >= 1.3
            got = Parallel(n_jobs=-1, batch_size=1)(delayed(where)(i) for i in range(8))
        assert {s for _, s, _ in got} == {"0", "1"}


def test_gridsearchcv_gives_the_results_of_a_local_run(pool_env):
    sklearn = pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    X, y = load_digits(return_X_y=True)
    grid = {"C": [0.1, 1, 10], "gamma": [1e-3, 1e-4]}
    local = GridSearchCV(SVC(), grid, cv=3, n_jobs=1).fit(X, y)
    with skyforge.sklearn_pool(nodes=2, concurrency=1):
        remote = GridSearchCV(SVC(), grid, cv=3, n_jobs=-1).fit(X, y)
    assert remote.best_params_ == local.best_params_
    for key, value in local.cv_results_.items():
        if "time" in key:
            continue  # times differ; scores, ranks and params do not
        if isinstance(value, np.ma.MaskedArray) or key == "params":
            assert list(remote.cv_results_[key]) == list(value), key
        else:
            np.testing.assert_array_equal(remote.cv_results_[key], value, err_msg=key)


def test_leaving_the_block_leaves_no_process(pool_env):
    with skyforge.joblib_pool(nodes=2, concurrency=2):
        pids = {p for _, _, p in Parallel(n_jobs=-1, batch_size=1)(delayed(where)(i) for i in range(20))}
    time.sleep(0.2)
    alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
    assert not alive, f"worker processes {alive} outlived the pool"
    out = processes_of("skyforge._node", pool_env)
    assert not out, f"node agents still running: {out}"


def test_a_bad_manifest_fails_the_block_with_skyforges_message(pool_env, tmp_path):
    bad = tmp_path / "pool.toml"
    bad.write_text("[pool]\nnodes = 0\n")
    with pytest.raises(skyforge.PoolError, match=r"pool\.toml:2:9: \[pool\] nodes"):
        with skyforge.joblib_pool(str(bad)):
            pass
    job = tmp_path / "job.toml"
    job.write_text("[pool]\nnodes = 1\n[job]\ncommand = [\"true\"]\n")
    with pytest.raises(skyforge.PoolError, match=r"has a \[job\] table"):
        with skyforge.joblib_pool(str(job)):
            pass


CTRL_C = """
import sys, time
import skyforge
from joblib import Parallel, delayed
with skyforge.joblib_pool(nodes=2, concurrency=1):
    print("ready", flush=True)
    Parallel(n_jobs=-1, batch_size=1)(delayed(time.sleep)(1) for _ in range(60))
"""


def test_ctrl_c_in_the_block_tears_the_pool_down(pool_env, tmp_path):
    import signal
    import sys
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                p for p in [os.path.dirname(os.path.dirname(skyforge.__file__)),
                                            os.environ.get("PYTHONPATH", "")] if p)))
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    time.sleep(1.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    assert took < 20, f"the teardown took {took:.1f} s"
    time.sleep(0.3)
    left = processes_of("skyforge._node|skyforge-worker", pool_env)
    assert not left, f"processes left behind: {left}"
