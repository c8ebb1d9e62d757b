"""The GPU half of bench/train_vs_pytorch.py (`--backend cuda`): skyforge's cuda backend vs
PyTorch on the same GPU, measured in the same run. NOT RUN ON A GPU YET in this form (the
peers below, the bf16 rows, the rounds and the ResNet and ViT); an earlier form ran on an H100
(docs/performance.md, "Training on a GPU").

For each model (mlp, convnet, resnet, vit: the examples, as the CPU bench checks them; PyTorch's
side is the same twin, bench/torch_twins.py, from skyforge's initial weights) and global batch
(64, 1024): the same data, the example's optimizer and learning-rate schedule (Adam or AdamW, with
Keras' epsilon placement, as the CPU bench), sparse categorical cross-entropy from logits, x/255.
The rows (bench/cuda_peers.py holds them; --configs picks them by key):

  sky1      skyforge cuda 1 GPU: `skyforge run` of the example with backend = "cuda", [pool]
            accelerator = "cuda", nodes = 1. FP32, deterministic (the default).
  sky1tf32  the same with the plugin's tf32 = true (TF32 tensor cores).
  sky1bf16  the same with the plugin's precision = "bf16" (Keras' mixed_bfloat16: every GEMM, the
            convolutions' through im2col, on bf16 operands with FP32 sums; FP32 weights and
            optimizer state; docs/compute-backends.md, "Mixed precision").
  sky1nchw  (models with a convolution) conv_layout = "nchw": cuDNN's convolutions in NCHW.
  sky1tune  (models with a convolution) autotune = true, FP32, deterministic: each convolution's
            fastest deterministic algorithm, timed at its first step, or the engine's im2col + GEMM
            backward where faster.
  sky1fast  (models with a convolution) tf32 = true, deterministic = false, autotune = true
            (docs/compute-backends.md, "Convolution algorithms").
  skyN      the same as sky1 with nodes = N (every GPU of the machine, when N >= 2): one node per
            GPU, data-parallel over NCCL.
  torch     PyTorch eager, its defaults (TF32 convolutions, FP32 matmuls): a plain loop with the
            dataset on the device (uploaded once), batches gathered there.
  fp32      eager with TF32 off (torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32 False).
  fp32det   (models with a convolution) fp32 with cudnn.deterministic = True: skyforge's default's
            exact peer (same precision, same determinism).
  fp32cl    (models where channels_last is chosen) fp32, cudnn.benchmark = True, the model in
            torch.channels_last.
  tf32      eager with TF32 on for matmuls and convolutions: the peer of skyforge's tf32 rows.
  torchbench  (models with a convolution) tf32 with cudnn.benchmark = True: PyTorch's timed choice
            of cuDNN algorithms, the peer of sky1fast.
  compile   torch.compile (its default mode), TF32 off.
  ro        torch.compile(mode="reduce-overhead") (CUDA graphs) with Adam/AdamW(fused=True,
            capturable=True), cudnn.benchmark = True, TF32 off.
  rocl      (channels_last models) ro with the model in torch.channels_last.
  rotf32    ro with TF32 on.  rotf32cl  (channels_last models) rotf32 in torch.channels_last.
  bf16      eager with the forward under torch.autocast("cuda", dtype=torch.bfloat16): FP32 master
            weights and optimizer state, as sky1bf16 and Keras' mixed_bfloat16; the loss from the
            logits cast to FP32; TF32 off for what stays FP32.
  robf16    ro under the same autocast (fused, capturable Adam/AdamW on the FP32 weights).
  robf16cl  (channels_last models) robf16 in torch.channels_last.

channels_last is chosen per model, the reason printed: for models of 2 convolutions or more
(convnet, resnet), not for the MLP (none) or the ViT (one patch convolution, then matmuls).
torch.compile runs one static graph per batch shape (dynamic=False), as skyforge captures one
per shape. Each PyTorch feature is detected in the torch at hand: a row whose feature is missing
(torch.compile before 2.0, fused= or capturable= in an optimizer, channels_last, the TF32
switches, torch.autocast, a GPU with bf16: torch.cuda.is_bf16_supported()) is left out, and the
output says which and why; nothing is estimated.

Every configuration trains one epoch more than the figure covers, and that first epoch is left
out of the time on both sides: it holds the one-time costs (cuDNN's and cuBLAS' loading and
plans, skyforge's graph capture, torch.compile's compilation and CUDA-graph recording of both
batch shapes, the full and the epoch's partial last one). skyforge's side is the sum of its
result line's epoch_seconds after the first; PyTorch's is timed from the end of its first epoch
(synchronized) to the end.

--rounds N (default 3) runs every configuration N times, round after round, in alternating order
(reversed in even rounds). The table gives each figure as median (min-max) over the rounds: samples/s
(60000 x epochs / steady training time, the slowest process), test accuracy (after all epochs,
the warm-up one included), peak device memory (the largest `used_memory` nvidia-smi reports for
the configuration's processes, polled every 0.1 s, the CUDA context included on both sides;
where nvidia-smi names none of them, as in a container, the largest rise of the GPUs' used
memory, marked), and two ratios, each taken within a round: to PyTorch eager (the torch row),
and for skyforge's 1-GPU rows to the best PyTorch row of the same precision (FP32, TF32 or bf16:
the one with the highest median samples/s at that model and batch). Then the targets (issue 37):
skyforge's best FP32 row >= 1.0x the best PyTorch FP32 row at batch 1024 and >= 2x at batch 64,
and the same for the bf16 row against the best PyTorch bf16 row; the TF32 pair for information.
With two GPUs or more, the allreduce bus bandwidth (nccl-tests' definition) at 8 MiB and 256 MiB,
in place: nccl-tests' `all_reduce_perf` (when it is on PATH) beside the cuda engine's own
gradient allreduce (`bench_allreduce --nccl`): target >= 90% of NCCL's figure at both sizes.

--dry-run needs neither a GPU nor skyforge: it builds every PyTorch configuration this torch has
on the CPU and trains it one step (fused= and capturable= left out there, CUDA tensors only;
torch.autocast("cpu", dtype=torch.bfloat16) standing in for CUDA's in the bf16 rows), and says
why each absent one is absent. Without a usable GPU the bench itself says why and exits 2.
"""
import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import cuda_peers


