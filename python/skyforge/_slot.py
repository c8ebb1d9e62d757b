"""One slot's Python worker process: runs tasks one after another for as long as the pool lives.

Started by the node agent (skyforge._node); reads task and control frames (skyforge._wire) from
its pipe (multiprocessing's own framing: the agent relays the caller's task frames as they came) and answers each task with a done frame. Nested joblib parallelism inside a task
runs sequentially, as joblib's own rule for nested calls in a worker says.
"""
from __future__ import annotations

import os
import pickle

from ._errors import pack
from ._payloads import dumps, held, loads_task
from ._wire import FROM_DRIVER, done_frame, kind_of, parse_control, parse_task


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
            frame = conn.recv_bytes()
        except (EOFError, OSError):
            return
        kind = kind_of(frame)
        if kind == b"T":
            task_id, payload = parse_task(frame)
            try:
                result = loads_task(payload, store)()
                answer = done_frame(task_id, slot, True, dumps(result))
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
                answer = done_frame(task_id, slot, False, pack(exc, node, slot))
            try:
                conn.send_bytes(answer)
            except (BrokenPipeError, OSError):
                return
            continue
        msg = parse_control(frame, FROM_DRIVER)
        if msg[0] == "put":
            store[msg[1]] = held(pickle.loads(msg[2]))
        elif msg[0] == "drop":
            for key in msg[1]:
                store.pop(key, None)
        elif msg[0] == "bye":
            return
