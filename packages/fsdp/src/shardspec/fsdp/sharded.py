"""ShardedTensors whose global metadata is a layout of ours: every box at its rule's offset,
owned by the global rank that really holds it.

torch's builders do not (FSDP-6): ``_chunk_tensor`` states uneven TP shards at floor
offsets and names a scapegoat owner for every shard but its own, ``_create_chunk_sharded_tensor``
drops empty chunks. The hooks, the flattening and the conversions of this package build their
ShardedTensors here instead. Nothing here communicates.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor.api import ShardedTensor
from torch.distributed._shard.sharded_tensor.shard import Shard as STShard
from torch.distributed.device_mesh import DeviceMesh

from shardspec.metadata import Box, ConversionError, Layout, Shard
from shardspec.metadata.placements import Placement
from shardspec.metadata.shard_metadata import to_sharded_tensor_metadata

from .mesh import fsdp_chunk_layout, mesh_fsdp_layout, ranks_along

__all__ = [
    "FSDP_DIM_ATTR",
    "LAYOUT_ATTR",
    "chunk_sharded_tensor",
    "flat_sharded_tensor",
    "make_sharded_tensor",
    "one_owner_per_box",
]

# The attribute on an outer (TP) ShardedTensor that carries the 2-D layout with every owner's
# global rank; flatten_sharded_tensors reads it.
LAYOUT_ATTR = "_shardspec_layout"
# On a flat ShardedTensor that chunk_dtensor returns instead of a DTensor: the root mesh dim
# FSDP shards over, which all_gather_dtensor needs to reassemble the TP piece.
FSDP_DIM_ATTR = "_shardspec_fsdp_mesh_dim"


def make_sharded_tensor(
    layout: Layout,
    my_rank: int,
    local: list[tuple[Box, torch.Tensor]],
    like: torch.Tensor,
    pg: Any,
) -> ShardedTensor:
    """A ShardedTensor whose global metadata is ``layout`` (owners are global ranks) and whose
    local shards are ``local`` (this rank's boxes with their data)."""
    device = str(like.device)
    md = to_sharded_tensor_metadata(layout, like.dtype, device=device)
    shards = [
        STShard(
            tensor=t.contiguous(),
            metadata=ShardMetadata(
                shard_offsets=list(b.offsets),
                shard_sizes=list(b.sizes),
                placement=f"rank:{my_rank}/{device}",
            ),
        )
        for b, t in local
    ]
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        shards, sharded_tensor_metadata=md, process_group=pg, init_rrefs=False
    )


def one_owner_per_box(layout: Layout, me: int, group: set[int]) -> Layout:
    """The layout with one owner per distinct box (replicas from TP Replicate or HSDP):
    ``me`` if it holds the box, else a rank of ``group``, else the lowest; ShardedTensor
    metadata cannot state replicas."""

    def preference(rank: int) -> tuple[int, int]:
        return (0 if rank == me else 1 if rank in group else 2, rank)

    chosen: dict[Box, int] = {}
    for s in layout.shards:
        if s.box not in chosen or preference(s.rank) < preference(chosen[s.box]):
            chosen[s.box] = s.rank
    return Layout(layout.shape, [Shard(b, r) for b, r in chosen.items()])


def chunk_sharded_tensor(
    tensor: torch.Tensor, rank: int, fsdp_ranks: list[int], pg: Any
) -> ShardedTensor:
    """FSDP's dim-0 chunk of a plain tensor as a ShardedTensor over FSDP's group: every chunk
    listed (empty ones at offset n, CHUNK-2), each owned by its real global rank."""
    if tensor.dim() == 0:
        raise ConversionError("FSDP cannot chunk a 0-d tensor (torch.chunk needs a dim)")
    layout = fsdp_chunk_layout(tuple(tensor.shape), tuple(fsdp_ranks))
    (box,) = layout.boxes_of(fsdp_ranks[rank])
    mine = tensor[box.slices()].clone()
    return make_sharded_tensor(layout, fsdp_ranks[rank], [(box, mine)], tensor, pg)


def flat_sharded_tensor(
    shape: tuple[int, ...],
    tp: Placement,
    tp_dim: int | None,
    shard_dim: int,
    root: DeviceMesh,
    mine: torch.Tensor,
) -> ShardedTensor:
    """This rank's FSDP chunk ``mine`` of its TP piece as a flat ShardedTensor over the world
    with FSDP-1's boxes on ``root``, for where no DTensor placements are exact (FSDP-5).
    It carries ``shard_dim`` (:data:`FSDP_DIM_ATTR`) for the gather back."""
    ranks = [int(r) for r in root.mesh.reshape(-1).tolist()]
    layout = mesh_fsdp_layout(
        shape, tp, tuple(root.mesh.shape), ranks, tp_dim=tp_dim, shard_dim=shard_dim
    )
    me = dist.get_rank()
    group = {int(r) for r in ranks_along(root, shard_dim)}
    (my_box,) = layout.boxes_of(me)
    st = make_sharded_tensor(one_owner_per_box(layout, me, group), me, [(my_box, mine)], mine, None)
    setattr(st, FSDP_DIM_ATTR, shard_dim)
    return st
