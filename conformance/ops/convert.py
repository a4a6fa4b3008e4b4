"""Pool operations of the converters area (spec/04-convert.md) and of FSDP's chunking helpers,
registered in ``shardspec.testing.ops``'s table when a pool imports this module (listed in
:data:`conformance.OPS`).

Every operation takes ``via`` (``"shardspec"`` or ``"torch"``) and runs that implementation's
code on the rank; the driver compares what comes back with the reference. Metadata travels as
the layout JSON form, unvalidated: judging it is the test's job.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from conformance.codec import layout_from_json, layout_to_json, placements_from_json
from conformance.ops.shared import (
    dtensor_check,
    from_wire,
    layout_check,
    sharded_tensor_of,
    to_wire,
    via_of,
)
from shardspec.metadata import Box, Layout, Shard
from shardspec.testing.ops import Context, operation

__all__: list[str] = []


def _metadata_layout(md: Any) -> Any:
    """The JSON layout of a ``ShardedTensorMetadata`` exactly as torch wrote it (past-the-end
    boxes included; a placement without a rank would be a bug of the op, not of torch)."""
    shards = [
        Shard(Box(m.shard_offsets, m.shard_sizes), m.placement.rank()) for m in md.shards_metadata
    ]
    return layout_to_json(Layout(tuple(md.size), shards))


def _boxes(items: Any) -> list[list[list[int]]]:
    return [[list(c.offsets), list(c.sizes)] for c in items]


def _shard_boxes(st: Any) -> list[list[list[int]]]:
    return [
        [list(s.metadata.shard_offsets), list(s.metadata.shard_sizes)] for s in st.local_shards()
    ]


# -- ShardedTensor from a layout (CONVERT-1, CONVERT-2, CONVERT-7) ------------------------
@operation("convert.sharded_tensor", collective=True, check=layout_check)
def _sharded_tensor(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """A real ShardedTensor holding this rank's boxes of ``layout``: from our
    ``to_sharded_tensor_metadata`` (no communication), or from torch's
    ``init_from_local_shards``, which gathers every rank's shard metadata. Returns the global
    metadata, the local shards' boxes, the DCP chunks of this rank (``to_chunk_list``, or the
    chunks of DCP's ``_create_write_items``) and the local data."""
    layout = layout_from_json(args["layout"])
    st = sharded_tensor_of(ctx, layout, getattr(torch, args["dtype"]), ts, via_of(args))
    if via_of(args) == "shardspec":
        from shardspec.metadata import to_chunk_list

        chunks = to_chunk_list(layout, ctx.rank)
    else:
        from torch.distributed.checkpoint.planner_helpers import _create_write_items

        # what DCP's save planner writes for this rank's part of the ShardedTensor
        chunks = [w.tensor_data.chunk for w in _create_write_items("t", st)]  # type: ignore[union-attr]
    value = {
        "layout": _metadata_layout(st.metadata()),
        "local": _shard_boxes(st),
        "chunks": _boxes(chunks),
    }
    return value, [s.tensor for s in st.local_shards()]


