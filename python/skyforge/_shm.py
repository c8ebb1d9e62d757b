"""Large NumPy arrays shared through memory with the nodes on the caller's machine (docs/python.md,
"Large arrays"), as joblib's loky backend memory-maps them for its workers.

The caller writes such an array once, as a .npy file in a private directory of /dev/shm (else of
the temporary directory): the directory is 0700 and its files 0600, named by mkdtemp, and held
with an flock for as long as the pool lives. A node gets the path when it proved, by reading the
directory's probe through a task, that it sees the caller's files; its slots map the file
read-only. SharedDir is the caller's side; MappedFile and probe() the node's.
"""
from __future__ import annotations

import fcntl
import io
import mmap
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
from typing import Any, Optional

PREFIX = "skyforge-shm-"
PROBE = "probe"
_FILE = re.compile(r"(?:[0-9]{1,20}\.npy|probe)\Z")  # what a node opens: a key's file or the probe
_HEADER_MAX = 1 << 16  # a .npy header is shorter than this
# A directory a crashed caller left is swept once its lock is free and it is this old (a new
# directory is locked microseconds after mkdtemp made it).
_STALE_AGE = 60.0


def mappable(value: Any) -> bool:
    """Whether `value` can be shared through a file: a plain ndarray of plain data."""
    return type(value).__name__ == "ndarray" and type(value).__module__ == "numpy" and not value.dtype.hasobject


def _bases():
    yield "/dev/shm"  # tmpfs: the file never touches a disk
    yield tempfile.gettempdir()


def sweep(base: str) -> None:
    """Removes from `base` the directories this user's crashed callers left: named PREFIX*, owned
    by this user, older than _STALE_AGE, and with no live process holding their lock."""
    try:
        names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(base, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or time.time() - st.st_mtime < _STALE_AGE:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its pool is alive
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


class SharedDir:
    """The caller's directory of shared arrays for one pool, made at its first use."""

    def __init__(self):
        self.path: Optional[str] = None
        self.token = b""  # what the probe file holds
        self._lock_fd: Optional[int] = None
        self._opening = threading.Lock()  # calls on two threads make one directory
        self._closed = False

    def open(self) -> Optional[str]:
        """The directory's path; None when no private directory can be made here, or once closed."""
        with self._opening:
            if self.path is None and not self._closed:
                self._make()
            return self.path

    def _make(self) -> None:
        for base in _bases():
            if not os.path.isdir(base):
                continue
            sweep(base)
            try:
                path = tempfile.mkdtemp(prefix=PREFIX, dir=base)  # 0700, a name nobody can guess
            except OSError:
                continue
            self._lock_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            self.path, self.token = path, secrets.token_bytes(32)
            if self._write(PROBE, lambda f: f.write(self.token)):
                return
            self._remove()

    def close(self) -> None:
        """Removes the directory and everything in it, for good; safe to call again."""
        with self._opening:
            self._closed = True
            self._remove()

    def probe_path(self) -> str:
        return os.path.join(self.path, PROBE)

    def write(self, key: int, array) -> Optional["MappedFile"]:
        """`array` as <dir>/<key>.npy, and what a node maps it by; None, with nothing left
        behind, when it cannot be (no room, an error). The file holds the array's dtype, shape
        and bytes in the order of its strides, so that it maps with the same strides when they
        are an order of its axes (C, Fortran, any transpose of them); another array (a strided
        or reversed view) is written in C order, as pickle writes it."""
        import numpy as np
        axes = sorted(range(array.ndim), key=lambda i: -abs(array.strides[i]))
        dense = array.transpose(axes)
        if not dense.flags.c_contiguous:
            axes, dense = list(range(array.ndim)), array
        name = f"{int(key)}.npy"
        with self._opening:  # never a file in a directory close() is removing
            if self.path is None:
                return None
            try:
                st = os.statvfs(self.path)
                if st.f_bavail * st.f_frsize < array.nbytes + (64 << 20):
                    return None  # leave tmpfs room for others
            except OSError:
                return None
            if not self._write(name, lambda f: np.lib.format.write_array(f, dense, allow_pickle=False)):
                return None
            return MappedFile(os.path.join(self.path, name), [axes.index(i) for i in range(array.ndim)])

    def _write(self, name: str, fill) -> bool:
        path = os.path.join(self.path, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
            return True
        except (OSError, ValueError):
            os.unlink(path)
            return False

    def remove(self, key: int) -> None:
        path = self.path
        if path is not None:
            try:
                os.unlink(os.path.join(path, f"{int(key)}.npy"))
            except FileNotFoundError:
                pass

    def _remove(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


# ---- the node's side --------------------------------------------------------------------------

def _open_checked(path: str) -> int:
    """A descriptor of the caller's file at `path`, read-only, once the path is one the caller
    makes (<dir>/skyforge-shm-*/<key>.npy or probe) and the file is a private regular file of
    this user: OSError otherwise."""
    name, parent = os.path.basename(path), os.path.basename(os.path.dirname(path))
    if not os.path.isabs(path) or os.path.normpath(path) != path or not _FILE.match(name) \
            or not parent.startswith(PREFIX):
        raise OSError(f"{path!r} is not a file of a skyforge pool's shared directory")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        os.close(fd)
        raise OSError(f"{path} is not a private file of this user")
    return fd


def _contents(path: str):
    """The file mapped read-only; its bytes read in when it cannot be mapped (the same, slower)."""
    fd = _open_checked(path)
    try:
        size = os.fstat(fd).st_size
        try:
            return mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            with os.fdopen(os.dup(fd), "rb") as f:
                return f.read()
    finally:
        os.close(fd)


def probe(path: str) -> bytes:
    """What a node sees at the caller's probe path (a task the caller sends each node once)."""
    return bytes(_contents(path))


class MappedFile:
    """A "put" to a node on the caller's machine: the path of the caller's .npy file, and the
    transpose that gives the array its strides. Unpickling it opens nothing; the first task that
    needs the array maps it (array()), read-only, as joblib's default mmap_mode="r" gives loky's
    workers."""

    def __init__(self, path: str, axes):
        self.path, self.axes = path, list(axes)
        self._array = None

    def __getstate__(self):
        return {"path": self.path, "axes": self.axes}

    def __setstate__(self, state):
        self.path, self.axes, self._array = state["path"], state["axes"], None

    def array(self):
        if self._array is None:
            import numpy as np
            buf = _contents(self.path)
            head = io.BytesIO(buf[:_HEADER_MAX])
            version = np.lib.format.read_magic(head)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(head)
            stored = np.ndarray(shape, dtype, buffer=buf, offset=head.tell(), order="F" if fortran else "C")
            self._array = stored.transpose(self.axes)
        return self._array
