"""The conformance suite's operations, registered by name in ``shardspec.testing.ops``'s table
(pools of the suite import this module on every rank: ``ops=("conformance.ops",)``).

An operation gets the rank's :class:`Context`, the JSON arguments (the same on every rank) and
its input tensors, and returns a JSON value and output tensors. A *collective* operation
splits into ``check`` (local validation, no communication) and ``run``; every rank runs its
check, then all ranks agree on the outcome with one all-reduce, and only if every check
passed does any rank enter ``run``. So a bad input never strands a rank inside a collective.

Adding an operation: decorate a function with ``@operation("area.name", collective=...,
check=...)``. Names are what travels; nothing else about the function does.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from shardspec.testing.ops import OPERATIONS, Context, Outcome, execute, operation, warm_up

__all__ = ["OPERATIONS", "Context", "Outcome", "execute", "operation", "warm_up"]


def _on_listed_rank(ctx: Context, args: dict[str, Any]) -> bool:
    return ctx.rank in args.get("ranks", [])


# -- operations used by the suite's own tests and the benchmark ---------------------------
@operation("pool.echo", collective=False)
def _echo(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    return {"rank": ctx.rank, "world": ctx.world, "args": args}, ts


def _fail_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    if args.get("phase") == "check" and _on_listed_rank(ctx, args):
        raise ValueError(args.get("message", "deliberate failure"))


@operation("pool.fail", collective=True, check=_fail_check)
def _fail(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    if args.get("phase") == "run" and _on_listed_rank(ctx, args):
        raise ValueError(args.get("message", "deliberate failure"))
    dist.barrier()
    return None, []


@operation("pool.exit", collective=False)
def _exit(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    if _on_listed_rank(ctx, args):
        os._exit(int(args.get("code", 7)))
    return None, []


@operation("pool.hang", collective=False)
def _hang(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    if _on_listed_rank(ctx, args):
        while True:
            time.sleep(3600)
    return None, []


def _a2a_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    splits = args["splits"]
    if len(splits) != ctx.world or any(len(row) != ctx.world for row in splits):
        raise ValueError(f"splits must be {ctx.world}x{ctx.world}, got {splits}")
    if len(ts) != 1 or ts[0].ndim != 1 or ts[0].numel() != sum(splits[ctx.rank]):
        raise ValueError(f"rank {ctx.rank} needs one 1-d input of {sum(splits[ctx.rank])} elements")


@operation("pool.all_to_all", collective=True, check=_a2a_check)
def _all_to_all(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``splits[i][j]`` elements go from rank i to rank j, as one flat byte buffer."""
    splits = args["splits"]
    (src,) = ts
    item = src.element_size()
    send = [n * item for n in splits[ctx.rank]]
    recv = [splits[j][ctx.rank] * item for j in range(ctx.world)]
    out = torch.empty(sum(recv), dtype=torch.uint8, device=src.device)
    src_bytes = (
        src.contiguous().view(torch.uint8) if src.numel() else src.new_empty(0, dtype=torch.uint8)
    )
    dist.all_to_all_single(out, src_bytes, recv, send)
    return None, [out.view(src.dtype) if out.numel() else out.new_empty(0, dtype=src.dtype)]


# -- DTensor ------------------------------------------------------------------------------
# Neither gloo's scatter ("Invalid scalar type") nor NCCL ("Input tensor data type is not
# supported for NCCL process group: Short") takes int16. Placement does not depend on the
# dtype and no drawn placement reduces, so int16 travels as float16 (same size) and is viewed
# back, bits unchanged, whatever the backend.
_WIRE_STANDIN = {torch.int16: torch.float16}


def _to_wire(ctx: Context, t: torch.Tensor) -> torch.Tensor:
    standin = _WIRE_STANDIN.get(t.dtype)
    return t.view(standin) if standin is not None else t


