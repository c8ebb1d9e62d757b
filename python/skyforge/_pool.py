"""A pool of Python worker processes on skyforge nodes, held for a `with` block (docs/python.md).

Pool.start() runs `skyforge run` on a manifest whose job is the node agent (skyforge._node) on
every node, and waits until every node has connected back — over TLS 1.3 to this pool's own
pinned certificate (_tls.py), authenticated inside it with a key made for this pool
(an HMAC-SHA256 challenge-response, both ways, before any byte is unpickled: _handshake.py,
docs/python-plane.md), each connection on a thread of its own within AUTH_TIMEOUT seconds, so a peer that
connects and says nothing costs the pool nothing, and a flood of them cannot keep the nodes
out (_Gate; the nodes also try again, _node.py). The key and the certificate reach the nodes
through `skyforge run --env` (the job's environment, on skyforge's sealed control plane): never
a command line, a file or a log.
Pool.close() — on leaving the block normally, on an exception, on Ctrl-C — says bye to every
node, lets `skyforge run` tear the pool down, and interrupts it (its own graceful teardown) or
kills it if it does not finish; a Ctrl-C while it waits is passed on to `skyforge run`, and the
temporary files go whatever happens.
"""
from __future__ import annotations

import functools
import hmac
import json
import os
import pickle
import queue
import secrets
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import wait as futures_wait
from typing import Any, Callable, Dict, List, Optional, Tuple

try:
    import tomllib
except ImportError:  # Python < 3.11: the same parser from PyPI (the package's dependency there)
    import tomli as tomllib

from . import _shm
from ._handshake import accept_connection
from ._errors import PoolError, RemoteTraceback, WorkerLostError, raised  # noqa: F401 - skyforge.RemoteTraceback
from ._payloads import dumps
from ._tls import _readable, server_context
from ._wire import FROM_NODE, FrameError, control_frame, parse_control, parse_done, task_frame

# A connection to the pool's port has this long to prove the key and say hello (a node needs a
# few round trips: milliseconds on a LAN, a second on the worst links).
AUTH_TIMEOUT = 3.0
# Connections authenticating at once; more wait in the kernel's backlog (_BACKLOG deep) until
# one finishes, or until the oldest of the busiest source has had CROWDED_AGE s and is dropped.
MAX_PENDING = 128
CROWDED_AGE = 0.5
_BACKLOG = 1024
# Refused peers kept by name (all are counted).
REFUSED_KEPT = 1000
# How long the first large array of a pool waits for its nodes' answers to the probe.
PROBE_WAIT = 10.0
# The longest line of `skyforge run`'s output read at once (a longer one comes in pieces).
_LINE_MAX = 1 << 16


