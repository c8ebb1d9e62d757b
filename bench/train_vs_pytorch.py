#!/usr/bin/python3
"""skyforge [train] vs PyTorch on Fashion-MNIST, measured in the same run.

Run with Debian's interpreter (the one PyTorch imports under):

    /usr/bin/python3 bench/train_vs_pytorch.py [--models mlp,convnet] [--epochs-mlp 5]
        [--epochs-convnet 1] [--rounds 1] [--skyforge build/bin/skyforge] [--json FILE]
        [--backend cpu|cuda] [--seeds 1,2,3,7,42]

(--backend cuda: the GPU table, bench/train_vs_pytorch_cuda.py.)

or `cmake --build build --target bench_train`.

For each model (mlp = examples/fashion-mnist.toml, convnet = examples/fashion-mnist-convnet.toml)
it runs four configurations on the same data, global batch 64, Adam(1e-3), sparse categorical
cross-entropy from logits, inputs scaled to [0, 1], the same number of epochs:

  skyforge 1 node   `skyforge run` of a temporary manifest derived from the example: nodes = 1,
                    threads = 1, epochs; history/tensorboard/checkpoint removed (no file I/O).
  skyforge 2 nodes  the same with nodes = 2 (data-parallel, 32 of every 64 per node).
  PyTorch 1 proc    a plain loop over a per-epoch index permutation (no DataLoader, no worker
                    processes), torch.set_num_threads(1), set_num_interop_threads(1).
  PyTorch DDP 2     2 processes, gloo on 127.0.0.1, 1 thread each, each global batch of 64 split
                    32 / 32 by rank (what DistributedSampler + batch 32 amounts to).

Figures per configuration:
  samples/s    global (whole pool): 60000 x epochs / training-loop wall time. skyforge: fit()'s
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

--seeds S1,S2,... gives round i the seed Si on both sides (skyforge's keras plugin `seed`, PyTorch's
manual_seed and data permutation; default 42 in every round) and implies --rounds len(seeds): the
test accuracy column is then the median over seeds and the note lists each seed's with their mean.
One seed's test accuracy after 1 epoch says little: with BatchNorm's momentum 0.99 it moves by
several points from seed to seed on both sides (docs/performance.md, "BatchNorm after one epoch").

Nothing is hard-coded: every figure comes from the runs made by this invocation.
Stdlib + numpy + torch only.
"""
import argparse
import gzip
import json
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
EXAMPLES = {"mlp": REPO / "examples" / "fashion-mnist.toml",
            "convnet": REPO / "examples" / "fashion-mnist-convnet.toml"}
GLOBAL_BATCH = 64
LEARNING_RATE = 1e-3
SEED = 42
TRAIN_SAMPLES = 60000

