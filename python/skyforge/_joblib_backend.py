"""joblib on a skyforge pool: the `skyforge` joblib backend (docs/python.md).

One class serves joblib 1.2 (Debian 12's: apply_async, job.get) and 1.3-1.6 (submit, with
retrieve_result_callback): submit() returns a Future that also has get(timeout), and joblib's
callback runs when the batch ends either way. Batches (joblib's BatchedCalls) travel with
cloudpickle; NumPy arrays of 1 MiB or more travel once per node per Parallel call, by reference:
through memory to the nodes on the caller's machine when larger than Parallel's max_nbytes
("1M"; None: never), read-only in the tasks as loky's mmap_mode="r" gives them (skyforge._shm).
Nested Parallel calls inside a task run sequentially (joblib's rule for its own workers), and so
does a call that asks for one job.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any, Dict, Optional

import joblib
from joblib._parallel_backends import AutoBatchingMixin, ParallelBackendBase, SequentialBackend
from joblib.disk import memstr_to_bytes

try:
    from joblib._parallel_backends import FallbackToBackend
except ImportError:  # pragma: no cover
    from joblib.parallel import FallbackToBackend  # type: ignore

from ._pool import Pool, PoolError, WorkerLostError
from ._payloads import dumps_task

_active: Optional[Pool] = None  # the pool of the innermost `with skyforge.joblib_pool(...)`
_active_lock = threading.Lock()


class BatchFuture(Future):
    """A batch's result (the list of its tasks' results); get() is joblib 1.2's way to ask."""

    def get(self, timeout=None):
        try:
            return self.result(timeout)
        except FuturesTimeout:
            raise multiprocessing.TimeoutError() from None


class SkyforgeBackend(AutoBatchingMixin, ParallelBackendBase):
    supports_timeout = True
    supports_retrieve_callback = True  # joblib >= 1.3: results through the callback; generators
    default_n_jobs = -1                # parallel_config(backend="skyforge"): every slot of the pool
    uses_threads = False
    supports_sharedmem = False

    def __init__(self, nesting_level=None, inner_max_num_threads=None, **kwargs):
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        self._pool = kwargs.get("pool")
        self._shared: Dict[int, Any] = {}   # id -> array: alive until the call ends
        self._max_nbytes: Optional[int] = 1 << 20  # through memory above this (Parallel's max_nbytes)
        self._outstanding: Dict[int, Future] = {}
        self._lock = threading.Lock()

    @property
    def pool(self) -> Pool:
        pool = self._pool or _active
        if pool is None:
            raise RuntimeError("the skyforge joblib backend needs a pool: use it inside `with skyforge.joblib_pool(...)` "
                               "or `with skyforge.joblib_backend(...)`")
        return pool

    def effective_n_jobs(self, n_jobs):
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        slots = self.pool.slots
        if n_jobs is None:
            n_jobs = self.default_n_jobs
        if n_jobs < 0:
            return max(slots + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs=1, parallel=None, prefer=None, require=None, **kwargs):
        self.parallel = parallel
        max_nbytes = kwargs.get("max_nbytes", "1M")  # joblib 1.2 passes the string, >= 1.3 bytes
        self._max_nbytes = memstr_to_bytes(max_nbytes) if isinstance(max_nbytes, str) else max_nbytes
        n = self.effective_n_jobs(n_jobs)
        if n == 1 or (self.nesting_level or 0) > 0:
            # One job, or a call from inside a task: run it here, as joblib's own workers do.
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        return n

    def get_nested_backend(self):
        return SequentialBackend(nesting_level=(self.nesting_level or 0) + 1), None

    def submit(self, func, callback=None):
        pool = self.pool
        before = set(self._shared)
        payload = dumps_task(func, self._shared)
        for key in set(self._shared) - before:  # new large arrays: to every node, once
            obj = self._shared[key]
            pool.share(key, obj, memory=self._max_nbytes is not None and obj.nbytes > self._max_nbytes)
        job = BatchFuture()
        if callback is not None:
            job.add_done_callback(callback)
        remote = pool.submit(payload)
        with self._lock:
            self._outstanding[id(job)] = remote

        def finish(f: Future) -> None:
            # Runs on the pool's completion thread: whatever happens here ends the batch, with its
            # result or an error, never only a log line (joblib would wait for it forever).
            with self._lock:
                if self._outstanding.pop(id(job), None) is None:
                    return  # aborted: nobody waits for it
            try:
                exc = f.exception()
                if exc is not None:
                    if isinstance(exc, WorkerLostError) and hasattr(exc, "add_note"):
                        exc.add_note("the batch: " + _describe(func))
                    job.set_exception(exc)
                else:
                    job.set_result(_load_result(f.result(), func))
            except BaseException as e:  # noqa: BLE001 - e.g. a result that does not unpickle here
                if not job.done():
                    job.set_exception(e)

        remote.add_done_callback(finish)
        return job

    apply_async = submit  # joblib 1.2 calls this

    def retrieve_result_callback(self, out):
        return out.result()

    def abort_everything(self, ensure_ready=True):
        with self._lock:
            dropped = list(self._outstanding.values())
            self._outstanding.clear()
        if dropped:
            self.pool.cancel(dropped)
        self._release_shared()

    def stop_call(self):
        self._release_shared()

    def terminate(self):
        self.reset_batch_stats()
        self._release_shared()

    def _release_shared(self):
        if self._shared:
            keys = list(self._shared)
            self._shared.clear()
            try:
                self.pool.unshare(keys)
            except Exception:  # noqa: BLE001 - a pool already closed
                pass