def smi(query):
    """nvidia-smi's CSV rows for a query (no header, no units), or None."""
    try:
        return subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def gpus_used_mib():
    q = smi("--query-gpu=memory.used")
    return sum(int(m) for m in re.findall(r"^\s*(\d+)", q, re.M)) if q is not None else None


def gpu_memory_poller(base, root_pid, peak, stop, interval=0.1):
    """peak[0] = max MiB nvidia-smi reports for root_pid and its descendants. peak[1] = max rise
    of every GPU's used memory over its value when the poller started: the figure to use where
    nvidia-smi's pids belong to another pid namespace (a container) and none is ours. The bench
    runs one configuration at a time, so the rise is this configuration's."""
    start = gpus_used_mib()
    while not stop.wait(interval):
        q = smi("--query-compute-apps=pid,used_memory")
        if q is not None:
            mine = {root_pid, *base.descendants(root_pid)}
            used = sum(int(m) for p, m in re.findall(r"^\s*(\d+),\s*(\d+)", q, re.M) if int(p) in mine)
            peak[0] = max(peak[0], used)
        now = gpus_used_mib()
        if start is not None and now is not None:
            peak[1] = max(peak[1], now - start)


def preflight(skyforge):
    """Why this machine cannot run the GPU bench, or None."""
    problems = []
    try:
        import torch
        if not torch.cuda.is_available():
            problems.append(f"PyTorch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)")
    except ImportError as e:
        problems.append(f"PyTorch cannot be imported ({e})")
    p = subprocess.run([skyforge, "backend-check", "cuda", "--against", ""], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode == 2:
        problems.append("skyforge's cuda backend cannot run here: " + p.stderr.strip().splitlines()[-1])
    elif p.returncode != 0:
        problems.append("skyforge backend-check cuda failed:\n" + p.stdout)
    return problems


def derive(base, model, nodes, epochs, batch, plugin=None):
    text = base.derive_manifest(model, nodes, epochs)
    if plugin:  # the cuda plugin's options (docs/compute-backends.md: "TF32", "Convolution algorithms")
        text += '\n[[plugins]]\nname = "cuda"\n' + "".join(f"{k} = {v}\n" for k, v in plugin.items())
    text, n = re.subn(r'^backend\s*=\s*"cpu"\s*$', 'backend = "cuda"', text, count=1, flags=re.M)
    assert n == 1, "the example selects no cpu backend"
    text = re.sub(r"^batch_size\s*=.*$", f"batch_size = {batch}", text, count=1, flags=re.M)
    return re.sub(r"^\[pool\]\s*$", '[pool]\naccelerator = "cuda"', text, count=1, flags=re.M)


def run_skyforge(base, spec):
    with tempfile.TemporaryDirectory(prefix="train_vs_pytorch_cuda.") as tmp:
        manifest = Path(tmp) / "job.toml"
        manifest.write_text(derive(base, spec["model"], spec["procs"], spec["epochs"] + 1, spec["batch"],
                                   spec.get("plugin")))
        p = subprocess.run([spec["skyforge"], "run", str(manifest)], cwd=tmp, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    nodes = [json.loads(m.group(2)) for m in re.finditer(r"^\[node (\d+)\] => (\{.*\})\s*$", p.stdout, re.M)]
    if p.returncode != 0 or len(nodes) != spec["procs"]:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        raise SystemExit(f"skyforge run failed (exit {p.returncode}, {len(nodes)} result lines)")
    # The epochs after the first (the warm-up): the slowest node's.
    return {"train_seconds": max(sum(r["epoch_seconds"][1:]) for r in nodes), "samples": base.TRAIN_SAMPLES * spec["epochs"],
            "first_epoch_seconds": max(r["epoch_seconds"][0] for r in nodes),
            "test_accuracy": nodes[0]["test_accuracy"],
            "replicas_agree": len({r["weights_fnv1a64"] for r in nodes}) == 1}


def optimizer_name(base, model):
    """The torch.optim class the model's example trains with."""
    return {"adam": "Adam", "adamw": "AdamW"}[base.example(model)["train"].get("optimizer", "adam")]


def torch_setup(base, torch, spec, dev, updates):
    """The twin of spec's model on dev, set up as its row asks: (the twin, the module to call, the
    optimizer, each of `updates` updates' (lr, eps), the forward's precision (a function giving a
    fresh context: autocast or none), notes on what was left out or stood in)."""
    if spec["precision"] != "default":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = spec["precision"] == "tf32"
    for name, value in spec["cudnn"].items():  # deterministic, benchmark
        setattr(torch.backends.cudnn, name, value)
    torch.manual_seed(base.SEED)
    net = base.build_torch_model(spec["model"]).to(dev)
    if spec["channels_last"]:
        net = net.to(memory_format=torch.channels_last)
    model = torch.compile(net, mode=spec["compile"], dynamic=False) if spec["compile"] else net
    options, notes = {}, []
    if spec["fused"] and dev.type == "cuda":
        options = {"fused": True, "capturable": True}
    elif spec["fused"]:
        notes.append("fused= and capturable= left out (CUDA tensors only)")
    opt, settings = base.torch_optimizer(net.parameters(), base.example(spec["model"])["train"], updates, **options)
    cast = contextlib.nullcontext
    if spec["precision"] == "bf16":  # FP32 master weights: only the forward's ops are cast
        cast = functools.partial(torch.autocast, dev.type, dtype=torch.bfloat16)
        if dev.type != "cuda":
            notes.append(f'torch.autocast("{dev.type}", dtype=torch.bfloat16) standing in for CUDA\'s')
    return net, model, opt, settings, cast, notes


def step_marker(torch, spec):
    """torch.compiler.cudagraph_mark_step_begin for a reduce-overhead row (where this torch has it):
    each call starts a new training step for the CUDA graphs."""
    if spec["compile"] != cuda_peers.RO:
        return lambda: None
    return getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", lambda: None)


def train_step(F, model, opt, setting, x, y, mark, cast):
    for group in opt.param_groups:  # the schedule's rate, Keras' epsilon placement
        group["lr"], group["eps"] = setting
    mark()
    opt.zero_grad(set_to_none=True)
    with cast():
        logits = model(x)
    loss = F.cross_entropy(logits.float(), y)  # in FP32, as skyforge's (and Keras') loss
    loss.backward()
    opt.step()
    return loss


def cudagraph_skips():
    """How often torch.compile fell back from CUDA graphs in this process (its inductor counter), or None."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(counters["inductor"].get("cudagraph_skips", 0))


def run_torch(base, spec):
    import torch
    import torch.nn.functional as F
    dev = torch.device("cuda", 0)
    xtr, ytr, xte, yte = (torch.from_numpy(a).to(dev) for a in base.load_fashion_mnist())
    n, batch = ytr.shape[0], spec["batch"]
    steps = -(-n // batch)
    net, model, opt, settings, cast, _ = torch_setup(base, torch, spec, dev, steps * (spec["epochs"] + 1))
    if spec["channels_last"]:
        xtr = xtr.contiguous(memory_format=torch.channels_last)
    mark = step_marker(torch, spec)
    gen = torch.Generator(device=dev).manual_seed(base.SEED)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for epoch in range(spec["epochs"] + 1):  # the first: the warm-up, left out of the time
        if epoch == 1:
            torch.cuda.synchronize()
            t1 = time.perf_counter()
        model.train()
        perm = torch.randperm(n, generator=gen, device=dev)
        for s in range(steps):
            idx = perm[s * batch:(s + 1) * batch]
            train_step(F, model, opt, settings[epoch * steps + s], xtr[idx], ytr[idx], mark, cast)
    torch.cuda.synchronize()
    train_s, first_s = time.perf_counter() - t1, t1 - t0
    net.eval()
    with torch.no_grad(), cast():  # in the precision it trained in
        correct = sum(int((net(xte[i:i + 1024]).argmax(1) == yte[i:i + 1024]).sum()) for i in range(0, yte.shape[0], 1024))
    return {"train_seconds": train_s, "first_epoch_seconds": first_s, "samples": n * spec["epochs"],
            "test_accuracy": correct / yte.shape[0],
            "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32, "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "autocast": "bfloat16" if spec["precision"] == "bf16" else None,
            "optimizer": type(opt).__name__ + ("(fused, capturable)" if spec["fused"] else ""),
            "cudagraph_skips": cudagraph_skips() if spec["compile"] == cuda_peers.RO else None}


def cell(base, spec):
    """One configuration in this (fresh) process; the peak device memory of its processes."""
    peak, stop = [0, 0], threading.Event()
    poller = threading.Thread(target=gpu_memory_poller, args=(base, os.getpid(), peak, stop), daemon=True)
    poller.start()
    res = run_skyforge(base, spec) if spec["kind"] == "skyforge" else run_torch(base, spec)
    stop.set()
    poller.join()
    # Its processes' own figure; where nvidia-smi names none of them, the GPUs' rise (said so).
    res["peak_device_mib"], res["peak_device_of"] = (peak[0], "processes") if peak[0] else (peak[1], "device rise")
    print("CELL_RESULT " + json.dumps(res), flush=True)


ALLREDUCE_SIZES = (8 << 20, 256 << 20)  # bytes: a gradient bucket's order, and a whole model's


def nccl_bus_bandwidth(gpus):
    """nccl-tests' all_reduce_perf at ALLREDUCE_SIZES: {bytes: in-place bus bandwidth, GB/s}
    (in place, as the engine's allreduce is)."""
    exe = shutil.which("all_reduce_perf")
    if not exe:
        return None, "nccl-tests' all_reduce_perf is not on PATH"
    lo, hi = ALLREDUCE_SIZES
    p = subprocess.run([exe, "-b", str(lo), "-e", str(hi), "-f", str(hi // lo), "-g", str(gpus)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return parse_all_reduce_perf(p.stdout)


def parse_all_reduce_perf(text):
    # A data row: size count type redop [root] then out-of-place time algbw busbw #wrong, then
    # in-place time algbw busbw #wrong; the in-place busbw is the next-to-last field.
    bw = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 9 and f[0].isdigit() and int(f[0]) in ALLREDUCE_SIZES:
            try:
                bw[int(f[0])] = float(f[-2])
            except ValueError:
                pass
    if set(bw) != set(ALLREDUCE_SIZES):
        return None, "all_reduce_perf printed no bus bandwidth at " + ", ".join(map(str, ALLREDUCE_SIZES)) + " bytes"
    return bw, None


def engine_bus_bandwidth(skyforge, gpus):
    """The cuda engine's own gradient allreduce (bench_allreduce --nccl, beside skyforge) at
    ALLREDUCE_SIZES: {bytes: bus bandwidth, GB/s}, nccl-tests' definition."""
    exe = Path(skyforge).resolve().parent / "bench_allreduce"
    if gpus < 2:
        return None, "one GPU: no allreduce between GPUs (bus bandwidth is 2 (n - 1) / n x bytes / time = 0 at n = 1)"
    if not exe.exists():
        return None, f"{exe} is not built"
    p = subprocess.run([str(exe), "--nccl", "--ranks", str(gpus), "--sizes", ",".join(map(str, ALLREDUCE_SIZES)),
                        "--seconds", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Its rows come in --sizes order: size, median (mean) µs per call, busbw of the median. nccl-tests
    # times the mean of its iterations, so the like figure here is the bus bandwidth of the mean.
    means = [float(m.group(1)) for m in re.finditer(r"^\S+ \S+\s+\S+ \(([0-9.]+)\)\s+[0-9.]+$", p.stdout, re.M)]
    if p.returncode != 0 or len(means) != len(ALLREDUCE_SIZES):
        return None, "bench_allreduce --nccl failed: " + p.stdout.strip()[-300:]
    figures = [2 * (gpus - 1) / gpus * size / (us * 1e3) for size, us in zip(ALLREDUCE_SIZES, means)]
    return dict(zip(ALLREDUCE_SIZES, figures)), None


def allreduce_report(bw, why, ebw, ewhy, gpus):
    """The two allreduces size by size; the target holds when the engine reaches 90% of
    nccl-tests' bus bandwidth at every size."""
    lines = []
    for size in ALLREDUCE_SIZES:
        nccl = f"{bw[size]:.1f} GB/s" if bw else f"not measured: {why}"
        ours = f"{ebw[size]:.1f} GB/s" if ebw else f"not measured: {ewhy}"
        ratio = f" = {100 * ebw[size] / bw[size]:.0f}% (target >= 90%)" if bw and ebw and bw[size] > 0 else ""
        lines.append(f"  {size >> 20:4d} MiB  nccl-tests {nccl}; skyforge {ours}{ratio}")
    return f"\nallreduce bus bandwidth, in place, {gpus} GPU(s):\n" + "\n".join(lines)


def plan(base, torch, table_rows, models, device):
    """What runs: ({model: its rows, in table order}, [(model, row, why absent)], {model: the
    channels_last choice's reason}): a row runs for the models it applies to, when this torch
    has its features on `device` ("cuda", or "cpu" for the dry run)."""
    runs, absent, why = {}, [], {}
    for m in models:
        traits, why[m] = cuda_peers.model_traits(base.example(m)["train"]["layers"])
        runs[m] = []
        for row in table_rows:
            if cuda_peers.applies(row, traits):
                reason = cuda_peers.missing_feature(torch, row, optimizer_name(base, m), device)
                if reason:
                    absent.append((m, row, reason))
                else:
                    runs[m].append(row)
    return runs, absent, why


def verdict_lines(found, labels, fmt_range):
    """The targets' lines of cuda_peers.verdicts' findings at one batch size."""
    lines = []
    for v in found:
        name = v["precision"].upper()
        if not v["peer"]:
            lines.append(f"{name}: {labels[v['ours']]}: no PyTorch {name} row measured, no ratio")
            continue
        verdict = {True: "met", False: "NOT met", None: "for information (the targets are FP32's and bf16's)"}[v["met"]]
        lines.append(f"{name}: {labels[v['ours']]} / {labels[v['peer']]} = {fmt_range(v['ratios'], '.2f')}x; "
                     f"target >= {v['target']:.1f}x: {verdict}")
    return lines


def table(cells, runs, table_rows, batches, fmt):
    """The table's lines and the targets' findings (cuda_peers.verdicts, with model and batch) of the
    measured cells; runs: {model: its rows}; fmt: the "median (min-max)" formatter."""
    labels = {r.key: r.label for r in table_rows}
    hdr = (f"{'model':8s} {'batch':>5s} {'configuration':40s} {'samples/s':>24s} {'test acc':>8s} {'peak MiB':>8s} "
           f"{'vs eager':>20s}  vs the best PyTorch row of its precision")
    lines, targets = [hdr, "-" * len(hdr)], []
    for m, model_rows in runs.items():
        for batch in batches:
            here = [c for c in cells if c["model"] == m and c["batch"] == batch]
            best_peer = cuda_peers.peers(here, table_rows)
            for row in model_rows:
                rs = [c for c in here if c["key"] == row.key]
                if not rs:
                    lines.append(f"{m:8s} {batch:5d} {row.label:40s} {'failed':>24s}")
                    continue
                q = cuda_peers.ratios(here, row.key, "torch")
                note = []
                peer = best_peer.get(row.precision)
                if row.kind == "skyforge" and row.procs == 1 and peer:
                    note.append(f"{fmt(cuda_peers.ratios(here, row.key, peer), '.2f')}x of {peer}")
                if row.key == peer:
                    note.append(f"the best PyTorch {row.precision.upper()} row")
                if any(c["peak_device_of"] != "processes" for c in rs):
                    note.append("peak: the GPUs' rise")
                if any(c.get("cudagraph_skips") for c in rs):
                    note.append("CUDA graphs skipped (torch.compile's log says why)")
                lines.append(f"{m:8s} {batch:5d} {row.label:40s} {fmt([c['samples_per_second'] for c in rs], '.0f'):>24s} "
                             f"{statistics.median(c['test_accuracy'] for c in rs):8.4f} "
                             f"{max(c['peak_device_mib'] for c in rs):8d} "
                             f"{fmt(q, '.2f') + 'x' if q else '-':>20s}  {'; '.join(note)}".rstrip())
            found = cuda_peers.verdicts(here, table_rows, batch)
            targets += [dict(v, model=m, batch=batch) for v in found]
            lines += [f"{'':14s} target, {m} batch {batch}: {line}" for line in verdict_lines(found, labels, fmt)]
    return lines, targets


def main(base, args, models, epochs, skyforge):
    try:  # the arguments first: a mistyped key is said on any machine
        keys = {r.key for r in cuda_peers.select(cuda_peers.rows(2), args.configs)}
        batches = cuda_peers.parse_batches(args.batches)
    except ValueError as e:
        print(f"train_vs_pytorch --backend cuda: {e}", file=sys.stderr)
        return 2
    problems = preflight(skyforge)
    if problems:
        print("train_vs_pytorch --backend cuda: no GPU figures on this machine:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 2
    import torch
    gpus = torch.cuda.device_count()
    table_rows = [r for r in cuda_peers.rows(gpus) if r.key in keys]
    runs, absent, why = plan(base, torch, table_rows, models, "cuda")
    if "skyN" in keys and gpus < 2:
        sky_n = next(r for r in cuda_peers.rows(2) if r.key == "skyN")
        absent += [(m, sky_n, "one GPU (it needs 2 or more)") for m in models]
    print(f"GPU: {gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, skyforge {skyforge}")
    print(f"{args.rounds} round{'s' * (args.rounds != 1)}, the configurations' order reversed in even rounds; "
          f"batches {', '.join(map(str, batches))}; epochs: " + ", ".join(f"{m} {epochs[m]}" for m in models))
    if args.rounds < 3:
        print("fewer than 3 rounds: the ranges below say little")
    for m in models:
        print(f"{m}: {why[m]}")
    for m, row, reason in absent:
        print(f"{m}: {row.key} ({row.label}) absent: {reason}")
    cells, failed = [], []
    work = [(m, batch, row) for m in models for batch in batches for row in runs[m]]
    for rnd in range(1, args.rounds + 1):
        for m, batch, row in cuda_peers.round_order(work, rnd):
            spec = dict(dataclasses.asdict(row), model=m, batch=batch, epochs=epochs[m], skyforge=skyforge)
            print(f"  round {rnd}: {m} batch {batch}: {row.label} ...", file=sys.stderr, flush=True)
            p = subprocess.run([sys.executable, str(Path(base.__file__).resolve()), "--_cuda-cell",
                                json.dumps(spec)], stdout=subprocess.PIPE, text=True)
            r = re.search(r"^CELL_RESULT (\{.*\})$", p.stdout, re.M)
            if p.returncode != 0 or not r:
                # Said, and the other configurations still measured: a GPU run is rare.
                print(f"  {row.label} ({m}, batch {batch}) FAILED (exit {p.returncode})", file=sys.stderr, flush=True)
                failed.append(f"{row.label} ({m}, batch {batch}, round {rnd})")
                continue
            res = json.loads(r.group(1))
            res.update(spec, round=rnd, samples_per_second=res["samples"] / res["train_seconds"])
            print(f"    {res['samples_per_second']:.0f} samples/s (first epoch {res['first_epoch_seconds']:.3f} s), "
                  f"test accuracy {res['test_accuracy']:.4f}, peak {res['peak_device_mib']} MiB",
                  file=sys.stderr, flush=True)
            cells.append(res)
    lines, targets = table(cells, runs, table_rows, batches, base.fmt_range)
    print(f"\n{args.rounds} round(s): median (min-max); every ratio taken within a round\n" + "\n".join(lines))
    bw, bwhy = nccl_bus_bandwidth(gpus)
    ebw, ewhy = engine_bus_bandwidth(skyforge, gpus)
    print(allreduce_report(bw, bwhy, ebw, ewhy, gpus))
    if failed:
        print("\nfailed: " + "; ".join(failed) + " (their errors are above)")
    if args.json:
        Path(args.json).write_text(json.dumps({"backend": "cuda", "gpus": gpus, "rounds": args.rounds, "cells": cells,
                                               "targets": targets,
                                               "absent": [{"model": m, "key": r.key, "why": w} for m, r, w in absent],
                                               "nccl_bus_bandwidth_gbs": bw and {str(k): v for k, v in bw.items()},
                                               "engine_bus_bandwidth_gbs": ebw and {str(k): v for k, v in ebw.items()},
                                               "failed": failed},
                                              indent=2) + "\n")
    return 1 if failed else 0


def mixed_precision_check(torch, net, opt, cast, x, row):
    """A bf16 row after its step: (its forward under `cast` gives bf16 logits and its weights and
    optimizer state are FP32, what the dry run says of it); (True, "") for other rows."""
    if row.precision != "bf16":
        return True, ""
    with torch.no_grad(), cast():
        logits = net(x).dtype
    state = [t.dtype for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.is_floating_point()]
    fp32 = all(p.dtype == torch.float32 for p in net.parameters()) and bool(state) and set(state) == {torch.float32}
    return logits == torch.bfloat16 and fp32, (f", {str(logits).replace('torch.', '')} logits, "
                                               f"{'FP32' if fp32 else 'NOT FP32'} weights and optimizer state")


def dry_run(base, models):
    """--dry-run: every PyTorch configuration this torch has, built on the CPU and trained one step
    of 8 random images; each absent one with the reason. 0 when every built one stepped (a finite
    loss, every parameter moved, channels_last weights where the row asks; a bf16 row's forward
    gives bf16 logits while its weights and optimizer state stay FP32)."""
    import torch
    import torch.nn.functional as F
    switches = [(torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32"),
                (torch.backends.cudnn, "benchmark"), (torch.backends.cudnn, "deterministic")]
    print(f"dry run: torch {torch.__version__} on the CPU, one step of 8 images per PyTorch configuration "
          "(no GPU, no skyforge, no figure)")
    runs, absent, why = plan(base, torch, cuda_peers.rows(2), models, "cpu")
    failures = 0
    for m in models:
        print(f"{m} ({optimizer_name(base, m)}): {why[m]}")
        for row in runs[m]:
            if row.kind == "skyforge":
                print(f"  {row.key:10s} {row.label}: skyforge's cuda backend, on a GPU only")
                continue
            spec = dict(dataclasses.asdict(row), model=m)
            saved = [getattr(obj, name) for obj, name in switches]
            try:
                # 2 updates' settings, the second's taken: a warm-up schedule's first rate is 0.
                net, model, opt, settings, cast, notes = torch_setup(base, torch, spec, torch.device("cpu"), 2)
                set_to = ", ".join(f"{'matmul' if obj is torch.backends.cuda.matmul else 'cudnn'}.{name} "
                                   f"{getattr(obj, name)}" for obj, name in switches)
                g = torch.Generator().manual_seed(base.SEED)
                x, y = torch.rand(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
                before = [p.detach().clone() for p in net.parameters()]
                loss = float(train_step(F, model, opt, settings[1], x, y, step_marker(torch, spec), cast))
                moved = all(not torch.equal(a, p) for a, p in zip(before, net.parameters()))
                weights = [p for p in net.parameters() if p.dim() == 4]
                # Every 4-d weight channels_last, and one not NCHW too (a 1-channel one is both).
                layout_ok = not row.channels_last or (all(p.is_contiguous(memory_format=torch.channels_last)
                                                          for p in weights)
                                                      and any(not p.is_contiguous() for p in weights))
                precision_ok, precision = mixed_precision_check(torch, net, opt, cast, x, row)
                ok = math.isfinite(loss) and moved and layout_ok and precision_ok
                result = (f"{'one step' if ok else 'FAILED'}: loss {loss:.4f}, "
                          f"{'every' if moved else 'NOT every'} parameter moved, {type(opt).__name__}"
                          + (", channels_last weights" if row.channels_last and layout_ok else "")
                          + (", weights NOT channels_last" if not layout_ok else "") + precision
                          + f"; {set_to}" + "".join("; " + n for n in notes))
            except Exception as e:  # said, and the other configurations still built
                ok, result = False, f"FAILED: {type(e).__name__}: {e}"
            finally:
                for (obj, name), value in zip(switches, saved):
                    setattr(obj, name, value)
            failures += not ok
            print(f"  {row.key:10s} {row.label}: {result}")
        for _, row, reason in (a for a in absent if a[0] == m):
            print(f"  {row.key:10s} {row.label}: absent: {reason}")
    return 1 if failures else 0
