"""Pool operations for the FSDP + TP area (spec/07-fsdp.md): every rank runs one
implementation's FSDP1 state-dict hook on its TP piece of a global tensor and returns the
boxes the hook states for it with the data it holds.

Registered in ``conformance.ops``'s table when that module imports this one.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.ops import Context, _from_wire, _to_wire, operation

__all__: list[str] = []


def _fsdp_mesh(ctx: Context, dp: int, tp: int) -> Any:
    # A named ("dp", "tp") mesh: FSDP's hooks find the TP and dp dims of the root mesh by name.
    key = (-1, dp, tp)  # not a mesh shape, so it never collides with ctx.mesh's cache
    mesh = ctx.meshes.get(key)
    if mesh is None:
        from torch.distributed.device_mesh import DeviceMesh

        ids = torch.arange(ctx.world).reshape(dp, tp)
        mesh = DeviceMesh(ctx.device.type, ids, mesh_dim_names=("dp", "tp"))
        ctx.meshes[key] = mesh
    return mesh


def _check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    dp, tp = args["mesh"]
    if dp * tp != ctx.world:
        raise ValueError(f"mesh {args['mesh']} has {dp * tp} devices, the pool {ctx.world} ranks")
    if len(ts) != 1 or ts[0].ndim < 1:
        raise ValueError("fsdp.tp_chunk takes one global tensor of at least 1 dim")
    pl = args["tp"]
    if pl[0] not in ("S", "R") or (pl[0] == "S" and not 0 <= pl[1] < ts[0].ndim):
        raise ValueError(
            f"TP placement {pl} is not Shard(d) / Replicate for a {ts[0].ndim}-d tensor"
        )
    if args["impl"] not in ("shardspec", "torch") or args["hook"] not in ("dtensor", "tensor"):
        raise ValueError(f"impl {args['impl']!r} / hook {args['hook']!r}")


def _extension(impl: str) -> Any:
    import torch.distributed.fsdp  # noqa: F401  (tensor.parallel.fsdp imports fsdp circularly)

    if impl == "shardspec":
        from shardspec.fsdp import DTensorExtensions

        return DTensorExtensions()
    from torch.distributed.tensor.parallel.fsdp import DTensorExtensions as Upstream

    return Upstream(None)


@operation("fsdp.tp_chunk", collective=True, check=_check)
def _tp_chunk(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """TP-shard the global tensor on the ("dp", "tp") mesh, run the implementation's FSDP1
    hook (``chunk_dtensor`` or ``chunk_tensor``) and return the boxes it states for this rank
    and the local data."""
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed.tensor import DTensor, Replicate, Shard

    dp, tp = args["mesh"]
    mesh = _fsdp_mesh(ctx, dp, tp)
    pl = args["tp"]
    tp_pl = Shard(pl[1]) if pl[0] == "S" else Replicate()
    # Every rank has the global tensor: cut the TP piece locally (gloo cannot broadcast every
    # dtype, and the TP split is not what is under test).
    dtype = ts[0].dtype
    g = _to_wire(ctx, ts[0])  # upstream's hook communicates; gloo lacks some dtypes
    p, t = mesh.get_coordinate()
    if pl[0] == "S":
        pieces = g.chunk(tp, pl[1])
        piece = pieces[t] if t < len(pieces) else g.narrow(pl[1], g.shape[pl[1]], 0)
    else:
        piece = g
    dt = DTensor.from_local(
        piece.contiguous(), mesh["tp"], [tp_pl], run_check=False, shape=g.shape, stride=g.stride()
    )
    ext = _extension(args["impl"])
    boxes: list[list[list[int]]] = []
    if args["hook"] == "dtensor":
        out = ext.chunk_dtensor(dt, p, mesh["dp"])
        if isinstance(out, DTensor):
            from shardspec.metadata.dtensor import from_dtensor

            boxes = [[list(b.offsets), list(b.sizes)] for b in from_dtensor(out).boxes_of(ctx.rank)]
            local = out.to_local()
        elif isinstance(out, ShardedTensor):
            (sh,) = out.local_shards()
            boxes = [[list(sh.metadata.shard_offsets), list(sh.metadata.shard_sizes)]]
            local = sh.tensor
        else:
            raise TypeError(f"chunk_dtensor returned {type(out).__name__}")
    else:
        st = ext.chunk_tensor(dt, p, dp, 1, mesh["dp"].get_group())
        (outer,) = st.local_shards()
        inner = outer.tensor.local_shards() if isinstance(outer.tensor, ShardedTensor) else []
        if len(inner) > 1:
            raise ValueError(f"rank {ctx.rank}: {len(inner)} inner shards")
        if inner:
            md = inner[0].metadata
            offs = [a + b for a, b in zip(outer.metadata.shard_offsets, md.shard_offsets)]
            boxes = [[offs, list(md.shard_sizes)]]
            local = inner[0].tensor
        else:
            local = ts[0].new_empty(0)
    dist.barrier()
    return {"boxes": boxes}, [_from_wire(local.contiguous(), dtype)]