# -- DTensor: DCP chunk list and from_dtensor (CONVERT-7, DTENSOR-9) ----------------------
@operation("convert.dtensor", collective=True, check=dtensor_check)
def _dtensor(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """A real DTensor; its DCP chunk list (``__create_chunk_list__`` for torch,
    ``to_chunk_list(from_dtensor(dt), rank)`` for shardspec) and, for shardspec, the layout
    ``from_dtensor`` reads."""
    from torch.distributed.tensor import distribute_tensor

    mesh = ctx.mesh(tuple(args["mesh"]))
    src = 0 if args.get("scatter", True) else None
    dt = distribute_tensor(
        to_wire(ctx, ts[0]), mesh, placements_from_json(args["placements"]), src_data_rank=src
    )
    local = from_wire(dt.to_local(), ts[0].dtype)
    value: dict[str, Any] = {"coordinate": mesh.get_coordinate()}
    if via_of(args) == "shardspec":
        from shardspec.metadata import from_dtensor, to_chunk_list

        layout = from_dtensor(dt)
        value["layout"] = layout_to_json(layout)
        value["chunks"] = _boxes(to_chunk_list(layout, ctx.rank))
    else:
        value["chunks"] = _boxes(dt.__create_chunk_list__())  # type: ignore[no-untyped-call]
    return value, [local]


# -- FSDP's dim-0 chunking of a state-dict tensor (FSDP-6, CHUNK-2, CHUNK-3) ---------------
def _fsdp_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    via_of(args)
    if len(ts) != 1 or ts[0].dim() < 1:
        raise ValueError("FSDP chunking takes one tensor of at least one dim")


def _chunk_fn(args: dict[str, Any]) -> Any:
    # torch.distributed.fsdp first: importing tensor.parallel.fsdp alone is a circular import
    import torch.distributed.fsdp  # noqa: F401

    if via_of(args) == "shardspec":
        from shardspec.fsdp import DTensorExtensions

        return DTensorExtensions().chunk_tensor
    from torch.distributed.tensor.parallel.fsdp import _chunk_tensor

    return _chunk_tensor


@operation("fsdp.chunk_sharded_tensor", collective=True, check=_fsdp_check)
def _fsdp_chunk_plain(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """FSDP's ShardedTensor of a plain tensor's dim-0 chunks over the whole group
    (torch: ``fsdp/_shard_utils.py`` ``_create_chunk_sharded_tensor``)."""
    group = dist.group.WORLD
    assert group is not None  # the worker has initialised the default group
    if via_of(args) == "torch":
        import torch.distributed.fsdp  # noqa: F401
        from torch.distributed.fsdp._shard_utils import _create_chunk_sharded_tensor

        st = _create_chunk_sharded_tensor(ts[0], ctx.rank, ctx.world, 1, group)
    else:
        st = _chunk_fn(args)(ts[0], ctx.rank, ctx.world, 1, group)
    value = {"layout": _metadata_layout(st.metadata()), "local": _shard_boxes(st)}
    return value, [s.tensor for s in st.local_shards()]


def _own_group(ctx: Context) -> Any:
    """A process group of this rank alone (creating groups is collective: every rank creates
    every rank's group, in the same order)."""
    # kept on the context: a launched rank's process group is formed again per world size
    if "own_group" not in ctx.cache:
        groups = [dist.new_group([r]) for r in range(ctx.world)]
        ctx.cache["own_group"] = groups[ctx.rank]
    return ctx.cache["own_group"]


@operation("fsdp.chunk_dtensor", collective=True, check=_fsdp_check)
def _fsdp_chunk_dtensor(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """FSDP1 + TP's ``chunk_tensor`` hook on a DTensor ``Shard(0)`` over a 1-D mesh of the
    whole group (torch: ``tensor/parallel/fsdp.py`` ``_chunk_tensor``): the outer
    ShardedTensor's metadata (TP boxes) and the inner one's (FSDP chunks of the TP piece)."""
    from torch.distributed.tensor import Shard as DShard, distribute_tensor

    mesh = ctx.mesh((ctx.world,))
    dt = distribute_tensor(to_wire(ctx, ts[0]), mesh, [DShard(0)])
    # A (dp=1, tp=W) mesh: TP over every rank, FSDP over a group of this rank alone.
    outer = _chunk_fn(args)(dt, 0, 1, 1, _own_group(ctx))
    (shard,) = outer.local_shards()
    inner = shard.tensor
    value = {
        "outer": _metadata_layout(outer.metadata()),
        "outer_local": [list(shard.metadata.shard_offsets), list(shard.metadata.shard_sizes)],
        "inner": _metadata_layout(inner.metadata()),
        "inner_local": _shard_boxes(inner),
    }
    return value, [from_wire(s.tensor, ts[0].dtype) for s in inner.local_shards()]
