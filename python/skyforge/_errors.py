"""A task's exception on its way from a node to the caller, and the pool's own error types.

Node side, pack(): the exception as an ErrorReport (_payloads.py). Caller side, raised(): the
exception to raise from one. The task's exception keeps its type: it is rebuilt as pickle
rebuilds it where that works, else without calling its __init__ (its class's __new__, then its
args and __dict__, as tblib and billiard do), so an exception whose __init__ takes other
arguments than its args (or keyword-only ones) arrives as itself. Its __cause__/__context__
chain travels the same way, and the node's traceback hangs at the chain's end as a
RemoteTraceback. What does not travel (an attribute that does not pickle, or whose class the
caller lacks) is left out and named in a note; an exception whose class the caller cannot load
comes back as RuntimeError("Type: message").
"""
from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ._payloads import ErrorReport, dumps

# The longest __cause__/__context__ chain that travels (a loop that re-raises could make one of
# thousands; the remote traceback still shows it all).
CHAIN_MAX = 16


class PoolError(RuntimeError):
    """The pool could not start, lost a node, or could not read what a task sent back."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a node (at the end of the re-raised one's chain)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


class WorkerLostError(RuntimeError):
    """A task's worker process died (a segfault, os._exit): raised for that task."""


@dataclass
class PackedException:
    """One exception of a task's chain, packed on the node so that the caller rebuilds it part by
    part: what of it does not load there is left out, not the whole."""
    type_name: str
    message: str
    pickled: Optional[bytes]  # pickle's own form, where that rebuilt an exception on the node
    cls: Optional[bytes]      # its class (cloudpickle: by reference, or by value where it is not importable)
    args: Tuple[bytes, ...]   # each of its args pickled (its repr, where it does not pickle)
    state: Dict[str, bytes]   # its __dict__ (attributes, __notes__), each value that pickles
    left_out: List[str]       # what did not travel
    cause: bool = False       # whether `next` is its __cause__, else its shown __context__
    next: Optional["PackedException"] = None


# ---- node side ---------------------------------------------------------------------------------

def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {_text(e)}"


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException as e:  # noqa: BLE001 - its __str__ raised: the task's error must still travel
        return f"<its __str__ raised {type(e).__name__}>"


def _pickled(value, what: str, left_out: List[str]) -> Optional[bytes]:
    try:
        return dumps(value)
    except BaseException as e:  # noqa: BLE001 - anything may raise while pickling
        left_out.append(f"{what} ({_why(e)})")
        return None


def _pickle_form(exc: BaseException) -> Optional[bytes]:
    """pickle's own form of the exception, where it makes an exception again (not where its
    __init__ refuses its args, or a __reduce__ makes something else of it)."""
    try:
        blob = dumps(exc)
        return blob if isinstance(pickle.loads(blob), BaseException) else None
    except BaseException:  # noqa: BLE001 - it does not travel that way
        return None


def _pack_one(exc: BaseException) -> PackedException:
    left_out: List[str] = []
    try:
        args = tuple(exc.args)
    except BaseException as e:  # noqa: BLE001 - an args that raises
        args, left_out = (), [f"args ({_why(e)})"]
    packed_args = []
    for i, arg in enumerate(args):
        blob = _pickled(arg, f"args[{i}], sent as its repr", left_out)
        packed_args.append(blob if blob is not None else dumps(_repr(arg)))
    state: Dict[str, bytes] = {}
    try:
        attributes = dict(vars(exc))
    except BaseException as e:  # noqa: BLE001
        attributes, left_out = {}, left_out + [f"its attributes ({_why(e)})"]
    for name, value in attributes.items():
        blob = _pickled(value, f".{name}", left_out)
        if blob is not None:
            state[str(name)] = blob
    return PackedException(str(getattr(type(exc), "__qualname__", "Exception")), _text(exc), _pickle_form(exc),
                           _pickled(type(exc), "its class", left_out), tuple(packed_args), state, left_out)


def _repr(value) -> str:
    try:
        return repr(value)
    except BaseException as e:  # noqa: BLE001
        return f"<its __repr__ raised {type(e).__name__}>"


