"""One slot's Python worker process: runs tasks one after another for as long as the pool lives.

Started by the node agent (skyforge._node); reads ("put" | "drop" | "task", ...) from its pipe and
answers each task with ("done", task_id, ok, payload). Nested joblib parallelism inside a task
runs sequentially, as joblib's own rule for nested calls in a worker says.
"""
from __future__ import annotations

import os
import pickle
import traceback

from ._wire import ErrorReport, dumps, loads_task


def _sequential_nested():
    try:
        import joblib
    except ImportError:
        return None
    if hasattr(joblib, "parallel_config"):  # joblib >= 1.3
        ctx = joblib.parallel_config(backend="sequential")
    else:
        ctx = joblib.parallel_backend("sequential")
    ctx.__enter__()
    return ctx


def serve(conn, node: int, slot: int) -> None:
    os.environ["SKYFORGE_SLOT"] = str(slot)
    _keep = _sequential_nested()  # noqa: F841 - stays entered while the process lives
    store = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        kind = msg[0]
        if kind == "put":
            store[msg[1]] = pickle.loads(msg[2])
        elif kind == "drop":
            for key in msg[1]:
                store.pop(key, None)
        elif kind == "task":
            task_id, payload = msg[1], msg[2]
            try:
                result = loads_task(payload, store)()
                answer = ("done", task_id, True, dumps(result))
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
                try:
                    blob = dumps(exc)
                    pickle.loads(blob)
                except Exception:  # noqa: BLE001 - an exception that does not travel
                    blob = None
                report = ErrorReport(blob, type(exc).__qualname__, str(exc), traceback.format_exc(), node, slot)
                answer = ("done", task_id, False, dumps(report))
            try:
                conn.send(answer)
            except (BrokenPipeError, OSError):
                return
        elif kind == "bye":
            return
