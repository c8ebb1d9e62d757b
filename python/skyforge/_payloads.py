"""What travels inside the Python pool's frames (docs/python-plane.md): a task is a cloudpickled
callable, as loky sends them; a result is its pickle; a failure is a pickled ErrorReport.
NumPy arrays of LARGE_BYTES or more in a joblib batch's arguments are left out of the task by
reference (persistent ids) and travel once per node in a "put" control message instead: their
pickle, or for a node on the caller's machine the path of a file it maps (skyforge._shm).
"""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Dict

from ._shm import MappedFile

try:  # the PyPI package, as loky uses it; joblib vendors the same module
    import cloudpickle
except ImportError:  # pragma: no cover - depends on the environment
    from joblib.externals import cloudpickle  # type: ignore

# Arguments at least this large travel once per node per Parallel call, not once per task.
LARGE_BYTES = 1 << 20


@dataclass
class ErrorReport:
    """A task's exception, as the node saw it."""
    exception: Any  # a skyforge._errors.PackedException: the exception, rebuilt part by part in the caller
    type_name: str
    message: str
    traceback: str
    node: int
    slot: int


class _SharingPickler(cloudpickle.CloudPickler):
    """cloudpickle that leaves large NumPy arrays out, by reference, for the node to hold."""

    def __init__(self, file, shared: Dict[int, Any]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._shared = shared

    def persistent_id(self, obj):  # noqa: D401 - pickle's hook
        if type(obj).__name__ != "ndarray" or type(obj).__module__ != "numpy":
            return None
        if obj.nbytes >= LARGE_BYTES:
            key = id(obj)
            self._shared.setdefault(key, obj)
            return ("skyforge-shared", key)
        return None


def _has_large_array(fn: Any) -> bool:
    """Whether a joblib batch passes a large NumPy array among its calls' arguments (one level
    into tuples, lists and dicts). Only then does it pay for the sharing pickler's per-object hook.
    A batch of up to 16 calls is looked at whole; a longer one (auto batching makes those of tiny
    tasks only) through its first and last calls: the calls of one Parallel are alike (the same X
    in every fit), and a look at each of 10,000 tiny calls cost more than running them. A large
    array that only a middle call of a long batch passes still travels, inline with that batch."""
    items = getattr(fn, "items", None)
    if items is None:
        return True  # not a joblib batch: look at everything

    def large(v, depth=0):
        if type(v).__name__ == "ndarray" and type(v).__module__ == "numpy":
            return v.nbytes >= LARGE_BYTES
        if depth == 0 and isinstance(v, (tuple, list)):
            return any(large(x, 1) for x in v)
        if depth == 0 and isinstance(v, dict):
            return any(large(x, 1) for x in v.values())
        return False

    for item in items if len(items) <= 16 else (items[0], items[-1]):
        args = item[1] if len(item) > 1 else ()
        kwargs = item[2] if len(item) > 2 else {}
        if any(large(a) for a in args) or any(large(v) for v in kwargs.values()):
            return True
    return False


def dumps_task(fn: Any, shared: Dict[int, Any]) -> bytes:
    """The callable, its large arrays replaced by keys recorded in `shared` (id -> array)."""
    if not _has_large_array(fn):
        return cloudpickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
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
        value = self._store[key]
        return value.array() if isinstance(value, MappedFile) else value


def held(value: Any) -> Any:
    """A shared argument as a slot keeps it for the tasks of a call: read-only, as loky's workers
    get a large array (joblib's mmap_mode="r"), so that no task changes what the next one sees."""
    if type(value).__name__ == "ndarray" and type(value).__module__ == "numpy":
        value.flags.writeable = False
    return value


def loads_task(payload: bytes, store: Dict[int, Any]) -> Callable[[], Any]:
    return _SharedUnpickler(io.BytesIO(payload), store).load()


def dumps(obj: Any) -> bytes:
    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