def _load_result(payload, func) -> Any:
    """A batch's results, unpickled here; a PoolError that says why when they cannot be (a class
    this process cannot import, a __reduce__ that raises)."""
    try:
        return pickle.loads(payload)
    except Exception as e:  # noqa: BLE001
        raise PoolError(f"the result of a task could not be unpickled in the caller ({type(e).__name__}: {e}); "
                        f"the batch: {_describe(func)}. Every class a task returns must be importable here.") from e


def _describe(func) -> str:
    """What a joblib batch runs, for an error about it: "f(1, x=2) and 3 more calls"."""
    items = getattr(func, "items", None) or []
    if not items:
        return repr(func)[:200]
    f, args, kwargs = (list(items[0]) + [(), {}])[:3]
    name = getattr(f, "__qualname__", None) or getattr(getattr(f, "function", None), "__qualname__", None) or repr(f)
    text = ", ".join([repr(a)[:40] for a in args] + [f"{k}={v!r}"[:40] for k, v in kwargs.items()])
    more = f" and {len(items) - 1} more call{'s' if len(items) > 2 else ''}" if len(items) > 1 else ""
    return f"{name}({text}){more}"


def _register() -> None:
    joblib.register_parallel_backend("skyforge", SkyforgeBackend)


def _config_context():
    """joblib >= 1.3's parallel_config, else 1.2's parallel_backend, with the skyforge backend."""
    config = getattr(joblib, "parallel_config", None)
    if config is not None:
        return config(backend="skyforge")
    return joblib.parallel_backend("skyforge")


@contextlib.contextmanager
def joblib_backend(manifest: Optional[str] = None, **pool_options: Any):
    """Starts a pool and registers joblib's "skyforge" backend for the block; joblib uses it where
    the code says so: parallel_config(backend="skyforge") / Parallel(backend="skyforge")."""
    global _active
    pool = Pool(manifest, **pool_options)
    pool.start()
    _register()
    with _active_lock:
        previous, _active = _active, pool
    try:
        yield pool
    except KeyboardInterrupt:
        pool.interrupt()
        raise
    finally:
        with _active_lock:
            _active = previous
        pool.close()


@contextlib.contextmanager
def joblib_pool(manifest: Optional[str] = None, **pool_options: Any):
    """Starts a pool for the block and makes it joblib's backend there: unchanged
    `Parallel(n_jobs=-1)(...)` code runs on the pool's slots (n_jobs=-1 is nodes x concurrency).
    `manifest` is a pool.toml ([pool], [provider], [image], [[plugins]]; no [job]); or give
    nodes=N, concurrency=C, provider="local"."""
    with joblib_backend(manifest, **pool_options) as pool, _config_context():
        yield pool


sklearn_pool = joblib_pool  # scikit-learn's n_jobs goes through joblib: the same thing
