"""What the pieces of a Python pool say to each other (docs/python.md, "How it works").

Client <-> node agent: multiprocessing.connection over TCP, authenticated with the pool's key
(HMAC challenge-response both ways before any message is unpickled). Messages are tuples:

  agent -> client  ("hello", node, slots, pid)
  client -> agent  ("put", key, blob)          a large argument, once per node per Parallel call
                   ("drop", keys)              the call is over: forget them
                   ("task", task_id, payload)  cloudpickled callable; run it on a free slot
                   ("bye",)                    stop the workers and leave
  agent -> client  ("done", task_id, slot, ok, payload)   payload: the pickled result, or an
                                               ErrorReport
Agent <-> slot worker: a multiprocessing Pipe with the same ("put"/"drop"/"task") messages.
"""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

try:  # the PyPI package, as loky uses it; joblib vendors the same module
    import cloudpickle
except ImportError:  # pragma: no cover - depends on the environment
    from joblib.externals import cloudpickle  # type: ignore

# Arguments at least this large travel once per node per Parallel call, not once per task.
LARGE_BYTES = 1 << 20


@dataclass
class ErrorReport:
    """A task's exception, as the node saw it."""
    exception: Optional[bytes]  # the pickled exception, when it pickles
    type_name: str
    message: str
    traceback: str
    node: int
    slot: int


class _SharingPickler(cloudpickle.CloudPickler):
    """cloudpickle that leaves large NumPy arrays out, by reference, for the node to hold."""

    def __init__(self, file, shared: Dict[int, tuple]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._shared = shared

    def persistent_id(self, obj):  # noqa: D401 - pickle's hook
        if type(obj).__name__ != "ndarray" or type(obj).__module__ != "numpy":
            return None
        if obj.nbytes >= LARGE_BYTES:
            key = id(obj)
            if key not in self._shared:
                self._shared[key] = (obj, None)
            return ("skyforge-shared", key)
        return None


def dumps_task(fn: Any, shared: Dict[int, tuple]) -> bytes:
    """The callable, its large arrays replaced by keys recorded in `shared` (id -> (array, blob))."""
    buf = io.BytesIO()
    _SharingPickler(buf, shared).dump(fn)
    return buf.getvalue()


class _SharedUnpickler(pickle.Unpickler):
    def __init__(self, file, store: Dict[int, Any]):
        super().__init__(file)
        self._store = store

    def persistent_load(self, pid):
        kind, key = pid
        if kind != "skyforge-shared" or key not in self._store:
            raise pickle.UnpicklingError(f"a shared argument ({pid!r}) never reached this node")
        return self._store[key]


def loads_task(payload: bytes, store: Dict[int, Any]) -> Callable[[], Any]:
    return _SharedUnpickler(io.BytesIO(payload), store).load()


def dumps(obj: Any) -> bytes:
    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
