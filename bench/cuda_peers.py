"""The rows of the GPU table (bench/train_vs_pytorch_cuda.py) and its arithmetic: which
configurations exist, which models and which PyTorch each one needs, and how rounds of samples/s
become medians, ranges, ratios to the best peer of the same precision and the targets' verdicts.
No GPU and no run here: stdlib only (torch is passed in where a feature is detected), so
tests/bench checks all of it on a machine without one."""
import inspect
import statistics
from dataclasses import dataclass, field

BATCHES = (64, 1024)
TARGETS = {64: 2.0, 1024: 1.0}  # batch: skyforge's ratio to the best PyTorch configuration (issue 37)
PRECISIONS = ("fp32", "tf32", "bf16")  # the groups a skyforge row is compared within
TARGETED = ("fp32", "bf16")  # the groups TARGETS holds for; TF32's ratio is for information


@dataclass(frozen=True)
class Row:
    """One configuration. precision: "fp32" (no TF32 anywhere), "tf32" (TF32 matmuls and
    convolutions), "bf16" (matmuls and convolutions on bfloat16 operands with FP32 sums, FP32
    weights and optimizer state: skyforge's precision = "bf16", PyTorch's
    torch.autocast(dtype=torch.bfloat16); TF32 off for what stays FP32) or "default" (PyTorch's:
    TF32 convolutions, FP32 matmuls); a row is compared with the best PyTorch row of its own
    precision. needs: None (every model), "conv" (models with a convolution) or "channels_last"
    (models where channels_last is chosen)."""
    key: str
    label: str
    kind: str  # "skyforge" or "torch"
    precision: str
    procs: int = 1
    plugin: dict = field(default_factory=dict)  # skyforge: the cuda plugin's options, TOML values
    cudnn: dict = field(default_factory=dict)  # torch: torch.backends.cudnn settings
    compile: str = None  # torch: None (eager) or torch.compile's mode
    fused: bool = False  # torch: Adam/AdamW(fused=True, capturable=True)
    channels_last: bool = False  # torch: model (and inputs) in torch.channels_last
    needs: str = None


SKYFORGE_ROWS = [
    Row("sky1", "skyforge cuda 1 GPU", "skyforge", "fp32"),
    Row("sky1tf32", "skyforge cuda 1 GPU tf32", "skyforge", "tf32", plugin={"tf32": "true"}),
    Row("sky1bf16", "skyforge cuda 1 GPU bf16", "skyforge", "bf16", plugin={"precision": '"bf16"'}),
    Row("sky1nchw", "skyforge cuda 1 GPU nchw", "skyforge", "fp32", plugin={"conv_layout": '"nchw"'}, needs="conv"),
    Row("sky1tune", "skyforge cuda 1 GPU autotuned", "skyforge", "fp32", plugin={"autotune": "true"}, needs="conv"),
    Row("sky1fast", "skyforge cuda 1 GPU tf32 autotuned", "skyforge", "tf32",
        plugin={"tf32": "true", "deterministic": "false", "autotune": "true"}, needs="conv"),
]
RO = "reduce-overhead"
TORCH_ROWS = [
    Row("torch", "PyTorch eager 1 GPU", "torch", "default"),
    Row("fp32", "PyTorch eager no TF32 1 GPU", "torch", "fp32"),
    Row("fp32det", "PyTorch eager no TF32 deterministic", "torch", "fp32", cudnn={"deterministic": True}, needs="conv"),
    Row("fp32cl", "PyTorch eager no TF32 channels_last", "torch", "fp32", cudnn={"benchmark": True},
        channels_last=True, needs="channels_last"),
    Row("tf32", "PyTorch eager TF32", "torch", "tf32"),
    Row("torchbench", "PyTorch eager TF32 cudnn.benchmark", "torch", "tf32", cudnn={"benchmark": True}, needs="conv"),
    Row("compile", "PyTorch torch.compile no TF32", "torch", "fp32", compile="default"),
    Row("ro", "PyTorch reduce-overhead no TF32", "torch", "fp32", cudnn={"benchmark": True}, compile=RO, fused=True),
    Row("rocl", "PyTorch reduce-overhead no TF32 ch_last", "torch", "fp32", cudnn={"benchmark": True}, compile=RO,
        fused=True, channels_last=True, needs="channels_last"),
    Row("rotf32", "PyTorch reduce-overhead TF32", "torch", "tf32", cudnn={"benchmark": True}, compile=RO, fused=True),
    Row("rotf32cl", "PyTorch reduce-overhead TF32 ch_last", "torch", "tf32", cudnn={"benchmark": True}, compile=RO,
        fused=True, channels_last=True, needs="channels_last"),
    Row("bf16", "PyTorch eager autocast bf16", "torch", "bf16"),
    Row("robf16", "PyTorch reduce-overhead autocast bf16", "torch", "bf16", cudnn={"benchmark": True}, compile=RO,
        fused=True),
    Row("robf16cl", "PyTorch reduce-overhead bf16 ch_last", "torch", "bf16", cudnn={"benchmark": True}, compile=RO,
        fused=True, channels_last=True, needs="channels_last"),
]


def rows(gpus):
    """Every configuration of a machine with `gpus` GPUs, in table order."""
    n = [Row("skyN", f"skyforge cuda {gpus} GPUs", "skyforge", "fp32", procs=gpus)] if gpus >= 2 else []
    return SKYFORGE_ROWS + n + TORCH_ROWS


