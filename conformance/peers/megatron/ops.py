"""Pool operations of the Megatron-Core peer (``conformance/peers/megatron/adapter.py``): a real
``megatron.core.dist_checkpointing.save`` on one pool and ``load`` on another, with the
``torch_dist`` backend, through the file system. Registered in ``shardspec.testing.ops``'s
table when a pool imports this module, which ``conformance.OPS`` lists only while megatron is
the implementation under test (``SHARDSPEC_IMPL=megatron``): the default suite runs where
Megatron is not installed.

Each shard of the tensor (key ``t``) is an entry ``[rank, offsets, sizes, replica_id, cell]``
of ``args["entries"]``, the same list on every rank; a rank builds a Megatron
``ShardedTensor`` for each of its own entries, in order, from its input tensors. ``form``
says how, the three ways Megatron has:

- ``boxes``: the constructor with ``axis_fragmentations=None``, Megatron's form for uneven
  splits (global offset, local and global shape, as they are);
- ``rank_offsets``: ``ShardedTensor.from_rank_offsets(key, data, (dim, cell[dim], parts), ...)``
  for each split dim (``args["parts"]``), the form Megatron's own model code uses;
- ``grid``: the constructor with ``axis_fragmentations=parts``: the same grid, stated with the
  real global shape and offsets.

On a CPU-only torch Megatron's save still calls ``torch.cuda.synchronize()``
(``strategies/filesystem_async.py``) and ``torch.cuda.current_device()``
(``strategies/state_dict_saver.py``); ``shardspec.testing.peers.megatron_cpu_patch`` answers
those two, in those two modules only, when CUDA is absent (stated in the report's header).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from shardspec.testing.ops import Context, operation
from shardspec.testing.peers import megatron_cpu_patch

__all__: list[str] = []

KEY = "t"
FORMS = ("boxes", "rank_offsets", "grid")


def _mine(ctx: Context, args: dict[str, Any]) -> list[list[Any]]:
    return [e for e in args["entries"] if e[0] == ctx.rank]


def _check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    if args.get("form", "boxes") not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {args.get('form')!r}")
    if any(e[0] >= ctx.world for e in args["entries"]):
        raise ValueError(f"entries name ranks beyond the pool's {ctx.world}")
    mine = _mine(ctx, args)
    if len(ts) != len(mine) or any(list(t.shape) != list(e[2]) for t, e in zip(ts, mine)):
        shapes = [tuple(t.shape) for t in ts]
        raise ValueError(f"rank {ctx.rank}: tensors {shapes} for entries {mine}")


def _sharded(args: dict[str, Any], entry: list[Any], data: torch.Tensor) -> Any:
    """Megatron's ShardedTensor of one entry, in ``args["form"]``."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    _, offsets, sizes, replica_id, cell = entry
    form = args.get("form", "boxes")
    shape = tuple(args["shape"])
    if form == "rank_offsets":
        cuts = [(d, cell[d], p) for d, p in enumerate(args["parts"]) if p > 1]
        return ShardedTensor.from_rank_offsets(KEY, data, *cuts, replica_id=replica_id)
    fragments = tuple(args["parts"]) if form == "grid" else None
    return ShardedTensor(
        KEY,
        data,
        data.dtype,
        tuple(sizes),
        shape,
        tuple(offsets),
        fragments,
        replica_id=replica_id,
    )


def _state_dict(args: dict[str, Any], mine: list[list[Any]], ts: list[torch.Tensor]) -> Any:
    return {f"{KEY}.{i}": _sharded(args, e, t) for i, (e, t) in enumerate(zip(mine, ts))}


@operation("megatron.save", collective=True, check=_check)
def _save(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``dist_checkpointing.save`` of this rank's entries to ``path`` (torch_dist)."""
    from megatron.core import dist_checkpointing

    megatron_cpu_patch()
    state_dict = _state_dict(args, _mine(ctx, args), [t.contiguous() for t in ts])
    dist_checkpointing.save(state_dict, args["path"])
    return {"files": sorted(os.listdir(args["path"]))}, []


@operation("megatron.load", collective=True, check=_check)
def _load(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``dist_checkpointing.load`` from ``path`` into this rank's entries, whose tensors
    ``ts`` arrive filled (so an element no read reaches shows); returns what the load gave
    for each entry, in order."""
    from megatron.core import dist_checkpointing

    megatron_cpu_patch()
    mine = _mine(ctx, args)
    loaded = dist_checkpointing.load(_state_dict(args, mine, list(ts)), args["path"])
    return None, [loaded[f"{KEY}.{i}"] for i in range(len(mine))]
