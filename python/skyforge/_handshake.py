"""Setting up a Python pool's connection, both ends (docs/python-plane.md, "Handshake").

TLS 1.3 to the pool's pinned certificate (_tls.py), then, inside it, the pool key proven both
ways before any message is unpickled: the pool challenges first and the node answers, then the
node challenges and the pool answers (_wire.py has the bytes). accept_connection() is the
pool's end, connect() the node's; pool_side() and node_side() are their key exchanges alone.
"""
from __future__ import annotations

import os
import socket
import ssl
import time
from multiprocessing import AuthenticationError
from typing import Tuple

from . import _wire
from ._tls import TlsConnection, client_context


def _nonce() -> bytes:
    return os.urandom(_wire.NONCE_BYTES)


def _challenge(conn, key: bytes) -> None:
    """Asks the peer to prove `key`; tells it the verdict, and raises AuthenticationError on a
    wrong proof."""
    message = _wire.challenge(_nonce())
    conn.send_bytes(message)
    answer = conn.recv_bytes(_wire.HANDSHAKE_LIMIT)
    try:
        _wire.check_proof(key, message, answer)
    except AuthenticationError:
        conn.send_bytes(_wire.FAILURE)
        raise
    conn.send_bytes(_wire.WELCOME)


def _answer(conn, key: bytes) -> None:
    """Proves `key` to the peer; AuthenticationError when its challenge is malformed or it
    refuses the proof."""
    conn.send_bytes(_wire.proof(key, conn.recv_bytes(_wire.HANDSHAKE_LIMIT)))
    if conn.recv_bytes(_wire.HANDSHAKE_LIMIT) != _wire.WELCOME:
        raise AuthenticationError("the peer refused this side's proof of the key: wrong key")


def pool_side(conn, key: bytes) -> None:
    _challenge(conn, key)
    _answer(conn, key)


def node_side(conn, key: bytes) -> None:
    _answer(conn, key)
    _challenge(conn, key)


def accept_connection(sock: socket.socket, key: bytes, tls: ssl.SSLContext, timeout: float) -> TlsConnection:
    """A socket the pool's listener accepted: TLS 1.3 with the pool's certificate, then the key
    both ways. Blocks; the caller bounds it by shutting `sock` down (it keeps `sock`, the
    connection holds a duplicate of its descriptor). Raises ssl.SSLError, AuthenticationError,
    EOFError, TimeoutError or OSError."""
    conn = TlsConnection(socket.socket(fileno=os.dup(sock.fileno())), tls, server_side=True, timeout=timeout)
    try:
        pool_side(conn, key)
    except BaseException:
        conn.close()
        raise
    return conn


def connect(address: Tuple[str, int], key: bytes, cert_pem: str, timeout: float) -> TlsConnection:
    """A node agent's connection to the pool: TLS 1.3 to a peer holding the pool's certificate
    and no other, then the key both ways: the TCP connect and the TLS handshake within `timeout`
    seconds, and each message of the key's within what is left of them."""
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
        node_side(conn, key)
        conn.settimeout(None)  # no limit from now on
    except BaseException:
        conn.close()
        raise
    return conn
