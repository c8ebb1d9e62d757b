"""The GPU half of bench/train_vs_pytorch.py (`--backend cuda`): skyforge's cuda backend vs
PyTorch on the same GPU, measured in the same run.

For each model (mlp, convnet: the examples, as the CPU bench checks them) and global batch (64,
1024), the same data, Adam(1e-3), sparse categorical cross-entropy from logits, x/255:

  skyforge cuda 1 GPU     `skyforge run` of the example with backend = "cuda", [pool]
                          accelerator = "cuda", nodes = 1.
  skyforge cuda 1 GPU tf32  the same with the plugin's tf32 = true (TF32 tensor cores).
  skyforge cuda 1 GPU nchw  (convnet) conv_layout = "nchw": cuDNN's convolutions in NCHW, their
                          tensors transformed around each call (PyTorch eager no TF32's layout
                          and precision).
  skyforge cuda 1 GPU autotuned  (convnet) autotune = true, FP32, deterministic: each
                          convolution's fastest deterministic cuDNN algorithm, timed at its first
                          step, or the engine's im2col + GEMM backward (cuBLAS) where that was
                          faster than cuDNN's chosen backward.
  skyforge cuda 1 GPU tf32 autotuned  (convnet) tf32 = true, deterministic = false, autotune =
                          true: every convolution's fastest cuDNN algorithm, timed at its first
                          step in NHWC and in NCHW (transforms included), atomics allowed
                          (docs/compute-backends.md, "Convolution algorithms").
  skyforge cuda N GPUs    the same with nodes = N (every GPU of the machine, when N >= 2): one
                          node per GPU, data-parallel over NCCL.
  PyTorch eager 1 GPU     a plain loop with the dataset on the device (uploaded once), batches
                          gathered there, losses read back once per epoch.
  PyTorch eager no TF32   the same with torch.backends.cudnn.allow_tf32 = False: PyTorch's
                          convolutions in full FP32, as skyforge's are (PyTorch's default lets
                          cuDNN round their inputs to TF32; its matmuls are FP32 by default).
  PyTorch eager no TF32 deterministic  (convnet) the same with torch.backends.cudnn.deterministic
                          = True: cuDNN's deterministic algorithms only, as skyforge's default
                          (same precision, same determinism).
  PyTorch eager cudnn.benchmark  (convnet) eager with torch.backends.cudnn.benchmark = True:
                          PyTorch's own timed choice of cuDNN algorithms, the peer of the
                          autotuned row.
  PyTorch compile 1 GPU   the same model under torch.compile (when this torch has it), one
                          static graph per batch shape (dynamic=False).

--configs picks rows by key (sky1, sky1tf32, sky1nchw, sky1tune, sky1fast, skyN, torch, fp32, fp32det, torchbench,
compile)
and --batches the batch sizes, for a short run; the ratio column needs the torch row.

Every configuration trains one epoch more than the figure covers, and that first epoch is left
out of the time on both sides: it holds the one-time costs (cuDNN's and cuBLAS' loading and
plans, skyforge's graph capture, torch.compile's compilation of both batch shapes, the full and
the epoch's partial last one). skyforge's side is the sum of its result line's epoch_seconds
after the first; PyTorch's is timed from the end of its first epoch (synchronized) to the end.

Figures: samples/s (60000 x epochs / steady training time, the slowest process), test accuracy
(after all epochs, the warm-up one included),
and peak device memory: the largest `used_memory` nvidia-smi reports for the configuration's
processes, polled every 0.1 s (the CUDA context included, on both sides alike); where nvidia-smi
names none of them (its pids are another pid namespace's, as in a container), the largest rise of
the GPUs' used memory over its value before the configuration started, marked in the table. Then, with two
GPUs or more, the allreduce bus bandwidth (nccl-tests' definition) at 8 MiB and 256 MiB, in
place, size by size: nccl-tests' `all_reduce_perf` on every GPU (when it is on PATH) beside the
cuda engine's own gradient allreduce (`bench_allreduce --nccl`, the engine's
Device::allreduce_sum on its collectives stream, timed by its mean as nccl-tests times):
target >= 90% of NCCL's figure at both sizes.

Targets (docs/compute-backends.md): >= 2x PyTorch eager at batch 64, >= 1x at batch 1024.
Without a usable GPU it says why and exits 2: nothing is estimated.
"""
import json
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

