#!/usr/bin/env python3
"""A `local` pool at its maximum (CTest `load.max_pool`, labels `load` and `faults`): the real
`skyforge` binary runs `hello` (broadcast) and a map job on as many nodes as the local provider's
plugin.toml allows (`max_nodes`, 256), under a soft descriptor limit of 1024 (the usual default),
and checks that

  - every node answered: `[node i] => node i/N` for every i, once,
  - every task's result came back, in input order: `[task t] => t^2=t*t` for every t,
  - nothing is left behind (soak.py's check: no process carrying the run's TMPDIR, no file in it,
    no /dev/shm segment, no namespace or bridge, no listening port held by a process of the run
    or by none found; ports of other tests running beside it on a shared machine do not count).

  python3 tests/e2e/max_pool.py --skyforge build/bin/skyforge --plugin-toml providers/local/plugin.toml
"""
import argparse
import os
import re
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import soak  # noqa: E402


def max_nodes(plugin_toml):
    m = re.search(r"^max_nodes\s*=\s*(\d+)\s*$", open(plugin_toml).read(), re.M)
    if not m:
        raise SystemExit(f"max_pool: no max_nodes in {plugin_toml}")
    return int(m.group(1))


def port_owners():
    """{listening TCP port: {pid of each process holding it}} from /proc."""
    inodes = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            for line in open(name).read().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A":
                    inodes[f[9]] = int(f[1].rsplit(":", 1)[1], 16)
        except OSError:
            pass
    owners = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    owners.setdefault(inodes[link[8:-1]], set()).add(int(pid))
        except OSError:
            pass
    return owners


def ours_only(tmpdir):
    """soak's listening_ports(), less the ports that only processes outside this run hold (other
    tests on a shared machine): a port held by a process of the run (it carries the run's TMPDIR),
    or by no process that can be found, still counts."""
    every = soak.listening_ports

    def ports():
        found = every()
        owners = port_owners()
        mine = set(soak.processes_with(tmpdir))
        return {p for p in found if p not in owners or owners[p] & mine}
    return ports


def run(s, name, text, timeout):
    t0 = time.monotonic()
    p = s.start(s.manifest(name + ".toml", text))
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException:
        p.kill()
        p.communicate()
        raise
    took = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"max_pool: {name} exited {p.returncode}:\n{err[-4000:]}")
    s.check(name)  # nothing left behind (waits up to 10 s)
    return out, err, took


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skyforge", required=True)
    ap.add_argument("--plugin-toml", required=True, help="the local provider's plugin.toml (its max_nodes)")
    ap.add_argument("--nodes", type=int, help="instead of max_nodes")
    ap.add_argument("--tasks-per-node", type=int, default=8)
    ap.add_argument("--nofile", type=int, default=1024, help="soft RLIMIT_NOFILE for the runs (0: leave it)")
    a = ap.parse_args()
    n = a.nodes or max_nodes(a.plugin_toml)
    if a.nofile:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lim = a.nofile if hard == resource.RLIM_INFINITY else min(a.nofile, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim, hard))
    with tempfile.TemporaryDirectory(prefix="skyforge-maxpool-") as root:
        s = soak.Soak(os.path.abspath(a.skyforge), root)
        soak.listening_ports = ours_only(s.tmp)  # what Soak.check() reads

        out, err, took = run(s, "hello", f'[pool]\nprovider = "local"\nnodes = {n}\n[job]\napp = "hello"\n', 170)
        answered = re.findall(r"^\[node (\d+)\] => node (\d+)/(\d+) ", out, re.M)
        nodes = sorted(int(i) for i, j, total in answered if i == j and int(total) == n)
        if nodes != list(range(n)):
            missing = sorted(set(range(n)) - set(nodes))
            raise SystemExit(f"max_pool: hello on {n} nodes: {len(nodes)} answered, missing {missing[:20]}; "
                             f"{len(answered)} result lines\n{out[-2000:]}\n{err[-2000:]}")
        print(f"max_pool: hello on {n} local nodes: every node answered, {took:.1f} s, nothing left")

        tasks = n * a.tasks_per_node
        out, err, took2 = run(s, "map", f'[pool]\nprovider = "local"\nnodes = {n}\n[job]\napp = "hello"\n'
                                        f'mode = "map"\ntasks = {tasks}\n', 170)
        got = [(int(t), int(i), int(sq)) for t, i, sq in re.findall(r"^\[task (\d+)\] => (\d+)\^2=(\d+)$", out, re.M)]
        want = [(t, t, t * t) for t in range(tasks)]
        if got != want:
            bad = next((k for k, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
            raise SystemExit(f"max_pool: map of {tasks} tasks on {n} nodes: {len(got)} results, first wrong at "
                             f"{bad}\n{out[-2000:]}\n{err[-2000:]}")
        print(f"max_pool: map of {tasks} tasks on {n} local nodes: every result back in order, {took2:.1f} s, "
              f"nothing left")


if __name__ == "__main__":
    main()
