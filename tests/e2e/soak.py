#!/usr/bin/env python3
"""Nothing leaks (CTest label `faults`): many short runs of the real `skyforge` binary in a row,
through every exit path, each followed by a check, from /proc and `ip`, that it left nothing:

  - no process (the runs' processes carry this soak's TMPDIR in their environment),
  - no file or directory in that TMPDIR (the local provider's pools live there),
  - no new /dev/shm segment of the communicator (skyforge-comm-*),
  - no new network namespace or bridge (isolation = "netns" runs, as root),
  - no new listening TCP port (/proc/net/tcp and tcp6).

A cycle is: hello on 2 nodes, a map job, a command, a command that fails, Ctrl-C (SIGINT to the
host), a worker SIGKILLed, the host SIGKILLed (its workers leave on their own), a train job (when
Fashion-MNIST is installed), a netns pool and its host SIGKILLed (as root), and a pool whose second Ctrl-C forces the
teardown. `--cycles 100` makes the 1,000 runs of docs/architecture.md; CTest runs 3.

  python3 tests/e2e/soak.py --skyforge build/bin/skyforge [--cycles N]
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

DATA = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


def listening_ports():
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            for line in open(name).read().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A":  # LISTEN
                    ports.add(int(f[1].rsplit(":", 1)[1], 16))
        except OSError:
            pass
    return ports


def shm_segments():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("skyforge-comm-")}
    except OSError:
        return set()


def netns():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {l.split()[0] for l in out.splitlines() if l.strip()}


def bridges():
    out = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    return {l.split(":")[1].strip() for l in out.splitlines() if l.strip()}


def processes_with(tmpdir):
    mine = f"TMPDIR={tmpdir}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mine in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def worker_pids(tmpdir):
    out = []
    for pid in processes_with(tmpdir):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == "skyforge-worker":
                out.append(pid)
        except OSError:
            pass
    return out


class Soak:
    def __init__(self, skyforge, root):
        self.skyforge = skyforge
        self.root = root
        self.tmp = os.path.join(root, "tmp")
        os.mkdir(self.tmp)
        self.runs = 0
        self.paths = {}
        self.base = (listening_ports(), shm_segments(), netns(), bridges())

    def manifest(self, name, text):
        p = os.path.join(self.root, name)
        with open(p, "w") as f:
            f.write(text)
        return p

    def start(self, path):
        env = dict(os.environ, TMPDIR=self.tmp)
        return subprocess.Popen([self.skyforge, "run", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, text=True, start_new_session=True)

    def wait_workers(self, n, timeout=30):
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            w = worker_pids(self.tmp)
            if len(w) >= n:
                return w
            time.sleep(0.01)
        raise SystemExit(f"soak: {n} workers did not start")

    def finish(self, name, p, want, timeout=120):
        out, err = p.communicate(timeout=timeout)
        if want is not None and p.returncode != want:
            raise SystemExit(f"soak: run {self.runs} ({name}) exited {p.returncode}, expected {want}:\n{err[-3000:]}")
        self.check(name)

    def check(self, name):
        """Waits up to 10 s for everything the run made to be gone, then says what is left."""
        until = time.monotonic() + 10
        while True:
            left = []
            procs = processes_with(self.tmp)
            if procs:
                left.append(f"processes {procs}")
            files = os.listdir(self.tmp)
            if files:
                left.append(f"files in TMPDIR {files}")
            ports, shm, ns, br = listening_ports(), shm_segments(), netns(), bridges()
            if shm - self.base[1]:
                left.append(f"/dev/shm {sorted(shm - self.base[1])}")
            if ns - self.base[2]:
                left.append(f"netns {sorted(ns - self.base[2])}")
            if br - self.base[3]:
                left.append(f"bridges {sorted(br - self.base[3])}")
            if ports - self.base[0]:
                left.append(f"listening ports {sorted(ports - self.base[0])}")
            if not left:
                break
            if time.monotonic() > until:
                raise SystemExit(f"soak: run {self.runs} ({name}) left: {'; '.join(left)}")
            time.sleep(0.05)
        self.runs += 1
        self.paths[name] = self.paths.get(name, 0) + 1

    def cycle(self, c):
        cmd = lambda sh, nodes=2, extra="": f'[pool]\nnodes = {nodes}\n{extra}[job]\ncommand = ["sh", "-c", "{sh}"]\n'
        self.finish("hello", self.start(self.manifest("hello.toml", '[pool]\nnodes = 2\n[job]\napp = "hello"\n')), 0)
        self.finish("map", self.start(self.manifest("map.toml", '[pool]\nnodes = 2\n[job]\napp = "hello"\nmode = "map"\n'
                                                               'tasks = 50\n')), 0)
        self.finish("command", self.start(self.manifest("cmd.toml", cmd("echo hi"))), 0)
        self.finish("app error", self.start(self.manifest("fail.toml", cmd("exit 3"))), 1)
        # Ctrl-C while the command runs
        p = self.start(self.manifest("sigint.toml", cmd("echo up; exec sleep 60")))
        self.wait_workers(2)
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        self.finish("SIGINT", p, 130)
        # a worker SIGKILLed
        p = self.start(self.manifest("kill.toml", cmd("echo up; exec sleep 60")))
        os.kill(self.wait_workers(2)[0], signal.SIGKILL)
        self.finish("worker SIGKILL", p, 1)
        # the host SIGKILLed: every worker's lease on it ends, and it leaves on its own
        p = self.start(self.manifest("host.toml", cmd("echo up; exec sleep 60")))
        self.wait_workers(2)
        time.sleep(0.2)
        p.kill()
        self.finish("host SIGKILL", p, -signal.SIGKILL)
        # a second Ctrl-C forces the teardown (the provider's terminate at once)
        p = self.start(self.manifest("force.toml", cmd("trap '' TERM; echo up; sleep 60", 2)))
        self.wait_workers(2)
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        self.finish("second Ctrl-C", p, 130)
        if os.path.exists(DATA):
            self.finish("train", self.start(self.manifest("train.toml", (
                '[pool]\nnodes = 2\n[[plugins]]\nname = "keras"\nbackend = "cpu"\nseed = 42\n'
                '[train]\nbatch_size = 64\nepochs = 1\nsteps_per_epoch = 5\nevaluate = false\n'
                '[[train.layers]]\ntype = "flatten"\n[[train.layers]]\ntype = "dense"\nunits = 10\n'))), 0)
        if os.geteuid() == 0:
            self.finish("netns", self.start(self.manifest("netns.toml", '[pool]\nnodes = 2\n[provider]\n'
                                                                        'isolation = "netns"\n[job]\napp = "hello"\n')), 0)
            # the host SIGKILLed with its pool in namespaces: its reaper removes them and the bridge
            p = self.start(self.manifest("netns-host.toml", cmd("echo up; exec sleep 60", 2,
                                                                '[provider]\nisolation = "netns"\n')))
            self.wait_workers(2)
            time.sleep(0.2)
            p.kill()
            self.finish("netns host SIGKILL", p, -signal.SIGKILL)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skyforge", required=True)
    ap.add_argument("--cycles", type=int, default=3)
    a = ap.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="skyforge-soak-") as root:
        s = Soak(os.path.abspath(a.skyforge), root)
        for c in range(a.cycles):
            s.cycle(c)
        paths = ", ".join(f"{k} {v}" for k, v in s.paths.items())
        print(f"soak: {s.runs} runs in {time.monotonic() - t0:.0f} s left nothing behind ({paths})")


if __name__ == "__main__":
    main()
