"""Flatten FSDP1 + TP's nested ShardedTensors into one ShardedTensor per parameter (FSDP-8).

A SHARDED_STATE_DICT entry of a TP parameter is an outer ShardedTensor (TP boxes, over the TP
group) whose one local shard is an inner ShardedTensor (FSDP chunks of the TP piece, over
FSDP's group). The flat ShardedTensor has the 2-D layout of FSDP-1: this rank's box is outer
offset + inner box, and the global metadata lists every rank's box with its real owner.

Unlike torch's ``_flatten_sharded_tensors`` (checkpoint/_sharded_tensor_utils.py), a tensor with
no local shard on this rank is kept (its rank holds an empty box), and no shard is attributed
to a stand-in rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor.api import ShardedTensor

from shardspec.metadata import Box, ConversionError, Layout, Shard, chunk_bounds
from shardspec.metadata.shard_metadata import from_sharded_tensor_metadata

from .rules import canonical_box
from .sharded import LAYOUT_ATTR, make_sharded_tensor, one_owner_per_box

__all__ = ["flat_layout", "flatten_sharded_tensors", "layout_of"]


def layout_of(st: ShardedTensor) -> Layout:
    """The layout a ShardedTensor's global metadata states (not validated)."""
    return from_sharded_tensor_metadata(st.metadata(), validate=False)


def flatten_sharded_tensors(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``state_dict`` (nested dicts and lists included) with every nested
    ShardedTensor replaced by its flat equivalent; everything else is kept as is, including
    ShardedTensors with no local shard here."""
    return _walk(state_dict)  # type: ignore[no-any-return]


def _walk(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _walk(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_walk(v) for v in value)
    if type(value) is ShardedTensor:
        shards = value.local_shards()
        if len(shards) == 1 and type(shards[0].tensor) is ShardedTensor:
            return _flatten_one(value)
    return value


def flat_layout(st: ShardedTensor) -> Layout:
    """The 2-D layout of a nested ShardedTensor, every box with its owner's global rank.

    Read from the layout our ``chunk_tensor`` attached when it built ``st``; otherwise built
    from the outer metadata (TP boxes and owners) and the inner ShardedTensor's process group
    (FSDP chunks every TP box along dim 0 over that group, FSDP-1), which needs the mesh to be
    a grid whose ranks add up (rank(t, p) = rank(t, mine) + rank(mine, p) - mine, true of every
    ``init_device_mesh`` mesh); ConversionError when the owners it finds are not distinct.
    """
    attached = getattr(st, LAYOUT_ATTR, None)
    if isinstance(attached, Layout):
        return attached
    me = dist.get_rank()
    inner: Any = st.local_shards()[0].tensor
    shape = tuple(st.size())
    if not shape:
        raise ConversionError("a 0-d tensor cannot be FSDP-chunked")
    fsdp_ranks = dist.get_process_group_ranks(inner._process_group)
    k = len(fsdp_ranks)
    out: list[Shard] = []
    for omd in st.metadata().shards_metadata:
        o_rank = _rank(omd)
        o_box = Box(omd.shard_offsets, omd.shard_sizes)
        base = o_box.offsets[0] if o_box.sizes[0] else 0
        for p, (lo, hi) in enumerate(chunk_bounds(o_box.sizes[0], k)):
            offs = (base + lo, *o_box.offsets[1:])
            sizes = (hi - lo, *o_box.sizes[1:])
            out.append(Shard(canonical_box(shape, offs, sizes), o_rank + fsdp_ranks[p] - me))
    layout = Layout(shape, out)
    owners = [s.rank for s in layout.shards]
    if len(set(owners)) != len(owners) or me not in owners:
        raise ConversionError(
            f"rank {me}: the TP owners and the FSDP group {fsdp_ranks} do not form a grid mesh "
            f"(inferred owners {owners}); flatten a ShardedTensor built by shardspec.fsdp"
        )
    return layout


def _rank(md: ShardMetadata) -> int:
    placement = md.placement
    rank = placement.rank() if placement is not None else None
    if rank is None:
        raise ConversionError(f"shard {md} has no rank in its placement")
    return int(rank)


def _flatten_one(st: ShardedTensor) -> ShardedTensor:
    me = dist.get_rank()
    outer_shard = st.local_shards()[0]
    inner: Any = outer_shard.tensor
    shape = tuple(st.size())
    layout = flat_layout(st)
    inner_local = inner.local_shards()
    if len(inner_local) > 1:
        raise ConversionError(
            f"rank {me}: the inner ShardedTensor has {len(inner_local)} local shards; FSDP "
            "gives each rank one chunk"
        )
    mine = layout.boxes_of(me)
    if len(mine) != 1:
        raise ConversionError(f"rank {me} owns {len(mine)} boxes of {shape} in {layout}")
    (my_box,) = mine
    # torch's own chunking lists no shard for a rank past the data: its chunk is empty.
    data = inner_local[0].tensor if inner_local else torch.empty(my_box.sizes, dtype=st.dtype)
    if tuple(data.shape) != my_box.sizes:
        raise ConversionError(
            f"rank {me}: local chunk of shape {tuple(data.shape)} does not fit its box {my_box}"
        )
    # One owner per distinct box; the same choice flat_layout's inference makes, so both paths
    # give one layout.
    group = set(dist.get_process_group_ranks(inner._process_group))
    flat = one_owner_per_box(layout, me, group)
    return make_sharded_tensor(flat, me, [(my_box, data)], data, None)
