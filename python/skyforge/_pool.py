"""A pool of Python worker processes on skyforge nodes, held for a `with` block (docs/python.md).

Pool.start() runs `skyforge run` on a manifest whose job is the node agent (skyforge._node) on
every node, and waits until every node has connected back — over TCP, authenticated with a key
made for this pool (multiprocessing.connection's HMAC challenge-response, both ways, before any
byte is unpickled). The key reaches the nodes through `skyforge run --env` (the job's
environment): never a command line, a file or a log. Pool.close() — on leaving the block
normally, on an exception, on Ctrl-C — says bye to every node, lets `skyforge run` tear the pool
down, and interrupts it (its own graceful teardown) or kills it if it does not finish.
"""
from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import Listener
from typing import Any, Callable, Dict, List, Optional

from ._wire import ErrorReport, control_frame, parse_control, parse_done, task_frame


class PoolError(RuntimeError):
    """The pool could not start, or lost a node."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a node (the __cause__ of the re-raised one)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


class WorkerLostError(RuntimeError):
    """A task's worker process died (a segfault, os._exit): raised for that task."""


def _skyforge_binary(explicit: Optional[str]) -> str:
    for candidate in (explicit, os.environ.get("SKYFORGE_BIN"), shutil.which("skyforge")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise PoolError("no `skyforge` program: put it on PATH, set $SKYFORGE_BIN, or pass skyforge=...")


def _toml_string(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


class Node:
    def __init__(self, index: int, slots: int, conn):
        self.index, self.slots, self.conn = index, slots, conn
        self.in_flight: Dict[int, Future] = {}
        self.lost: Optional[str] = None
        self.send_lock = threading.Lock()
        self.shared = set()  # keys this node holds

    def send(self, msg) -> None:
        """A control message (a tuple), or a frame (bytes) as it is."""
        frame = msg if isinstance(msg, (bytes, bytearray)) else control_frame(msg)
        with self.send_lock:
            self.conn.send_bytes(frame)


class Pool:
    def __init__(self, manifest: Optional[str] = None, *, nodes: Optional[int] = None,
                 concurrency: Optional[int] = None, provider: Optional[str] = None,
                 python: Optional[str] = None, skyforge: Optional[str] = None, listen: Optional[str] = None,
                 start_timeout: float = 120.0, verbose: bool = False):
        if manifest is None and nodes is None:
            raise TypeError("joblib_pool: give a manifest (pool.toml) or nodes=N")
        self.manifest, self.nodes_wanted, self.concurrency = manifest, nodes, concurrency
        self.provider, self.python = provider, python
        self.binary = _skyforge_binary(skyforge)
        self.listen = listen
        self.start_timeout, self.verbose = start_timeout, verbose
        self.nodes: List[Node] = []
        self._proc: Optional[subprocess.Popen] = None
        self._dir: Optional[str] = None
        self._job_file: Optional[str] = None
        self._lock = threading.Lock()
        self._next_id = 0
        self._closed = False
        self._output: List[str] = []
        self._done: "queue.SimpleQueue" = queue.SimpleQueue()

    # ---- start ---------------------------------------------------------------------------
    def _job_text(self) -> str:
        python = self.python or sys.executable
        job = ("\n[job]\ncommand = [" + ", ".join(_toml_string(a) for a in (python, "-m", "skyforge._node")) + "]\n")
        if self.manifest is None:
            pool = f"[pool]\nprovider = {_toml_string(self.provider or 'local')}\nnodes = {int(self.nodes_wanted)}\n"
            if self.concurrency:
                pool += f"concurrency = {int(self.concurrency)}\n"
            return pool + job
        with open(self.manifest, encoding="utf-8") as f:
            text = f.read()
        import tomllib
        data = tomllib.loads(text)
        for table in ("job", "train", "search", "tasks"):
            if table in data:
                raise PoolError(f"{self.manifest}: a pool manifest describes the pool only; it has a [{table}] table "
                                "(the job is the Python code inside the `with` block)")
        if self.nodes_wanted or self.concurrency or self.provider:
            raise TypeError("joblib_pool: give either a manifest or nodes/concurrency/provider, not both")
        return text + ("\n" if not text.endswith("\n") else "") + job

    def _local_loopback(self) -> bool:
        if self.manifest is None:
            return (self.provider or "local") == "local"
        import tomllib
        with open(self.manifest, "rb") as f:
            data = tomllib.load(f)
        return data.get("pool", {}).get("provider", "local") == "local" and \
            data.get("provider", {}).get("isolation", "none") != "netns"

    def start(self) -> "Pool":
        self._dir = tempfile.mkdtemp(prefix="skyforge-pool-")  # 0700
        text = self._job_text()
        # The job's manifest sits beside the user's, so its relative paths mean what they say.
        where = os.path.dirname(os.path.abspath(self.manifest)) if self.manifest else self._dir
        fd, self._job_file = tempfile.mkstemp(prefix=".skyforge-pool-", suffix=".toml", dir=where)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        key = secrets.token_bytes(32)
        host = self.listen or ("127.0.0.1" if self._local_loopback() else "0.0.0.0")
        listener = Listener((host, 0), authkey=key)
        env = dict(os.environ, SKYFORGE_PY_PORT=str(listener.address[1]), SKYFORGE_PY_KEY=key.hex())
        # The nodes import this package (and what its callers' tasks import) as this process does.
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join([here] + [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)])
        args = [self.binary, "run", "--env", "SKYFORGE_PY_PORT", "--env", "SKYFORGE_PY_KEY", "--env", "PYTHONPATH"]
        if self.verbose:
            args.append("-v")
        self._proc = subprocess.Popen(args + [self._job_file], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._relay_output, daemon=True).start()
        try:
            self._accept(listener)
        except BaseException:
            listener.close()
            self.close()
            raise
        listener.close()
        os.unlink(self._job_file)
        self._job_file = None
        return self

    def _relay_output(self) -> None:
        assert self._proc and self._proc.stdout
        for line in self._proc.stdout:
            self._output.append(line)
            del self._output[:-200]
            if self.verbose or (not line.startswith("[node ") and "skyforge:" in line):
                sys.stderr.write(line)
            elif line.startswith("[node "):
                sys.stdout.write(line)  # what the tasks print, prefixed by node, as `skyforge run` shows it

    def _accept(self, listener: Listener) -> None:
        deadline = time.monotonic() + self.start_timeout
        pending = []
        # Accept in a thread so a `skyforge run` that fails early (bad manifest) is seen at once.
        def accept_all():
            while True:
                try:
                    pending.append(listener.accept())
                except Exception:  # noqa: BLE001 - a peer without the key, or the listener closed
                    if self._closed or listener._listener is None:  # type: ignore[attr-defined]
                        return
        t = threading.Thread(target=accept_all, daemon=True)
        t.start()
        expected = None
        by_node: Dict[int, Node] = {}
        while True:
            while pending:
                conn = pending.pop()
                kind, node, slots, _pid = parse_control(conn.recv_bytes())
                if kind != "hello":
                    raise PoolError(f"a node spoke out of turn: {kind!r}")
                by_node[node] = Node(node, slots, conn)
            if expected is None:
                expected = self._expected_nodes()
            if expected and len(by_node) >= expected:
                break
            if self._proc.poll() is not None:
                time.sleep(0.2)  # the last lines of its output
                raise PoolError("`skyforge run` ended before the pool was up (exit " + str(self._proc.returncode) +
                                "):\n" + self._said())
            if time.monotonic() > deadline:
                raise PoolError(f"the pool did not come up within {self.start_timeout:.0f} s:\n" + self._said())
            time.sleep(0.01)
        self.nodes = [by_node[i] for i in sorted(by_node)]
        threading.Thread(target=self._complete, daemon=True, name="skyforge-completions").start()
        for n in self.nodes:
            threading.Thread(target=self._reader, args=(n,), daemon=True, name=f"skyforge-node-{n.index}").start()

    def _said(self) -> str:
        """skyforge's last lines, naming the user's manifest where it named the job's (same lines)."""
        text = "".join(self._output[-30:])
        if self.manifest and self._job_file:
            text = text.replace(self._job_file, self.manifest)
        return text

    def _expected_nodes(self) -> Optional[int]:
        if self.nodes_wanted is not None:
            return int(self.nodes_wanted)
        import tomllib
        with open(self.manifest, "rb") as f:
            return int(tomllib.load(f).get("pool", {}).get("nodes", 1))

    # ---- tasks ---------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return sum(n.slots for n in self.nodes if not n.lost)

    def submit(self, payload: bytes, callback: Optional[Callable[[Future], None]] = None) -> Future:
        fut: Future = Future()
        if callback is not None:
            fut.add_done_callback(callback)
        with self._lock:
            live = [n for n in self.nodes if not n.lost]
            if not live:
                fut.set_exception(PoolError("every node of the pool is lost"))
                return fut
            # The node with the most free slots (fewest tasks per slot) takes it.
            node = min(live, key=lambda n: len(n.in_flight) / n.slots)
            task_id = self._next_id
            self._next_id += 1
            node.in_flight[task_id] = fut
        try:
            node.send(task_frame(task_id, payload))
        except OSError as e:
            self._lose(node, f"sending to it failed: {e}")
        return fut

    def share(self, key: int, blob: bytes) -> None:
        for n in self.nodes:
            if not n.lost and key not in n.shared:
                n.send(("put", key, blob))
                n.shared.add(key)

    def cancel(self, futures) -> None:
        """Drop these tasks: the nodes skip them if they have not started (joblib's abort)."""
        wanted = set(map(id, futures))
        with self._lock:
            per_node = {n: [t for t, f in n.in_flight.items() if id(f) in wanted] for n in self.nodes}
            for n, ids in per_node.items():
                for t in ids:
                    n.in_flight.pop(t, None)
        for n, ids in per_node.items():
            if ids and not n.lost:
                try:
                    n.send(("cancel", ids))
                except OSError:
                    pass

    def unshare(self, keys) -> None:
        keys = list(keys)
        for n in self.nodes:
            held = [k for k in keys if k in n.shared]
            if held and not n.lost:
                try:
                    n.send(("drop", held))
                except OSError:
                    pass
            n.shared.difference_update(held)

    def _reader(self, node: Node) -> None:
        while True:
            try:
                frame = node.conn.recv_bytes()
            except (EOFError, OSError) as e:
                if not self._closed:
                    self._lose(node, "its connection ended" + (f" ({e})" if str(e) else ""))
                return
            task_id, slot, ok, payload = parse_done(frame)
            with self._lock:
                fut = node.in_flight.pop(task_id, None)
            if fut is not None:
                self._done.put((fut, ok, payload))

    def _complete(self) -> None:
        # Futures complete here, never on a node's reader: a completion's callbacks (joblib's
        # dispatch of the next batch) may send to any node, and a reader must keep reading.
        while True:
            item = self._done.get()
            if item is None:
                return
            fut, ok, payload = item
            if fut.done():
                continue
            if ok is None:  # the node was lost
                fut.set_exception(payload)
            elif ok:
                fut.set_result(payload)
            else:
                fut.set_exception(_reraisable(payload))

    def _lose(self, node: Node, why: str) -> None:
        with self._lock:
            if node.lost:
                return
            node.lost = why
            futures = list(node.in_flight.values())
            node.in_flight.clear()
        for f in futures:
            self._done.put((f, None, PoolError(f"node {node.index} lost: {why}")))

    # ---- stop ----------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for n in self.nodes:
            try:
                n.send(("bye",))
                n.conn.close()
            except OSError:
                pass
        self._done.put(None)
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)  # skyforge's graceful teardown
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        if self._job_file and os.path.exists(self._job_file):
            os.unlink(self._job_file)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def interrupt(self) -> None:
        """Ctrl-C in the caller: stop `skyforge run` at once (it tears the pool down itself)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
        self.close()

    def __enter__(self) -> "Pool":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is KeyboardInterrupt:
            self.interrupt()
        else:
            self.close()


def _reraisable(payload: bytes) -> BaseException:
    import pickle
    report: ErrorReport = pickle.loads(payload)
    where = f"(raised on skyforge node {report.node} slot {report.slot})"
    exc: Optional[BaseException] = None
    if report.exception is not None:
        try:
            exc = pickle.loads(report.exception)
        except Exception:  # noqa: BLE001 - its class does not exist here
            exc = None
    if exc is None:
        cls = WorkerLostError if report.type_name == "WorkerLostError" else RuntimeError
        exc = cls(f"{report.type_name}: {report.message}" if cls is RuntimeError else report.message)
    if report.traceback:
        exc.__cause__ = RemoteTraceback("\n" + report.traceback.rstrip() + "\n" + where)
    if hasattr(exc, "add_note"):
        exc.add_note(where)
    return exc