# The layers the PyTorch models below implement; the examples are checked against these so that
# an edited example cannot silently be compared with a different PyTorch model.
EXPECTED_LAYERS = {
    "mlp": [{"type": "flatten"}, {"type": "dense", "units": 128, "activation": "relu"},
            {"type": "dense", "units": 10}],
    "convnet": [
        {"type": "conv2d", "filters": 12, "kernel_size": 3, "padding": "same", "use_bias": False},
        {"type": "batch_normalization"}, {"type": "relu"},
        {"type": "conv2d", "filters": 24, "kernel_size": 6, "strides": 2, "use_bias": False},
        {"type": "batch_normalization"}, {"type": "relu"},
        {"type": "conv2d", "filters": 32, "kernel_size": 6, "strides": 2, "padding": "same"},
        {"type": "batch_normalization"}, {"type": "relu"},
        {"type": "global_average_pooling2d"},
        {"type": "dense", "units": 256, "activation": "relu"},
        {"type": "dropout", "rate": 0.5},
        {"type": "dense", "units": 10}],
}

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
def build_torch_model(name):
    import torch.nn as nn
    import torch.nn.functional as F

    class KerasConv2d(nn.Conv2d):
        """Conv2d with Keras' padding: 'valid', or 'same' = TF's pad, the odd pixel bottom/right."""

        def __init__(self, cin, cout, k, stride=1, padding="valid", bias=True):
            super().__init__(cin, cout, k, stride=stride, padding=0, bias=bias)
            self.keras_padding = padding
            self.pads = {}  # (H, W) -> (left, right, top, bottom)

        @staticmethod
        def same_pad(size, k, s):
            out = -(-size // s)
            total = max((out - 1) * s + k - size, 0)
            return total // 2, total - total // 2

        def forward(self, x):
            if self.keras_padding != "same":
                return super().forward(x)
            hw = (x.shape[2], x.shape[3])
            if hw not in self.pads:
                t, b = self.same_pad(hw[0], self.kernel_size[0], self.stride[0])
                l, r = self.same_pad(hw[1], self.kernel_size[1], self.stride[1])
                self.pads[hw] = (l, r, t, b)
            l, r, t, b = self.pads[hw]
            if l == r and t == b:  # symmetric: let the convolution pad (no extra copy)
                return F.conv2d(x, self.weight, self.bias, self.stride, (t, l))
            return F.conv2d(F.pad(x, (l, r, t, b)), self.weight, self.bias, self.stride)

    class GlobalAvgPool(nn.Module):
        def forward(self, x):
            return x.mean(dim=(2, 3))

    def bn(c):  # Keras BatchNormalization(momentum=0.99, epsilon=1e-3)
        return nn.BatchNorm2d(c, eps=1e-3, momentum=0.01)

    if name == "mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    elif name == "convnet":
        model = nn.Sequential(
            KerasConv2d(1, 12, 3, padding="same", bias=False), bn(12), nn.ReLU(),
            KerasConv2d(12, 24, 6, stride=2, padding="valid", bias=False), bn(24), nn.ReLU(),
            KerasConv2d(24, 32, 6, stride=2, padding="same", bias=True), bn(32), nn.ReLU(),
            GlobalAvgPool(),
            nn.Linear(32, 256), nn.ReLU(), nn.Dropout(0.5), nn.Linear(256, 10))
    else:
        raise ValueError(name)
    # Keras' initialisers: glorot_uniform kernels, zero biases (BatchNorm: gamma 1, beta 0).
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return model


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

    torch.manual_seed(spec["seed"])  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    net = build_torch_model(spec["model"])
    model = net
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        # BatchNorm statistics per replica, as in skyforge/Keras: no buffer broadcast per step.
        model = DDP(net, broadcast_buffers=False)
    opt = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.999), eps=1e-7)

    n = ytr.shape[0]
    steps = -(-n // GLOBAL_BATCH)
    gen = torch.Generator().manual_seed(spec["seed"])  # the same permutation on every rank
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros((), dtype=torch.int64)
    seen = 0
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(spec["epochs"]):
        model.train()
        perm = torch.randperm(n, generator=gen)
        loss_sum.zero_(), correct.zero_()
        seen = 0
        for s in range(steps):
            idx = perm[s * GLOBAL_BATCH:(s + 1) * GLOBAL_BATCH]
            lo, hi = share(idx.shape[0], world, rank)
            idx = idx[lo:hi]
            xb, yb = xtr[idx], ytr[idx]
            opt.zero_grad(set_to_none=True)
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
              "samples": n * spec["epochs"],
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
    got = doc["train"]["layers"]
    want = EXPECTED_LAYERS[model]
    if got != want:
        raise SystemExit(f"train_vs_pytorch: {EXAMPLES[model]} layers changed; the PyTorch model here "
                         f"implements\n  {want}\nbut the example has\n  {got}")
    t = doc["train"]
    for key, value in (("optimizer", "adam"), ("learning_rate", LEARNING_RATE),
                       ("batch_size", GLOBAL_BATCH)):
        if t.get(key, value) != value:
            raise SystemExit(f"train_vs_pytorch: {EXAMPLES[model]}: train.{key} = {t[key]!r}, expected {value!r}")
    if t.get("loss", "sparse_categorical_crossentropy") != "sparse_categorical_crossentropy":
        raise SystemExit(f"train_vs_pytorch: {EXAMPLES[model]}: unexpected loss {t['loss']!r}")


def derive_manifest(model, nodes, epochs, independent=False, seed=SEED):
    """The example's text with nodes, epochs, threads and the keras plugin's seed set and every
    file output removed; independent: keras' data_parallel = false (every node trains its own replica)."""
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
        manifest.write_text(derive_manifest(spec["model"], spec["procs"], spec["epochs"], independent, spec["seed"]))
        p = subprocess.run([spec["skyforge"], "run", str(manifest)], cwd=tmp,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    nodes = [json.loads(m.group(2)) for m in re.finditer(r"^\[node (\d+)\] => (\{.*\})\s*$", p.stdout, re.M)]
    if p.returncode != 0 or len(nodes) != spec["procs"]:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        raise SystemExit(f"skyforge run failed (exit {p.returncode}, {len(nodes)} result lines)")
    nodes.sort(key=lambda r: r["node"])
    train_s = max(r["train_seconds"] for r in nodes)
    # Data-parallel nodes share each epoch's samples; independent ones each train on all of them.
    return {"train_seconds": train_s, "samples": TRAIN_SAMPLES * spec["epochs"] * (spec["procs"] if independent else 1),
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


def run_cell(spec):
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_cell", json.dumps(spec)],
                       stdout=subprocess.PIPE, text=True)
    m = re.search(r"^CELL_RESULT (\{.*\})$", p.stdout, re.M)
    if p.returncode != 0 or not m:
        raise SystemExit(f"train_vs_pytorch: {spec['label']} ({spec['model']}) failed, exit {p.returncode}")
    return json.loads(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs-mlp", type=int, default=5)
    ap.add_argument("--epochs-convnet", type=int, default=1)
    ap.add_argument("--models", default="mlp,convnet", help="comma-separated: mlp, convnet")
    ap.add_argument("--skyforge", default=str(REPO / "build" / "bin" / "skyforge"),
                    help="the skyforge binary (default: build/bin/skyforge under the repository root)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every configuration this many times, interleaved (round 1 of each, then round 2 "
                         "...); report medians and ranges, ratios taken within each round")
    ap.add_argument("--seeds", help="comma-separated seeds, one per round (implies --rounds their count); "
                                    "default: 42 in every round")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu",
                    help="cpu (this table) or cuda: skyforge's cuda backend vs PyTorch eager and torch.compile on "
                         "the same GPU, batch 64 and 1024 (bench/train_vs_pytorch_cuda.py)")
    ap.add_argument("--configs", help="--backend cuda: only these configurations (comma-separated keys; "
                                      "bench/train_vs_pytorch_cuda.py lists them)")
    ap.add_argument("--batches", help="--backend cuda: only these global batch sizes (default 64,1024)")
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

    models = [m.strip() for m in a.models.split(",") if m.strip()]
    for m in models:
        if m not in EXAMPLES:
            ap.error(f"unknown model '{m}' (mlp, convnet)")
    epochs = {"mlp": a.epochs_mlp, "convnet": a.epochs_convnet}
    if any(epochs[m] < 1 for m in models):
        ap.error("epochs must be >= 1")
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    try:
        seeds = [int(v) for v in a.seeds.split(",")] if a.seeds else [SEED] * a.rounds
    except ValueError:
        ap.error(f"--seeds {a.seeds!r}: expected comma-separated integers")
    if a.seeds and a.backend == "cuda":
        ap.error("--seeds is --backend cpu's")
    a.rounds = len(seeds)
    skyforge = str(Path(a.skyforge).resolve())
    if not os.access(skyforge, os.X_OK):
        raise SystemExit(f"train_vs_pytorch: {skyforge} is not an executable (build it, or pass --skyforge)")
    for m in models:  # fail early on an edited example
        derive_manifest(m, 1, epochs[m])
    if a.backend == "cpu" and (a.configs or a.batches):
        ap.error("--configs and --batches are --backend cuda's")
    if a.backend == "cuda":
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
    print(f"data: {DATA_DIR}, global batch {GLOBAL_BATCH}, Adam({LEARNING_RATE}), sparse CE from logits, "
          f"x/255; epochs: " + ", ".join(f"{m} {epochs[m]}" for m in models))
    # Settings both sides inherit that change which kernels run (OPENBLAS_CORETYPE pins OpenBLAS'
    # kernel set, e.g. Haswell's AVX2 ones on an AVX-512 core), printed so a table says what it measured.
    tuning = {k: v for k, v in sorted(os.environ.items())
              if k.startswith(("OPENBLAS_", "OMP_", "GOMP_", "MKL_", "DNNL_", "ONEDNN_", "SKYFORGE_CPU_"))}
    machine["environment"] = tuning
    print("environment (both sides): " + (" ".join(f"{k}={v}" for k, v in tuning.items()) or "no BLAS/OpenMP variables set"))
    print(f"load average at start: {machine['loadavg_start']}")
    print("samples/s: global, 60000 x epochs / training-loop time (slowest process); "
          "peak RSS: max over the configuration's processes (getrusage RUSAGE_CHILDREN.ru_maxrss "
          "of a fresh wrapper per configuration)", flush=True)

    # Rounds interleave the configurations (a VM's speed drifts over minutes: a ratio is only
    # meaningful between runs made close together), so each round yields its own ratios.
    cells = []
    for rnd in range(1, a.rounds + 1):
        for m in models:
            for key, label, kind, procs in CONFIGS:
                spec = {"model": m, "key": key, "label": label, "kind": kind, "procs": procs,
                        "epochs": epochs[m], "skyforge": skyforge, "seed": seeds[rnd - 1]}
                print(f"  round {rnd}/{a.rounds}: running {m:8s} {label} "
                      f"({epochs[m]} epoch{'s' if epochs[m] != 1 else ''}) ...", file=sys.stderr, flush=True)
                la0 = loadavg()
                r = run_cell(spec)
                r.update(model=m, config=key, label=label, processes=procs, epochs=epochs[m], round=rnd, seed=seeds[rnd - 1],
                         samples_per_second=r["samples"] / r["train_seconds"], loadavg_before=la0,
                         loadavg_after=loadavg())
                cells.append(r)

    def fmt_range(values, spec):
        lo, mid, hi = min(values), statistics.median(values), max(values)
        return format(mid, spec) if len(values) == 1 else f"{mid:{spec}} ({lo:{spec}}-{hi:{spec}})"

    print()
    if a.rounds > 1:
        print(f"{a.rounds} rounds: median (min-max) over the rounds")
    sw = 10 if a.rounds == 1 else 22  # the samples/s column: "median (min-max)" with rounds
    hdr = (f"{'model':8s} {'configuration':32s} {'epochs':>6s} {'samples/s':>{sw}s} {'test acc':>8s} "
           f"{'peak RSS MiB':>12s} {'train s':>8s} {'wall s':>7s}  note")
    print(hdr)
    print("-" * len(hdr))
    for m in models:
        for key, label, _, procs in CONFIGS:
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
    hdr = (f"{'model':8s} {'skyforge/PyTorch 1 proc':>24s} {'skyforge/PyTorch 2 procs':>25s} "
           f"{'2-node eff. skyforge':>21s} {'2-proc eff. PyTorch':>20s} {'2 nodes, no comm.':>18s}")
    print(hdr)
    print("-" * len(hdr))
    ratios = {}
    for m in models:
        per_round = []
        for rnd in range(1, a.rounds + 1):
            s = {r["config"]: r["samples_per_second"] for r in cells if r["model"] == m and r["round"] == rnd}
            per_round.append({"skyforge_over_pytorch_1": s["sky1"] / s["torch1"],
                              "skyforge_over_pytorch_2": s["sky2"] / s["torch2"],
                              "scaling_efficiency_skyforge": s["sky2"] / (2 * s["sky1"]),
                              "scaling_efficiency_pytorch": s["torch2"] / (2 * s["torch1"]),
                              "scaling_efficiency_no_communication": s["sky2ind"] / (2 * s["sky1"])})
        ratios[m] = {k: statistics.median(q[k] for q in per_round) for k in per_round[0]}
        ratios[m]["per_round"] = per_round
        cols = [fmt_range([q[k] for q in per_round], ".2f") for k in per_round[0]]
        print(f"{m:8s} {cols[0] + 'x':>24s} {cols[1] + 'x':>25s} {cols[2]:>21s} {cols[3]:>20s} {cols[4]:>18s}")
    machine["loadavg_end"] = loadavg()
    print(f"\nscaling efficiency = samples/s(2 processes) / (2 x samples/s(1 process)); '2 nodes, no comm.': "
          f"the same for 2 skyforge nodes that never communicate (the machine's ceiling); "
          f"load average at end: {machine['loadavg_end']}")

    if a.json:
        Path(a.json).write_text(json.dumps({"machine": machine, "global_batch": GLOBAL_BATCH,
                                            "learning_rate": LEARNING_RATE, "rounds": a.rounds, "cells": cells,
                                            "ratios": ratios}, indent=2) + "\n")
        print(f"figures written to {a.json}")


if __name__ == "__main__":
    main()
