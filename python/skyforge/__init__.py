"""skyforge's Python side: the runtime API on a pool's nodes (docs/runtime-api.md, "From Python").

``instance_info()`` says where this process runs; ``shard()``, ``shard_indices()``,
``permutation()`` and ``DistributedSampler`` split data exactly as the C++ SDK
(``skyforge/data.hpp``) does, so a Python node and a native one agree index for index.
"""
from .data import DistributedSampler, Rng, permutation, shard, shard_indices
from .runtime import InstanceInfo, NotOnANode, instance_info


# What to pip install for a dependency of the pool API that is missing.
_PIP_NAMES = {"joblib": "'joblib>=1.2'", "cloudpickle": "cloudpickle"}


def __getattr__(name):
    # joblib and cloudpickle are needed only by the pool API: imported when that is used.
    try:
        if name in ("joblib_pool", "joblib_backend", "sklearn_pool", "SkyforgeBackend"):
            from . import _joblib_backend
            return getattr(_joblib_backend, name)
        if name in ("Pool", "PoolError", "RemoteTraceback", "WorkerLostError"):
            from . import _pool
            return getattr(_pool, name)
    except ModuleNotFoundError as e:
        if e.name not in _PIP_NAMES:
            raise
        import sys
        raise ModuleNotFoundError(f"skyforge.{name} needs {e.name}, which {sys.executable} does not have: "
                                  f"pip install {_PIP_NAMES[e.name]} (`pip install ./python` installs it)",
                                  name=e.name) from e
    raise AttributeError(f"module 'skyforge' has no attribute {name!r}")

__all__ = [
    "DistributedSampler",
    "InstanceInfo",
    "NotOnANode",
    "Rng",
    "instance_info",
    "permutation",
    "shard",
    "shard_indices",
    "joblib_pool",
    "joblib_backend",
    "sklearn_pool",
    "SkyforgeBackend",
    "Pool",
    "PoolError",
    "RemoteTraceback",
    "WorkerLostError",
]
__version__ = "0.1.0"
