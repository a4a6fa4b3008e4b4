"""What the conformance areas' pool operations share: the wire stand-in for dtypes a backend
does not carry, the checks of mesh and layout arguments, the mesh and the ShardedTensor an
operation builds. No operation is registered here; the areas (``conformance.ops.<area>``)
register their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from conformance.codec import layout_from_json
from shardspec.metadata import Layout
from shardspec.testing.ops import Context

__all__ = [
    "dtensor_check",
    "dtensor_mesh",
    "from_wire",
    "group_rank",
    "layout_check",
    "mesh_check",
    "on_listed_rank",
    "placement",
    "sharded_tensor_of",
    "subgroup",
    "to_wire",
    "via_of",
]


def group_rank(ctx: Context, args: dict[str, Any]) -> int | None:
    """This rank's rank in the call's group: the pool's, or its place among ``members``
    (world ranks, ascending: new_group orders them so); None outside the group."""
    members = args.get("members")
    if members is None:
        return ctx.rank
    return members.index(ctx.rank) if ctx.rank in members else None


@contextmanager
def subgroup(ctx: Context, members: list[int]) -> Iterator[Any]:
    """The process group of ``members`` for one call (every rank makes it: creating a group is
    collective over the world), destroyed after the call once every member is done. Not kept:
    a pooled rank releases the groups nothing holds when enough have piled up, counting its own
    (``shardspec.testing.groups``), which works only while every rank holds the same groups; a
    kept group of some ranks would make the members release and the others not."""
    import torch.distributed as dist

    group = dist.new_group(list(members))
    try:
        yield group
    finally:
        if ctx.rank in members:
            dist.barrier(group=group)
            dist.destroy_process_group(group)


def on_listed_rank(ctx: Context, args: dict[str, Any]) -> bool:
    return ctx.rank in args.get("ranks", [])


# Neither gloo's scatter ("Invalid scalar type") nor NCCL ("Input tensor data type is not
# supported for NCCL process group: Short") takes int16. Placement does not depend on the
# dtype and no drawn placement reduces, so int16 travels as float16 (same size) and is viewed
# back, bits unchanged, whatever the backend.
_WIRE_STANDIN = {torch.int16: torch.float16}


def to_wire(ctx: Context, t: torch.Tensor) -> torch.Tensor:
    standin = _WIRE_STANDIN.get(t.dtype)
    return t.view(standin) if standin is not None else t


def from_wire(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.view(dtype) if t.dtype != dtype else t


def mesh_check(ctx: Context, args: dict[str, Any]) -> list[Any]:
    """The args' torch placements, after checking that ``mesh`` has the ranks of ``order``
    (default: the pool's) and one placement per mesh dim."""
    from conformance.codec import placements_from_json

    mesh = tuple(args["mesh"])
    n = 1
    for m in mesh:
        n *= m
    order = args.get("order")
    ranks = list(range(ctx.world)) if order is None else list(order)
    if n != len(ranks):
        raise ValueError(f"mesh {mesh} has {n} devices for the {len(ranks)} ranks {ranks}")
    if any(not 0 <= r < ctx.world for r in ranks) or len(set(ranks)) != len(ranks):
        raise ValueError(f"mesh ranks {ranks} are not distinct ranks of the pool's {ctx.world}")
    placements = placements_from_json(args["placements"])
    if len(placements) != len(mesh):
        raise ValueError(f"{len(placements)} placements for a {len(mesh)}-d mesh")
    return placements


def dtensor_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    placements = mesh_check(ctx, args)
    if len(ts) != 1:
        raise ValueError("dtensor ops take the global tensor as their one input")
    for p in placements:
        d = getattr(p, "dim", None)
        if d is not None and not -ts[0].ndim <= d < ts[0].ndim:
            raise ValueError(f"placement {p} is out of range for a {ts[0].ndim}-d tensor")


def dtensor_mesh(ctx: Context, args: dict[str, Any]) -> Any:
    """The args' mesh: ``mesh`` (shape), ``order`` (ranks in row-major order, default
    ascending), ``flatten`` (dims named and flattened, DTensor's one-collective paths)."""
    return ctx.mesh(tuple(args["mesh"]), args.get("order"), flatten=args.get("flatten", False))


def placement(ctx: Context, rank: int) -> str:
    """The ShardMetadata placement of ``rank`` in ``ctx``'s world: torch checks that a local
    shard's tensor is on the device its placement names."""
    from shardspec.testing.devices import rank_device

    return f"rank:{rank}/{rank_device(rank, ctx.backend, ctx.device_type)}"


def via_of(args: dict[str, Any], default: str | None = None) -> str:
    """Whose code an operation runs: ``args["via"]``, ``shardspec`` or ``torch`` (``default``
    when absent; without one, absent is an error)."""
    via = args.get("via", default)
    if via not in ("shardspec", "torch"):
        raise ValueError(f"via must be 'shardspec' or 'torch', got {via!r}")
    return str(via)


def sharded_tensor_of(
    ctx: Context,
    layout: Layout,
    dtype: torch.dtype,
    ts: list[torch.Tensor],
    via: str,
    group: Any = None,
) -> Any:
    """A ShardedTensor of ``layout`` (pool ranks, as torch's placements name global ranks)
    whose local shards are ``ts`` (this rank's boxes in the layout's order), on ``group``
    (default: the world): its global metadata from our ``to_sharded_tensor_metadata`` (no
    communication) ``via`` shardspec, from torch's ``init_from_local_shards`` (which gathers
    every rank's shard metadata over the group) ``via`` torch."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed._shard.sharded_tensor.shard import Shard as TorchShard

    from shardspec.testing.devices import rank_device

    def device(rank: int) -> str:  # each owner's own device: cuda:<rank> under NCCL
        return rank_device(rank, ctx.backend)

    mine = [s for s in layout.shards if s.rank == ctx.rank]
    mds = [
        ShardMetadata(list(s.box.offsets), list(s.box.sizes), f"rank:{s.rank}/{device(s.rank)}")
        for s in mine
    ]
    local = [TorchShard(t.contiguous(), m) for t, m in zip(ts, mds)]
    from shardspec.metadata import to_sharded_tensor_metadata, to_sharding_spec

    try:
        if via == "shardspec":
            md = to_sharded_tensor_metadata(layout, dtype, device=device)
            return ShardedTensor._init_from_local_shards_and_global_metadata(
                local, md, process_group=group
            )
        return ShardedTensor._init_from_local_shards(local, *layout.shape, process_group=group)
    except ValueError:
        # torch infers a sharding spec from the shards and refuses a valid layout none of
        # its specs can express (zero-size shards inside others, BOX-2): say so as CONVERT-5
        # does, on every rank alike, whichever way the ShardedTensor was built
        to_sharding_spec(layout, device=device)
        raise


def layout_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    via_of(args)
    layout = layout_from_json(args["layout"])
    if any(s.rank >= ctx.world for s in layout.shards):
        raise ValueError(f"layout names ranks beyond the pool's {ctx.world}")
    boxes = layout.boxes_of(ctx.rank)
    if len(ts) != len(boxes) or any(tuple(t.shape) != b.sizes for t, b in zip(ts, boxes)):
        raise ValueError(f"rank {ctx.rank}: tensors {[tuple(t.shape) for t in ts]} for {boxes}")
