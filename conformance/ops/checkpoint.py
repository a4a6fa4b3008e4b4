"""Pool operations of the checkpoint area (spec/09-checkpoint.md): a real ``dcp.save`` on one
pool and a real ``dcp.load`` on another, through the file system, so a checkpoint written on
W ranks is read back on any other number. Registered in ``shardspec.testing.ops``'s table
when a pool imports this module (listed in :data:`conformance.OPS`).

``via`` picks whose code runs: torch's own ShardedTensor construction, ``distribute_tensor``
and DCP's default planners and ``FileSystemReader``, or shardspec's
``to_sharded_tensor_metadata``, ``distribute_dtensor`` and ``shardspec.checkpoint.dcp``'s
planners and ``FileSystemReader``. Only DCP's file format and its writer are shared. A load
with ``plain`` reads through DCP's default planner and reader whatever ``via`` built the
tensor it loads into: how a job that knows nothing of shardspec loads a checkpoint that
``shardspec reshard`` rewrote (CKPT-17).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from conformance.codec import layout_from_json, placements_from_json
from conformance.ops.shared import (
    dtensor_mesh,
    layout_check,
    mesh_check,
    sharded_tensor_of,
    subgroup,
    via_of,
)
from shardspec.testing.ops import Context, operation

__all__: list[str] = []

KEY = "t"


def _check_save(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    for part in _parts(ts, args):
        layout_check(ctx, args, part)


@operation("checkpoint.save", collective=True, check=_check_save)
def _save(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``dcp.save`` of one ShardedTensor holding this rank's boxes of ``layout`` to ``path``;
    with ``hf``, by torch's ``HuggingFaceStorageWriter`` (``save_distributed``: DCP's Hugging
    Face format, a safetensors file a rank, CKPT-28)."""
    import torch.distributed.checkpoint as dcp

    layout = layout_from_json(args["layout"])
    via = via_of(args)
    dtype = getattr(torch, args["dtype"])
    sd: dict[str, Any] = {
        key: sharded_tensor_of(ctx, layout, dtype, part, via)
        for key, part in zip(_keys(args), _parts(ts, args))
    }
    sd.update(args.get("values", {}))  # non-tensor values saved beside the tensor
    if args.get("hf"):
        from torch.distributed.checkpoint import HuggingFaceStorageWriter

        writer = HuggingFaceStorageWriter(args["path"], save_distributed=True)
        dcp.save(sd, storage_writer=writer, planner=_save_planner(via))
    else:
        dcp.save(sd, checkpoint_id=args["path"], planner=_save_planner(via))
    return None, []


def _keys(args: dict[str, Any]) -> list[str]:
    """The tensors' keys: ``t``, and with ``copies`` k, ``t1`` .. ``tk``."""
    return [KEY] + [f"{KEY}{j}" for j in range(1, int(args.get("copies", 0)) + 1)]


def _parts(ts: list[torch.Tensor], args: dict[str, Any]) -> list[list[torch.Tensor]]:
    """``ts`` cut into each key's local tensors (each key's as many, in the keys' order)."""
    n = len(_keys(args))
    if len(ts) % n:
        raise ValueError(f"{len(ts)} local tensors do not divide among {n} tensors")
    each = len(ts) // n
    return [ts[i * each : (i + 1) * each] for i in range(n)]


def _save_planner(via: str) -> Any:
    if via == "shardspec":
        from shardspec.checkpoint.dcp import SavePlanner

        return SavePlanner()
    from torch.distributed.checkpoint import DefaultSavePlanner

    return DefaultSavePlanner()


def _load_planner(via: str) -> Any:
    if via == "shardspec":
        from shardspec.checkpoint.dcp import LoadPlanner

        return LoadPlanner()
    from torch.distributed.checkpoint import DefaultLoadPlanner

    return DefaultLoadPlanner()


def _load_reader(via: str, args: dict[str, Any]) -> Any:
    """shardspec's reader (CKPT-13); ``whole_item_bytes`` 0 sends every chunk down its
    partial-read path (CKPT-14), as the drawn round trips do half the time."""
    if via == "shardspec":
        from shardspec.checkpoint.dcp import FileSystemReader

        return FileSystemReader(
            args["path"], whole_item_bytes=args.get("whole_item_bytes", 1 << 18)
        )
    from torch.distributed.checkpoint import FileSystemReader as DcpReader

    return DcpReader(args["path"])


def _check_load(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    via_of(args)
    if args["kind"] == "sharded":
        layout_check(ctx, args, ts)
    elif args["kind"] == "dtensor":
        mesh_check(ctx, args)
    else:
        raise ValueError(f"kind must be 'sharded' or 'dtensor', got {args['kind']!r}")


def _target(
    ctx: Context,
    args: dict[str, Any],
    ts: list[torch.Tensor],
    via: str,
    group: Any = None,
    mesh: Any = None,
) -> Any:
    """What a load fills: a ShardedTensor holding this rank's boxes of ``layout`` (``kind``
    sharded; ``ts`` are its local tensors), or a DTensor of ``fill`` on a ``mesh`` with
    ``placements`` (``kind`` dtensor)."""
    dtype = getattr(torch, args["dtype"])
    if args["kind"] == "sharded":
        return sharded_tensor_of(ctx, layout_from_json(args["layout"]), dtype, ts, via, group)
    return _filled_dtensor(ctx, args, dtype, via, mesh)


@operation("checkpoint.load", collective=True, check=_check_load)
def _load(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``dcp.load`` from ``path`` into a tensor of ``dtype`` whose elements are all ``fill``
    (so an element no read reaches shows): a ShardedTensor holding this rank's boxes of
    ``layout`` (``kind`` sharded; ``ts`` are the filled boxes), or a DTensor on a ``mesh``
    with ``placements`` (``kind`` dtensor). With ``plain``, DCP's own planner and reader
    read. Returns the local tensors after the load, in the layout's local order, and the
    DTensor's mesh coordinate."""
    import torch.distributed.checkpoint as dcp

    via = via_of(args)
    obj = _target(ctx, args, ts, via)
    reading = "torch" if args.get("plain") else via
    dcp.load(
        {KEY: obj},
        checkpoint_id=args["path"],
        storage_reader=_load_reader(reading, args),
        planner=_load_planner(reading),
    )
    if args["kind"] == "sharded":
        return None, [s.tensor for s in obj.local_shards()]
    return {"coordinate": obj.device_mesh.get_coordinate()}, [obj.to_local()]


def _check_collective(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    if args.get("reads") not in ("auto", "own", "once"):
        raise ValueError(f"reads must be auto, own or once, got {args.get('reads')!r}")
    odd = args.get("odd")
    if odd is not None:
        if via_of(args) != "shardspec" or set(odd) - {"rank", "reads", "max_buffer_bytes", "drop"}:
            raise ValueError(f"odd {odd}: shardspec's, with rank, reads, max_buffer_bytes, drop")
        if odd.get("drop") not in (None, "v", "w"):
            raise ValueError(f"odd drop {odd['drop']!r}: 'v' or 'w'")
    members = args.get("members")
    if members is not None:
        if sorted(set(members)) != list(members) or not members or members[-1] >= ctx.world:
            raise ValueError(f"members {members}: distinct pool ranks, ascending")
        if args.get("odd"):
            raise ValueError("a load on a subgroup takes no odd rank")
        if ctx.rank not in members:
            if ts:
                raise ValueError(f"rank {ctx.rank} is not in the group but got tensors")
            return
        args = _on_members(args)
    if args["kind"] != "plain":
        for part in _parts(ts, args):
            _check_load(ctx, args, part)


def _on_members(args: dict[str, Any]) -> dict[str, Any]:
    """A load on the group of ``members`` in pool ranks: the layout's group ranks renamed to
    the members (group rank i is ``members[i]``: new_group orders them so), the mesh over the
    members in that order."""
    from conformance.codec import layout_to_json

    members = list(args["members"])
    if args["kind"] == "sharded":
        layout = layout_from_json(args["layout"]).with_ranks(members)
        return {**args, "layout": layout_to_json(layout)}
    if args["kind"] == "dtensor":
        return {**args, "order": members}
    return args


@operation("checkpoint.collective_load", collective=True, check=_check_collective)
def _collective_load(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """:func:`_collective_load_on` the pool, or with ``members`` (pool ranks, ascending) on
    the process group of those ranks alone: the layout's ranks and the mesh's are the group's
    (group rank i is ``members[i]``), and the other ranks take no part (no error, no value,
    no tensors)."""
    members = args.get("members")
    if members is None:
        return _collective_load_on(ctx, args, ts, None)
    on = _on_members(args)
    with subgroup(ctx, members) as group, _members_mesh(ctx, on, group) as mesh:
        if ctx.rank not in members:
            return {"error": None, "stats": None, "value": None}, []
        return _collective_load_on(ctx, on, ts, group, mesh)


@contextmanager
def _members_mesh(ctx: Context, args: dict[str, Any], group: Any) -> Iterator[Any]:
    """A DTensor destination's mesh over the members (None for the other kinds), for one
    call: built by every pool rank (new_group is collective over the world), its groups
    destroyed after the call by the members, which alone hold them, once all are done. Not
    the context's kept meshes: members holding groups the others do not would make the ranks
    name a later group of the same ranks differently (a hang) and release groups apart."""
    if args["kind"] != "dtensor":
        yield None
        return
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from shardspec.testing.groups import live_groups

    before = set(live_groups())
    ids = torch.tensor(args["order"]).reshape(tuple(args["mesh"]))
    flatten = args.get("sub") is not None
    names = tuple(f"d{i}" for i in range(ids.dim())) if flatten else None
    mesh = DeviceMesh(ctx.device.type, ids, mesh_dim_names=names)
    if flatten and ids.dim() > 1:
        mesh._flatten()
    made = [pg for pg in live_groups() if pg not in before]
    try:
        yield mesh
    finally:
        if ctx.rank in args["order"]:
            dist.barrier(group=group)
        for pg in reversed(made):
            dist.destroy_process_group(pg)


def _collective_load_on(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor], group: Any, mesh: Any = None
) -> tuple[Any, list[torch.Tensor]]:
    """A collective load of ``path`` into ``{"t": tensor, "v": {"n": 0}, "w": 0}`` (with
    ``copies`` k, also ``"t1"`` .. ``"tk"``, each a tensor as ``t``; ``ts`` holds each one's
    local tensors in turn, and so do the returned ones) (``{"t":
    tensor}`` from a safetensors checkpoint, ``safetensors``, or with ``tensor_only``, as a
    checkpoint another library wrote holds no such values): with shardspec,
    ``shardspec.checkpoint.load`` with ``reads`` (tracing the byte ranges each rank read);
    with torch, ``dcp.load`` with DCP's default planner and reader (its only way to read), or
    with its ``HuggingFaceStorageReader``.
    The tensor as in ``checkpoint.load``, or (``kind`` plain) a plain tensor of ``fill`` on
    every rank (with ``parameter``, an ``nn.Parameter`` of it). Shardspec's load takes
    ``max_buffer_bytes`` and ``thread_count`` when given (dcp.load has neither: they bound
    memory and threads, never what is loaded). With ``odd``
    (shardspec's only), pool rank ``odd["rank"]`` alone passes another ``reads`` or
    ``max_buffer_bytes``, or leaves the value ``odd["drop"]`` out of its state dict.
    Returns ``error`` (what this rank raised, or None), the loaded value, the rank's load
    stats (shardspec) and its local tensors after the load."""
    via = via_of(args)
    options = {k: args[k] for k in ("reads", "max_buffer_bytes", "thread_count") if k in args}
    odd = args.get("odd") or {}
    mine = odd.get("rank") == ctx.rank
    if mine:
        options.update({k: odd[k] for k in ("reads", "max_buffer_bytes") if k in odd})
    dtype = getattr(torch, args["dtype"])
    objs: dict[str, Any] = {}
    for key, part in zip(_keys(args), _parts(ts, args)):
        if args["kind"] == "plain":
            shape = tuple(args["shape"])
            objs[key] = torch.full(shape, args["fill"], dtype=dtype, device=ctx.device)
            if args.get("parameter"):  # dict(model.named_parameters()): a subclass
                objs[key] = torch.nn.Parameter(objs[key], requires_grad=False)
        else:
            objs[key] = _target(ctx, args, part, via, group, mesh)
    hf = bool(args.get("safetensors"))
    alone = hf or bool(args.get("tensor_only"))
    sd: dict[str, Any] = dict(objs) if alone else {**objs, "v": {"n": 0}, "w": 0}
    if mine and odd.get("drop") is not None:
        del sd[odd["drop"]]
    facts: dict[str, Any] = {"error": None, "stats": None}
    try:
        if via == "shardspec":
            from shardspec.checkpoint.collective_load import load

            stats = load(
                sd, args["path"], group=group, trace_reads=True, storage=args.get("storage"),
                **options,
            )  # fmt: skip
            facts["stats"] = {
                "reads": stats.reads,
                "storage": stats.storage,
                "data_bytes": stats.data_bytes,
                "value_bytes": stats.value_bytes,
                "ranges": [list(r) for r in stats.ranges],
            }
        elif hf:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint import HuggingFaceStorageReader

            reader = HuggingFaceStorageReader(args["path"])
            dcp.load(sd, storage_reader=reader, process_group=group)
        else:
            import torch.distributed.checkpoint as dcp

            dcp.load(sd, checkpoint_id=args["path"], process_group=group)
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        facts["error"] = f"{type(e).__name__}: {e}"
    facts["value"] = None if alone else {k: sd[k] for k in ("v", "w") if k in sd}
    out: list[torch.Tensor] = []
    for obj in objs.values():
        if args["kind"] == "sharded":
            out += [s.tensor for s in obj.local_shards()]
        elif args["kind"] == "dtensor":
            facts["coordinate"] = obj.device_mesh.get_coordinate()
            out.append(obj.to_local())
        else:
            out.append(obj.detach() if isinstance(obj, torch.nn.Parameter) else obj)
    return facts, out


def _load_mesh(ctx: Context, args: dict[str, Any]) -> Any:
    """The mesh of a DTensor destination (with ``sub``, its dims named for the sub-mesh)."""
    if args.get("sub") is not None:
        return ctx.mesh(tuple(args["mesh"]), args.get("order"), flatten=True)
    return dtensor_mesh(ctx, args)


def _filled_dtensor(
    ctx: Context, args: dict[str, Any], dtype: torch.dtype, via: str, mesh: Any = None
) -> Any:
    """A DTensor of ``fill`` (every rank makes its own piece: no collective, no scatter). With
    ``sub`` = d, on the sub-mesh of mesh dim d with its placement alone: each rank on the mesh
    of its own coordinates in the other dims (whose placements must be Replicate: the
    layout of the whole world is then the mesh's own with them)."""
    from torch.distributed.tensor import distribute_tensor

    placements = placements_from_json(args["placements"])
    mesh = _load_mesh(ctx, args) if mesh is None else mesh
    if args.get("sub") is not None:
        d = int(args["sub"])
        mesh = mesh[f"d{d}"]
        placements = [placements[d]]
    full = torch.full(tuple(args["shape"]), args["fill"], dtype=dtype, device=ctx.device)
    if via == "shardspec":
        from shardspec.reshard.dtensor_io import distribute_dtensor

        return distribute_dtensor(full, mesh, placements, src_rank=None)
    return distribute_tensor(full, mesh, placements, src_data_rank=None)


@operation("checkpoint.layouts_of", collective=True, check=_check_load)
def _layouts_of(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """The ``--layouts`` file of ``shardspec reshard`` as the target job writes it: shardspec's
    ``layouts_of`` of a state dict holding the load's target (see ``checkpoint.load``) under
    the checkpoint's key. Only shardspec has offline rewriting, so only ``via`` shardspec."""
    if via_of(args) != "shardspec":
        raise ValueError("layouts_of is shardspec's (CKPT-17): pass via='shardspec'")
    from shardspec.checkpoint.offline import layouts_of

    return {"layouts": layouts_of({KEY: _target(ctx, args, ts, "shardspec")})}, []
