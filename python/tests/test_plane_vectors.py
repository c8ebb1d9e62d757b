"""The Python pool's plane against its vectors (vectors/plane.json, docs/python-plane.md): the
driver's side (skyforge._pool: the key's exchange at its gate, what Pool sends, what its reader
takes) and the node's (skyforge._node's key exchange and reading of the caller, skyforge._slot's
answers) each encode the vectors' bytes exactly and refuse the malformed ones. No pool, no
network: the connections are scripted."""
import json
import os
import pickle
import queue
import sys
from multiprocessing import AuthenticationError

import pytest

from skyforge import _handshake, _node, _slot, _wire

with open(os.path.join(os.path.dirname(__file__), "vectors", "plane.json"), encoding="utf-8") as f:
    V = json.load(f)
HS = V["handshake"]
SECRET = bytes.fromhex(HS["secret_hex"])
FRAMES = {f["name"]: f for f in V["frames"]}


def hexes(items):
    return [bytes.fromhex(i["hex"]) for i in items]


def refused(to):
    return [pytest.param(bytes.fromhex(r["hex"]), id=r["why"]) for r in V["refused_frames"] if r["to"] == to]


def message(frame_vector) -> tuple:
    """A control frame's message as the vectors write it: {"hex": ...} for bytes."""
    return tuple(bytes.fromhex(x["hex"]) if isinstance(x, dict) else x for x in frame_vector["message"])


class Scripted:
    """A connection that answers recv_bytes() with `incoming`, in order (EOFError after), and
    keeps what is sent."""

    def __init__(self, incoming=()):
        self.incoming, self.sent = list(incoming), []

    def recv_bytes(self, maxlength=None):
        if not self.incoming:
            raise EOFError("the script is over")
        return self.incoming.pop(0)

    def send_bytes(self, buf):
        self.sent.append(bytes(buf))

    def fileno(self):
        raise OSError("a scripted connection has no descriptor")


# ---- the message stream -------------------------------------------------------------------------

@pytest.mark.parametrize("v", V["records"]["accepted"], ids=lambda v: f"{len(v['message_hex']) // 2} bytes")
def test_records_frame_each_message_with_its_length(v):
    msg, record = bytes.fromhex(v["message_hex"]), bytes.fromhex(v["record_hex"])
    assert _wire.record_header(len(msg)) + msg == record
    assert _wire.record_length(record) == len(msg)
    assert _wire.record_length(record[:-1]) is None  # not all of it is there yet


@pytest.mark.parametrize("v", V["records"]["refused"], ids=lambda v: v["why"])
def test_a_record_longer_than_the_limit_is_refused_from_its_header(v):
    with pytest.raises(_wire.RecordTooLong, match="longer than"):
        _wire.record_length(bytes.fromhex(v["hex"]), v["limit"])


# ---- the key's challenge-response -------------------------------------------------------------------

def transcript(sender):
    return [bytes.fromhex(m["hex"]) for m in HS["transcript"] if m["from"] == sender]


def with_nonce(monkeypatch, which):
    monkeypatch.setattr(_handshake, "_nonce", lambda: bytes.fromhex(HS[f"{which}_nonce_hex"]))


def test_the_pool_side_of_the_handshake_says_the_vectors_bytes(monkeypatch):
    with_nonce(monkeypatch, "pool")
    conn = Scripted(transcript("node"))
    _handshake.pool_side(conn, SECRET)
    assert conn.sent == transcript("pool") and not conn.incoming


def test_the_node_side_of_the_handshake_says_the_vectors_bytes(monkeypatch):
    with_nonce(monkeypatch, "node")
    conn = Scripted(transcript("pool"))
    _handshake.node_side(conn, SECRET)
    assert conn.sent == transcript("node") and not conn.incoming


@pytest.mark.parametrize("proof", hexes(HS["proofs_refused"]), ids=[p["why"] for p in HS["proofs_refused"]])
@pytest.mark.parametrize("side", ["pool", "node"])
def test_a_wrong_proof_is_refused_and_told(monkeypatch, side, proof):
    with_nonce(monkeypatch, side)
    conn = Scripted(([] if side == "pool" else transcript("pool")[:2]) + [proof])
    with pytest.raises(AuthenticationError):
        getattr(_handshake, f"{side}_side")(conn, SECRET)
    its_challenge = transcript(side)[0 if side == "pool" else 1]
    assert conn.sent[-2:] == [its_challenge, bytes.fromhex(HS["failure_hex"])]


@pytest.mark.parametrize("challenge", hexes(HS["challenges_refused"]), ids=[c["why"] for c in HS["challenges_refused"]])
@pytest.mark.parametrize("side", ["pool", "node"])
def test_a_malformed_challenge_gets_no_proof(monkeypatch, side, challenge):
    with_nonce(monkeypatch, side)
    # The pool answers once the node has proven the key; the node answers first.
    conn = Scripted((transcript("node")[:1] if side == "pool" else []) + [challenge])
    with pytest.raises(AuthenticationError, match="challenge is not"):
        getattr(_handshake, f"{side}_side")(conn, SECRET)
    assert conn.sent == (transcript("pool")[:2] if side == "pool" else [])