def _skyforge_binary(explicit: Optional[str]) -> str:
    for candidate in (explicit, os.environ.get("SKYFORGE_BIN"), shutil.which("skyforge")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise PoolError("no `skyforge` program: put it on PATH, set $SKYFORGE_BIN, or pass skyforge=...")


def _toml_string(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def _without_job_table(text: str, data: dict, manifest: str) -> str:
    """The manifest's text with its [job] table's lines left blank, so that the pool's own [job]
    can go at the end and every other line keeps its number in skyforge's errors."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.split("#")[0].replace(" ", "").strip() == "[job]"), None)
    if start is not None:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
        lines[start:end] = ["\n"] * (end - start)
    out = "".join(lines)
    try:
        same = tomllib.loads(out) == {k: v for k, v in data.items() if k != "job"}
    except tomllib.TOMLDecodeError:
        same = False
    if not same:
        raise PoolError(f"{manifest}: write plugin_path in a [job] table of its own (`[job]` on a line, then "
                        "`plugin_path = [\"dir\", ...]`)")
    return out


def _route_source(host: str) -> Optional[str]:
    """This machine's address on the route to `host` (as the providers choose the address their
    nodes connect back to: a UDP connect sends nothing); None when it cannot be told."""
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, _, _, _, addr in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(addr)
                return s.getsockname()[0]
        except OSError:
            continue
    return None


def _ssh_host(entry: str) -> str:
    """The host of an ssh provider's "[user@]host[:port]" / "[user@][ipv6]:port" entry."""
    rest = entry.rsplit("@", 1)[-1]
    if rest.startswith("["):
        return rest[1:rest.find("]")] if "]" in rest else rest
    return rest.split(":", 1)[0] if rest.count(":") == 1 else rest


class Node:
    def __init__(self, index: int, slots: int, conn):
        self.index, self.slots, self.conn = index, slots, conn
        self.in_flight: Dict[int, Future] = {}
        self.lost: Optional[str] = None
        self.send_lock = threading.Lock()
        self.shared = set()  # keys this node holds
        self.reader: Optional[threading.Thread] = None

    def send(self, msg) -> None:
        """A control message (a tuple), or a frame (bytes) as it is."""
        frame = msg if isinstance(msg, (bytes, bytearray)) else control_frame(msg)
        with self.send_lock:
            self.conn.send_bytes(frame)

    def shut_down(self) -> None:
        """Ends the connection both ways without closing its descriptor under the reader: the
        reader sees the end (EOFError) and leaves; the descriptor is closed after it has."""
        try:
            s = socket.socket(fileno=os.dup(self.conn.fileno()))
        except (OSError, ValueError):
            return
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            s.close()


class _Pending:
    __slots__ = ("since", "deadline", "peer", "source", "cut")

    def __init__(self, since: float, deadline: float, peer: str, source: str):
        self.since, self.deadline, self.peer, self.source = since, deadline, peer, source
        self.cut: Optional[str] = None  # why the gate ended it (its handshake thread says so)


class _Gate:
    """The pool's TCP port while the pool starts: one thread accepts; each connection proves the
    key and says hello on a thread of its own within `timeout` seconds, or is dropped. Nodes that
    said hello wait in `ready`; every refused peer is counted with the reason (`refused` keeps the
    first REFUSED_KEPT of them).

    A new connection is never closed for want of room. With MAX_PENDING connections
    authenticating, the gate stops accepting (the kernel's backlog holds the new ones, in the
    order they came) until one of them has had CROWDED_AGE seconds — far more than a node needs
    — and then drops that one to make room: the oldest of the source address that holds the
    most, so one source (a flood of silent connections) cannot keep the others out, and a flood
    from the nodes' own address only delays them by about CROWDED_AGE."""

    def __init__(self, host: str, key: bytes, tls: ssl.SSLContext, timeout: float, port: int = 0):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=_BACKLOG)
        self.address: Tuple[str, int] = self.sock.getsockname()[:2]
        self.key, self.tls, self.timeout = key, tls, timeout
        self.ready: "queue.SimpleQueue" = queue.SimpleQueue()  # (conn, hello, peer)
        self.refused: List[Tuple[str, str]] = []  # (peer, why): the first REFUSED_KEPT
        self.refused_count = 0
        self._by_source: "Counter[str]" = Counter()  # refused, by source address
        self._by_reason: "Counter[str]" = Counter()
        self._pending: Dict[socket.socket, _Pending] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name="skyforge-pool-accept")
        self._thread.start()

    def refuse(self, peer: str, why: str) -> None:
        with self._lock:
            self.refused_count += 1
            self._by_source[peer.rsplit(":", 1)[0]] += 1
            self._by_reason[why] += 1
            if len(self.refused) < REFUSED_KEPT:
                self.refused.append((peer, why))

    def _accept_loop(self) -> None:
        while not self._closed:
            self._expire()
            wait = self._make_room()
            if wait is not None:  # crowded, nobody old enough to drop yet: the backlog holds the new ones
                time.sleep(min(max(wait, 0.005), 0.1))
                continue
            try:
                readable = _readable(self.sock, 0.1)  # poll(2): any descriptor number
            except (OSError, ValueError):
                return  # closed
            if not readable or self._closed:
                continue
            try:
                s, addr = self.sock.accept()
            except OSError:
                continue
            peer = f"{addr[0]}:{addr[1]}"
            now = time.monotonic()
            with self._lock:
                self._pending[s] = _Pending(now, now + self.timeout, peer, addr[0])
            threading.Thread(target=self._handshake, args=(s, peer), daemon=True,
                             name="skyforge-pool-handshake").start()

    def _cut(self, victims: List[socket.socket]) -> None:
        for s in victims:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes its handshake thread: EOFError
            except OSError:
                pass

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [s for s, p in self._pending.items() if p.cut is None and now >= p.deadline]
            for s in late:
                self._pending[s].cut = f"did not prove the key and say hello within {self.timeout:g} s"
        self._cut(late)

    def _make_room(self) -> Optional[float]:
        """None when there is room for one more connection (having dropped one to make it, if
        need be); otherwise how long until one may be dropped."""
        now = time.monotonic()
        with self._lock:
            live = [(s, p) for s, p in self._pending.items() if p.cut is None]
            if len(live) < MAX_PENDING:
                return None
            per_source = Counter(p.source for _, p in live)
            old = [(s, p) for s, p in live if now - p.since >= CROWDED_AGE]
            if not old:
                return min(p.since for _, p in live) + CROWDED_AGE - now
            s, p = max(old, key=lambda sp: (per_source[sp[1].source], now - sp[1].since))
            p.cut = f"not authenticated after {CROWDED_AGE:g} s, with {MAX_PENDING} connections authenticating"
        self._cut([s])
        return None

    def _handshake(self, s: socket.socket, peer: str) -> None:
        conn, pending = None, None
        try:
            conn = accept_connection(s, self.key, self.tls, self.timeout)
            hello = parse_control(conn.recv_bytes(4096), FROM_NODE)
            with self._lock:
                pending = self._pending.pop(s, None)
                if pending is not None and pending.cut is not None:  # cut just as it said hello
                    raise EOFError("cut")
        except BaseException as e:  # noqa: BLE001 - anything a peer does ends here, never in the pool
            with self._lock:
                pending = self._pending.pop(s, pending)
            if pending is not None and pending.cut is not None:
                why = pending.cut
            elif self._closed:
                why = "still authenticating when the pool came up"
            elif isinstance(e, TimeoutError):  # the TLS handshake ran into the same deadline
                why = f"did not prove the key and say hello within {self.timeout:g} s"
            elif type(e).__name__ == "AuthenticationError":
                why = str(e)[:200]  # "wrong key", or how its proof is malformed
            elif isinstance(e, FrameError):
                why = f"its first message was refused: {e}"[:200]
            elif isinstance(e, ssl.SSLError):
                why = f"TLS handshake failed: {e.reason or e}"[:200]
            elif isinstance(e, EOFError):
                why = "closed the connection before proving the key"
            else:
                why = f"{type(e).__name__}: {e}"[:200]
            self.refuse(peer, why)
            if conn is not None:
                conn.close()
            s.close()
            return
        s.close()
        self.ready.put((conn, hello, peer))

    def close(self) -> None:
        """No more connections; those still authenticating are dropped (and counted)."""
        self._closed = True
        self._thread.join(2)
        try:
            self.sock.close()  # what waited in the backlog is reset by the kernel (not counted: never seen)
        except OSError:
            pass
        with self._lock:
            pending = [s for s, p in self._pending.items() if p.cut is None]
            for s in pending:
                self._pending[s].cut = "still authenticating when the pool came up"
        self._cut(pending)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending:
                    break
            time.sleep(0.01)
        while True:  # authenticated, but not wanted (the pool is up, or failed)
            try:
                conn, _, peer = self.ready.get_nowait()
            except queue.Empty:
                break
            conn.close()

    def summary(self) -> str:
        """One line: how many connections were refused, and who and why — each of them when
        there are a few, else counted by source address and by reason (with the first few)."""
        with self._lock:
            count, refused = self.refused_count, self.refused[:5]
            by_source, by_reason = self._by_source.most_common(), self._by_reason.most_common()
        if not count:
            return ""
        head = f"skyforge pool: refused {count} connection{'s' if count != 1 else ''} to its port {self.address[1]}"
        if count <= 5:
            return head + ": " + "; ".join(f"{peer} ({why})" for peer, why in refused)

        def counted(items):
            shown = ", ".join(f"{n} {what}" for what, n in items[:5])
            return shown + (f", {sum(n for _, n in items[5:])} more" if len(items) > 5 else "")

        return (f"{head}: {counted([(f'from {a}', n) for a, n in by_source])}; "
                f"why: {counted(by_reason)}; the first: "
                + "; ".join(f"{peer} ({why})" for peer, why in refused[:3]))


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
        self.refused: List[Tuple[str, str]] = []  # peers the port refused while the pool started (the first 1000)
        self.refused_count = 0  # all of them
        self.address: Optional[Tuple[str, int]] = None  # where the pool listened for its nodes
        self._proc: Optional[subprocess.Popen] = None
        self._relay: Optional[threading.Thread] = None
        self._dir: Optional[str] = None
        self._job_file: Optional[str] = None
        self._data: Optional[dict] = None  # the manifest, parsed
        self._lock = threading.Lock()
        self._next_id = 0
        self._closed = False    # close() has begun: nothing new is sent
        self._finished = False  # close() has done everything
        self._stage = 0         # 1: SIGINT sent to `skyforge run`; 2: a second (forced); 3: killed
        self._interrupted = False
        self._output: List[str] = []
        self._done: "queue.SimpleQueue" = queue.SimpleQueue()
        self._shm = _shm.SharedDir()  # large arrays for the nodes on this machine
        self._probes: Dict[int, Future] = {}  # node -> its answer to the shared directory's probe

    # ---- start ---------------------------------------------------------------------------
    def _manifest(self) -> dict:
        if self._data is None:
            if self.manifest is None:
                self._data = {"pool": {"provider": self.provider or "local", "nodes": int(self.nodes_wanted)}}
            else:
                try:
                    with open(self.manifest, "rb") as f:
                        self._data = tomllib.load(f)
                except OSError as e:
                    raise PoolError(f"cannot read the pool manifest {self.manifest}: {e.strerror or e}") from None
                except tomllib.TOMLDecodeError as e:
                    raise PoolError(f"{self.manifest}: {e}") from None
        return self._data

    def _job_text(self) -> str:
        python = self.python or sys.executable
        job = ("\n[job]\ncommand = [" + ", ".join(_toml_string(a) for a in (python, "-m", "skyforge._node")) + "]\n")
        if self.manifest is None:
            pool = f"[pool]\nprovider = {_toml_string(self.provider or 'local')}\nnodes = {int(self.nodes_wanted)}\n"
            if self.concurrency:
                pool += f"concurrency = {int(self.concurrency)}\n"
            return pool + job
        data = self._manifest()
        with open(self.manifest, encoding="utf-8") as f:
            text = f.read()
        for table in ("train", "search", "tasks"):
            if table in data:
                raise PoolError(f"{self.manifest}: a pool manifest describes the pool only; it has a [{table}] table "
                                "(the job is the Python code inside the `with` block)")
        given = data.get("job", {})
        if not isinstance(given, dict) or set(given) - {"plugin_path"}:
            sets = ", ".join(sorted(set(given) - {"plugin_path"})) if isinstance(given, dict) else "an array of tables"
            raise PoolError(f"{self.manifest}: a pool manifest describes the pool only; it has a [job] table that sets "
                            f"{sets} (a pool's [job] sets plugin_path only: the job is the Python code inside the "
                            "`with` block)")
        if self.nodes_wanted or self.concurrency or self.provider:
            raise TypeError("joblib_pool: give either a manifest or nodes/concurrency/provider, not both")
        if "job" in data:
            dirs = given.get("plugin_path", [])
            if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
                raise PoolError(f"{self.manifest}: [job] plugin_path: expected an array of strings (plugin directories, "
                                "relative to the manifest's directory)")
            text = _without_job_table(text, data, self.manifest)
            # The job's manifest sits beside this one: its relative entries mean the same there.
            job += "plugin_path = [" + ", ".join(_toml_string(d) for d in dirs) + "]\n"
        return text + ("\n" if not text.endswith("\n") else "") + job

    def _bind_address(self) -> str:
        """The one address the pool listens on: the one its nodes connect to ($SKYFORGE_CLIENT_ADDR,
        the provider's control address), where that can be told before they exist."""
        if self.listen:
            return self.listen
        data = self._manifest()
        provider = data.get("pool", {}).get("provider", "local")
        options = data.get("provider", {}) if isinstance(data.get("provider"), dict) else {}
        given = options.get("control_address")
        if isinstance(given, str) and given:
            return given
        if provider == "local":
            # A netns pool's nodes come through a bridge made for the run (its address known
            # only then); a plain local pool's through loopback.
            return "0.0.0.0" if options.get("isolation", "none") == "netns" else "127.0.0.1"
        if provider == "ssh" and not options.get("ssh_config"):
            hosts = options.get("hosts")
            if isinstance(hosts, list) and hosts and isinstance(hosts[0], str):
                source = _route_source(_ssh_host(hosts[0]))  # the ssh provider's choice (docs/providers.md)
                if source:
                    return source
        return "0.0.0.0"  # slurm, aws: the nodes' machines are not known before the run

    def start(self) -> "Pool":
        try:
            self._start()
        except BaseException:
            if self._proc is not None:
                self._escalate()  # the nodes that never came up cannot be told bye
            self.close()
            raise
        return self

    def _start(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="skyforge-pool-")  # 0700
        text = self._job_text()
        # The job's manifest sits beside the user's, so its relative paths mean what they say.
        where = os.path.dirname(os.path.abspath(self.manifest)) if self.manifest else self._dir
        try:
            fd, self._job_file = tempfile.mkstemp(prefix=".skyforge-pool-", suffix=".toml", dir=where)
        except OSError as e:
            raise PoolError(f"cannot write the pool's job manifest in {where}, beside {self.manifest} "
                            f"(it goes there so that relative paths keep their meaning): {e.strerror or e}") from None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        key = secrets.token_bytes(32)
        tls, cert_pem = self._tls_identity()
        host = self._bind_address()
        try:
            gate = _Gate(host, key, tls, AUTH_TIMEOUT)
        except OSError as e:
            raise PoolError(f"cannot listen for the pool's nodes on {host}: {e.strerror or e}"
                            + ("" if self.listen else " (give listen=ADDRESS)")) from None
        self.address = gate.address
        try:
            env = dict(os.environ, SKYFORGE_PY_PORT=str(gate.address[1]), SKYFORGE_PY_KEY=key.hex(),
                       SKYFORGE_PY_CERT=cert_pem)
            # The nodes import this package (and what its callers' tasks import) as this process does.
            here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            env["PYTHONPATH"] = os.pathsep.join([here] + [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)])
            args = [self.binary, "run", "--env", "SKYFORGE_PY_PORT", "--env", "SKYFORGE_PY_KEY", "--env", "SKYFORGE_PY_CERT",
                    "--env", "PYTHONPATH"]
            if self.verbose:
                args.append("-v")
            self._proc = subprocess.Popen(args + [self._job_file], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, start_new_session=True)
            self._relay = threading.Thread(target=self._relay_output, daemon=True, name="skyforge-pool-output")
            self._relay.start()
            self._accept(gate)
        finally:
            gate.close()
            self.refused, self.refused_count = list(gate.refused), gate.refused_count
        report = gate.summary()
        if report:
            sys.stderr.write(report + "\n")
        os.unlink(self._job_file)
        self._job_file = None

    def _tls_identity(self) -> Tuple[ssl.SSLContext, str]:
        """The pool's TLS server context and the certificate its nodes pin: a fresh key and
        self-signed certificate from `skyforge tls-identity` in the pool's private directory;
        the key file is gone once the context holds the key."""
        where = os.path.join(self._dir, "tls")
        os.mkdir(where, 0o700)
        made = subprocess.run([self.binary, "tls-identity", where], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        if made.returncode != 0:
            raise PoolError("cannot make the pool's TLS identity: "
                            + made.stdout.decode("utf-8", errors="replace").strip())
        cert, key = os.path.join(where, "cert.pem"), os.path.join(where, "key.pem")
        try:
            tls = server_context(cert, key)
        finally:
            os.unlink(key)
        with open(cert, encoding="ascii") as f:
            return tls, f.read()

    def _relay_output(self) -> None:
        """`skyforge run`'s output, line by line, to this process's stdout/stderr, for as long as
        it writes: bytes that are not UTF-8 become U+FFFD, and nothing stops this loop before
        the pipe ends (a stalled relay would stall `skyforge run` itself)."""
        assert self._proc and self._proc.stdout
        pipe = self._proc.stdout
        where = None  # where the line a piece continues went
        while True:
            try:
                raw = pipe.readline(_LINE_MAX)
            except (OSError, ValueError):
                return
            if not raw:
                return
            try:
                line = raw.decode("utf-8", errors="replace")
                if where is None:
                    self._output.append(line)
                    del self._output[:-200]
                    if self.verbose or (not line.startswith("[node ") and "skyforge:" in line):
                        where = "err"
                    elif line.startswith("[node "):
                        where = "out"  # what the tasks print, prefixed by node, as `skyforge run` shows it
                    else:
                        where = "none"
                stream = sys.stderr if where == "err" else sys.stdout if where == "out" else None
                if stream is not None:
                    stream.write(line)
                if raw.endswith(b"\n"):
                    where = None
            except Exception:  # noqa: BLE001 - a closed or odd stdout: keep draining the pipe
                where = None if raw.endswith(b"\n") else where

    def _accept(self, gate: _Gate) -> None:
        deadline = time.monotonic() + self.start_timeout
        expected = self._expected_nodes()
        by_node: Dict[int, Node] = {}
        while True:
            while True:
                try:
                    conn, hello, peer = gate.ready.get_nowait()
                except queue.Empty:
                    break
                _, node, slots, _pid = hello
                if not 0 <= node < expected or not 1 <= slots <= 1 << 16 or node in by_node:
                    gate.refuse(peer, f"said hello as node {node} with {slots} slots "
                                + ("(that node is already here)" if node in by_node else f"(the pool has {expected} nodes)"))
                    conn.close()
                    continue
                by_node[node] = Node(node, slots, conn)
            if len(by_node) >= expected:
                break
            if self._proc.poll() is not None:
                time.sleep(0.2)  # the last lines of its output
                raise PoolError("`skyforge run` ended before the pool was up (exit " + str(self._proc.returncode) +
                                "):\n" + self._said() + self._refused_note(gate))
            if time.monotonic() > deadline:
                raise PoolError(f"the pool did not come up within {self.start_timeout:.0f} s "
                                f"({len(by_node)} of {expected} nodes connected to {gate.address[0]}:{gate.address[1]}):\n"
                                + self._said() + self._refused_note(gate))
            time.sleep(0.01)
        self.nodes = [by_node[i] for i in sorted(by_node)]
        threading.Thread(target=self._complete, daemon=True, name="skyforge-completions").start()
        for n in self.nodes:
            n.reader = threading.Thread(target=self._reader, args=(n,), daemon=True, name=f"skyforge-node-{n.index}")
            n.reader.start()

    @staticmethod
    def _refused_note(gate: _Gate) -> str:
        text = gate.summary()
        return "\n" + text if text else ""

    def _said(self) -> str:
        """skyforge's last lines, naming the user's manifest where it named the job's (same lines)."""
        text = "".join(self._output[-30:])
        if self.manifest and self._job_file:
            text = text.replace(self._job_file, self.manifest)
        return text

    def _expected_nodes(self) -> int:
        if self.nodes_wanted is not None:
            return int(self.nodes_wanted)
        nodes = self._manifest().get("pool", {}).get("nodes", 1)
        return nodes if isinstance(nodes, int) and nodes > 0 else 1  # skyforge run says what is wrong

    # ---- tasks ---------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return sum(n.slots for n in self.nodes if not n.lost)

    def submit(self, payload: bytes, callback: Optional[Callable[[Future], None]] = None,
               to: Optional[Node] = None) -> Future:
        fut: Future = Future()
        if callback is not None:
            fut.add_done_callback(callback)
        with self._lock:
            live = [n for n in self.nodes if not n.lost and to in (None, n)]
            if self._closed or not live:
                fut.set_exception(PoolError("the pool is closed" if self._closed else "every node of the pool is lost"
                                            if to is None else f"node {to.index} is lost"))
                return fut
            # The node with the most free slots (fewest tasks per slot) takes it.
            node = min(live, key=lambda n: len(n.in_flight) / n.slots)
            task_id = self._next_id
            self._next_id += 1
            node.in_flight[task_id] = fut
        try:
            node.send(task_frame(task_id, payload))
        except (OSError, ValueError) as e:
            self._lose(node, f"sending to it failed: {e}")
        return fut

    # ---- large arguments (docs/python.md, "Large arrays") ----------------------------------
    def share(self, key: int, value: Any, memory: bool = True) -> None:
        """`value`, a large argument of a call, to every node once, as `key`: to the nodes on this
        machine through memory when it is an array that can be (skyforge._shm; never when
        `memory` is False), to the others (and whenever the file cannot be written) as its pickle."""
        wanting = [n for n in self.nodes if not n.lost and key not in n.shared]
        mapping = self._mapping_nodes() if wanting and memory and _shm.mappable(value) else set()
        mapped_file = self._shm.write(key, value) if any(n.index in mapping for n in wanting) else None
        blobs: Dict[bool, bytes] = {}
        for n in wanting:
            mapped = mapped_file is not None and n.index in mapping
            if mapped not in blobs:
                blobs[mapped] = pickle.dumps(mapped_file if mapped else value, protocol=pickle.HIGHEST_PROTOCOL)
            n.send(("put", key, blobs[mapped]))
            n.shared.add(key)

    def _mapping_nodes(self) -> set:
        """The nodes that proved they map this pool's shared files: each is asked once, by a task
        that reads the shared directory's probe file; one that has not answered within
        PROBE_WAIT seconds gets pickles until it has."""
        if self._shm.open() is None:
            return set()
        probe = dumps(functools.partial(_shm.probe, self._shm.probe_path()))
        for n in self.nodes:
            if not n.lost and n.index not in self._probes:
                self._probes[n.index] = self.submit(probe, to=n)
        # The completion thread cannot wait for a completion (joblib dispatches from its callbacks).
        on_completions = threading.current_thread().name == "skyforge-completions"
        futures_wait(list(self._probes.values()), timeout=0 if on_completions else PROBE_WAIT)
        return {i for i, f in self._probes.items() if f.done() and self._proved(f)}

    def _proved(self, probe: Future) -> bool:
        try:
            return probe.exception() is None and hmac.compare_digest(pickle.loads(probe.result()), self._shm.token)
        except Exception:  # noqa: BLE001 - an answer that is not the probe's bytes
            return False

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
                except (OSError, ValueError):
                    pass

    def unshare(self, keys) -> None:
        keys = list(keys)
        for n in self.nodes:
            held = [k for k in keys if k in n.shared]
            if held and not n.lost:
                try:
                    n.send(("drop", held))
                except (OSError, ValueError):
                    pass
            n.shared.difference_update(held)
        for k in keys:
            self._shm.remove(k)

    def _reader(self, node: Node) -> None:
        try:
            while True:
                try:
                    frame = node.conn.recv_bytes()
                except (EOFError, OSError) as e:
                    if not self._closed:
                        self._lose(node, "its connection ended" + (f" ({e})" if str(e) else ""))
                    return
                try:
                    task_id, slot, ok, payload = parse_done(frame)
                except FrameError as e:
                    self._lose(node, f"it sent a frame the pool refuses (docs/python-plane.md): {e}")
                    node.shut_down()
                    return
                with self._lock:
                    fut = node.in_flight.pop(task_id, None)
                if fut is not None:
                    self._done.put((fut, ok, payload))
        except Exception as e:  # noqa: BLE001 - never a traceback from this thread; the node is lost instead
            if not self._closed:
                self._lose(node, f"reading from it failed: {type(e).__name__}: {e}")

    def _complete(self) -> None:
        # Futures complete here, never on a node's reader: a completion's callbacks (joblib's
        # dispatch of the next batch) may send to any node, and a reader must keep reading.
        while True:
            item = self._done.get()
            if item is None:
                return
            fut, ok, payload = item
            try:
                if fut.done():
                    continue
                if ok is None:  # the node was lost, or the pool closed
                    fut.set_exception(payload)
                elif ok:
                    fut.set_result(payload)
                else:
                    fut.set_exception(raised(payload))
            except BaseException as e:  # noqa: BLE001 - this thread must live: the error goes to the task
                try:
                    fut.set_exception(PoolError(f"the task's outcome could not be read here: {type(e).__name__}: {e}"))
                except InvalidStateError:
                    pass

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
        """Ends the pool; safe to call again (it finishes what an interrupted call left), and a
        Ctrl-C while it waits goes to `skyforge run` (its teardown), then is raised here."""
        if self._finished:
            return
        handler_set = False
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._on_sigint)
            handler_set = True
        try:
            if not self._closed:
                self._closed = True
                self._say_bye()
            self._wait_for_run()
        finally:
            try:
                self._wait_for_run(after_error=True)
            finally:
                if handler_set:
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                self._remove_files()
                self._finished = True
        if self._interrupted:  # Ctrl-C while closing: passed on to `skyforge run`, now said here
            self._interrupted = False
            raise KeyboardInterrupt

    def _say_bye(self) -> None:
        with self._lock:
            ended = []
            for n in self.nodes:
                ended += n.in_flight.values()
                n.in_flight.clear()
        for f in ended:
            self._done.put((f, None, PoolError("the pool was closed before the task ended")))
        self._done.put(None)
        for n in self.nodes:
            if not n.lost:
                try:
                    n.send(("bye",))
                except (OSError, ValueError):
                    pass
            n.shut_down()
        for n in self.nodes:
            if n.reader is not None:
                n.reader.join(2)
            if n.reader is None or not n.reader.is_alive():
                n.conn.close()

    def _on_sigint(self, signum, frame) -> None:
        self._interrupted = True
        self._escalate()

    def _escalate(self) -> None:
        """The next step of stopping `skyforge run`: SIGINT (its graceful teardown), a second
        SIGINT (its forced one), then SIGKILL to its process group."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        self._stage = min(self._stage + 1, 3)
        try:
            if self._stage < 3:
                proc.send_signal(signal.SIGINT)
            else:
                os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass

    def _wait_for_run(self, after_error: bool = False) -> None:
        """Until `skyforge run` has ended: 30 s for its own teardown after bye (an interrupted
        close goes on at once), then 20 s after a SIGINT, 5 s after the second, then SIGKILL."""
        proc = self._proc
        if proc is None:
            return
        if after_error and proc.poll() is None and self._stage == 0:
            self._escalate()
        grace = {0: 30.0, 1: 20.0, 2: 5.0, 3: 5.0}
        stage, deadline = self._stage, time.monotonic() + grace[self._stage]
        while True:
            try:
                proc.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            except KeyboardInterrupt:
                self._interrupted = True  # a Ctrl-C before our handler (or with another one): go on
                self._escalate()
            if self._stage != stage:
                stage, deadline = self._stage, time.monotonic() + grace[self._stage]
            elif time.monotonic() > deadline:
                if self._stage == 3:
                    break  # killed and still not reaped: nothing more to do
                self._escalate()
        if self._relay is not None:
            self._relay.join(2)

    def _remove_files(self) -> None:
        self._shm.close()
        if self._job_file:
            try:
                os.unlink(self._job_file)
            except FileNotFoundError:
                pass
            except OSError:
                return  # left for the next close() to try
            self._job_file = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def interrupt(self) -> None:
        """Ctrl-C in the caller: stop `skyforge run` at once (it tears the pool down itself)."""
        if self._proc is not None and self._stage == 0:
            self._escalate()
        self.close()

    def __enter__(self) -> "Pool":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is KeyboardInterrupt:
            self.interrupt()
        else:
            self.close()

