#!/usr/bin/python3
"""skyforge [train] vs PyTorch on Fashion-MNIST, measured in the same run.

Run with Debian's interpreter (the one PyTorch imports under):

    /usr/bin/python3 bench/train_vs_pytorch.py [--models mlp,convnet,resnet,vit] [--epochs-mlp 5]
        [--epochs-convnet 1] [--epochs-resnet 1] [--epochs-vit 1] [--steps N] [--rounds 1]
        [--skyforge build/bin/skyforge] [--json FILE] [--backend cpu|cuda] [--seeds 1,2,3,7,42] [--same-masks]
    /usr/bin/python3 bench/train_vs_pytorch.py --check [--models ...] [--steps 1]

(--backend cuda [--configs KEYS] [--batches 64,1024] [--dry-run]: the GPU table, bench/train_vs_pytorch_cuda.py.)

or `cmake --build build --target bench_train`.

For each model (mlp = examples/fashion-mnist.toml, convnet = examples/fashion-mnist-convnet.toml,
resnet = examples/fashion-mnist-resnet.toml, vit = examples/fashion-mnist-vit.toml) it runs the
configurations below on the same data, global batch 64, sparse categorical cross-entropy from
logits, inputs scaled to [0, 1], the same number of epochs (--steps: at most N steps per epoch).
The PyTorch model is the example's twin (bench/torch_twins.py: built from its model graph with
Keras' semantics), starting from skyforge's exact initial weights for the seed, trained on
skyforge's exact data order (each epoch's permutation, each rank's share of a global batch) with
the example's optimizer (Adam or AdamW with Keras' epsilon placement) and learning-rate schedule.
The dropout masks are PyTorch's own, or with --same-masks skyforge's (its Philox draws, computed
in numpy inside PyTorch's timed loop: for accuracy comparisons, where the twins then train the same
function). --check runs 1 node and 1 process for 1 epoch of --steps (default
1) steps and prints both training and test losses: after 1 step they agree to ~1e-7.

  skyforge 1 node   `skyforge run` of a temporary manifest derived from the example: nodes = 1,
                    threads = 1, epochs; history/tensorboard/checkpoint removed (no file I/O).
  skyforge 2 nodes  the same with nodes = 2 (data-parallel, 32 of every 64 per node).
  PyTorch 1 proc    a plain loop over a per-epoch index permutation (no DataLoader, no worker
                    processes), torch.set_num_threads(1), set_num_interop_threads(1).
  PyTorch DDP 2     2 processes, gloo on 127.0.0.1, 1 thread each, each global batch of 64 split
                    32 / 32 by rank (what DistributedSampler + batch 32 amounts to).

Figures per configuration:
  samples/s    global (whole pool): samples trained (60000 x epochs) / training-loop wall time. skyforge: fit()'s
               train_seconds from the result line of each node (the slowest node); PyTorch: the
               timed loop of each rank (the slowest rank). Data loading, model construction,
               process start and evaluation are outside the timed region on both sides.
  test acc     on the 10000 test images after training.
  peak RSS     the largest resident set of any process of the configuration: every
               configuration runs under a fresh wrapper process (this script, --_cell) whose
               getrusage(RUSAGE_CHILDREN).ru_maxrss covers all its waited-for descendants
               (skyforge: the host and its worker processes; PyTorch: the rank processes).
               A cross-check polls VmHWM in /proc/<pid>/status of every descendant every 0.1 s
               (written to --json as rss_polled_mib).

--rounds N runs the whole set N times, interleaved (every configuration once per round), and
reports each figure as the median (min-max) over the rounds; every ratio is taken within a round,
between runs made minutes apart, then summarised the same way. On a shared VM whose speed drifts
by tens of percent over minutes, 3 rounds say more than one.

--seeds S1,S2,... gives round i the seed Si on both sides (skyforge's keras plugin `seed`: the
initial weights and data order of both; default 42 in every round) and implies --rounds len(seeds): the
test accuracy column is then the median over seeds and the note lists each seed's with their mean.
One seed's test accuracy after 1 epoch says little: with BatchNorm's momentum 0.99 it moves by
several points from seed to seed on both sides (docs/performance.md, "BatchNorm after one epoch").

Nothing is hard-coded: every figure comes from the runs made by this invocation.
Stdlib + numpy + torch only.
"""
import argparse
import gzip
import json
import math
import os
import platform
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