def test_a_refused_proof_ends_the_handshake_on_the_side_that_gave_it():
    conn = Scripted([transcript("pool")[0], bytes.fromhex(HS["failure_hex"])])
    with pytest.raises(AuthenticationError, match="wrong key"):
        _handshake.node_side(conn, SECRET)
    assert conn.sent == transcript("node")[:1]


# ---- frames: the driver's side -------------------------------------------------------------------

@pytest.fixture
def pool():
    """A Pool with one node on a scripted connection (no `skyforge run`)."""
    from skyforge import _pool
    p = _pool.Pool(nodes=1, skyforge=sys.executable)
    p.nodes = [_pool.Node(0, 1, Scripted())]
    return p


def test_what_the_driver_sends_is_the_vectors_bytes(pool):
    node = pool.nodes[0]
    task, put = FRAMES["task"], message(FRAMES["put"])
    pool._next_id = task["task_id"]
    fut = pool.submit(bytes.fromhex(task["payload_hex"]))
    pool.share(put[1], pickle.loads(put[2]))  # a value, its pickle the blob
    pool.cancel([fut])
    pool.unshare([put[1]])
    node.send(("bye",))
    assert node.conn.sent == hexes([task, FRAMES["put"], FRAMES["cancel"], FRAMES["drop"], FRAMES["bye"]])


@pytest.mark.parametrize("name", ["done, ok", "done, failed"])
def test_the_drivers_reader_takes_a_done_frame(pool, name):
    v = FRAMES[name]
    node = pool.nodes[0]
    node.in_flight[v["task_id"]] = fut = object()
    node.conn.incoming.append(bytes.fromhex(v["hex"]))
    pool._closed = True  # the script's end is the pool closing, not a lost node
    pool._reader(node)
    got, ok, payload = pool._done.get_nowait()
    assert (got, ok, bytes(payload)) == (fut, v["ok"], bytes.fromhex(v["payload_hex"]))
    assert _wire.done_frame(v["task_id"], v["slot"], v["ok"], bytes.fromhex(v["payload_hex"])) == bytes.fromhex(v["hex"])


@pytest.mark.parametrize("frame", refused("driver"))
def test_the_drivers_reader_refuses_a_malformed_frame_and_loses_the_node(pool, frame):
    node = pool.nodes[0]
    node.conn.incoming.append(frame)
    pool._reader(node)
    assert node.lost and "refuses" in node.lost, node.lost


def test_the_gate_takes_the_vectors_hello():
    v = FRAMES["hello"]
    assert _wire.parse_control(bytes.fromhex(v["hex"]), _wire.FROM_NODE) == message(v)
    assert _wire.control_frame(message(v)) == bytes.fromhex(v["hex"])  # what the node sends


@pytest.mark.parametrize("frame", refused("hello"))
def test_the_gate_refuses_a_first_message_that_is_not_a_hello(frame):
    with pytest.raises(_wire.FrameError):
        _wire.parse_control(frame, _wire.FROM_NODE)


# ---- frames: the node's side -----------------------------------------------------------------------

def test_the_node_agent_reads_the_vectors_frames(monkeypatch):
    monkeypatch.setattr(_node, "cancelled", set())

    class Worker:
        control = queue.SimpleQueue()

    names = ["task", "task, the largest id", "put", "drop", "cancel", "bye"]
    tasks = queue.SimpleQueue()
    assert _node.listen(Scripted(hexes([FRAMES[n] for n in names])), 0, [Worker], tasks) == 0
    assert [tasks.get_nowait() for _ in range(2)] == [(FRAMES[n]["task_id"], bytes.fromhex(FRAMES[n]["hex"]))
                                                     for n in names[:2]]
    assert [Worker.control.get_nowait() for _ in range(2)] == [message(FRAMES["put"]), message(FRAMES["drop"])]
    assert _node.cancelled == {7}


@pytest.mark.parametrize("frame", refused("node"))
def test_the_node_agent_refuses_a_malformed_frame_and_leaves(frame, capsys):
    assert _node.listen(Scripted([frame]), 3, [], queue.SimpleQueue()) == 1
    assert "skyforge pool node 3: the caller sent a frame this node refuses" in capsys.readouterr().err


def test_a_slot_answers_the_vectors_task_with_the_vectors_done_frame(monkeypatch):
    monkeypatch.setattr(_slot, "_sequential_nested", lambda: None)  # joblib's config stays this test process's
    monkeypatch.setenv("SKYFORGE_SLOT", "")
    done = FRAMES["done, ok"]
    conn = Scripted(hexes([FRAMES["put"], FRAMES["task"], FRAMES["drop"], FRAMES["bye"]]))
    _slot.serve(conn, node=0, slot=done["slot"])
    assert conn.sent == [bytes.fromhex(done["hex"])]
    assert pickle.loads(bytes.fromhex(FRAMES["task"]["payload_hex"])) is int  # the task is int(): 0


@pytest.mark.parametrize("frame", refused("node"))
def test_a_slot_refuses_a_malformed_frame(monkeypatch, frame):
    monkeypatch.setattr(_slot, "_sequential_nested", lambda: None)
    monkeypatch.setenv("SKYFORGE_SLOT", "")
    with pytest.raises(_wire.FrameError):
        _slot.serve(Scripted([frame]), node=0, slot=0)
