"""A refit case as Megatron-Core's resharding sees it: each rank's ``ParameterMetadata`` of its
source and destination parameters (as plain data; ``refit_ops.py`` builds the real objects on
the ranks), the rosters that ``megatron.core.resharding.build_local_reshard_plan`` gathers.

Megatron reshards between two Megatron models of the same parameters: each rank holds one
local tensor per parameter, either whole (replicated across its data-parallel group) or its
tensor-parallel chunk along one ``partition_dim`` (even: ``size / TP`` a rank, ranks in
ascending order, as ``torch.distributed.new_group`` orders a TP group), or, for a parameter
packing several independently split parts (``partition_sizes``), its chunk of each part in
part order. A rename is its ``resolved_name`` (the name both sides match on). Every other
transform of a recipe (packing separate sources, padding, stacking, transposes, casts, FP8
blocks) and every other layout (uneven or empty chunks, several dims split, chunks out of rank
order) is not expressible: :class:`Inexpressible` says why, and the adapter reports the case
unsupported with that reason (CONF-4).

Pure: no Megatron import, so the suite's own venv can test it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardspec.metadata import Box, Layout

__all__ = ["Inexpressible", "Sharding", "rosters", "sharding"]


class Inexpressible(ValueError):
    """The case has something Megatron's resharding has no way to say."""


@dataclass(frozen=True)
class Sharding:
    """One rank's Megatron view of one parameter."""

    local_shape: tuple[int, ...]
    is_tp: bool
    partition_dim: int
    partition_sizes: list[int] | None  # per-rank size of each packed part, or None
    tp: list[int]  # its TP group, in TP order (one rank when whole)
    dp: list[int]  # the ranks that hold the same chunk
    # how the local tensor is the rank's boxes, in local order: their sizes along split_dim
    split_dim: int = 0
    pieces: tuple[int, ...] = ()


def _split_dims(shape: tuple[int, ...], per: dict[int, list[Box]]) -> set[int]:
    return {
        d
        for boxes in per.values()
        for b in boxes
        for d in range(len(shape))
        if b.offsets[d] != 0 or b.sizes[d] != shape[d]
    }


def sharding(name: str, layout: Layout) -> dict[int, Sharding]:
    """Each holding rank's :class:`Sharding` of ``name`` in ``layout``."""
    shape = tuple(layout.shape)
    per = {r: list(layout.boxes_of(r)) for r in sorted(layout.ranks)}
    per = {r: v for r, v in per.items() if v}
    counts = {len(v) for v in per.values()}
    if len(counts) > 1:
        raise Inexpressible(
            f"{name!r}: its ranks hold {sorted(counts)} boxes each, where a Megatron parameter "
            "is one local tensor of the same parts on every rank"
        )
    dims = _split_dims(shape, per)
    if not dims:
        whole = next(iter(per.values()))
        if len(whole) != 1:
            raise Inexpressible(f"{name!r}: a rank holds the whole tensor {len(whole)} times")
        ranks = sorted(per)
        return {r: Sharding(shape, False, 0, None, [r], ranks, 0, (shape[0],) if shape else ())
                for r in ranks}  # fmt: skip
    if len(dims) > 1:
        raise Inexpressible(
            f"{name!r} is split along dims {sorted(dims)}; Megatron splits one (partition_dim)"
        )
    d = dims.pop()
    k = counts.pop()
    parts = [sorted({(v[p].offsets[d], v[p].sizes[d]) for v in per.values()}) for p in range(k)]
    tp = len(parts[0])
    at, local = 0, []
    for p, ranges in enumerate(parts):
        size = ranges[0][1]
        if len(ranges) != tp or any(
            s != size or o != at + i * size for i, (o, s) in enumerate(ranges)
        ):
            raise Inexpressible(
                f"{name!r}: part {p}'s chunks along dim {d} are {ranges}, where Megatron's TP "
                f"splits each part into {tp} equal, contiguous chunks"
            )
        at += tp * size
        local.append(size)
    if at != shape[d]:
        raise Inexpressible(f"{name!r}: its chunks cover {at} of dim {d}'s {shape[d]}")
    if 0 in local and shape[d]:
        raise Inexpressible(f"{name!r}: an empty chunk, where Megatron's TP splits evenly")
    index: dict[int, int] = {}
    for r, v in per.items():
        at_ = {parts[p].index((v[p].offsets[d], v[p].sizes[d])) for p in range(k)}
        if len(at_) != 1:
            raise Inexpressible(f"{name!r}: rank {r} holds chunks {sorted(at_)} of its parts")
        index[r] = at_.pop()
    by_index = [sorted(r for r, i in index.items() if i == j) for j in range(tp)]
    copies = {len(v) for v in by_index}
    if len(copies) != 1:
        raise Inexpressible(
            f"{name!r}: its {tp} chunks are held by {[len(v) for v in by_index]} ranks each, "
            "where Megatron replicates whole TP groups (data parallelism)"
        )
    out = {}
    for j in range(copies.pop()):
        group = [by_index[i][j] for i in range(tp)]
        if group != sorted(group):
            raise Inexpressible(
                f"{name!r}: ranks {group} hold chunks 0..{tp - 1} in that order, where a "
                "Megatron TP group's chunks follow its ranks' ascending order"
            )
        for i, r in enumerate(group):
            local_shape = tuple(sum(local) if e == d else n for e, n in enumerate(shape))
            if tp == 1:  # every rank holds its parts whole: the whole tensor, in order
                out[r] = Sharding(local_shape, False, 0, None, [r], by_index[0], d, tuple(local))
            else:
                sizes = list(local) if k > 1 else None
                out[r] = Sharding(local_shape, True, d, sizes, group, by_index[i], d, tuple(local))
    return out