def _pack(exc: BaseException) -> PackedException:
    """The exception and the chain a traceback shows of it (__cause__, else __context__ unless
    suppressed), up to CHAIN_MAX long."""
    top = packed = _pack_one(exc)
    seen = {id(exc)}
    while len(seen) < CHAIN_MAX:
        cause = exc.__cause__
        nxt = cause if cause is not None else (None if exc.__suppress_context__ else exc.__context__)
        if nxt is None or id(nxt) in seen:
            break
        packed.cause, packed.next = cause is not None, _pack_one(nxt)
        exc, packed = nxt, packed.next
        seen.add(id(exc))
    return top


def pack(exc: BaseException, node: int, slot: int) -> bytes:
    """A task's exception as a pickled ErrorReport. Nothing the exception does (a __reduce__ that
    raises or makes a non-exception, a __str__ that raises) stops it from being reported: what
    does not travel is left out, and the type name, message and traceback remain."""
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:  # noqa: BLE001
        text = ""
    name = getattr(type(exc), "__qualname__", "Exception")
    try:
        return dumps(ErrorReport(_pack(exc), name, _text(exc), text, node, slot))
    except BaseException:  # noqa: BLE001 - the last resort: nothing of the exception's own
        return dumps(ErrorReport(None, str(name), "", text, node, slot))


# ---- caller side -------------------------------------------------------------------------------

def _note(exc: BaseException, text: str) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        try:
            exc.add_note(text)
        except Exception:  # noqa: BLE001 - an exception with odd __notes__
            pass


def _loaded(blob: bytes, what: str, left_out: List[str]):
    try:
        return pickle.loads(blob), True
    except Exception as e:  # noqa: BLE001 - e.g. a class the caller lacks
        left_out.append(f"{what} ({_why(e)})")
        return None, False


def _rebuilt(p: PackedException) -> BaseException:
    """The exception `p` stands for: pickle's form where it loads here as an exception, else its
    class made without __init__ with its args and attributes, else RuntimeError("Type: message")."""
    if p.pickled is not None:
        try:
            exc = pickle.loads(p.pickled)
            if isinstance(exc, BaseException):
                return exc
        except Exception:  # noqa: BLE001 - rebuilt part by part below
            pass
    left_out = list(p.left_out)
    cls, ok = _loaded(p.cls, "its class", left_out) if p.cls is not None else (None, False)
    if ok and isinstance(cls, type) and issubclass(cls, BaseException):
        args = []
        for i, blob in enumerate(p.args):
            arg, ok = _loaded(blob, f"args[{i}]", left_out)
            args.append(arg if ok else None)
        try:
            try:
                exc = cls.__new__(cls, *args)
            except TypeError:  # a __new__ of its own that takes other arguments
                exc = cls.__new__(cls)
            exc.args = tuple(args)
        except Exception as e:  # noqa: BLE001 - a class that cannot be made without its __init__
            left_out.append(f"the exception itself ({_why(e)})")
        else:
            for name, blob in p.state.items():
                value, ok = _loaded(blob, f".{name}", left_out)
                if ok:
                    try:
                        setattr(exc, name, value)
                    except Exception as e:  # noqa: BLE001 - a read-only attribute
                        left_out.append(f".{name} ({_why(e)})")
            if left_out:
                _note(exc, "not kept from the node: " + "; ".join(left_out))
            return exc
    exc = RuntimeError(f"{p.type_name}: {p.message}")
    _note(exc, f"its {p.type_name} could not be rebuilt here: " + "; ".join(left_out))
    return exc


def raised(payload: bytes) -> BaseException:
    """The exception a task's pickled ErrorReport stands for, to raise in the caller."""
    try:
        report = pickle.loads(payload)
        if not isinstance(report, ErrorReport):
            raise TypeError(f"a {type(report).__name__}, not an ErrorReport")
    except Exception as e:  # noqa: BLE001 - a report that does not unpickle is still an error
        return PoolError(f"a task failed, and what its node said about it could not be read here: {_why(e)}")
    where = f"(raised on skyforge node {report.node} slot {report.slot})"
    p = report.exception
    if isinstance(p, PackedException):
        top = last = _rebuilt(p)
        while p.next is not None:
            nxt = _rebuilt(p.next)
            if p.cause:
                last.__cause__ = nxt
            else:
                last.__context__ = nxt
            last, p = nxt, p.next
    elif report.type_name == "WorkerLostError":
        top = last = WorkerLostError(report.message)
    else:
        top = last = RuntimeError(f"{report.type_name}: {report.message}")
    if report.traceback:
        last.__cause__ = RemoteTraceback("\n" + report.traceback.rstrip() + "\n" + where)
    _note(top, where)
    return top
