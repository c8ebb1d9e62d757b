"""bench_joblib_pool: joblib and scikit-learn code on a skyforge pool beside joblib's own loky
backend, measured in the same run, on the same machine (issue figures; README "Performance").

    SKYFORGE_BIN=build/bin/skyforge .venv/bin/python bench/bench_joblib_pool.py [--rounds 3]
    SKYFORGE_BIN=build/bin/skyforge PYTHONPATH=python /usr/bin/python3 bench/bench_joblib_pool.py   # Debian's joblib 1.2

Figures (medians over the rounds; each round runs skyforge and loky one after the other, warm):
  start      `with skyforge.joblib_pool(nodes=2)`: entering the block until the pool takes tasks
  tiny       100,000 `delayed(abs)(i)`, auto batching: skyforge 2 nodes x 1 slot vs loky n_jobs=2
  grid       GridSearchCV(SVC(), C: 6 values x gamma: 2 values, cv=5) on sklearn's digits (60 fits):
             skyforge 2 nodes vs loky n_jobs=2, wall time of fit()
"""
import argparse
import statistics
import sys
import time

import joblib
from joblib import Parallel, delayed

import skyforge


def tiny(n):
    t0 = time.perf_counter()
    out = Parallel(n_jobs=-1)(delayed(abs)(i) for i in range(n))
    dt = time.perf_counter() - t0
    assert out[-1] == n - 1
    return dt


def grid_fit():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    X, y = load_digits(return_X_y=True)
    grid = {"C": [0.1, 0.3, 1, 3, 10, 30], "gamma": [1e-3, 1e-4]}
    t0 = time.perf_counter()
    gs = GridSearchCV(SVC(), grid, cv=5, n_jobs=-1).fit(X, y)
    return time.perf_counter() - t0, gs.best_params_


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=100_000)
    a = ap.parse_args()
    import os
    ncpu = len(os.sched_getaffinity(0))
    print(f"python {sys.version.split()[0]}, joblib {joblib.__version__}, {ncpu} cores")
    starts, sky_tiny, loky_tiny, sky_grid, loky_grid = [], [], [], [], []
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        with skyforge.joblib_pool(nodes=2, concurrency=1):
            starts.append(time.perf_counter() - t0)
            tiny(1000)  # warm: the workers have imported what the tasks need
            sky_tiny.append(tiny(a.tasks))
            grid_fit()
            dt, best_sky = grid_fit()
            sky_grid.append(dt)
        with joblib.parallel_backend("loky", n_jobs=2):
            tiny(1000)
            loky_tiny.append(tiny(a.tasks))
            grid_fit()
            dt, best_loky = grid_fit()
            loky_grid.append(dt)
        assert best_sky == best_loky, (best_sky, best_loky)
    m = statistics.median
    print(f"pool start (2 local nodes, enter the block -> tasks accepted): {m(starts) * 1000:.0f} ms")
    rate = lambda ts: f"{a.tasks / m(ts):.0f} tasks/s ({a.tasks / max(ts):.0f}-{a.tasks / min(ts):.0f})"  # noqa: E731
    print(f"{a.tasks} x delayed(abs)(i), auto batching: skyforge {rate(sky_tiny)}, loky n_jobs=2 {rate(loky_tiny)} "
          f"-> skyforge/loky = {m(loky_tiny) / m(sky_tiny):.2f}x [target >= 1x]")
    print(f"GridSearchCV(SVC, 12 candidates, cv=5: 60 fits) on digits: skyforge {m(sky_grid):.3f} s, "
          f"loky n_jobs=2 {m(loky_grid):.3f} s -> skyforge/loky time = {m(sky_grid) / m(loky_grid):.2f} "
          f"[target <= 1.1]; best params {best_sky}")


if __name__ == "__main__":
    main()