def _side(names: dict[str, Layout]) -> dict[str, dict[int, Sharding]]:
    """Every parameter of one side; a whole parameter's TP and DP groups are those of its
    rank's model (Megatron gives every parameter its rank's TP group), when a TP parameter
    says what they are."""
    per = {n: sharding(n, layout) for n, layout in names.items()}
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for n, by_rank in per.items():
        for r, s in by_rank.items():
            if not s.is_tp:
                continue
            had = groups.setdefault(r, (s.tp, s.dp))
            if had != (s.tp, s.dp):
                raise Inexpressible(
                    f"rank {r} is in TP group {had[0]} (DP {had[1]}) for one parameter and "
                    f"{s.tp} (DP {s.dp}) for {n!r}: a Megatron model has one of each per rank"
                )
    for by_rank in per.values():
        for r, s in list(by_rank.items()):
            if not s.is_tp and r in groups:
                tp, dp = groups[r]
                by_rank[r] = Sharding(s.local_shape, False, 0, None, tp, dp, s.split_dim, s.pieces)
    return per


def _meta(name: str, resolved: str, dtype: str, s: Sharding) -> dict[str, Any]:
    return {
        "name": name,
        "resolved_name": resolved,
        "dtype": dtype,
        "shape": list(s.local_shape),
        "is_tp": s.is_tp,
        "partition_dim": s.partition_dim,
        "partition_sizes": s.partition_sizes,
        "tp": s.tp,
        "dp": s.dp,
        "split_dim": s.split_dim,
        "pieces": list(s.pieces),
    }


def rosters(
    recipe: Any,
    src: dict[str, Layout],
    dst: dict[str, Layout],
    dtypes: dict[str, str],
    world: int,
) -> list[dict[str, list[dict[str, Any]]]]:
    """Per rank, ``{"src": [...], "dst": [...]}``: the metadata of the parameters it holds
    (source parameters by source name, resolved to the target's name; destination parameters
    by target name). Raises :class:`Inexpressible`."""
    from shardspec.refit import Source

    feeds: dict[str, list[str]] = {}
    for t in recipe.targets:
        if type(t.expr) is not Source:
            raise Inexpressible(
                f"target {t.name!r} = {t.expr!r}: Megatron's resharding moves each parameter "
                "as it is (a rename at most: its resolved_name); it has no packing of separate "
                "tensors, padding, stacking, transposes, casts or FP8 blocks"
            )
        feeds.setdefault(t.expr.name, []).append(t.name)
    used = {n: src[n] for n in feeds}
    s_side, d_side = _side(used), _side(dst)
    out: list[dict[str, list[dict[str, Any]]]] = [{"src": [], "dst": []} for _ in range(world)]
    for n, by_rank in s_side.items():
        for target in feeds[n]:
            for r, s in by_rank.items():
                out[r]["src"].append(_meta(n, target, dtypes[n], s))
    for t in recipe.targets:
        assert isinstance(t.expr, Source)
        for r, s in d_side[t.name].items():
            out[r]["dst"].append(_meta(t.name, t.name, dtypes[t.expr.name], s))
    return out
