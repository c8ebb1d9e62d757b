"""The GPU table of bench/train_vs_pytorch.py (--backend cuda) on a machine without a GPU: its rows
and arguments, its medians, ranges, ratios and targets (bench/cuda_peers.py), the manifests of
skyforge's rows as the host checks them, the dry run that builds every PyTorch configuration on the
CPU (bf16 under CPU autocast), and the exit 2 that says why no figure is made."""
import inspect
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "train_vs_pytorch.py"
sys.path.insert(0, str(BENCH.parent))

import cuda_peers  # noqa: E402
import train_vs_pytorch as base  # noqa: E402
import train_vs_pytorch_cuda as gpu  # noqa: E402

SKYFORGE = os.environ.get("SKYFORGE_BIN", str(REPO / "build" / "bin" / "skyforge"))


def bench(*args):
    return subprocess.run([sys.executable, str(BENCH), "--skyforge", SKYFORGE, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=300)


# ---- rows and arguments -----------------------------------------------------------------------
def test_rows_have_unique_keys_and_a_multi_gpu_row_only_with_two_gpus():
    for gpus in (1, 2, 8):
        keys = [r.key for r in cuda_peers.rows(gpus)]
        assert len(keys) == len(set(keys))
        assert ("skyN" in keys) == (gpus >= 2)
    assert next(r for r in cuda_peers.rows(8) if r.key == "skyN").procs == 8


def test_every_row_declares_its_precision_and_the_fused_ones_are_cuda_graphs():
    for r in cuda_peers.rows(2):
        assert r.kind in ("skyforge", "torch") and r.precision in cuda_peers.PRECISIONS + ("default",)
        assert r.needs in (None, "conv", "channels_last")
        assert not r.fused or r.compile == cuda_peers.RO
    torch_rows = [r for r in cuda_peers.rows(2) if r.kind == "torch"]
    # The peers: reduce-overhead with the fused optimizer, channels_last, TF32, bf16, fp32det.
    assert {("fp32", False), ("fp32", True), ("tf32", False), ("tf32", True), ("bf16", False), ("bf16", True)} <= \
        {(r.precision, r.channels_last) for r in torch_rows if r.compile == cuda_peers.RO and r.fused}
    # bf16: eager autocast too; skyforge's row is the plugin's precision = "bf16" and nothing else.
    assert any(r.precision == "bf16" and not r.compile for r in torch_rows)
    assert [r.plugin for r in cuda_peers.rows(1) if r.kind == "skyforge" and r.precision == "bf16"] == \
        [{"precision": '"bf16"'}]
    det = next(r for r in torch_rows if r.key == "fp32det")
    assert det.precision == "fp32" and det.cudnn == {"deterministic": True}
    # Each precision of skyforge's 1-GPU rows has PyTorch rows to be compared with.
    assert {r.precision for r in cuda_peers.rows(1) if r.kind == "skyforge"} <= {r.precision for r in torch_rows}


def test_select_keeps_table_order_and_names_unknown_keys():
    rows = cuda_peers.rows(2)
    assert cuda_peers.select(rows, None) == rows and cuda_peers.select(rows, " , ") == rows
    assert [r.key for r in cuda_peers.select(rows, "ro, sky1,fp32det")] == ["sky1", "fp32det", "ro"]
    with pytest.raises(ValueError, match="no configuration nope, zz here"):
        cuda_peers.select(rows, "sky1,zz,nope")


def test_batches_parse():
    assert cuda_peers.parse_batches(None) == (64, 1024)
    assert cuda_peers.parse_batches("256, 64") == (256, 64)
    for bad in ("0", "64,x", ",", "-1"):
        with pytest.raises(ValueError, match="positive batch sizes"):
            cuda_peers.parse_batches(bad)


def test_models_choose_their_rows_from_their_layers():
    traits = {m: cuda_peers.model_traits(base.example(m)["train"]["layers"]) for m in base.EXAMPLES}
    assert traits["mlp"][0] == {"conv": False, "channels_last": False}
    assert traits["convnet"][0] == traits["resnet"][0] == {"conv": True, "channels_last": True}
    assert traits["vit"][0] == {"conv": True, "channels_last": False}
    assert "9 convolutions" in traits["resnet"][1] and "patch embedding" in traits["vit"][1]
    keys = {m: {r.key for r in cuda_peers.rows(1) if cuda_peers.applies(r, t)} for m, (t, _) in traits.items()}
    assert "rocl" in keys["resnet"] and "rocl" not in keys["vit"] and "fp32det" in keys["vit"]
    assert {"robf16cl", "bf16", "sky1bf16"} <= keys["resnet"] and "robf16cl" not in keys["vit"]
    assert not {"sky1nchw", "fp32det", "torchbench", "fp32cl"} & keys["mlp"]


def test_round_order_alternates():
    assert cuda_peers.round_order("abc", 1) == cuda_peers.round_order("abc", 3) == list("abc")
    assert cuda_peers.round_order("abc", 2) == list("cba")


# ---- the arithmetic -------------------------------------------------------------------------------
def cells_of(figures):
    """{key: samples/s per round} -> the cells of one model and batch."""
    return [{"key": k, "round": i + 1, "samples_per_second": v} for k, vs in figures.items()
            for i, v in enumerate(vs) if v is not None]


ROUNDS = {"sky1": [100.0, 110.0, 90.0], "sky1tune": [95.0, 100.0, 85.0], "sky1tf32": [300.0, 330.0, 310.0],
          "torch": [40.0, 50.0, 45.0], "fp32": [50.0, 60.0, 40.0], "ro": [80.0, 100.0, 70.0],
          "tf32": [100.0, 100.0, 100.0], "rotf32": [400.0, None, 200.0],
          "sky1bf16": [900.0, 1000.0, 800.0], "bf16": [300.0, 250.0, 400.0], "robf16": [500.0, 400.0, 300.0]}


def test_ratios_are_taken_within_rounds():
    cells = cells_of(ROUNDS)
    assert cuda_peers.ratios(cells, "sky1", "ro") == [100 / 80, 110 / 100, 90 / 70]
    assert cuda_peers.ratios(cells, "sky1tf32", "rotf32") == [300 / 400, 310 / 200]  # round 2: no rotf32
    assert cuda_peers.ratios(cells, "sky1", "absent") == []


def test_the_best_peer_is_the_highest_median_of_its_precision():
    rows = cuda_peers.rows(1)
    # bf16: robf16's median 400 over eager autocast's 300.
    assert cuda_peers.peers(cells_of(ROUNDS), rows) == {"fp32": "ro", "tf32": "rotf32", "bf16": "robf16"}
    # `torch` (PyTorch's default: TF32 convolutions) is the peer of neither precision.
    assert cuda_peers.peers(cells_of({"torch": [1e9], "fp32": [1.0]}), rows) == {"fp32": "fp32"}
    assert cuda_peers.best(cells_of(ROUNDS), ["sky1", "sky1tune"]) == "sky1"
    assert cuda_peers.best([], ["sky1"]) is None


def test_verdicts_against_the_targets():
    rows, cells = cuda_peers.rows(1), cells_of(ROUNDS)
    at1024 = cuda_peers.verdicts(cells, rows, 1024)
    fp32, tf32, bf16 = at1024
    assert (fp32["precision"], fp32["ours"], fp32["peer"], fp32["target"], fp32["met"]) == ("fp32", "sky1", "ro", 1.0, True)
    assert fp32["ratios"] == [100 / 80, 110 / 100, 90 / 70]
    assert (tf32["ours"], tf32["peer"], tf32["met"]) == ("sky1tf32", "rotf32", None)  # no TF32 target
    # bf16 has the FP32 targets: 900/500, 1000/400, 800/300 -> median 2.5 >= 1 and >= 2.
    assert (bf16["ours"], bf16["peer"], bf16["target"], bf16["met"]) == ("sky1bf16", "robf16", 1.0, True)
    assert bf16["ratios"] == [900 / 500, 1000 / 400, 800 / 300]
    at64 = cuda_peers.verdicts(cells, rows, 64)
    assert [(v["precision"], v["met"]) for v in at64] == [("fp32", False), ("tf32", None), ("bf16", True)]  # 1.25 < 2
    slow = cells_of(dict(ROUNDS, sky1bf16=[700.0, 700.0, 700.0]))  # 1.4, 1.75, 2.33: median 1.75 < 2
    assert cuda_peers.verdicts(slow, rows, 64)[2]["met"] is False and cuda_peers.verdicts(slow, rows, 1024)[2]["met"]
    assert cuda_peers.verdicts(cells, rows, 128) == []
    lone = cuda_peers.verdicts(cells_of({"sky1": [1.0], "torch": [1.0]}), rows, 64)
    assert lone == [{"precision": "fp32", "ours": "sky1", "peer": None, "ratios": [], "target": 2.0, "met": None}]


def test_the_table_prints_median_and_range():
    assert base.fmt_range([100 / 80, 110 / 100, 90 / 70], ".2f") == "1.25 (1.10-1.29)"
    assert base.fmt_range([3.0], ".0f") == "3"
    labels = {r.key: r.label for r in cuda_peers.rows(1)}
    lines = gpu.verdict_lines(cuda_peers.verdicts(cells_of(ROUNDS), cuda_peers.rows(1), 64), labels, base.fmt_range)
    assert lines[0] == ("FP32: skyforge cuda 1 GPU / PyTorch reduce-overhead no TF32 = 1.25 (1.10-1.29)x; "
                        "target >= 2.0x: NOT met")
    assert lines[1] == ("TF32: skyforge cuda 1 GPU tf32 / PyTorch reduce-overhead TF32 = 1.15 (0.75-1.55)x; "
                        "target >= 2.0x: for information (the targets are FP32's and bf16's)")
    assert lines[2] == ("BF16: skyforge cuda 1 GPU bf16 / PyTorch reduce-overhead autocast bf16 = 2.50 (1.80-2.67)x; "
                        "target >= 2.0x: met")
    assert len(lines) == 3
    lone = gpu.verdict_lines(cuda_peers.verdicts(cells_of({"sky1": [1.0]}), cuda_peers.rows(1), 64), labels,
                             base.fmt_range)
    assert lone[0] == "FP32: skyforge cuda 1 GPU: no PyTorch FP32 row measured, no ratio"


def test_the_table_of_measured_cells():
    rows = {r.key: r for r in cuda_peers.rows(1)}
    runs = {"convnet": [rows[k] for k in ("sky1", "sky1tf32", "sky1bf16", "torch", "fp32", "fp32det", "ro", "tf32",
                                          "rotf32", "bf16", "robf16")]}
    cells = [dict(c, model="convnet", batch=1024, test_accuracy=0.5 + c["round"] / 100, peak_device_mib=100 * c["round"],
                  peak_device_of="device rise" if c["key"] == "tf32" else "processes",
                  cudagraph_skips=1 if c["key"] == "rotf32" and c["round"] == 3 else 0) for c in cells_of(ROUNDS)]
    lines, targets = gpu.table(cells, runs, list(rows.values()), (1024,), base.fmt_range)
    by_key = {r.key: next(l for l in lines if f" {r.label:40s} " in l + " ") for r in runs["convnet"]}
    assert by_key["sky1"] == ("convnet   1024 skyforge cuda 1 GPU                      " + "100 (90-110)".rjust(24)
                              + "   0.5200      300 " + "2.20 (2.00-2.50)x".rjust(20) + "  1.25 (1.10-1.29)x of ro")
    assert by_key["fp32det"].endswith("failed")
    assert by_key["ro"].endswith("the best PyTorch FP32 row") and by_key["torch"].endswith("1.00 (1.00-1.00)x")
    assert by_key["tf32"].endswith("peak: the GPUs' rise")
    assert by_key["rotf32"].endswith("the best PyTorch TF32 row; CUDA graphs skipped (torch.compile's log says why)")
    assert by_key["sky1bf16"].endswith("2.50 (1.80-2.67)x of robf16")
    assert by_key["robf16"].endswith("the best PyTorch BF16 row") and by_key["bf16"].endswith("7.50 (5.00-8.89)x")
    assert lines[-3].endswith("target, convnet batch 1024: FP32: skyforge cuda 1 GPU / PyTorch reduce-overhead no "
                              "TF32 = 1.25 (1.10-1.29)x; target >= 1.0x: met")
    assert lines[-1].endswith("target, convnet batch 1024: BF16: skyforge cuda 1 GPU bf16 / PyTorch reduce-overhead "
                              "autocast bf16 = 2.50 (1.80-2.67)x; target >= 1.0x: met")
    assert [(t["model"], t["batch"], t["precision"], t["met"]) for t in targets] == \
        [("convnet", 1024, "fp32", True), ("convnet", 1024, "tf32", None), ("convnet", 1024, "bf16", True)]


def test_every_skyforge_row_makes_a_manifest_the_host_accepts(tmp_path):
    # skyforge validate checks [[plugins]] options against the cuda plugin's plugin.toml.
    plugin = Path(SKYFORGE).resolve().parents[1] / "lib" / "skyforge" / "plugins" / "cuda_backend" / "plugin.toml"
    if not os.access(SKYFORGE, os.X_OK) or not plugin.exists():
        pytest.skip(f"{SKYFORGE} or its cuda plugin ({plugin}) is not built")

    def validate(plugin_options):
        job = tmp_path / "job.toml"
        job.write_text(gpu.derive(base, "convnet", 1, 2, 64, plugin_options))
        return subprocess.run([SKYFORGE, "validate", str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=60)

    for r in cuda_peers.rows(1):
        if r.kind == "skyforge":
            p = validate(r.plugin)
            assert p.returncode == 0, (r.key, p.stderr)
    p = validate({"precision": '"bf17"'})  # the same check refuses what the plugin lacks
    assert p.returncode == 2 and "precision: 'bf17' is not one of: fp32, bf16" in p.stderr


# ---- with this machine's torch --------------------------------------------------------------------
def test_missing_features_are_detected_not_assumed():
    torch = pytest.importorskip("torch")
    rows = {r.key: r for r in cuda_peers.rows(1)}
    for key in ("compile", "ro", "robf16"):
        why = cuda_peers.missing_feature(torch, rows[key], "Adam", "cpu")
        assert (why is None) == hasattr(torch, "compile")
        assert why is None or "has no torch.compile" in why
    assert cuda_peers.missing_feature(torch, rows["sky1"], "Adam", "cpu") is None
    assert cuda_peers.missing_feature(torch, rows["fp32det"], "AdamW", "cpu") is None
    # Eager autocast bf16 on the CPU: torch.autocast since 1.10 (Debian's 1.13 has it).
    assert (cuda_peers.missing_feature(torch, rows["bf16"], "Adam", "cpu") is None) == hasattr(torch, "autocast")
    eager_fused = cuda_peers.Row("x", "x", "torch", "fp32", fused=True)
    for name in ("Adam", "AdamW"):
        params = inspect.signature(getattr(torch.optim, name)).parameters
        why = cuda_peers.missing_feature(torch, eager_fused, name, "cpu")
        assert (why is None) == ("fused" in params and "capturable" in params), why
        assert why is None or f"torch.optim.{name} has no" in why


def test_a_torch_without_bf16_says_so():
    # Stand-ins for what the real torch at hand cannot show: a torch before torch.autocast, and a
    # CUDA device without bf16 (before Ampere), each the attributes missing_feature reads.
    bf16 = next(r for r in cuda_peers.rows(1) if r.key == "bf16")
    switches = types.SimpleNamespace(allow_tf32=False)
    backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=switches), cudnn=switches)
    old = types.SimpleNamespace(__version__="1.9.0", bfloat16=object(), backends=backends)
    assert cuda_peers.missing_feature(old, bf16, "Adam", "cpu") == "torch 1.9.0 has no torch.autocast (PyTorch >= 1.10)"
    cuda = types.SimpleNamespace(is_bf16_supported=lambda: False, get_device_name=lambda i: "Tesla V100-SXM2-16GB")
    volta = types.SimpleNamespace(__version__="2.5.1", autocast=object(), bfloat16=object(), cuda=cuda,
                                  backends=backends)
    assert cuda_peers.missing_feature(volta, bf16, "Adam", "cuda") == \
        "torch 2.5.1 on Tesla V100-SXM2-16GB: no bf16 (torch.cuda.is_bf16_supported())"
    assert cuda_peers.missing_feature(volta, bf16, "Adam", "cpu") is None  # the dry run's CPU autocast
    ampere = types.SimpleNamespace(**dict(vars(volta), cuda=types.SimpleNamespace(is_bf16_supported=lambda: True)))
    assert cuda_peers.missing_feature(ampere, bf16, "Adam", "cuda") is None


