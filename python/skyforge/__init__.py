"""skyforge's Python side: the runtime API on a pool's nodes (docs/runtime-api.md, "From Python").

``instance_info()`` says where this process runs; ``shard()``, ``shard_indices()``,
``permutation()`` and ``DistributedSampler`` split data exactly as the C++ SDK
(``skyforge/data.hpp``) does, so a Python node and a native one agree index for index.
"""
from .data import DistributedSampler, Rng, permutation, shard, shard_indices
from .runtime import InstanceInfo, NotOnANode, instance_info

__all__ = [
    "DistributedSampler",
    "InstanceInfo",
    "NotOnANode",
    "Rng",
    "instance_info",
    "permutation",
    "shard",
    "shard_indices",
]
__version__ = "0.1.0"
