#!/usr/bin/env python3
"""Time lost to one lost node, against the time between checkpoints.

For the main job's MLP and the convnet on 2 and 4 local nodes: the [train] job runs once
uninterrupted, then again with [job] max_restarts = 1 while node 1's worker is SIGKILLed halfway
between two checkpoints. Printed per case: the time between checkpoints, the host's own restart
figure (the kill seen -> every node ready again), and the run's wall time lost (faulty minus
uninterrupted: the restart, reloading the data and the checkpoint, and replaying the steps since
the checkpoint). Both runs must end with the same weights hash; the script says so.

  build/bin/skyforge must exist (cmake --build build). Needs Debian's dataset-fashion-mnist.
  python3 bench/bench_faults.py [--skyforge build/bin/skyforge] [--rounds 3] [--nodes 2,4]
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def example_layers(name):
    """The [[train.layers]] tables at the end of examples/<name>."""
    text = open(os.path.join(ROOT, "examples", name)).read()
    return text[text.index("[[train.layers]]"):]


# name -> (layers, steps per epoch, epochs, checkpoint every N steps)
MODELS = {
    "mlp": (example_layers("fashion-mnist.toml"), 900, 4, 300),
    "convnet": (example_layers("fashion-mnist-convnet.toml"), 120, 2, 40),
}


def manifest(layers, nodes, steps, epochs, every, out, restarts):
    return f"""[pool]
provider = "local"
nodes = {nodes}

[job]
max_restarts = {restarts}

[[plugins]]
name = "keras"
backend = "cpu"
seed = 42

[train]
dataset = "fashion-mnist"
batch_size = 64
threads = 1
epochs = {epochs}
steps_per_epoch = {steps}
evaluate = false
checkpoint = "{out}/ckpt"
checkpoint_every = {every}
{layers}"""


def worker_of(node, tmpdir):
    """The skyforge-worker of `node` whose environment has this run's TMPDIR."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if not args or not args[0].endswith(b"skyforge-worker"):
                continue
            if args[args.index(b"--node") + 1] != str(node).encode():
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"TMPDIR={tmpdir}".encode() in f.read().split(b"\0"):
                    return int(pid)
        except (OSError, ValueError, IndexError):
            continue
    return None


def weights(out):
    m = re.search(r'\[node 0\] => \{.*"weights_fnv1a64": "([0-9a-f]+)"', out)
    return m.group(1) if m else None


def run(skyforge, path, tmpdir, kill_after_step=None, out_dir=None):
    env = dict(os.environ, TMPDIR=tmpdir)
    t0 = time.monotonic()
    p = subprocess.Popen([skyforge, "run", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    if kill_after_step is not None:
        # Kill node 1 once the checkpoint after `kill_after_step - half an interval` is in place:
        # poll `latest` until it names a checkpoint at or past that step, then wait the half.
        epoch_steps, target, half_s = kill_after_step
        latest = os.path.join(out_dir, "ckpt", "latest")
        while p.poll() is None:
            try:
                name = open(latest).read().strip()
                m = re.match(r"ckpt-(\d+)(?:-(\d+))?\.bin", name)
                if m and int(m.group(1)) * epoch_steps + int(m.group(2) or 0) >= target:
                    break
            except OSError:
                pass
            time.sleep(0.001)
        time.sleep(half_s)
        pid = worker_of(1, tmpdir)
        if pid:
            os.kill(pid, signal.SIGKILL)
    out, err = p.communicate(timeout=900)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"skyforge run {path} failed ({p.returncode}):\n{err[-2000:]}")
    return wall, out, err


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skyforge", default=os.path.join(ROOT, "build", "bin", "skyforge"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nodes", default="2,4")
    ap.add_argument("--models", default="mlp,convnet")
    a = ap.parse_args()
    if not os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
        sys.exit("no /usr/share/datasets/fashion-mnist: apt-get install dataset-fashion-mnist")
    print(f"one lost node (worker SIGKILLed halfway between two checkpoints), {a.rounds} rounds, medians")
    for model in a.models.split(","):
        layers, steps, epochs, every = MODELS[model]
        for nodes in [int(n) for n in a.nodes.split(",")]:
            refs, lost, restart_ms, intervals = [], [], [], []
            for r in range(a.rounds):
                with tempfile.TemporaryDirectory(prefix="skyforge-bench-faults-") as d:
                    tmp = os.path.join(d, "tmp")
                    os.mkdir(tmp)
                    ref_path = os.path.join(d, "ref.toml")
                    open(ref_path, "w").write(manifest(layers, nodes, steps, epochs, every, d + "/ref", 0))
                    t_ref, out_ref, _ = run(a.skyforge, ref_path, tmp)
                    interval = t_ref / (steps * epochs / every)  # the run's mean time between checkpoints
                    job = os.path.join(d, "job.toml")
                    open(job, "w").write(manifest(layers, nodes, steps, epochs, every, d + "/job", 1))
                    # halfway through the training, halfway between two checkpoints
                    target = (steps * epochs // 2) // every * every
                    t_job, out_job, err_job = run(a.skyforge, job, tmp, (steps, target, interval / 2), d + "/job")
                    m = re.search(r"every node ready again in (\d+) ms", err_job)
                    if not m:
                        sys.exit(f"no restart seen in the faulty run:\n{err_job[-2000:]}")
                    if weights(out_ref) != weights(out_job):
                        sys.exit(f"{model} on {nodes}: the resumed run's weights differ from the uninterrupted run's")
                    refs.append(t_ref)
                    lost.append(t_job - t_ref)
                    restart_ms.append(int(m.group(1)))
                    intervals.append(interval)
            print(f"{model:8s} {nodes} nodes: uninterrupted {statistics.median(refs):.2f} s; "
                  f"checkpoint every {every} steps = {statistics.median(intervals):.2f} s; "
                  f"kill -> every node ready {statistics.median(restart_ms):.0f} ms; "
                  f"time lost {statistics.median(lost):.2f} s (range {min(lost):.2f}-{max(lost):.2f}); "
                  f"weights equal to the uninterrupted run's: yes")


if __name__ == "__main__":
    main()
