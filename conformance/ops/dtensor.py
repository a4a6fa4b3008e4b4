"""Pool operations of the DTensor area (spec/03-dtensor.md) and FSDP's ``_get_local_box``:
``distribute_tensor``, ``redistribute`` and ``from_local`` by torch or shardspec on the
pool's mesh.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.ops.shared import (
    dtensor_check,
    dtensor_mesh,
    from_wire,
    to_wire,
    via_of,
)
from shardspec.testing.ops import Context, operation

__all__: list[str] = []


# -- DTensor ------------------------------------------------------------------------------
@operation("dtensor.distribute", collective=True, check=dtensor_check)
def _distribute(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``distribute_tensor`` (``via`` torch, the default) or shardspec's
    ``distribute_dtensor``: this rank's local tensor and mesh coordinate."""
    from torch.distributed.tensor import distribute_tensor

    from conformance.codec import placements_from_json

    mesh = dtensor_mesh(ctx, args)
    placements = placements_from_json(args["placements"])
    # src_data_rank=None: every rank splits its own copy, no scatter. Used for _StridedShard,
    # whose scatter path asserts on zero-size and some uneven tensors in torch 2.13 (its padded
    # split gives pieces of different shapes); the placement logic is the same either way.
    src = 0 if args.get("scatter", True) else None
    if via_of(args, "torch") == "shardspec":
        from shardspec.reshard.dtensor_io import distribute_dtensor

        dt = distribute_dtensor(ts[0], mesh, placements, src_rank=src)
        local = dt.to_local()
    else:
        dt = distribute_tensor(to_wire(ctx, ts[0]), mesh, placements, src_data_rank=src)
        local = from_wire(dt.to_local(), ts[0].dtype)
    return {"coordinate": mesh.get_coordinate(), "stride": list(local.stride())}, [local]


def _redistribute_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    dtensor_check(ctx, args, ts)
    dtensor_check(ctx, {**args, "placements": args["dst"]}, ts)
    via_of(args, "torch")


@operation("dtensor.redistribute", collective=True, check=_redistribute_check)
def _redistribute(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """Every rank slices its own source piece (``placements``, no scatter: that is
    ``dtensor.distribute``'s question), then ``redistribute`` to ``dst`` and ``full_tensor``
    (``via`` torch) or shardspec's ``reshard_dtensor`` to ``dst`` and to all-Replicate: the
    local tensor after the move and the full tensor."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    from conformance.codec import placements_from_json

    mesh = dtensor_mesh(ctx, args)
    dst = placements_from_json(args["dst"])
    dt = distribute_tensor(
        to_wire(ctx, ts[0]), mesh, placements_from_json(args["placements"]), src_data_rank=None
    )
    if via_of(args, "torch") == "shardspec":
        from shardspec.reshard.frontends import reshard_dtensor

        moved = reshard_dtensor(dt, mesh, dst).to_local()
        full = reshard_dtensor(dt, mesh, [Replicate()] * mesh.ndim).to_local()
    else:
        moved = dt.redistribute(mesh, dst).to_local()
        full = dt.full_tensor()
    dtype = ts[0].dtype
    return {"coordinate": mesh.get_coordinate()}, [
        from_wire(moved.contiguous(), dtype),
        from_wire(full.contiguous(), dtype),
    ]


def _from_local_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    from conformance.codec import placements_from_json

    via_of(args, "torch")
    if len(ts) != 1:
        raise ValueError("dtensor.from_local takes this rank's local tensor as its one input")
    mesh = tuple(args["mesh"])
    if len(placements_from_json(args["placements"])) != len(mesh):
        raise ValueError(f"{len(args['placements'])} placements for a {len(mesh)}-d mesh")
    if len(args["shape"]) != ts[0].ndim:
        raise ValueError(f"shape {args['shape']} for a {ts[0].ndim}-d local tensor")


@operation("dtensor.from_local", collective=True, check=_from_local_check)
def _from_local(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``DTensor.from_local(local, mesh, placements, run_check=True, shape=...)`` (``via``
    torch) or shardspec's ``dtensor_from_local``: the error it raised (on this rank), or the
    boxes its DTensor states for this rank, read with torch's own
    ``compute_local_shape_and_global_offset`` (what DCP saves)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from conformance.codec import placements_from_json

    mesh = dtensor_mesh(ctx, args)
    placements = placements_from_json(args["placements"])
    shape = tuple(args["shape"])
    try:
        if via_of(args, "torch") == "shardspec":
            from shardspec.reshard.dtensor_io import dtensor_from_local

            dt = dtensor_from_local(ts[0], mesh, placements, shape)
        else:
            stride = torch.empty(shape, device="meta").stride()
            dt = DTensor.from_local(
                to_wire(ctx, ts[0]),
                mesh,
                placements,
                run_check=True,
                shape=torch.Size(shape),
                stride=stride,
            )
    except Exception as e:  # the verdict of a refusal is the error itself
        dist.barrier()  # a rank that refused alone must not leave the others in a collective
        return {"error": f"{type(e).__name__}: {e}"}, []
    local_shape, offset = compute_local_shape_and_global_offset(dt.shape, mesh, dt.placements)
    dist.barrier()
    return {"box": [list(offset), list(local_shape)], "local_shape": list(dt.to_local().shape)}, []


def _fsdp_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    if len(ts) != 1 or not 0 <= args["dim"] < ts[0].ndim:
        raise ValueError(f"dim {args['dim']} out of range for the input")


@operation("fsdp.local_box", collective=True, check=_fsdp_check)
def _fsdp_local_box(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``tensor/parallel/fsdp.py``'s ``_get_local_box`` of a DTensor sharded on a 1-D mesh,
    with the local tensor it describes."""
    # torch.distributed.fsdp first: importing tensor.parallel.fsdp alone is a circular import
    import torch.distributed.fsdp  # noqa: F401
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel.fsdp import _get_local_box

    mesh = ctx.mesh((ctx.world,))
    dt = distribute_tensor(to_wire(ctx, ts[0]), mesh, [Shard(args["dim"])])
    offsets, sizes = _get_local_box(dt)
    local = from_wire(dt.to_local(), ts[0].dtype)
    return {"offsets": list(offsets), "sizes": list(sizes)}, [local]
