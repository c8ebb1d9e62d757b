"""The node agent of a Python pool: `python -m skyforge._node`, the command app `skyforge run`
starts on every node for skyforge.joblib_pool() (docs/python.md).

It connects to the client at $SKYFORGE_CLIENT_ADDR:$SKYFORGE_PY_PORT — trying again, with
jittered backoff, for up to CONNECT_TIMEOUT seconds (a crowded port drops a connection) — proves
the pool key ($SKYFORGE_PY_KEY, from the job's environment, never argv), starts one worker
process per slot ($SKYFORGE_CONCURRENCY) that lives as long as the pool, and hands each task to a free slot. A
worker that dies (a segfault, os._exit) fails the task it held, naming the node and slot, and is
replaced, so the pool stays usable. When the client says bye or its connection ends, the agent
stops its workers and leaves — and with it the node.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import random
import ssl
import sys
import threading
import time
from collections import Counter
from multiprocessing import AuthenticationError

from . import _slot
from ._handshake import connect
from ._payloads import ErrorReport, dumps
from ._wire import FROM_DRIVER, FrameError, control_frame, done_frame, kind_of, parse_control, parse_task


class Slot:
    """A slot's worker process and the thread that feeds it: tasks from the node's queue, and
    before each, what the client shared since ("put"/"drop", in the order they came)."""

    def __init__(self, ctx, node: int, index: int, tasks, send):
        self.ctx, self.node, self.index, self.tasks, self.send = ctx, node, index, tasks, send
        self.control: "queue.SimpleQueue" = queue.SimpleQueue()
        self.start()
        threading.Thread(target=self.loop, daemon=True, name=f"skyforge-slot-{index}").start()

    def start(self):
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_slot.serve, args=(child, self.node, self.index), daemon=True,
                                     name=f"skyforge-slot-{self.index}")
        self.proc.start()
        child.close()

    def how_it_ended(self) -> str:
        self.proc.join(5)
        code = self.proc.exitcode
        if code is None:
            return "its worker process stopped answering"
        if code < 0:
            import signal
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"its worker process was killed by {name}"
        return f"its worker process exited with status {code}"

    def loop(self):
        shared = {}  # what this slot's worker holds, to give a replacement
        while True:
            task = self.tasks.get()
            while True:
                try:
                    msg = self.control.get_nowait()
                except queue.Empty:
                    break
                if msg[0] == "put":
                    shared[msg[1]] = msg[2]
                else:
                    for k in msg[1]:
                        shared.pop(k, None)
                self._tell(msg)
            if task is None:
                self._tell(("bye",))
                return
            task_id, frame = task
            if task_id in cancelled or leaving.is_set():
                continue  # not wanted any more, or nobody to tell: the queue drains to the bye
            try:
                self.conn.send_bytes(frame)  # relayed as it came: never unpickled here
                answer = self.conn.recv_bytes()
            except (EOFError, OSError):
                how = self.how_it_ended()
                report = ErrorReport(None, "WorkerLostError",
                                     f"node {self.node} slot {self.index}: {how} while running the task", "",
                                     self.node, self.index)
                answer = done_frame(task_id, self.index, False, dumps(report))
                self.start()  # a fresh worker, told what the old one held
                for k, blob in shared.items():
                    self._tell(("put", k, blob))
            try:
                self.send(answer)
            except (OSError, ValueError):
                leaving.set()  # the client is gone (or closing): the agent's main loop ends too

    def _tell(self, msg):
        try:
            self.conn.send_bytes(control_frame(msg))
        except OSError:
            pass  # a dead worker: the next task finds out and replaces it


# How long a node agent keeps trying to connect to the pool's caller.
CONNECT_TIMEOUT = 30.0


def connect_with_retries(address, key: bytes, cert: str, timeout: float = CONNECT_TIMEOUT):
    """connect() again and again, 0.1 s apart at first, doubling to 2 s, each pause jittered (so
    the nodes of a pool do not come back in step), until it works or `timeout` seconds have
    passed: then one ConnectionError that says how many tries failed, and how. A certificate that
    is not the pinned one, or a wrong key, ends it at once: trying again cannot change them."""
    deadline = time.monotonic() + timeout
    failures: "Counter[str]" = Counter()
    last = ""
    pause = 0.1
    while True:
        try:
            return connect(address, key, cert, timeout=deadline - time.monotonic())
        except (ssl.SSLCertVerificationError, AuthenticationError):
            raise
        except Exception as e:  # noqa: BLE001 - refused, reset, dropped, timed out: try again
            last = f"{type(e).__name__}: {e}"
            failures[last] += 1
        left = deadline - time.monotonic()
        if left > 0:
            time.sleep(min(left, pause * random.uniform(0.5, 1.5)))
            pause = min(pause * 2, 2.0)
        if time.monotonic() >= deadline:
            tries = sum(failures.values())
            how = "; ".join(f"{what} ({n}x)" if n > 1 else what for what, n in failures.most_common(5))
            raise ConnectionError(f"{tries} tr{'ies' if tries != 1 else 'y'} in {timeout:g} s failed: {how}"
                                  + (f"; the last: {last}" if len(failures) > 1 else ""))

cancelled = set()  # task ids the client no longer wants (joblib's abort_everything)
leaving = threading.Event()  # the client said bye or went away: queued tasks are skipped


def listen(conn, node: int, workers, tasks) -> int:
    """The agent's reading of the caller, until bye or the end of the connection (0), or a frame
    it refuses (1, said on stderr): tasks to the node's queue, shared arguments to every slot,
    cancels to `cancelled`. It only reads: a slot busy with a long task never stops the node
    from hearing the caller (a cancel, a put for the next call, a bye)."""
    while True:
        try:
            frame = conn.recv_bytes()
        except (EOFError, OSError):
            return 0
        try:
            if kind_of(frame) == b"T":
                tasks.put((parse_task(frame)[0], frame))
                continue
            msg = parse_control(frame, FROM_DRIVER)
        except FrameError as e:
            print(f"skyforge pool node {node}: the caller sent a frame this node refuses (docs/python-plane.md): {e}",
                  file=sys.stderr, flush=True)
            return 1
        if msg[0] in ("put", "drop"):
            for w in workers:
                w.control.put(msg)
        elif msg[0] == "cancel":
            cancelled.update(msg[1])
        else:  # bye
            return 0


def main() -> int:
    node = int(os.environ["SKYFORGE_NODE"])
    slots = max(1, int(os.environ.get("SKYFORGE_CONCURRENCY", "1")))
    address = (os.environ["SKYFORGE_CLIENT_ADDR"], int(os.environ["SKYFORGE_PY_PORT"]))
    key = bytes.fromhex(os.environ.pop("SKYFORGE_PY_KEY"))
    cert = os.environ.pop("SKYFORGE_PY_CERT")
    try:
        conn = connect_with_retries(address, key, cert)
    except Exception as e:  # noqa: BLE001 - said in the job's output: the caller shows it
        print(f"skyforge pool node {node}: cannot connect to the caller at {address[0]}:{address[1]}: "
              f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    ctx = mp.get_context("spawn")  # no thread or socket of this process reaches the workers
    send_lock = threading.Lock()

    def send(frame: bytes):
        with send_lock:
            conn.send_bytes(frame)

    tasks: "queue.SimpleQueue" = queue.SimpleQueue()
    workers = [Slot(ctx, node, i, tasks, send) for i in range(slots)]
    send(control_frame(("hello", node, slots, os.getpid())))
    status = listen(conn, node, workers, tasks)
    leaving.set()
    for _ in workers:
        tasks.put(None)
    for w in workers:
        w.proc.join(5)
        if w.proc.is_alive():
            w.proc.kill()
    return status


if __name__ == "__main__":
    sys.exit(main())
