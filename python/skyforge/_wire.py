"""What the pieces of a Python pool say to each other (docs/python.md, "How it works").

Client <-> node agent: TLS 1.3 over TCP, the caller's certificate pinned by the nodes (_tls.py),
and inside it the pool's key proven both ways (multiprocessing.connection's HMAC
challenge-response) before any message is unpickled: accept_connection() and connect(), the one
place a connection is set up; agent <-> slot worker: a multiprocessing Pipe. Every message is one frame (send_bytes), its first byte its kind:

  T task_id:u64 payload          client -> agent -> slot: a cloudpickled callable to run. The
                                 agent relays the frame as it came, without unpickling it.
  D task_id:u64 slot:u32 ok:u8 payload   slot -> agent -> client: the pickled result, or an
                                 ErrorReport (ok = 0); relayed as it came
  C pickle(tuple)                control: ("hello", node, slots, pid) agent -> client;
                                 ("put", key, blob) a large argument, once per node per call;
                                 ("drop", keys) the call is over; ("cancel", task_ids) skip
                                 these if not started; ("bye",) stop the workers and leave
"""
from __future__ import annotations

import io
import os
import pickle
import socket
import struct
import time
from dataclasses import dataclass
import ssl
from multiprocessing.connection import answer_challenge, deliver_challenge
from typing import Any, Callable, Dict, Optional, Tuple

from ._tls import TlsConnection, client_context

try:  # the PyPI package, as loky uses it; joblib vendors the same module
    import cloudpickle
except ImportError:  # pragma: no cover - depends on the environment
    from joblib.externals import cloudpickle  # type: ignore

# Arguments at least this large travel once per node per Parallel call, not once per task.
LARGE_BYTES = 1 << 20

_TASK = struct.Struct("<cQ")
_DONE = struct.Struct("<cQIB")


# ---- connection setup: both ends, in one place ------------------------------------------------

def accept_connection(sock: socket.socket, key: bytes, tls: ssl.SSLContext, timeout: float) -> TlsConnection:
    """A socket the pool's listener accepted: TLS 1.3 with the pool's certificate (_tls.py),
    then, inside it, the node proves the key and the pool does (multiprocessing.connection's HMAC
    challenge-response, as Listener.accept() does). Blocks; the caller bounds it by shutting
    `sock` down (it keeps `sock`, the connection holds a duplicate of its descriptor). Raises
    ssl.SSLError, AuthenticationError, EOFError, TimeoutError or OSError."""
    conn = TlsConnection(socket.socket(fileno=os.dup(sock.fileno())), tls, server_side=True, timeout=timeout)
    try:
        deliver_challenge(conn, key)
        answer_challenge(conn, key)
    except BaseException:
        conn.close()
        raise
    return conn


def connect(address: Tuple[str, int], key: bytes, cert_pem: str, timeout: float) -> TlsConnection:
    """A node agent's connection to the pool (the other side of accept_connection): TLS 1.3 to a
    peer holding the pool's certificate and no other, then the key both ways: the TCP connect and
    the TLS handshake within `timeout` seconds, and each message of the key's within what is left
    of them."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise TimeoutError(f"not connected within {timeout:g} s")
        return rest

    sock = socket.create_connection(address, timeout=left())
    conn = TlsConnection(sock, client_context(cert_pem), server_side=False, timeout=left())
    try:
        conn.settimeout(left())
        answer_challenge(conn, key)
        deliver_challenge(conn, key)
        conn.settimeout(None)  # no limit from now on
    except BaseException:
        conn.close()
        raise
    return conn


def task_frame(task_id: int, payload: bytes) -> bytes:
    return _TASK.pack(b"T", task_id) + payload


def done_frame(task_id: int, slot: int, ok: bool, payload: bytes) -> bytes:
    return _DONE.pack(b"D", task_id, slot, 1 if ok else 0) + payload


def control_frame(msg: tuple) -> bytes:
    return b"C" + pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def kind_of(frame) -> bytes:
    return bytes(frame[:1])


def parse_task(frame):
    _, task_id = _TASK.unpack_from(frame)
    return task_id, memoryview(frame)[_TASK.size:]


def parse_done(frame):
    _, task_id, slot, ok = _DONE.unpack_from(frame)
    return task_id, slot, bool(ok), memoryview(frame)[_DONE.size:]


def parse_control(frame) -> tuple:
    return pickle.loads(memoryview(frame)[1:])


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


def dumps_task(fn: Any, shared: Dict[int, tuple]) -> bytes:
    """The callable, its large arrays replaced by keys recorded in `shared` (id -> (array, blob))."""
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
        return self._store[key]


def loads_task(payload: bytes, store: Dict[int, Any]) -> Callable[[], Any]:
    return _SharedUnpickler(io.BytesIO(payload), store).load()


def dumps(obj: Any) -> bytes:
    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