def _from_wire(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.view(dtype) if t.dtype != dtype else t


def mesh_check(ctx: Context, args: dict[str, Any]) -> list[Any]:
    """The args' torch placements, after checking that ``mesh`` has the pool's ranks and one
    placement per mesh dim."""
    from conformance.codec import placements_from_json

    mesh = tuple(args["mesh"])
    n = 1
    for m in mesh:
        n *= m
    if n != ctx.world:
        raise ValueError(f"mesh {mesh} has {n} devices but the pool has {ctx.world} ranks")
    placements = placements_from_json(args["placements"])
    if len(placements) != len(mesh):
        raise ValueError(f"{len(placements)} placements for a {len(mesh)}-d mesh")
    return placements


def _dtensor_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    placements = mesh_check(ctx, args)
    if len(ts) != 1:
        raise ValueError("dtensor ops take the global tensor as their one input")
    for p in placements:
        d = getattr(p, "dim", None)
        if d is not None and not -ts[0].ndim <= d < ts[0].ndim:
            raise ValueError(f"placement {p} is out of range for a {ts[0].ndim}-d tensor")


def _dtensor_mesh(ctx: Context, args: dict[str, Any]) -> Any:
    """The args' mesh: ``mesh`` (shape), ``order`` (ranks in row-major order, default
    ascending), ``flatten`` (dims named and flattened, DTensor's one-collective paths)."""
    return ctx.mesh(tuple(args["mesh"]), args.get("order"), flatten=args.get("flatten", False))


def placement(ctx: Context, rank: int) -> str:
    """The ShardMetadata placement of ``rank`` in ``ctx``'s world: torch checks that a local
    shard's tensor is on the device its placement names."""
    from shardspec.testing.devices import rank_device

    return f"rank:{rank}/{rank_device(rank, ctx.backend, ctx.device_type)}"


def _via(args: dict[str, Any], default: str | None = None) -> str:
    """Whose code an operation runs: ``args["via"]``, ``shardspec`` or ``torch`` (``default``
    when absent; without one, absent is an error)."""
    via = args.get("via", default)
    if via not in ("shardspec", "torch"):
        raise ValueError(f"via must be 'shardspec' or 'torch', got {via!r}")
    return str(via)


@operation("dtensor.distribute", collective=True, check=_dtensor_check)
def _distribute(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``distribute_tensor`` (``via`` torch, the default) or shardspec's
    ``distribute_dtensor``: this rank's local tensor and mesh coordinate."""
    from torch.distributed.tensor import distribute_tensor

    from conformance.codec import placements_from_json

    mesh = _dtensor_mesh(ctx, args)
    placements = placements_from_json(args["placements"])
    # src_data_rank=None: every rank splits its own copy, no scatter. Used for _StridedShard,
    # whose scatter path asserts on zero-size and some uneven tensors in torch 2.13 (its padded
    # split gives pieces of different shapes); the placement logic is the same either way.
    src = 0 if args.get("scatter", True) else None
    if _via(args, "torch") == "shardspec":
        from shardspec.reshard.dtensor_io import distribute_dtensor

        dt = distribute_dtensor(ts[0], mesh, placements, src_rank=src)
        local = dt.to_local()
    else:
        dt = distribute_tensor(_to_wire(ctx, ts[0]), mesh, placements, src_data_rank=src)
        local = _from_wire(dt.to_local(), ts[0].dtype)
    return {"coordinate": mesh.get_coordinate(), "stride": list(local.stride())}, [local]


def _redistribute_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    _dtensor_check(ctx, args, ts)
    _dtensor_check(ctx, {**args, "placements": args["dst"]}, ts)
    _via(args, "torch")


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

    mesh = _dtensor_mesh(ctx, args)
    dst = placements_from_json(args["dst"])
    dt = distribute_tensor(
        _to_wire(ctx, ts[0]), mesh, placements_from_json(args["placements"]), src_data_rank=None
    )
    if _via(args, "torch") == "shardspec":
        from shardspec.reshard.frontends import reshard_dtensor

        moved = reshard_dtensor(dt, mesh, dst).to_local()
        full = reshard_dtensor(dt, mesh, [Replicate()] * mesh.ndim).to_local()
    else:
        moved = dt.redistribute(mesh, dst).to_local()
        full = dt.full_tensor()
    dtype = ts[0].dtype
    return {"coordinate": mesh.get_coordinate()}, [
        _from_wire(moved.contiguous(), dtype),
        _from_wire(full.contiguous(), dtype),
    ]


def _from_local_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    from conformance.codec import placements_from_json

    _via(args, "torch")
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

    mesh = _dtensor_mesh(ctx, args)
    placements = placements_from_json(args["placements"])
    shape = tuple(args["shape"])
    try:
        if _via(args, "torch") == "shardspec":
            from shardspec.reshard.dtensor_io import dtensor_from_local

            dt = dtensor_from_local(ts[0], mesh, placements, shape)
        else:
            stride = torch.empty(shape, device="meta").stride()
            dt = DTensor.from_local(
                _to_wire(ctx, ts[0]),
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
    dt = distribute_tensor(_to_wire(ctx, ts[0]), mesh, [Shard(args["dim"])])
    offsets, sizes = _get_local_box(dt)
    local = _from_wire(dt.to_local(), ts[0].dtype)
    return {"offsets": list(offsets), "sizes": list(sizes)}, [local]


# -- resharding (spec/06-reshard.md) and FSDP + TP (spec/07-fsdp.md): their operations live
# in their own modules
from conformance import (  # noqa: E402
    ops_checkpoint as _ops_checkpoint,  # noqa: F401 - registers checkpoint.save, checkpoint.load
    ops_convert as _ops_convert,  # noqa: F401 - registers convert.*, fsdp.chunk_*
    ops_fsdp as _ops_fsdp,  # noqa: F401 - registers fsdp.tp_chunk
    ops_reshard as _ops_reshard,  # noqa: F401 - registers reshard.*
)
