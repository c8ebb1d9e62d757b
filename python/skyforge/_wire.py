"""The Python pool's plane, byte for byte: what docs/python-plane.md specifies, and nothing else.

Pure encoders and decoders, no I/O: the message stream's length prefix (_tls.TlsConnection
sends and cuts messages with it), the pool key's challenge and proof (_handshake runs them), and
the frames both sides exchange once the key is proven (T task, D done, C control). The driver
(_pool) and the node (_node, _slot) import this one module; python/tests/vectors/plane.json holds
the vectors both sides are tested against (test_plane_vectors.py). A frame that breaks the format
is refused with FrameError, saying what was expected.
"""
from __future__ import annotations

import hmac
import pickle
import struct
from multiprocessing import AuthenticationError
from typing import Optional, Tuple

# ---- the message stream -----------------------------------------------------------------------

RECORD_HEADER = struct.Struct("!Q")  # every message: its length, u64 big-endian, then its bytes


class RecordTooLong(OSError):
    """A message longer than the receiver takes at that point (said from its 8-byte header)."""


def record_header(length: int) -> bytes:
    return RECORD_HEADER.pack(length)


def record_length(buf, limit: Optional[int] = None) -> Optional[int]:
    """The length of the message at the start of `buf` once all of it is there, else None;
    RecordTooLong as soon as the header announces more than `limit` bytes."""
    if len(buf) < RECORD_HEADER.size:
        return None
    (n,) = RECORD_HEADER.unpack_from(buf)
    if limit is not None and n > limit:
        raise RecordTooLong(f"message of {n} bytes is longer than {limit}")
    return n if len(buf) >= RECORD_HEADER.size + n else None


# ---- the pool key's challenge-response -----------------------------------------------------------
# The bytes of CPython 3.12+'s multiprocessing.connection with its default digest, owned here so
# that they do not depend on the interpreter (3.11's are HMAC-MD5 of 20 bytes).

CHALLENGE = b"#CHALLENGE#"
DIGEST_TAG = b"{sha256}"
NONCE_BYTES = 40
WELCOME = b"#WELCOME#"
FAILURE = b"#FAILURE#"
HANDSHAKE_LIMIT = 256  # the longest handshake message a side reads
_MAC_BYTES = 32


def challenge(nonce: bytes) -> bytes:
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a challenge's nonce is {NONCE_BYTES} bytes, not {len(nonce)}")
    return CHALLENGE + DIGEST_TAG + nonce


def proof(key: bytes, challenge_message: bytes) -> bytes:
    """The answer to a challenge: the tag, then HMAC-SHA256(key, tag | nonce). AuthenticationError
    when `challenge_message` is not a challenge of this plane."""
    body = challenge_message[len(CHALLENGE):]
    if not challenge_message.startswith(CHALLENGE) or not body.startswith(DIGEST_TAG) \
            or len(body) != len(DIGEST_TAG) + NONCE_BYTES:
        raise AuthenticationError(f"the peer's challenge is not {CHALLENGE.decode()}{DIGEST_TAG.decode()} and "
                                  f"{NONCE_BYTES} bytes: {bytes(challenge_message[:40])!r}")
    return DIGEST_TAG + hmac.new(key, body, "sha256").digest()


def check_proof(key: bytes, challenge_message: bytes, answer: bytes) -> None:
    """AuthenticationError unless `answer` proves `key` for `challenge_message` (compared in
    constant time)."""
    if not answer.startswith(DIGEST_TAG) or len(answer) != len(DIGEST_TAG) + _MAC_BYTES:
        raise AuthenticationError(f"its proof of the key is not {DIGEST_TAG.decode()} and {_MAC_BYTES} bytes "
                                  f"(an older skyforge on the node?)")
    if not hmac.compare_digest(proof(key, challenge_message), answer):
        raise AuthenticationError("wrong key")


# ---- frames -------------------------------------------------------------------------------------

PICKLE_PROTOCOL = 5  # control messages; the payloads inside T and D frames are the sender's pickles
_TASK = struct.Struct("<cQ")    # b"T" task_id
_DONE = struct.Struct("<cQIB")  # b"D" task_id slot ok


class FrameError(ValueError):
    """A frame that breaks docs/python-plane.md; its receiver refuses it."""


def _ids(v) -> bool:
    return isinstance(v, (list, tuple)) and all(_int(x) for x in v)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# name -> what its fields must be, in order
_CONTROL = {
    "hello": (("node", _int), ("slots", _int), ("pid", _int)),
    "put": (("key", _int), ("blob", lambda v: isinstance(v, bytes))),
    "drop": (("keys", _ids),),
    "cancel": (("task ids", _ids),),
    "bye": (),
}
FROM_NODE = ("hello",)                          # the node's first message, and its only control one
FROM_DRIVER = ("put", "drop", "cancel", "bye")  # what the driver (and a node agent, to its slots) sends


def task_frame(task_id: int, payload: bytes) -> bytes:
    return _TASK.pack(b"T", task_id) + payload


def done_frame(task_id: int, slot: int, ok: bool, payload: bytes) -> bytes:
    return _DONE.pack(b"D", task_id, slot, 1 if ok else 0) + payload


def control_frame(msg: tuple) -> bytes:
    return b"C" + pickle.dumps(msg, protocol=PICKLE_PROTOCOL)


def kind_of(frame) -> bytes:
    return bytes(frame[:1])


def _expect(frame, kind: bytes, size: int, what: str) -> None:
    if kind_of(frame) != kind:
        raise FrameError(f"expected {what} (a frame starting {kind!r}), got one starting {kind_of(frame)!r}")
    if len(frame) < size:
        raise FrameError(f"{what} has a {size}-byte header; this frame is {len(frame)} bytes")


def parse_task(frame) -> Tuple[int, memoryview]:
    _expect(frame, b"T", _TASK.size, "a task frame")
    _, task_id = _TASK.unpack_from(frame)
    return task_id, memoryview(frame)[_TASK.size:]


def parse_done(frame) -> Tuple[int, int, bool, memoryview]:
    _expect(frame, b"D", _DONE.size, "a done frame")
    _, task_id, slot, ok = _DONE.unpack_from(frame)
    if ok > 1:
        raise FrameError(f"a done frame's ok byte is 0 or 1, not {ok}")
    return task_id, slot, bool(ok), memoryview(frame)[_DONE.size:]


def parse_control(frame, allowed: Tuple[str, ...]) -> tuple:
    """The control message in `frame`, one of the names in `allowed` with the fields it must have."""
    _expect(frame, b"C", 1, "a control frame")
    try:
        msg = pickle.loads(memoryview(frame)[1:])
    except Exception as e:  # noqa: BLE001 - whatever a malformed pickle raises
        raise FrameError(f"a control frame's body does not unpickle: {type(e).__name__}: {e}") from None
    name = msg[0] if isinstance(msg, tuple) and msg else None
    if not isinstance(name, str) or name not in allowed:
        raise FrameError(f"expected a control message {' / '.join(allowed)}, got {str(msg)[:80]!r}")
    fields = _CONTROL[name]
    if len(msg) != 1 + len(fields) or not all(ok(v) for (_, ok), v in zip(fields, msg[1:])):
        shape = ", ".join([repr(name)] + [f for f, _ in fields])
        raise FrameError(f"expected ({shape}), got {str(msg)[:80]!r}")
    return msg
