"""TLS 1.3 for the Python pool's connections (docs/python-plane.md).

The pool's caller makes a throwaway key and self-signed certificate per pool (`skyforge
tls-identity`, OpenSSL through the skyforge binary: Python's ssl module cannot make one), serves
TLS 1.3 with it, and hands the certificate to the nodes in their environment, which reaches them
through skyforge's sealed control plane. A node accepts that certificate and no other (the pin
is the trust: no CA, no host name). The pool's key is then proven both ways inside the channel
(_handshake.py), so each side knows the other holds it, and nothing — tasks, results, the key's
challenge — crosses the network in cleartext.

TlsConnection is a message connection over one TLS socket with the methods of
multiprocessing.connection.Connection that the pool uses (send_bytes, recv_bytes, poll, fileno,
close), each message behind _wire's length prefix. It drives an ssl.SSLObject through memory
BIOs under one lock and does the socket I/O itself, outside that lock, so that one thread may
block receiving while others send: an SSLSocket shared that way would use one OpenSSL object
from two threads at once, which OpenSSL does not allow.
"""
from __future__ import annotations

import math
import select
import socket
import ssl
import threading
import time
from typing import Optional

from ._wire import RECORD_HEADER, record_header, record_length

_CHUNK = 256 * 1024


def _readable(sock: socket.socket, timeout: Optional[float]) -> bool:
    """Whether `sock` has something to read within `timeout` seconds (None: wait). poll(2), not
    select(2): a process with many files open has descriptors past select's 1024."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))))


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def client_context(cert_pem: str) -> ssl.SSLContext:
    """Trusts exactly the pool's certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # the pinned certificate names no host: it is the identity
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=cert_pem)
    return ctx


class TlsConnection:
    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, server_side: bool, timeout: float):
        """Runs the TLS handshake on `sock` (blocking, within `timeout` seconds). Takes `sock`
        over; raises ssl.SSLError (a certificate that is not the pinned one among them), OSError,
        EOFError or TimeoutError, after closing it."""
        self._sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._ssl = ctx.wrap_bio(self._in, self._out, server_side=server_side)
        self._lock = threading.Lock()  # the SSLObject and its BIOs
        self._send_lock = threading.Lock()  # the socket's outgoing byte order
        self._plain = bytearray()  # decrypted, not yet returned
        self._closed = False
        try:
            sock.setblocking(True)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with self._lock:
                        self._ssl.do_handshake()
                    self._flush()
                    break
                except ssl.SSLWantReadError:
                    self._flush()
                    left = deadline - time.monotonic()
                    if left <= 0 or not _readable(sock, left):
                        raise TimeoutError(f"TLS handshake not done within {timeout:g} s")
                    if not self._pump():
                        raise EOFError("the peer closed the connection during the TLS handshake")
        except BaseException:
            self._closed = True
            sock.close()
            raise

    # -- raw bytes ---------------------------------------------------------------------------

    def _flush(self) -> None:
        """Sends what the SSLObject has written, in order."""
        with self._send_lock:
            with self._lock:
                data = self._out.read()
            if data:
                self._sock.sendall(data)

    def _pump(self) -> bool:
        """One receive from the socket, fed to the SSLObject; its plaintext joins _plain.
        False at end of stream."""
        data = self._sock.recv(_CHUNK)
        if not data:
            return False
        with self._lock:
            self._in.write(data)
            while True:
                try:
                    chunk = self._ssl.read(_CHUNK)
                except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                    break
                if not chunk:
                    break
                self._plain += chunk
        # A post-handshake message may have queued an answer. Sent now unless a sender holds
        # the socket (it may be blocked on a full send buffer waiting for the peer, whose own
        # reader may be waiting for it: never wait for it here); a sender takes the queued bytes
        # with its own, in order.
        if self._send_lock.acquire(blocking=False):
            try:
                with self._lock:
                    data = self._out.read()
                if data:
                    self._sock.sendall(data)
            finally:
                self._send_lock.release()
        return True

    def _message_ready(self, maxlength: Optional[int]) -> Optional[int]:
        return record_length(self._plain, maxlength)

    # -- multiprocessing.connection.Connection's methods --------------------------------------

    def send_bytes(self, buf, offset: int = 0, size: Optional[int] = None) -> None:
        if self._closed:
            raise OSError("handle is closed")
        view = memoryview(buf).cast("B")[offset:]
        if size is not None:
            view = view[:size]
        with self._send_lock:
            with self._lock:
                self._ssl.write(record_header(len(view)))
                for i in range(0, len(view), _CHUNK):
                    self._ssl.write(view[i:i + _CHUNK])
                data = self._out.read()
            self._sock.sendall(data)

    def recv_bytes(self, maxlength: Optional[int] = None) -> bytes:
        """The next message; EOFError when the peer has closed. One thread at a time."""
        while True:
            n = self._message_ready(maxlength)
            if n is not None:
                msg = bytes(self._plain[RECORD_HEADER.size:RECORD_HEADER.size + n])
                del self._plain[:RECORD_HEADER.size + n]
                return msg
            if self._closed:
                raise OSError("handle is closed")
            if not self._pump():
                raise EOFError("the peer closed the connection")

    def poll(self, timeout: Optional[float] = 0.0) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._message_ready(None) is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not _readable(self._sock, left):
                return False
            if not self._pump():
                return True  # recv_bytes will raise EOFError
        return True

    def settimeout(self, timeout: Optional[float]) -> None:
        """Bounds each later receive and send (TimeoutError); None: no bound."""
        self._sock.settimeout(timeout)

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self) -> None:
        """Wakes a thread blocked in recv_bytes (it gets EOFError) without closing."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with self._send_lock:
                with self._lock:
                    try:
                        self._ssl.unwrap()  # queues close_notify; the peer's is not awaited
                    except ssl.SSLError:
                        pass
                    data = self._out.read()
                if data:
                    self._sock.sendall(data)
        except (OSError, ValueError):
            pass
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
