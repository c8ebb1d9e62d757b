"""bench_shared_arrays: one large NumPy array passed to every task of a Parallel call, on a local
skyforge pool beside joblib's loky backend with the same n_jobs, in the same run (issue 35, item 3;
docs/python.md, "Large arrays").

    SKYFORGE_BIN=build/bin/skyforge .venv/bin/python bench/bench_shared_arrays.py [--rounds 7]
    SKYFORGE_BIN=build/bin/skyforge PYTHONPATH=python /usr/bin/python3 bench/bench_shared_arrays.py

Each round times `Parallel(n_jobs=N)(delayed(task)(x, i) for i in range(16))`, x a 100 MB
float64 array, on a pool of 2 local nodes x 1 slot and on loky n_jobs=2, both warm (one untimed
call first), one after the other. Two tasks: `first` reads one element (what passing costs), `sum`
reads all of x (passing and using it). Also the pool with Parallel(max_nbytes=None), which sends
the array over the wire to each node as remote nodes get it. Printed: median and range per side,
and skyforge/loky time (target <= 1.2).
"""
import argparse
import statistics
import sys
import time

import joblib
import numpy as np
from joblib import Parallel, delayed

import skyforge


def first(x, i):
    return float(x[i])


def total(x, i):
    return float(x.sum()) + i


TASKS = {"first": first, "sum": total}


def timed(task, x, tasks, **parallel):
    t0 = time.perf_counter()
    out = Parallel(n_jobs=2, **parallel)(delayed(task)(x, i) for i in range(tasks))
    dt = time.perf_counter() - t0
    assert len(out) == tasks
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--wire-rounds", type=int, default=2, help="rounds of the max_nbytes=None (wire) figure")
    a = ap.parse_args()
    x = np.random.default_rng(0).random(a.mb * 1_000_000 // 8)
    print(f"python {sys.version.split()[0]}, joblib {joblib.__version__}, numpy {np.__version__}; "
          f"{x.nbytes / 1e6:.0f} MB float64 to {a.tasks} tasks, n_jobs=2")
    sky = {name: [] for name in TASKS}
    loky = {name: [] for name in TASKS}
    wire = []
    with skyforge.joblib_pool(nodes=2, concurrency=1):
        for name, task in TASKS.items():
            timed(task, x, a.tasks)  # warm: workers started, imports done, the nodes probed
            for _ in range(a.rounds):
                sky[name].append(timed(task, x, a.tasks))
                with joblib.parallel_backend("loky"):
                    if not loky[name]:
                        timed(task, x, a.tasks)
                    loky[name].append(timed(task, x, a.tasks))
        for _ in range(a.wire_rounds):
            wire.append(timed(first, x, a.tasks, max_nbytes=None))
    m = statistics.median

    def fig(ts):
        return f"{m(ts):.3f} s ({min(ts):.3f}-{max(ts):.3f})"

    for name in TASKS:
        print(f"task {name:5}: skyforge 2 local nodes {fig(sky[name])}, loky n_jobs=2 {fig(loky[name])} "
              f"-> skyforge/loky = {m(sky[name]) / m(loky[name]):.2f} [target <= 1.2]")
    if wire:
        print(f"task first, max_nbytes=None (over the wire to each node): skyforge {fig(wire)}")


if __name__ == "__main__":
    main()
