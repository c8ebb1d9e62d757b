"""Peer figure for bench_pool: joblib (loky, n_jobs=2) over N empty tasks, auto batching.

Run with Debian's interpreter (/usr/bin/python3), which has python3-joblib.
Prints one line: joblib_tasks_per_s=<float> joblib_seconds=<float>
"""
import sys
import time

from joblib import Parallel, delayed


def noop(x):
    return None


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with Parallel(n_jobs=2, backend="loky", batch_size="auto") as parallel:
        parallel(delayed(noop)(i) for i in range(1000))  # warm: workers started and imported
        t0 = time.perf_counter()
        parallel(delayed(noop)(i) for i in range(n))
        dt = time.perf_counter() - t0
    print(f"joblib_tasks_per_s={n / dt:.0f} joblib_seconds={dt:.4f}")


if __name__ == "__main__":
    main()