def select(all_rows, keys):
    """The rows named by a comma-separated --configs (all when empty), in table order; raises
    ValueError naming the unknown keys."""
    keep = [k.strip() for k in (keys or "").split(",") if k.strip()]
    if not keep:
        return list(all_rows)
    unknown = sorted(set(keep) - {r.key for r in all_rows})
    if unknown:
        raise ValueError(f"no configuration {', '.join(unknown)} here (these: {', '.join(r.key for r in all_rows)})")
    return [r for r in all_rows if r.key in keep]


def parse_batches(text):
    """--batches "64,1024" -> (64, 1024); BATCHES when empty; ValueError on anything else."""
    if not text:
        return BATCHES
    try:
        batches = tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError:
        batches = ()
    if not batches or min(batches) < 1:
        raise ValueError("--batches: positive batch sizes, comma-separated")
    return batches


def model_traits(layers):
    """What a model's [[train.layers]] asks of the rows: {"conv": has a convolution,
    "channels_last": channels_last chosen}, and the reason for that choice."""
    convs = sum(1 for l in layers if l["type"] == "conv2d")
    if convs >= 2:
        why = f"channels_last rows: {convs} convolutions (cuDNN's NHWC kernels, no transposes between them)"
    elif convs == 1:
        why = "no channels_last rows: one convolution (a patch embedding), then matmuls, which have no layout"
    else:
        why = "no channels_last rows: no convolution"
    return {"conv": convs >= 1, "channels_last": convs >= 2}, why


def applies(row, traits):
    return row.needs is None or traits[row.needs]


def missing_feature(torch, row, optimizer, device):
    """Why this torch cannot build the row on `device` ("cuda", or "cpu" for the dry run) (a
    sentence), or None. optimizer: the model's torch.optim class name ("Adam" or "AdamW")."""
    if row.kind != "torch":
        return None
    version = getattr(torch, "__version__", "?")
    if row.compile and not hasattr(torch, "compile"):
        return f"torch {version} has no torch.compile (PyTorch >= 2.0)"
    if row.fused:
        params = inspect.signature(getattr(torch.optim, optimizer)).parameters
        absent = [p for p in ("fused", "capturable") if p not in params]
        if absent:
            return f"torch {version}'s torch.optim.{optimizer} has no " + " or ".join(f"{p}=" for p in absent)
    if row.channels_last and not hasattr(torch, "channels_last"):
        return f"torch {version} has no torch.channels_last"
    if row.precision == "bf16":
        if not (hasattr(torch, "autocast") and hasattr(torch, "bfloat16")):
            return f"torch {version} has no torch.autocast (PyTorch >= 1.10)"
        if device == "cuda" and not torch.cuda.is_bf16_supported():
            return f"torch {version} on {torch.cuda.get_device_name(0)}: no bf16 (torch.cuda.is_bf16_supported())"
    if row.precision != "default" and not (hasattr(torch.backends.cuda.matmul, "allow_tf32")
                                           and hasattr(torch.backends.cudnn, "allow_tf32")):
        return f"torch {version} has no allow_tf32 switches"
    return None


def round_order(items, rnd):
    """The configurations of round `rnd` (from 1): in order in odd rounds, reversed in even ones,
    so no configuration always runs right after the same other one (a GPU's clocks and a host's
    caches carry over)."""
    return list(items) if rnd % 2 else list(reversed(items))


def by_round(cells, key):
    """{round: samples/s} of one configuration's cells (one model and batch)."""
    return {c["round"]: c["samples_per_second"] for c in cells if c["key"] == key}


def ratios(cells, num, den):
    """num's samples/s over den's, round by round (each ratio of two runs made close together)."""
    a, b = by_round(cells, num), by_round(cells, den)
    return [a[r] / b[r] for r in sorted(a) if r in b and b[r] > 0]


def best(cells, candidates):
    """The key of the row among `candidates` with the highest median samples/s in cells, or None."""
    medians = {k: statistics.median(v.values()) for k in candidates if (v := by_round(cells, k))}
    return max(medians, key=medians.get) if medians else None


def peers(cells, table_rows):
    """{precision: the best PyTorch row's key} over one model and batch's cells, for each of
    PRECISIONS (a precision with no PyTorch row measured is left out)."""
    out = {}
    for precision in PRECISIONS:
        key = best(cells, [r.key for r in table_rows if r.kind == "torch" and r.precision == precision])
        if key:
            out[precision] = key
    return out


def verdicts(cells, table_rows, batch):
    """The targets at this batch size, one per precision with a skyforge 1-GPU row measured:
    {"precision", "ours": its best row's key, "peer": the best PyTorch row's of that precision
    (None: none measured), "ratios": ours / peer round by round, "target": TARGETS[batch],
    "met": the median ratio reaches it (FP32's and bf16's verdicts; None for TF32, where the
    issue sets none)}, in PRECISIONS' order. [] at a batch size without a target."""
    if batch not in TARGETS:
        return []
    out, best_peer = [], peers(cells, table_rows)
    for precision in PRECISIONS:
        ours = best(cells, [r.key for r in table_rows if r.kind == "skyforge" and r.procs == 1
                            and r.precision == precision])
        if not ours:
            continue
        peer = best_peer.get(precision)
        q = ratios(cells, ours, peer) if peer else []
        met = statistics.median(q) >= TARGETS[batch] if q and precision in TARGETED else None
        out.append({"precision": precision, "ours": ours, "peer": peer, "ratios": q, "target": TARGETS[batch],
                    "met": met})
    return out
