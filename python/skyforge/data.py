"""Deterministic data partitioning, the same as the C++ SDK's skyforge/data.hpp, index for index.

The permutation comes from a specified generator — xoshiro256** seeded through SplitMix64,
an unbiased bounded draw (Lemire's multiply-shift with rejection) and a Fisher-Yates shuffle —
so a (n, seed) gives the same order here, in a native app on another node, and in every
release (tests/python checks this module against the C++ implementation).
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional, Sequence, Tuple, Union

import numpy as np

from .runtime import instance_info

_MASK = (1 << 64) - 1


def _splitmix64(state: int) -> Tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & _MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return state, z ^ (z >> 31)


def _xoshiro256ss(seed: int) -> Iterator[int]:
    """The outputs of xoshiro256** seeded through SplitMix64, endlessly (state in locals: fast)."""
    state = int(seed) & _MASK
    words = []
    for _ in range(4):
        state, word = _splitmix64(state)
        words.append(word)
    s0, s1, s2, s3 = words
    while True:
        x = (s1 * 5) & _MASK
        result = ((((x << 7) | (x >> 57)) & _MASK) * 9) & _MASK
        t = (s1 << 17) & _MASK
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = ((s3 << 45) | (s3 >> 19)) & _MASK
        yield result


def _bounded(draws: Iterator[int], bounds: Iterable[int]) -> Iterator[int]:
    """For each bound, a draw uniform in [0, bound), unbiased (Lemire's multiply-shift with rejection)."""
    for bound in bounds:
        m = next(draws) * bound
        if (m & _MASK) < bound:
            threshold = ((1 << 64) - bound) % bound
            while (m & _MASK) < threshold:
                m = next(draws) * bound
        yield m >> 64


class Rng:
    """xoshiro256** seeded through SplitMix64 (Blackman & Vigna), as skyforge::Rng."""

    def __init__(self, seed: int):
        self._draws = _xoshiro256ss(seed)

    def next(self) -> int:
        return next(self._draws)

    def below(self, bound: int) -> int:
        """Uniform in [0, bound), unbiased (Lemire's multiply-shift with rejection)."""
        if bound <= 0:
            raise ValueError("Rng.below: bound must be > 0")
        return next(_bounded(self._draws, (bound,)))


def permutation(n: int, shuffle: bool = True, seed: int = 0) -> np.ndarray:
    """[0, n) as int64, permuted by Fisher-Yates from `seed` when shuffle is set."""
    n = int(n)
    if n < 0:
        raise ValueError(f"permutation: n must be >= 0, got {n}")
    idx = list(range(n))
    if shuffle and n > 1:
        # Generators, not method calls, per swap: this loop is the whole cost of a shuffle.
        for i, j in zip(range(n - 1, 0, -1), _bounded(_xoshiro256ss(seed), range(n, 1, -1))):
            idx[i], idx[j] = idx[j], idx[i]
    return np.asarray(idx, dtype=np.int64)


def _where(node: Optional[int], total: Optional[int], who: str = "shard", node_name: str = "node",
           total_name: str = "total_nodes") -> Tuple[int, int]:
    """(node, total), instance_info()'s where not given, checked; errors say `who` and the argument names."""
    if node is None or total is None:
        info = instance_info()
        node = info.node if node is None else node
        total = info.total_nodes if total is None else total
    if total < 1:
        raise ValueError(f"{who}: {total_name} must be >= 1")
    if not 0 <= node < total:
        raise ValueError(f"{who}: {node_name} {node} is not below {total_name} {total}")
    return int(node), int(total)


def _bounds(n: int, node: int, total: int) -> Tuple[int, int]:
    base, extra = divmod(n, total)
    begin = node * base + min(node, extra)
    return begin, begin + base + (1 if node < extra else 0)


def shard_indices(n: int, node: Optional[int] = None, total_nodes: Optional[int] = None,
                  shuffle: bool = False, seed: int = 0) -> np.ndarray:
    """This node's indices of [0, n): its contiguous slice of permutation(n, shuffle, seed).

    The first n % total_nodes nodes get one more; the parts are disjoint and cover [0, n).
    node and total_nodes default to this process's instance_info().
    """
    node, total_nodes = _where(node, total_nodes)
    begin, end = _bounds(int(n), node, total_nodes)
    if not shuffle:
        return np.arange(begin, end, dtype=np.int64)
    return permutation(n, True, seed)[begin:end]


def _rows(a: Any, idx: np.ndarray, window: Optional[Tuple[int, int]]) -> Any:
    if isinstance(a, np.ndarray) or hasattr(a, "__array__") and hasattr(a, "shape"):
        arr = np.asarray(a)
        return arr[window[0]:window[1]] if window is not None else arr[idx]
    if window is not None:
        return a[window[0]:window[1]]
    return [a[int(i)] for i in idx]


def shard(*arrays: Any, shuffle: bool = False, seed: int = 0, node: Optional[int] = None,
          total_nodes: Optional[int] = None) -> Union[np.ndarray, Any, Tuple[Any, ...]]:
    """This node's rows of each array (row i of every array lands on the same node).

    shard(x, y, shuffle=True, seed=42) -> (x_mine, y_mine); shard(x) -> x_mine;
    shard(n) with an int -> shard_indices(n, ...). Without shuffle a NumPy array's part is a
    view (a slice); with shuffle, a copy in the permuted order. Lists give lists.
    """
    if not arrays:
        raise TypeError("shard: pass at least one array (or an int n)")
    if len(arrays) == 1 and isinstance(arrays[0], (int, np.integer)):
        return shard_indices(int(arrays[0]), node, total_nodes, shuffle, seed)
    lengths = [len(a) for a in arrays]
    if any(length != lengths[0] for length in lengths):
        raise ValueError(f"shard: arrays differ in length ({lengths[0]} vs "
                         f"{next(x for x in lengths if x != lengths[0])})")
    node, total_nodes = _where(node, total_nodes)
    if shuffle:
        idx = shard_indices(lengths[0], node, total_nodes, True, seed)
        window = None
    else:
        window = _bounds(lengths[0], node, total_nodes)
        idx = np.arange(*window, dtype=np.int64)
    parts = tuple(_rows(a, idx, window) for a in arrays)
    return parts[0] if len(parts) == 1 else parts


class DistributedSampler:
    """PyTorch's DistributedSampler semantics, deterministically (as skyforge::DistributedSampler).

    Each epoch's order is permutation(size, shuffle, seed + epoch); without drop_last the list
    is padded cyclically from its start to num_replicas * ceil(size / num_replicas), with it the
    tail is dropped to num_replicas * floor(size / num_replicas); rank r takes positions
    r, r + num_replicas, ... `dataset` is a size or anything with len(); num_replicas and rank
    default to this node's total_nodes and node.
    """

    def __init__(self, dataset: Union[int, Sequence[Any]], num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        size = int(dataset) if isinstance(dataset, (int, np.integer)) else len(dataset)
        self.rank, self.num_replicas = _where(rank, num_replicas, "DistributedSampler", "rank", "num_replicas")
        self.size = size
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.num_samples = size // self.num_replicas if drop_last else -(-size // self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def indices(self) -> np.ndarray:
        order = permutation(self.size, self.shuffle, (self.seed + self.epoch) & _MASK)
        if len(order) > self.total_size:
            order = order[: self.total_size]
        elif len(order) and len(order) < self.total_size:
            order = np.resize(order, self.total_size)  # cyclic repetition from the start
        return order[self.rank:: self.num_replicas]

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples
