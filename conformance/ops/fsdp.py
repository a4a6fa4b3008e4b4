"""Pool operations for the FSDP + TP area (spec/07-fsdp.md): every rank runs one
implementation's FSDP1 state-dict hook on its TP piece of a global tensor and returns the
boxes the hook states for it with the data it holds.

Registered in ``shardspec.testing.ops``'s table when a pool imports this module (listed in
:data:`conformance.OPS`).
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.ops.shared import from_wire, placement, to_wire
from shardspec.testing.ops import Context, operation

__all__: list[str] = []


def _dim_names(ndim: int) -> tuple[str, ...]:
    """``("rep0", ..., "dp", "tp")``: the outer dims replicate (HSDP's replicate dim, and one
    more replicate-like dim on a 4-D mesh), FSDP shards over "dp", TP over "tp"."""
    return (*(f"rep{i}" for i in range(ndim - 2)), "dp", "tp")


def _fsdp_mesh(ctx: Context, shape: tuple[int, ...]) -> Any:
    # A named (*outer, "dp", "tp") mesh: FSDP's hooks find the TP and dp dims of the root mesh
    # by name. Built from this rank's own group per dim (each created by its members only):
    # DeviceMesh's constructor has every rank create every group of every dim, which takes
    # minutes for a 4-D mesh of a 1024-rank simulated world and seconds this way.
    key = (-1, *shape)  # not a mesh shape, so it never collides with ctx.mesh's cache
    mesh = ctx.meshes.get(key)
    if mesh is None:
        from torch.distributed.device_mesh import DeviceMesh

        ids = torch.arange(ctx.world).reshape(shape)
        coord = [int(c) for c in torch.nonzero(ids == ctx.rank)[0]]
        groups = []
        for d in range(len(shape)):
            index: list[Any] = list(coord)
            index[d] = slice(None)
            groups.append(_group(ctx, tuple(ids[tuple(index)].tolist())))
        mesh = DeviceMesh.from_group(
            groups, ctx.device.type, mesh=ids, mesh_dim_names=_dim_names(len(shape))
        )
        ctx.meshes[key] = mesh
    return mesh


def _group(ctx: Context, ranks: tuple[int, ...]) -> Any:
    """The process group of ``ranks`` (this rank among them), created once per pool world:
    a group created by its members only is named after its ranks."""
    key = (-2, *ranks)
    group = ctx.meshes.get(key)
    if group is None:
        import torch.distributed as dist

        group = dist.new_group(list(ranks), use_local_synchronization=True)
        ctx.meshes[key] = group
    return group


def _submesh(ctx: Context, mesh: Any, names: tuple[str, ...]) -> Any:
    key = (-3, *mesh.mesh.shape, *names)  # slicing walks the whole mesh: once per shape
    sub = ctx.meshes.get(key)
    if sub is None:
        sub = ctx.meshes[key] = mesh[names[0]] if len(names) == 1 else mesh[names]
    return sub


def _mesh_shape(ctx: Context, args: dict[str, Any]) -> tuple[int, ...]:
    shape = tuple(int(k) for k in args["mesh"])
    if not 2 <= len(shape) <= 4 or any(k < 1 for k in shape):
        raise ValueError(f"mesh {list(shape)} is not a (*outer, dp, tp) mesh of 2 to 4 dims")
    n = 1
    for k in shape:
        n *= k
    if n != ctx.world:
        raise ValueError(f"mesh {list(shape)} has {n} devices, the pool {ctx.world} ranks")
    return shape


def _check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    _mesh_shape(ctx, args)
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
    """TP-shard the global tensor on the (*outer, "dp", "tp") mesh (outer dims: HSDP's
    replicate dims), run the implementation's FSDP1 hook (``chunk_dtensor`` on FSDP's
    (*outer, "dp") submesh, or ``chunk_tensor`` on the dp group) and return the boxes it states
    for this rank and the local data."""
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed.tensor import DTensor, Replicate, Shard

    shape = _mesh_shape(ctx, args)
    dp, tp = shape[-2:]
    mesh = _fsdp_mesh(ctx, shape)
    pl = args["tp"]
    tp_pl = Shard(pl[1]) if pl[0] == "S" else Replicate()
    # Every rank has the global tensor: cut the TP piece locally (gloo cannot broadcast every
    # dtype, and the TP split is not what is under test).
    dtype = ts[0].dtype
    g = to_wire(ctx, ts[0])  # upstream's hook communicates; gloo lacks some dtypes
    *_, p, t = mesh.get_coordinate()
    if pl[0] == "S":
        pieces = g.chunk(tp, pl[1])
        piece = pieces[t] if t < len(pieces) else g.narrow(pl[1], g.shape[pl[1]], 0)
    else:
        piece = g
    dt = DTensor.from_local(
        piece.contiguous(),
        _submesh(ctx, mesh, ("tp",)),
        [tp_pl],
        run_check=False,
        shape=g.shape,
        stride=g.stride(),
    )
    ext = _extension(args["impl"])
    boxes: list[list[list[int]]] = []
    if args["hook"] == "dtensor":
        # FSDP's device mesh: "dp" alone, or (outer..., "dp") for HSDP, as FSDP1 is given it.
        out = ext.chunk_dtensor(dt, p, _submesh(ctx, mesh, mesh.mesh_dim_names[:-1]))
        if isinstance(out, DTensor):
            from shardspec.metadata.dtensor import dtensor_local_boxes

            # This rank's boxes only: the whole layout, on every rank, is O(world^2) work for
            # a simulated world.
            coord = out.device_mesh.get_coordinate()
            stated = dtensor_local_boxes(out.shape, out.device_mesh, out.placements, coord)
            boxes = [[list(b.offsets), list(b.sizes)] for b in stated]
            local = out.to_local()
        elif isinstance(out, ShardedTensor):
            (sh,) = out.local_shards()
            boxes = [[list(sh.metadata.shard_offsets), list(sh.metadata.shard_sizes)]]
            local = sh.tensor
        else:
            raise TypeError(f"chunk_dtensor returned {type(out).__name__}")
        if args.get("gather"):
            # Back to the TP piece as FSDP1's state-dict load does: all_gather_dtensor on the
            # root mesh, and (shardspec) the optimizer-state path that gathers the same way.
            dist.barrier()
            backs = [ext.all_gather_dtensor(out, mesh)]
            if args["impl"] == "shardspec":
                from shardspec.fsdp.optim import tp_local_optim_state

                osd = tp_local_optim_state({"state": {"w": {"exp_avg": out}}}, mesh)
                backs.append(osd["state"]["w"]["exp_avg"])
            dist.barrier()
            return {"boxes": boxes}, [from_wire(t.contiguous(), dtype) for t in (local, *backs)]
    else:
        st = ext.chunk_tensor(dt, p, dp, 1, _submesh(ctx, mesh, ("dp",)).get_group())
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
    return {"boxes": boxes}, [from_wire(local.contiguous(), dtype)]


def _flatten_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    dp, tp = args["mesh"]
    if dp * tp != ctx.world:
        raise ValueError(f"mesh {args['mesh']} has {dp * tp} devices, the pool {ctx.world} ranks")
    if len(ts) != 2 or ts[0].ndim < 1 or ts[1].ndim < 1:
        raise ValueError("fsdp.flatten takes two global tensors of at least 1 dim")
    if not 0 <= args["tp_dim"] < ts[0].ndim or args["via"] not in ("shardspec", "torch"):
        raise ValueError(f"TP dim {args['tp_dim']} / via {args['via']!r}")
    if not all(0 <= r < ctx.world for r in args["owners"]):
        raise ValueError(f"owners {args['owners']} are not ranks of the pool")


def _plain_sharded_tensor(ctx: Context, g: torch.Tensor, owners: list[int]) -> Any:
    """A ShardedTensor of ``g``'s dim-0 chunks on ``owners`` (chunk i on owners[i]): the
    other ranks hold no local shard at all."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import (
        ShardedTensorMetadata,
        TensorProperties,
    )
    from torch.distributed._shard.sharded_tensor.shard import Shard as TorchShard

    from conformance.reference import chunk_intervals

    mds, mine = [], []
    for (a, b), r in zip(chunk_intervals(g.shape[0], len(owners)), owners):
        md = ShardMetadata([a] + [0] * (g.ndim - 1), [b - a, *g.shape[1:]], placement(ctx, r))
        mds.append(md)
        if r == ctx.rank:
            mine.append(TorchShard(g[a:b].contiguous(), md))
    meta = ShardedTensorMetadata(mds, g.shape, TensorProperties(dtype=g.dtype))
    return ShardedTensor._init_from_local_shards_and_global_metadata(mine, meta)


def _describe_st(st: Any) -> tuple[dict[str, Any], list[torch.Tensor]]:
    from conformance.codec import layout_to_json
    from shardspec.metadata import Box, Layout, Shard

    shards = [
        Shard(Box(md.shard_offsets, md.shard_sizes), md.placement.rank())
        for md in st.metadata().shards_metadata
    ]
    local = [
        [list(s.metadata.shard_offsets), list(s.metadata.shard_sizes)] for s in st.local_shards()
    ]
    data = [s.tensor.contiguous() for s in st.local_shards()]
    return {"layout": layout_to_json(Layout(tuple(st.size()), shards)), "local": local}, data


@operation("fsdp.flatten", collective=True, check=_flatten_check)
def _flatten(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """A SHARDED_STATE_DICT as FSDP1 + TP writes it: ``layer.w`` is the implementation's
    ``chunk_tensor`` hook on ``ts[0]`` TP-sharded on ``tp_dim`` (a nested ShardedTensor),
    ``layer.n`` a plain value, ``buf`` a ShardedTensor of ``ts[1]`` held by ``owners`` only
    (nothing local on the other ranks). Flattened by the implementation; returns the keys it
    kept and, per ShardedTensor kept, its layout, its local boxes and their data."""
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed.tensor import DTensor, Shard

    dp, tp = args["mesh"]
    mesh = _fsdp_mesh(ctx, (dp, tp))
    d = args["tp_dim"]
    p, t = mesh.get_coordinate()
    g = ts[0]
    pieces = g.chunk(tp, d)
    piece = pieces[t] if t < len(pieces) else g.narrow(d, g.shape[d], 0)
    dt = DTensor.from_local(
        piece.contiguous(),
        mesh["tp"],
        [Shard(d)],
        run_check=False,
        shape=g.shape,
        stride=g.stride(),
    )
    ext = _extension(args["via"])
    state = {
        "layer": {"w": ext.chunk_tensor(dt, p, dp, 1, mesh["dp"].get_group()), "n": 3},
        "buf": _plain_sharded_tensor(ctx, ts[1], args["owners"]),
    }
    if args["via"] == "shardspec":
        from shardspec.fsdp import flatten_sharded_tensors as flatten
    else:
        from torch.distributed.checkpoint._sharded_tensor_utils import (
            _flatten_sharded_tensors as flatten,
        )
    flat = flatten(state)
    facts: dict[str, Any] = {"keys": [], "entries": {}}
    data: list[torch.Tensor] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}{k}.", v)
            return
        key = prefix[:-1]
        facts["keys"].append(key)
        if isinstance(value, ShardedTensor):
            facts["entries"][key], local = _describe_st(value)
            data.extend(local)

    walk("", flat)
    dist.barrier()
    return facts, data
