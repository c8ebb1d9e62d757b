"""Where this process runs: the node's identity as skyforge-worker gives it to a command app.

The worker sets these variables in the environment of every command it starts (and of the
processes that command starts); ``instance_info()`` reads them, as the C++ SDK's
``instance_info()`` reads the same values from the host.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional


class NotOnANode(RuntimeError):
    """Raised by instance_info() outside a skyforge pool (no SKYFORGE_NODE in the environment)."""


@dataclass(frozen=True)
class InstanceInfo:
    node: int
    total_nodes: int
    is_head: bool
    head_addr: str
    private_ip: str
    local_rank: int
    local_world_size: int
    accelerators: int
    accelerator: str
    concurrency: int
    pool_id: str
    work_dir: str
    # $SKYFORGE_OUTPUT_DIR: what is in it when the job ends comes back to the client
    # (docs/manifest.md, "Getting files back"); "" outside a job that has one.
    output_dir: str = ""


def _int(env: Mapping[str, str], key: str, default: Optional[int] = None) -> int:
    text = env.get(key)
    if text is None or text == "":
        if default is None:
            raise NotOnANode(f"${key} is not set: this process was not started by skyforge-worker")
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"${key}: expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise ValueError(f"${key}: expected a non-negative integer, got {text!r}")
    return value


def instance_info(environ: Optional[Mapping[str, str]] = None) -> InstanceInfo:
    """This node's identity in its pool. Raises NotOnANode outside a pool."""
    env = os.environ if environ is None else environ
    if "SKYFORGE_NODE" not in env:
        raise NotOnANode(
            "not on a skyforge node: $SKYFORGE_NODE is not set "
            "(instance_info() works in a command that `skyforge run` started)"
        )
    node = _int(env, "SKYFORGE_NODE")
    total = _int(env, "SKYFORGE_TOTAL_NODES")
    if total < 1 or node >= total:
        raise ValueError(f"$SKYFORGE_NODE={node} is not below $SKYFORGE_TOTAL_NODES={total}")
    return InstanceInfo(
        node=node,
        total_nodes=total,
        is_head=node == 0,
        head_addr=env.get("SKYFORGE_HEAD_ADDR", ""),
        private_ip=env.get("SKYFORGE_PRIVATE_IP", ""),
        local_rank=_int(env, "SKYFORGE_LOCAL_RANK", 0),
        local_world_size=_int(env, "SKYFORGE_LOCAL_WORLD_SIZE", 1),
        accelerators=_int(env, "SKYFORGE_ACCELERATORS", 0),
        accelerator=env.get("SKYFORGE_ACCELERATOR", ""),
        concurrency=_int(env, "SKYFORGE_CONCURRENCY", 1),
        pool_id=env.get("SKYFORGE_POOL_ID", ""),
        work_dir=env.get("SKYFORGE_WORK_DIR", ""),
        output_dir=env.get("SKYFORGE_OUTPUT_DIR", ""),
    )
