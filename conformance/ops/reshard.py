"""Pool operations of the resharding area (spec/06-reshard.md), registered in
``shardspec.testing.ops``'s table when a pool imports this module (listed in
:data:`conformance.OPS`).

Each rank receives its own source shards (``per_rank_tensors``) and the layouts as JSON, and
returns its destination shards in the destination's local order; the driver compares them with
the global tensor, bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.codec import layout_from_json
from conformance.ops.shared import group_rank, placement, subgroup
from shardspec.testing.ops import Context, operation

__all__: list[str] = []


def _noncontig(t: torch.Tensor) -> torch.Tensor:
    """The same values in a strided view (every other element of a larger last dim)."""
    if t.dim() == 0:
        return t.clone()
    buf = torch.zeros((*t.shape[:-1], 2 * t.shape[-1] + 1), dtype=t.dtype, device=t.device)
    view = buf[..., 1::2]
    view.copy_(t)
    return view


def _check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    src = layout_from_json(args["src"])
    dst = layout_from_json(args["dst"])
    if src.shape != dst.shape:
        raise ValueError(f"source shape {src.shape} differs from destination shape {dst.shape}")
    boxes = src.boxes_of(ctx.rank)
    if len(ts) != len(boxes):
        raise ValueError(f"rank {ctx.rank} got {len(ts)} tensors for {len(boxes)} source boxes")
    for t, b in zip(ts, boxes):
        if tuple(t.shape) != b.sizes:
            raise ValueError(f"rank {ctx.rank}: a tensor of shape {tuple(t.shape)} for box {b}")


@operation("reshard.shardspec", collective=True, check=_check)
def _reshard_shardspec(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``shardspec.reshard.reshard`` (the dtype travels with the data: ranks without source
    shards learn it from the others)."""
    from shardspec.reshard import reshard

    inputs = [_noncontig(t) if args.get("noncontig") else t for t in ts]
    out = reshard(
        inputs,
        layout_from_json(args["src"]),
        layout_from_json(args["dst"]),
        max_buffer_bytes=args.get("max_buffer_bytes"),
        dtype=getattr(torch, args["dtype"]),
    )
    return None, out


def _out_view(
    kind: str, sizes: tuple[int, ...], dtype: torch.dtype, pad: int, device: torch.device
) -> torch.Tensor:
    """An out= tensor of ``sizes`` laid out as ``kind`` (``strategies.streams.OUT_KINDS``) in a
    larger buffer filled with ones, on the ranks' ``device``, so a write outside the view
    shows."""
    numel = 1
    for n in sizes:
        numel *= n
    if kind == "contiguous":
        return torch.ones(sizes, dtype=dtype, device=device)
    base = torch.ones(pad + 2 * numel + 1, dtype=dtype, device=device)
    if kind == "offset":
        return base[pad : pad + numel].view(sizes)
    if kind == "strided":
        strides = [2] * len(sizes)
        for d in range(len(sizes) - 2, -1, -1):
            strides[d] = strides[d + 1] * sizes[d + 1]
        return base.as_strided(sizes, strides, pad)
    return base[pad : pad + numel].view(sizes[::-1]).permute(list(range(len(sizes) - 1, -1, -1)))


def _spilled(t: torch.Tensor) -> bool:
    """Whether any element of ``t``'s buffer outside ``t`` itself differs from one."""
    base = t._base if t._base is not None else t
    flat = base.reshape(-1)
    inside = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    idx = torch.arange(flat.numel(), device=flat.device).as_strided(
        t.shape, t.stride(), t.storage_offset()
    )
    inside[idx.reshape(-1)] = True
    return bool((flat[~inside] != 1).any())


def _state_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    me = group_rank(ctx, args)
    need = 0
    if me is not None:
        need = sum(len(layout_from_json(e["src"]).boxes_of(me)) for e in args["entries"])
    if len(ts) != need:
        raise ValueError(f"rank {ctx.rank} got {len(ts)} tensors for {need} source boxes")


