"""Rank functions for test_rank_functions.py (the pool itself)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist


class NotAnException(BaseException):
    """Like DCP's CheckpointException: a BaseException that is not an Exception."""


def all_reduce_rank(rank: int, world: int, extra: int = 0) -> tuple[int, int, float]:
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return rank, world + extra, t.item()


def environment(rank: int, world: int, name: str) -> str | None:
    return os.environ.get(name)


def raise_on(rank: int, world: int, bad: int, base: bool) -> int:
    if rank == bad:
        raise (NotAnException if base else ValueError)(f"bad rank {rank}")
    return rank


def raise_then_collective(rank: int, world: int) -> int:
    # Rank 0 fails before a collective the others enter: without a grace period they hang.
    if rank == 0:
        raise ValueError("rank 0 never joins")
    dist.barrier()
    return rank


def exit_on(rank: int, world: int, bad: int) -> int:
    if rank == bad:
        os._exit(3)
    return rank


def sleep(rank: int, world: int, seconds: float) -> int:
    time.sleep(seconds)
    return rank


def pid(rank: int, world: int) -> int:
    return os.getpid()


def unsendable(rank: int, world: int) -> Any:
    return lambda: rank


def round_trip(rank: int, world: int, value: Any) -> Any:
    return value


def uneven_all_to_all(rank: int, world: int) -> list[float]:
    # rank r sends (r + d) % 3 elements to rank d, valued 1000 r + d
    send = [(rank + d) % 3 for d in range(world)]
    recv = [(s + rank) % 3 for s in range(world)]
    src = torch.cat([torch.full((n,), 1000.0 * rank + d) for d, n in enumerate(send)])
    out = torch.empty(sum(recv))
    dist.all_to_all_single(out, src, recv, send)
    return out.tolist()


def hang_on(rank: int, world: int, bad: int) -> int:
    if rank == bad:
        dist.barrier()  # the others never join: stuck in the collective
    return rank


def group_device(rank: int, world: int) -> str:
    """The device torch's own code asks a group for (FSDP's chunk_tensor does)."""
    import torch.distributed as dist

    return str(dist.distributed_c10d._get_pg_default_device(dist.group.WORLD))


def empty_sharded_tensor_device(rank: int, world: int) -> str:
    """The device of a ShardedTensor whose one shard lies on rank 0 (dcp.load asks every rank
    for it): the other ranks hold no shard and ask the group's backend."""
    import warnings

    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed._shard.sharded_tensor.shard import Shard
    from torch.distributed._shard.sharding_spec import ShardMetadata

    local = [Shard(torch.zeros(2), ShardMetadata([0], [2], "rank:0/cpu"))] if rank == 0 else []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # ShardedTensor's deprecation
        st = ShardedTensor._init_from_local_shards(local, 2, process_group=dist.group.WORLD)
    return str(st.device)


def group_recorded(rank: int, world: int) -> list[bool]:
    """[does this torch attach flight recorders to groups, is this rank's default group
    recorded]: torch 2.15's init_process_group records every group that answers a device."""
    import torch.distributed as dist

    hooks = getattr(dist.distributed_c10d._world, "pg_flight_recorder_hooks", None)
    return [hooks is not None, hooks is not None and dist.group.WORLD in hooks]


def process_facts(rank: int, world: int) -> list[Any]:
    """The rank's pid, parent pid, process group and working directory."""
    return [os.getpid(), os.getppid(), os.getpgid(0), os.getcwd()]