def test_dry_run_builds_every_pytorch_configuration_on_the_cpu():
    torch = pytest.importorskip("torch")
    p = bench("--backend", "cuda", "--dry-run", "--models", "convnet,vit")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "FAILED" not in out
    sections, model = {}, None
    for line in out.splitlines()[1:]:  # each model's line, then its rows' indented ones
        if not line.startswith(" "):
            model = line.split()[0]
        sections.setdefault(model, []).append(line)
    assert list(sections) == ["convnet", "vit"]
    for m, lines in sections.items():
        traits, _ = cuda_peers.model_traits(base.example(m)["train"]["layers"])
        for r in cuda_peers.rows(2):
            line = next((l for l in lines if l.split()[0] == r.key), None)
            if not cuda_peers.applies(r, traits):
                assert line is None, line
            elif r.kind == "skyforge":
                assert line.endswith("on a GPU only"), line
            elif cuda_peers.missing_feature(torch, r, gpu.optimizer_name(base, m), "cpu"):
                assert ": absent: torch " in line, line
            else:
                assert ": one step: " in line and "every parameter moved" in line, line
                assert (", channels_last weights;" in line) == r.channels_last, line
                if r.precision != "default":
                    tf32 = r.precision == "tf32"
                    assert f"matmul.allow_tf32 {tf32}, cudnn.allow_tf32 {tf32}" in line, line
                # A bf16 row's forward is bf16 under CPU autocast, standing in for CUDA's; its
                # weights and Adam's state FP32 (master weights).
                bf16 = ", bfloat16 logits, FP32 weights and optimizer state;" in line
                stand_in = 'torch.autocast("cpu", dtype=torch.bfloat16) standing in for CUDA\'s' in line
                assert bf16 == stand_in == (r.precision == "bf16"), line
    assert "  bf16       PyTorch eager autocast bf16: one step: " in out
    assert "no channels_last rows: one convolution" in out and "channels_last rows: 3 convolutions" in out


def test_without_a_gpu_it_says_why_and_exits_2():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    if not os.access(SKYFORGE, os.X_OK):
        pytest.skip(f"{SKYFORGE} is not built")
    p = bench("--backend", "cuda", "--models", "mlp")
    assert p.returncode == 2 and p.stdout == ""
    assert "no GPU figures on this machine" in p.stderr and "sees no CUDA device" in p.stderr
    p = bench("--backend", "cuda", "--models", "mlp", "--configs", "sky1,nope")
    assert p.returncode == 2 and "no configuration nope here" in p.stderr
    p = bench("--backend", "cuda", "--models", "mlp", "--batches", "64,0")
    assert p.returncode == 2 and "positive batch sizes" in p.stderr
    p = bench("--models", "mlp", "--dry-run")
    assert p.returncode == 2 and "--dry-run is --backend cuda's" in p.stderr