@operation("reshard.state_dict", collective=True, check=_state_check)
def _reshard_state_dict(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``shardspec.reshard.reshard_state_dict`` over every entry at once, into out= views
    when the entries name a kind; with ``members``, on the subgroup of those world ranks
    (layout ranks are group ranks; the other ranks take no part and return nothing). Returns,
    per entry, whether the returned tensors are the out= tensors given and whether anything
    outside them was written, and the outputs."""
    if args.get("members") is None:
        return _state_dict_on(ctx, args, ts, None)
    with subgroup(ctx, args["members"]) as group:
        return _state_dict_on(ctx, args, ts, group)


def _state_dict_on(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor], group: Any
) -> tuple[Any, list[torch.Tensor]]:
    from shardspec.reshard import reshard_state_dict

    me = group_rank(ctx, args)
    if me is None:
        return {"same": {}, "spilled": {}}, []
    state: dict[str, list[torch.Tensor]] = {}
    src, dst, dtypes = {}, {}, {}
    out: dict[str, list[torch.Tensor]] | None = None
    pos = 0
    for e in args["entries"]:
        key = e["key"]
        src[key], dst[key] = layout_from_json(e["src"]), layout_from_json(e["dst"])
        dtypes[key] = getattr(torch, e["dtype"])
        k = len(src[key].boxes_of(me))
        state[key] = ts[pos : pos + k]
        pos += k
        if e["out"] is not None:
            out = out if out is not None else {}
            out[key] = [
                _out_view(e["out"], b.sizes, dtypes[key], e["pad"], ctx.device)
                for b in dst[key].boxes_of(me)
            ]
    # A rank with no source shard and no out= tensor of a key learns its dtype from the others.
    result = reshard_state_dict(state, src, dst, group, max_buffer_bytes=args["budget"], out=out)
    facts: dict[str, Any] = {"same": {}, "spilled": {}}
    outs: list[torch.Tensor] = []
    for e in args["entries"]:
        key = e["key"]
        got = result[key]
        if out is not None:
            facts["same"][key] = len(got) == len(out[key]) and all(
                a is b for a, b in zip(got, out[key])
            )
            facts["spilled"][key] = any(_spilled(t) for t in out[key])
        outs += [t.contiguous() for t in got]
    return facts, outs


@operation("reshard.torch_sharded", collective=True, check=_check)
def _reshard_torch_sharded(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """Upstream ``ShardedTensor.reshard`` from one chunk spec to another (the adapter only
    sends layouts it can express: one chunk per rank, every rank of the pool)."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import (
        ShardedTensorMetadata,
        TensorProperties,
    )
    from torch.distributed._shard.sharded_tensor.shard import Shard as TorchShard
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    src = layout_from_json(args["src"])
    dtype = getattr(torch, args["dtype"])
    mds = [
        ShardMetadata(list(s.box.offsets), list(s.box.sizes), placement(ctx, s.rank))
        for s in src.shards
    ]
    md = ShardedTensorMetadata(mds, torch.Size(src.shape), TensorProperties(dtype=dtype))
    mine = [m for s, m in zip(src.shards, mds) if s.rank == ctx.rank]
    inputs = [_noncontig(t) if args.get("noncontig") else t for t in ts]
    # The spec is given, as a ShardedTensor made by sharding with it would carry it: torch's
    # inference from the metadata alone answers Enumerable for a single shard.
    src_spec = ChunkShardingSpec(
        dim=args["src_dim"],
        placements=[placement(ctx, r) for r in args["src_ranks"]],  # type: ignore[misc]
    )
    st = ShardedTensor._init_from_local_shards_and_global_metadata(
        [TorchShard(t, m) for t, m in zip(inputs, mine)], md, sharding_spec=src_spec
    )
    spec = ChunkShardingSpec(
        dim=args["dst_dim"],
        placements=[placement(ctx, r) for r in args["dst_ranks"]],  # type: ignore[misc]
    )
    st = st.reshard(spec)
    return None, [s.tensor for s in st.local_shards()]