import torch_twins

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
EXAMPLES = {"mlp": REPO / "examples" / "fashion-mnist.toml",
            "convnet": REPO / "examples" / "fashion-mnist-convnet.toml",
            "resnet": REPO / "examples" / "fashion-mnist-resnet.toml",
            "vit": REPO / "examples" / "fashion-mnist-vit.toml"}
INPUT_SHAPE = (28, 28, 1)  # Keras' shape of one sample
GLOBAL_BATCH = 64
SEED = 42
TRAIN_SAMPLES = 60000

CONFIGS = [  # (key, label, kind, processes)
    ("sky1", "skyforge 1 node x 1 thread", "skyforge", 1),
    ("sky2", "skyforge 2 nodes x 1 thread", "skyforge", 2),
    ("torch1", "PyTorch 1 proc x 1 thread", "torch", 1),
    ("torch2", "PyTorch DDP 2 procs x 1 thread", "torch", 2),
    # The machine's own ceiling: 2 nodes at once with no communication (keras data_parallel =
    # false: each trains its own replica on every sample). Two processes that never talk and
    # still fall short of 2x show how much of a 2-node shortfall the cores themselves cause
    # (shared SMT siblings, memory bandwidth, other tenants of a VM).
    ("sky2ind", "skyforge 2 nodes, no allreduce", "skyforge", 2),
]
RATIOS = [  # (name, title, width, numerator, denominator, factor of the denominator, unit): samples/s
    ("skyforge_over_pytorch_1", "skyforge/PyTorch 1 proc", 24, "sky1", "torch1", 1, "x"),
    ("skyforge_over_pytorch_2", "skyforge/PyTorch 2 procs", 25, "sky2", "torch2", 1, "x"),
    ("scaling_efficiency_skyforge", "2-node eff. skyforge", 21, "sky2", "sky1", 2, ""),
    ("scaling_efficiency_pytorch", "2-proc eff. PyTorch", 20, "torch2", "torch1", 2, ""),
    ("scaling_efficiency_no_communication", "2 nodes, no comm.", 18, "sky2ind", "sky1", 2, ""),
]