BATCHES = (64, 1024)


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


def run_torch(base, spec):
    import torch
    import torch.nn.functional as F
    dev = torch.device("cuda", 0)
    for name, value in spec.get("cudnn", {}).items():  # e.g. allow_tf32 = False, benchmark = True
        setattr(torch.backends.cudnn, name, value)
    xtr, ytr, xte, yte = (torch.from_numpy(a).to(dev) for a in base.load_fashion_mnist())
    torch.manual_seed(base.SEED)
    net = base.build_torch_model(spec["model"]).to(dev)
    # dynamic=False: one static graph per batch shape, as skyforge captures one per shape; with
    # the default, the epoch's last, partial batch would recompile into a dynamic-shape graph.
    model = torch.compile(net, dynamic=False) if spec["compile"] else net
    opt = torch.optim.Adam(net.parameters(), lr=base.LEARNING_RATE, betas=(0.9, 0.999), eps=1e-7)
    n, batch = ytr.shape[0], spec["batch"]
    steps = -(-n // batch)
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
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
    torch.cuda.synchronize()
    train_s, first_s = time.perf_counter() - t1, t1 - t0
    net.eval()
    with torch.no_grad():
        correct = sum(int((net(xte[i:i + 1024]).argmax(1) == yte[i:i + 1024]).sum()) for i in range(0, yte.shape[0], 1024))
    return {"train_seconds": train_s, "first_epoch_seconds": first_s, "samples": n * spec["epochs"],
            "test_accuracy": correct / yte.shape[0],
            "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32, "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32}


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


def main(base, args, models, epochs, skyforge):
    problems = preflight(skyforge)
    if problems:
        print("train_vs_pytorch --backend cuda: no GPU figures on this machine:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 2
    import torch
    gpus = torch.cuda.device_count()
    print(f"GPU: {gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, skyforge {skyforge}")
    # (key, label, kind, processes, torch.compile, the cuda plugin's options or PyTorch's
    # torch.backends.cudnn settings, the models it runs: None for every one)
    configs = [("sky1", "skyforge cuda 1 GPU", "skyforge", 1, False, {}, None),
               ("sky1tf32", "skyforge cuda 1 GPU tf32", "skyforge", 1, False, {"tf32": "true"}, None),
               ("sky1nchw", "skyforge cuda 1 GPU nchw", "skyforge", 1, False, {"conv_layout": '"nchw"'},
                ("convnet",)),
               ("sky1tune", "skyforge cuda 1 GPU autotuned", "skyforge", 1, False, {"autotune": "true"},
                ("convnet",)),
               ("sky1fast", "skyforge cuda 1 GPU tf32 autotuned", "skyforge", 1, False,
                {"tf32": "true", "deterministic": "false", "autotune": "true"}, ("convnet",))]
    if gpus >= 2:
        configs.append(("skyN", f"skyforge cuda {gpus} GPUs", "skyforge", gpus, False, {}, None))
    configs += [("torch", "PyTorch eager 1 GPU", "torch", 1, False, {}, None),
                ("fp32", "PyTorch eager no TF32 1 GPU", "torch", 1, False, {"allow_tf32": False}, None),
                ("fp32det", "PyTorch eager no TF32 deterministic", "torch", 1, False,
                 {"allow_tf32": False, "deterministic": True}, ("convnet",)),
                ("torchbench", "PyTorch eager cudnn.benchmark", "torch", 1, False, {"benchmark": True}, ("convnet",))]
    if hasattr(torch, "compile"):
        configs.append(("compile", "PyTorch torch.compile 1 GPU", "torch", 1, True, {}, None))
    if args.configs:
        keep = [k.strip() for k in args.configs.split(",") if k.strip()]
        unknown = set(keep) - {c[0] for c in configs}
        if unknown:
            print(f"train_vs_pytorch --backend cuda: no configuration {', '.join(sorted(unknown))} here "
                  f"(these: {', '.join(c[0] for c in configs)})", file=sys.stderr)
            return 2
        configs = [c for c in configs if c[0] in keep]
    batches = BATCHES
    if args.batches:
        try:
            batches = tuple(int(b) for b in args.batches.split(",") if b.strip())
        except ValueError:
            batches = ()
        if not batches or min(batches) < 1:
            print("train_vs_pytorch --backend cuda: --batches: positive batch sizes, comma-separated", file=sys.stderr)
            return 2
    cells, failed = [], []
    for rnd in range(1, args.rounds + 1):
        for m in models:
            for batch in batches:
                for key, label, kind, procs, compiled, settings, only in configs:
                    if only and m not in only:
                        continue
                    spec = {"model": m, "key": key, "label": label, "kind": kind, "procs": procs, "batch": batch,
                            "compile": compiled, ("plugin" if kind == "skyforge" else "cudnn"): settings,
                            "epochs": epochs[m], "skyforge": skyforge}
                    print(f"  round {rnd}: {m} batch {batch}: {label} ...", file=sys.stderr, flush=True)
                    p = subprocess.run([sys.executable, str(Path(base.__file__).resolve()), "--_cuda-cell",
                                        json.dumps(spec)], stdout=subprocess.PIPE, text=True)
                    r = re.search(r"^CELL_RESULT (\{.*\})$", p.stdout, re.M)
                    if p.returncode != 0 or not r:
                        # Said, and the other configurations still measured: a GPU run is rare.
                        print(f"  {label} ({m}, batch {batch}) FAILED (exit {p.returncode})", file=sys.stderr, flush=True)
                        failed.append(f"{label} ({m}, batch {batch})")
                        continue
                    res = json.loads(r.group(1))
                    res.update(spec, round=rnd, samples_per_second=res["samples"] / res["train_seconds"])
                    print(f"    {res['samples_per_second']:.0f} samples/s (first epoch {res['first_epoch_seconds']:.3f} s), "
                          f"test accuracy {res['test_accuracy']:.4f}, peak {res['peak_device_mib']} MiB",
                          file=sys.stderr, flush=True)
                    cells.append(res)
    hdr = f"{'model':8s} {'batch':>5s} {'configuration':36s} {'samples/s':>10s} {'test acc':>8s} {'peak MiB':>8s}  vs eager"
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for m in models:
        for batch in batches:
            rows = [c for c in cells if c["model"] == m and c["batch"] == batch]
            eagers = [c["samples_per_second"] for c in rows if c["key"] == "torch"]
            eager = statistics.median(eagers) if eagers else float("nan")
            for key, label, *_, only in configs:
                if only and m not in only:
                    continue
                rs = [c for c in rows if c["key"] == key]
                if not rs:
                    print(f"{m:8s} {batch:5d} {label:36s} {'failed':>10s}")
                    continue
                sps = statistics.median(c["samples_per_second"] for c in rs)
                print(f"{m:8s} {batch:5d} {label:36s} {sps:10.0f} {statistics.median(c['test_accuracy'] for c in rs):8.4f} "
                      f"{max(c['peak_device_mib'] for c in rs):8d}  {sps / eager:.2f}x"
                      + ("  (peak: the GPUs' rise)" if any(c["peak_device_of"] != "processes" for c in rs) else ""))
    bw, why = nccl_bus_bandwidth(gpus)
    ebw, ewhy = engine_bus_bandwidth(skyforge, gpus)
    print(allreduce_report(bw, why, ebw, ewhy, gpus))
    if failed:
        print("\nfailed: " + "; ".join(failed) + " (their errors are above)")
    if args.json:
        Path(args.json).write_text(json.dumps({"backend": "cuda", "gpus": gpus, "cells": cells,
                                               "nccl_bus_bandwidth_gbs": bw and {str(k): v for k, v in bw.items()},
                                               "engine_bus_bandwidth_gbs": ebw and {str(k): v for k, v in ebw.items()},
                                               "failed": failed},
                                              indent=2) + "\n")
    return 1 if failed else 0