def _own_layouts(ctx: Context, args: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Per entry ``(key, src, dst)`` as this rank passes them: the entry's layouts, or this
    rank's own copy where ``copies[str(rank)][key]`` gives one (``src``, ``dst``)."""
    mine = args.get("copies", {}).get(str(ctx.rank), {})
    out = []
    for e in args["entries"]:
        own = mine.get(e["key"], {})
        src = layout_from_json(own.get("src", e["src"]))
        out.append((e["key"], src, layout_from_json(own.get("dst", e["dst"]))))
    return out


def _checked_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    if args.get("api") not in ("reshard", "state_dict"):
        raise ValueError(f"api must be 'reshard' or 'state_dict', got {args.get('api')!r}")
    if args["api"] == "reshard" and len(args["entries"]) != 1:
        raise ValueError("api 'reshard' moves one entry")
    need = sum(len(src.boxes_of(ctx.rank)) for _, src, _ in _own_layouts(ctx, args))
    if len(ts) != need:
        raise ValueError(f"rank {ctx.rank} got {len(ts)} tensors for {need} source boxes")


_SENTINEL = 0xA5  # the byte every out= tensor of reshard.checked starts with (1 for bool)


def _sentinel(sizes: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    n = 1
    for s in sizes:
        n *= s
    flat = torch.empty(n, dtype=dtype, device=device)
    flat.view(torch.uint8).fill_(1 if dtype == torch.bool else _SENTINEL)
    return flat.view(sizes)


def _untouched(t: torch.Tensor) -> bool:
    fill = 1 if t.dtype == torch.bool else _SENTINEL
    return bool((t.reshape(-1).view(torch.uint8) == fill).all())


@operation("reshard.checked", collective=True, check=_checked_check)
def _reshard_checked(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """shardspec's ``reshard`` (``api`` reshard: the one entry) or ``reshard_state_dict``
    with ``check_replicas`` as given, where this rank may pass its own copy of an entry's
    layouts (``copies``, see :func:`_own_layouts`) and its source shards are whatever it was
    sent (copies of a replicated box may differ), strided when ``noncontig``; with ``out``,
    into out= tensors of its own destination boxes whose every byte is a sentinel. A
    ``ReshardError`` is an answer, not a failure: ``{"error": its message or None,
    "untouched": whether every out= tensor still holds only the sentinel (None without
    out=)}`` and, when the call returned, the destination shards of every entry in order."""
    from shardspec.reshard import ReshardError, reshard, reshard_state_dict

    state: dict[str, list[torch.Tensor]] = {}
    src, dst, dtypes = {}, {}, {}
    outs: dict[str, list[torch.Tensor]] = {}
    pos = 0
    for (key, s, d), e in zip(_own_layouts(ctx, args), args["entries"]):
        k = len(s.boxes_of(ctx.rank))
        state[key] = [_noncontig(t) if args.get("noncontig") else t for t in ts[pos : pos + k]]
        pos += k
        src[key], dst[key], dtypes[key] = s, d, getattr(torch, e["dtype"])
        if args.get("out"):
            outs[key] = [_sentinel(b.sizes, dtypes[key], ctx.device) for b in d.boxes_of(ctx.rank)]
    out = outs if args.get("out") else None
    check = bool(args.get("check_replicas"))
    try:
        if args["api"] == "reshard":
            (key,) = state
            given = None if out is None else out[key]
            got = {
                key: reshard(
                    state[key],
                    src[key],
                    dst[key],
                    dtype=dtypes[key],
                    out=given,
                    check_replicas=check,
                )
            }
        else:
            got = reshard_state_dict(state, src, dst, dtypes=dtypes, out=out, check_replicas=check)
    except ReshardError as e:
        untouched = None if out is None else all(_untouched(t) for v in out.values() for t in v)
        return {"error": str(e), "untouched": untouched}, []
    return {"error": None, "untouched": None}, [t.contiguous() for k in state for t in got[k]]