# ---- data ---------------------------------------------------------------------------------------
def load_idx(path):
    import numpy as np
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[0:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_fashion_mnist():
    """(x_train, y_train, x_test, y_test) as float32 N x 1 x 28 x 28 in [0, 1] and int64 labels."""
    import numpy as np

    def find(stem):
        for name in (stem + ".gz", stem):
            if (DATA_DIR / name).exists():
                return DATA_DIR / name
        raise SystemExit(f"train_vs_pytorch: {DATA_DIR / stem}.gz not found")

    out = []
    for images, labels in (("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                           ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")):
        raw = load_idx(find(images))
        x = np.empty(raw.shape, dtype=np.float32)  # x / 255 without a float temporary (RSS)
        np.divide(raw, np.float32(255.0), out=x, dtype=np.float32)
        del raw
        out += [x.reshape(-1, 1, 28, 28), load_idx(find(labels)).astype(np.int64)]
    return out


# ---- the PyTorch side (runs in --_torch-rank processes) -----------------------------------------
def example(name):
    """The example's manifest as a table."""
    return tomllib.loads(EXAMPLES[name].read_text())


def build_torch_model(name, seed=SEED, same_masks=False, rank=0):
    """The PyTorch twin of the example's model graph, holding skyforge's initial weights for `seed`;
    its dropout layers draw skyforge's masks for `seed` and `rank` when same_masks, PyTorch's own
    otherwise."""
    layers = example(name)["train"]["layers"]
    return torch_twins.build(layers, INPUT_SHAPE, torch_twins.initial_weights(layers, INPUT_SHAPE, seed),
                             seed if same_masks else None, rank)


def torch_optimizer(params, train, updates, **options):
    """The example's optimizer (adam or adamw, Keras' defaults; `options` passed on, e.g. fused=True)
    and the (lr, eps) of each of `updates` updates. Keras adds epsilon to sqrt(v) where PyTorch adds
    it to sqrt(v / (1 - beta_2^t)): PyTorch's eps of update t is Keras' epsilon / sqrt(1 - beta_2^t),
    so both take the same step."""
    import torch
    kind = train.get("optimizer", "adam")
    beta_2, eps = train.get("beta_2", 0.999), train.get("epsilon", 1e-7)
    args = dict(lr=0.0, betas=(train.get("beta_1", 0.9), beta_2), eps=eps)
    if kind == "adamw":  # PyTorch's AdamW: p *= 1 - lr * weight_decay, then Adam's step (Keras' order)
        opt = torch.optim.AdamW(params, weight_decay=train.get("weight_decay", 0.004), **args, **options)
    else:
        opt = torch.optim.Adam(params, **args, **options)
    rate = torch_twins.schedule_of(train)
    return opt, [(rate(t), eps / math.sqrt(1.0 - beta_2 ** (t + 1))) for t in range(updates)]


def steps_per_epoch(spec):
    """Every batch of the training set, or --steps of them."""
    every = -(-TRAIN_SAMPLES // GLOBAL_BATCH)
    return min(every, spec["steps"]) if spec.get("steps") else every


def trained_samples(spec):
    return min(TRAIN_SAMPLES, steps_per_epoch(spec) * GLOBAL_BATCH) * spec["epochs"]


def share(n, world, rank):
    """[lo, hi) of rank's part of n items: as equal as possible, the first ranks one more."""
    base, extra = divmod(n, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def torch_rank(spec):
    import torch
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, world = spec["rank"], spec["world"]
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}",
                                rank=rank, world_size=world)
    xtr, ytr, xte, yte = (torch.from_numpy(a) for a in load_fashion_mnist())

    torch.manual_seed(spec["seed"])  # PyTorch's own dropout masks, without --same-masks
    net = build_torch_model(spec["model"], spec["seed"], spec.get("same_masks", False), rank)
    model = net
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        # BatchNorm statistics per replica, as in skyforge/Keras: no buffer broadcast per step.
        model = DDP(net, broadcast_buffers=False)
    n = ytr.shape[0]
    steps = steps_per_epoch(spec)
    opt, settings = torch_optimizer(model.parameters(), example(spec["model"])["train"], steps * spec["epochs"])
    # skyforge's data order: epoch e's global batches are permutation(n, seed + e), split by rank.
    perms = [torch.from_numpy(torch_twins.permutation(n, spec["seed"] + e)) for e in range(spec["epochs"])]
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros((), dtype=torch.int64)
    seen = 0
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for epoch, perm in enumerate(perms):
        model.train()
        loss_sum.zero_(), correct.zero_()
        seen = 0
        for s in range(steps):
            idx = perm[s * GLOBAL_BATCH:(s + 1) * GLOBAL_BATCH]
            lo, hi = share(idx.shape[0], world, rank)
            idx = idx[lo:hi]
            xb, yb = xtr[idx], ytr[idx]
            for group in opt.param_groups:
                group["lr"], group["eps"] = settings[epoch * steps + s]
            opt.zero_grad(set_to_none=True)
            net.set_step(epoch * steps + s)
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            loss.backward()
            opt.step()
            with torch.no_grad():  # the running metrics Keras' progress bar shows
                loss_sum += loss.detach() * yb.shape[0]
                correct += (logits.argmax(1) == yb).sum()
            seen += yb.shape[0]
    train_s = time.perf_counter() - t0

    result = {"rank": rank, "train_seconds": train_s, "epochs": spec["epochs"],
              "samples": trained_samples(spec),
              "loss": float(loss_sum) / seen, "accuracy": int(correct) / seen}
    if rank == 0:
        net.eval()
        tl, tc = 0.0, 0
        with torch.no_grad():
            for i in range(0, yte.shape[0], 512):
                logits = net(xte[i:i + 512])
                tl += float(F.cross_entropy(logits, yte[i:i + 512], reduction="sum"))
                tc += int((logits.argmax(1) == yte[i:i + 512]).sum())
        result.update(test_loss=tl / yte.shape[0], test_accuracy=tc / yte.shape[0],
                      torch=torch.__version__, torch_threads=torch.get_num_threads(),
                      torch_interop_threads=torch.get_num_interop_threads())
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    print("TORCH_RESULT " + json.dumps(result), flush=True)


# ---- skyforge manifests ---------------------------------------------------------------------------
def check_example(model, doc):
    """The [train] keys the PyTorch side reproduces (the layers: torch_twins refuses what it lacks)."""
    t = doc["train"]
    if t.get("optimizer", "adam") not in ("adam", "adamw"):
        raise SystemExit(f"train_vs_pytorch: {EXAMPLES[model]}: train.optimizer = {t['optimizer']!r}, expected adam or adamw")
    if t.get("batch_size", GLOBAL_BATCH) != GLOBAL_BATCH:
        raise SystemExit(f"train_vs_pytorch: {EXAMPLES[model]}: train.batch_size = {t['batch_size']!r}, expected {GLOBAL_BATCH}")
    if t.get("loss", "sparse_categorical_crossentropy") != "sparse_categorical_crossentropy":
        raise SystemExit(f"train_vs_pytorch: {EXAMPLES[model]}: unexpected loss {t['loss']!r}")
    for key in ("clipnorm", "global_clipnorm", "amsgrad"):
        if key in t:
            raise SystemExit(f"train_vs_pytorch: {EXAMPLES[model]}: train.{key} has no PyTorch side here")


def derive_manifest(model, nodes, epochs, independent=False, seed=SEED, steps=None):
    """The example's text with nodes, epochs, threads, the keras plugin's seed and steps_per_epoch
    (steps: --steps) set and every file output removed; independent: keras' data_parallel = false
    (every node trains its own replica)."""
    text = EXAMPLES[model].read_text()
    check_example(model, tomllib.loads(text))

    def setkey(text, key, value, section):
        pat = re.compile(rf"^{key}\s*=.*$", re.M)
        if pat.search(text):
            return pat.sub(f"{key} = {value}", text, count=1)
        return re.sub(rf"^\[{re.escape(section)}\]\s*$", f"[{section}]\n{key} = {value}", text, count=1, flags=re.M)

    text = re.sub(r"^(history|tensorboard|checkpoint|resume|steps_per_epoch)\s*=.*\n", "", text, flags=re.M)
    text = setkey(text, "nodes", nodes, "pool")
    text = setkey(text, "epochs", epochs, "train")
    text = setkey(text, "threads", 1, "train")
    text = setkey(text, "batch_size", GLOBAL_BATCH, "train")
    if steps:
        text = setkey(text, "steps_per_epoch", steps, "train")
    text, n = re.subn(r"^seed\s*=.*$", f"seed = {seed}", text, count=1, flags=re.M)
    assert n == 1, "the example's keras plugin table has no seed"
    if independent:
        text, n = re.subn(r'^name\s*=\s*"keras"\s*$', 'name = "keras"\ndata_parallel = false', text, count=1, flags=re.M)
        assert n == 1, "the example has no keras plugin table"
    doc = tomllib.loads(text)
    t = doc["train"]
    assert doc["pool"]["nodes"] == nodes and t["epochs"] == epochs and t["threads"] == 1, doc
    assert doc["plugins"][0]["seed"] == seed, doc
    assert not any(k in t for k in ("history", "tensorboard", "checkpoint")), t
    return text


# ---- one configuration, in a fresh wrapper process ------------------------------------------------
def descendants(pid):
    """Every process below pid, from /proc's children lists."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for k in kids:
            out.append(int(k))
            todo.append(int(k))
    return out


class RssPoller(threading.Thread):
    """Max VmHWM over every descendant of this process, polled (cross-check of ru_maxrss)."""

    def __init__(self, interval=0.1):
        super().__init__(daemon=True)
        self.interval, self.peak_kib, self.pids = interval, 0, set()
        self.stop = threading.Event()

    def sample(self):
        for pid in descendants(os.getpid()):
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak_kib = max(self.peak_kib, int(line.split()[1]))
                        self.pids.add(pid)
                        break
            except (OSError, ValueError):
                pass

    def run(self):
        while not self.stop.wait(self.interval):
            self.sample()


def run_skyforge(spec):
    with tempfile.TemporaryDirectory(prefix="train_vs_pytorch.") as tmp:
        manifest = Path(tmp) / f"{spec['model']}-{spec['procs']}.toml"
        independent = spec["key"] == "sky2ind"
        manifest.write_text(derive_manifest(spec["model"], spec["procs"], spec["epochs"], independent, spec["seed"],
                                             spec.get("steps")))
        p = subprocess.run([spec["skyforge"], "run", str(manifest)], cwd=tmp,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    nodes = [json.loads(m.group(2)) for m in re.finditer(r"^\[node (\d+)\] => (\{.*\})\s*$", p.stdout, re.M)]
    if p.returncode != 0 or len(nodes) != spec["procs"]:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        raise SystemExit(f"skyforge run failed (exit {p.returncode}, {len(nodes)} result lines)")
    nodes.sort(key=lambda r: r["node"])
    train_s = max(r["train_seconds"] for r in nodes)
    # Data-parallel nodes share each epoch's samples; independent ones each train on all of them.
    return {"train_seconds": train_s, "samples": trained_samples(spec) * (spec["procs"] if independent else 1),
            "test_accuracy": nodes[0]["test_accuracy"], "test_loss": nodes[0]["test_loss"],
            "train_loss": nodes[0].get("loss"), "train_accuracy": nodes[0].get("accuracy"),
            "skyforge_samples_per_second_reported": min(r["samples_per_second"] for r in nodes),
            "replicas_agree": len({r["weights_fnv1a64"] for r in nodes}) == 1,
            "per_process_train_seconds": [r["train_seconds"] for r in nodes]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(spec):
    world = spec["procs"]
    port = free_port() if world > 1 else 0
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world))
    procs = []
    for rank in range(world):
        rs = dict(spec, rank=rank, world=world, port=port)
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--_torch-rank", json.dumps(rs)],
                                      env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate() for p in procs]
    results = []
    for p, (out, err) in zip(procs, outs):
        m = re.search(r"^TORCH_RESULT (\{.*\})$", out, re.M)
        if p.returncode != 0 or not m:
            sys.stderr.write(out[-4000:] + err[-4000:])
            raise SystemExit(f"PyTorch rank failed (exit {p.returncode})")
        results.append(json.loads(m.group(1)))
    r0 = next(r for r in results if r["rank"] == 0)
    return {"train_seconds": max(r["train_seconds"] for r in results), "samples": r0["samples"],
            "test_accuracy": r0["test_accuracy"], "test_loss": r0["test_loss"],
            "train_loss": r0["loss"], "train_accuracy": r0["accuracy"], "torch": r0["torch"],
            "torch_threads": r0["torch_threads"], "torch_interop_threads": r0["torch_interop_threads"],
            "per_process_train_seconds": [r["train_seconds"] for r in sorted(results, key=lambda r: r["rank"])]}


def cell(spec):
    poller = RssPoller()
    poller.start()
    t0 = time.perf_counter()
    res = run_skyforge(spec) if spec["kind"] == "skyforge" else run_torch(spec)
    wall = time.perf_counter() - t0
    poller.stop.set()
    poller.join()
    res.update(wall_seconds=wall,
               rss_mib=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0,  # KiB on Linux
               rss_polled_mib=poller.peak_kib / 1024.0, rss_polled_processes=len(poller.pids))
    print("CELL_RESULT " + json.dumps(res), flush=True)


# ---- the driver ---------------------------------------------------------------------------------
def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def loadavg():
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def fmt_range(values, spec):
    """"median (min-max)" of a figure over the rounds, or its one value."""
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return format(mid, spec) if len(values) == 1 else f"{mid:{spec}} ({lo:{spec}}-{hi:{spec}})"


def run_cell(spec):
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_cell", json.dumps(spec)],
                       stdout=subprocess.PIPE, text=True)
    m = re.search(r"^CELL_RESULT (\{.*\})$", p.stdout, re.M)
    if p.returncode != 0 or not m:
        raise SystemExit(f"train_vs_pytorch: {spec['label']} ({spec['model']}) failed, exit {p.returncode}")
    return json.loads(m.group(1))


def check(models, skyforge, steps):
    """--check: the twins against skyforge, 1 epoch of `steps` steps from the same weights on the same
    batches and dropout masks. Returns the exit status: 1 when, after 1 step, a model (without
    attention dropout) differs by more
    than 1e-4 (after more, rounding differences grow: in the ResNet ~1e-5 after 5 steps, ~3e-4 after 20)."""
    print(f"twin check: skyforge 1 node vs PyTorch 1 process, seed {SEED}, {steps} step{'s' * (steps != 1)} "
          f"of batch {GLOBAL_BATCH}; train loss: the mean over those steps (the first: the initial weights); "
          "test loss: after them, on the 10000 test images")
    hdr = (f"{'model':8s} {'train loss skyforge':>20s} {'PyTorch':>12s} {'|diff|':>9s} "
           f"{'test loss skyforge':>19s} {'PyTorch':>12s} {'|diff|':>9s}  note")
    print(hdr)
    print("-" * len(hdr))
    status = 0
    for m in models:
        r = {}
        for key, label, kind, procs in CONFIGS:
            if procs == 1:
                r[kind] = run_cell({"model": m, "key": key, "label": label, "kind": kind, "procs": 1, "epochs": 1,
                                    "skyforge": skyforge, "seed": SEED, "steps": steps, "same_masks": True})
        dtrain = abs(r["skyforge"]["train_loss"] - r["torch"]["train_loss"])
        dtest = abs(r["skyforge"]["test_loss"] - r["torch"]["test_loss"])
        layers = example(m)["train"]["layers"]
        # Dropout layers draw skyforge's masks on both sides here; attention's dropout is PyTorch's own.
        dropout = any(l["type"] == "multi_head_attention" and l.get("dropout", 0) > 0 for l in layers)
        if dropout:
            note = "attention dropout: the masks differ, not compared"
        elif steps > 1:
            note = "no verdict after more than 1 step"
        else:
            note = "ok" if dtrain <= 1e-4 and dtest <= 1e-4 else "DIFFERS"
        status |= note == "DIFFERS"
        print(f"{m:8s} {r['skyforge']['train_loss']:20.7f} {r['torch']['train_loss']:12.7f} {dtrain:9.2e} "
              f"{r['skyforge']['test_loss']:19.7f} {r['torch']['test_loss']:12.7f} {dtest:9.2e}  {note}", flush=True)
    return status


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs-mlp", type=int, default=5)
    ap.add_argument("--epochs-convnet", type=int, default=1)
    ap.add_argument("--epochs-resnet", type=int, default=1)
    ap.add_argument("--epochs-vit", type=int, default=1)
    ap.add_argument("--models", help="comma-separated: " + ", ".join(EXAMPLES) + " (default: all)")
    ap.add_argument("--steps", type=int, help="at most this many steps per epoch on both sides (skyforge's "
                                              "steps_per_epoch); default: every batch")
    ap.add_argument("--check", action="store_true",
                    help="only check the twins: skyforge 1 node and PyTorch 1 process, 1 epoch of --steps (default 1) "
                         "steps, their training and test losses side by side")
    ap.add_argument("--skyforge", default=str(REPO / "build" / "bin" / "skyforge"),
                    help="the skyforge binary (default: build/bin/skyforge under the repository root)")
    ap.add_argument("--rounds", type=int,
                    help="run every configuration this many times, interleaved (round 1 of each, then round 2 "
                         "...); report medians and ranges, ratios taken within each round (default: 1; "
                         "--backend cuda: 3)")
    ap.add_argument("--seeds", help="comma-separated seeds, one per round (implies --rounds their count); "
                                    "default: 42 in every round")
    ap.add_argument("--same-masks", action="store_true",
                    help="the PyTorch twin draws skyforge's dropout masks (for accuracy comparisons; costs PyTorch "
                         "~0.3 ms per step of numpy)")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu",
                    help="cpu (this table) or cuda: skyforge's cuda backend vs PyTorch eager and torch.compile on "
                         "the same GPU, batch 64 and 1024 (bench/train_vs_pytorch_cuda.py)")
    ap.add_argument("--configs", help="only these configurations (comma-separated keys; cpu: "
                                      + ", ".join(c[0] for c in CONFIGS) + "; cuda: bench/train_vs_pytorch_cuda.py lists them)")
    ap.add_argument("--batches", help="--backend cuda: only these global batch sizes (default 64,1024)")
    ap.add_argument("--dry-run", action="store_true",
                    help="--backend cuda: no GPU and no skyforge run: build every PyTorch configuration this torch "
                         "has on the CPU and train it one step; say why each absent one is absent")
    ap.add_argument("--_cell", help=argparse.SUPPRESS)
    ap.add_argument("--_cuda-cell", dest="cuda_cell", help=argparse.SUPPRESS)
    ap.add_argument("--_torch-rank", dest="torch_rank", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._cell:
        return cell(json.loads(a._cell))
    if a.cuda_cell:
        import train_vs_pytorch_cuda
        return train_vs_pytorch_cuda.cell(sys.modules[__name__], json.loads(a.cuda_cell))
    if a.torch_rank:
        return torch_rank(json.loads(a.torch_rank))

    models = [m.strip() for m in (a.models or ",".join(EXAMPLES)).split(",") if m.strip()]
    for m in models:
        if m not in EXAMPLES:
            ap.error(f"unknown model '{m}' ({', '.join(EXAMPLES)})")
    epochs = {m: getattr(a, "epochs_" + m) for m in EXAMPLES}
    if any(epochs[m] < 1 for m in models):
        ap.error("epochs must be >= 1")
    if a.rounds is None:
        a.rounds = 3 if a.backend == "cuda" else 1
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    if a.dry_run and a.backend != "cuda":
        ap.error("--dry-run is --backend cuda's")
    if a.steps is not None and a.steps < 1:
        ap.error("--steps must be >= 1")
    try:
        seeds = [int(v) for v in a.seeds.split(",")] if a.seeds else [SEED] * a.rounds
    except ValueError:
        ap.error(f"--seeds {a.seeds!r}: expected comma-separated integers")
    if a.seeds and a.backend == "cuda":
        ap.error("--seeds is --backend cpu's")
    if a.same_masks and a.backend == "cuda":
        ap.error("--same-masks is --backend cpu's")
    a.rounds = len(seeds)
    if a.dry_run:  # no skyforge and no GPU: the PyTorch configurations, built on the CPU
        import train_vs_pytorch_cuda
        sys.exit(train_vs_pytorch_cuda.dry_run(sys.modules[__name__], models))
    skyforge = str(Path(a.skyforge).resolve())
    if not os.access(skyforge, os.X_OK):
        raise SystemExit(f"train_vs_pytorch: {skyforge} is not an executable (build it, or pass --skyforge)")
    for m in models:  # fail early on an edited example
        derive_manifest(m, 1, epochs[m])
        build_torch_model(m)
    if a.backend == "cpu" and a.batches:
        ap.error("--batches is --backend cuda's")
    configs = CONFIGS
    if a.backend == "cpu" and a.configs:
        keep = [k.strip() for k in a.configs.split(",") if k.strip()]
        if set(keep) - {c[0] for c in CONFIGS}:
            ap.error(f"--configs {a.configs!r}: expected some of " + ", ".join(c[0] for c in CONFIGS))
        configs = [c for c in CONFIGS if c[0] in keep]
    if a.check:
        sys.exit(check(models, skyforge, a.steps or 1))
    if a.backend == "cuda":
        if a.steps:
            ap.error("--backend cuda runs every step (bench/train_vs_pytorch_cuda.py)")
        import train_vs_pytorch_cuda
        sys.exit(train_vs_pytorch_cuda.main(sys.modules[__name__], a, models, epochs, skyforge))

    import numpy
    import torch
    nproc = len(os.sched_getaffinity(0))
    machine = {"nproc": nproc, "cpu_count": os.cpu_count(), "cpu_model": cpu_model(),
               "kernel": platform.release(), "python": platform.python_version(), "torch": torch.__version__,
               "numpy": numpy.__version__, "skyforge": skyforge, "loadavg_start": loadavg()}
    print(f"machine: nproc {nproc} (os.cpu_count {os.cpu_count()}), CPU {machine['cpu_model']}, "
          f"Linux {machine['kernel']}")
    print(f"versions: python {machine['python']}, torch {torch.__version__}, numpy {numpy.__version__}; "
          f"skyforge {skyforge}")
    print(f"data: {DATA_DIR}, global batch {GLOBAL_BATCH}, each example's optimizer, sparse CE from logits, "
          f"x/255; epochs: " + ", ".join(f"{m} {epochs[m]}" for m in models) +
          (f"; at most {a.steps} steps per epoch" if a.steps else ""))
    # Settings both sides inherit that change which kernels run (OPENBLAS_CORETYPE pins OpenBLAS'
    # kernel set, e.g. Haswell's AVX2 ones on an AVX-512 core), printed so a table says what it measured.
    tuning = {k: v for k, v in sorted(os.environ.items())
              if k.startswith(("OPENBLAS_", "OMP_", "GOMP_", "MKL_", "DNNL_", "ONEDNN_", "SKYFORGE_CPU_"))}
    machine["environment"] = tuning
    print("environment (both sides): " + (" ".join(f"{k}={v}" for k, v in tuning.items()) or "no BLAS/OpenMP variables set"))
    print(f"load average at start: {machine['loadavg_start']}")
    print("dropout masks: " + ("skyforge's on both sides (--same-masks; PyTorch computes them in its timed loop)"
                               if a.same_masks else "each side its own"))
    print("samples/s: global, samples trained (60000 x epochs unless --steps) / training-loop time (slowest process); "
          "peak RSS: max over the configuration's processes (getrusage RUSAGE_CHILDREN.ru_maxrss "
          "of a fresh wrapper per configuration)", flush=True)

    # Rounds interleave the configurations (a VM's speed drifts over minutes: a ratio is only
    # meaningful between runs made close together), so each round yields its own ratios.
    cells = []
    for rnd in range(1, a.rounds + 1):
        for m in models:
            for key, label, kind, procs in configs:
                spec = {"model": m, "key": key, "label": label, "kind": kind, "procs": procs,
                        "epochs": epochs[m], "skyforge": skyforge, "seed": seeds[rnd - 1], "steps": a.steps,
                        "same_masks": a.same_masks}
                print(f"  round {rnd}/{a.rounds}: running {m:8s} {label} "
                      f"({epochs[m]} epoch{'s' if epochs[m] != 1 else ''}) ...", file=sys.stderr, flush=True)
                la0 = loadavg()
                r = run_cell(spec)
                r.update(model=m, config=key, label=label, processes=procs, epochs=epochs[m], round=rnd, seed=seeds[rnd - 1],
                         samples_per_second=r["samples"] / r["train_seconds"], loadavg_before=la0,
                         loadavg_after=loadavg())
                cells.append(r)

    print()
    if a.rounds > 1:
        print(f"{a.rounds} rounds: median (min-max) over the rounds")
    sw = 10 if a.rounds == 1 else 22  # the samples/s column: "median (min-max)" with rounds
    hdr = (f"{'model':8s} {'configuration':32s} {'epochs':>6s} {'samples/s':>{sw}s} {'test acc':>8s} "
           f"{'peak RSS MiB':>12s} {'train s':>8s} {'wall s':>7s}  note")
    print(hdr)
    print("-" * len(hdr))
    for m in models:
        for key, label, _, procs in configs:
            rs = [r for r in cells if r["model"] == m and r["config"] == key]
            note = []
            if procs > 1 and key != "sky2ind" and any("replicas_agree" in r for r in rs):
                agree = all(r.get("replicas_agree", False) for r in rs)
                note.append("replica weights equal" if agree else "REPLICA WEIGHTS DIFFER")
            if procs > 1 and len(rs) == 1:
                note.append("per-process train s " + "/".join(f"{t:.2f}" for t in rs[0]["per_process_train_seconds"]))
            acc = f"{statistics.median(r['test_accuracy'] for r in rs):.4f}"
            accs = sorted({round(r["test_accuracy"], 4) for r in rs})
            if a.seeds:
                note.append("test acc by seed " + ", ".join(f"{r['seed']}: {r['test_accuracy']:.4f}" for r in rs) +
                            f"; mean {statistics.mean(r['test_accuracy'] for r in rs):.4f}")
            elif len(accs) > 1:
                note.append("test acc " + "/".join(f"{v:.4f}" for v in accs))
            print(f"{m:8s} {label:32s} {rs[0]['epochs']:6d} "
                  f"{fmt_range([r['samples_per_second'] for r in rs], '.0f'):>{sw}s} {acc:>8s} "
                  f"{max(r['rss_mib'] for r in rs):12.1f} "
                  f"{statistics.median(r['train_seconds'] for r in rs):8.2f} "
                  f"{statistics.median(r['wall_seconds'] for r in rs):7.2f}  {'; '.join(note)}")

    print()
    hdr = f"{'model':8s} " + " ".join(f"{title:>{w}s}" for _, title, w, *_ in RATIOS)
    print(hdr)
    print("-" * len(hdr))
    ratios = {}
    for m in models:
        per_round = []
        for rnd in range(1, a.rounds + 1):
            s = {r["config"]: r["samples_per_second"] for r in cells if r["model"] == m and r["round"] == rnd}
            per_round.append({name: s[num] / (den_factor * s[den]) for name, _, _, num, den, den_factor, _ in RATIOS
                              if num in s and den in s})
        ratios[m] = {k: statistics.median(q[k] for q in per_round) for k in per_round[0]}
        ratios[m]["per_round"] = per_round
        cols = [(fmt_range([q[name] for q in per_round], ".2f") + unit if name in per_round[0] else "-").rjust(w)
                for name, _, w, *_, unit in RATIOS]
        print(f"{m:8s} " + " ".join(cols))
    machine["loadavg_end"] = loadavg()
    print(f"\nscaling efficiency = samples/s(2 processes) / (2 x samples/s(1 process)); '2 nodes, no comm.': "
          f"the same for 2 skyforge nodes that never communicate (the machine's ceiling); "
          f"load average at end: {machine['loadavg_end']}")

    if a.json:
        Path(a.json).write_text(json.dumps({"machine": machine, "global_batch": GLOBAL_BATCH,
                                            "steps_per_epoch": a.steps, "rounds": a.rounds, "same_masks": a.same_masks, "cells": cells,
                                            "ratios": ratios}, indent=2) + "\n")
        print(f"figures written to {a.json}")


if __name__ == "__main__":
    main()
