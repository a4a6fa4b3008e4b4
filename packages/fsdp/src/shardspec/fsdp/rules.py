"""The boxes every rank holds under FSDP (or HSDP) on top of tensor parallelism.

The mesh is ``(replicate, dp, tp)`` (``replicate`` is 1 for plain FSDP), ranks in row-major
order unless ``ranks`` names them. Tensor parallelism cuts the global tensor first (a TP
placement on the ``tp`` mesh dim); FSDP then ``torch.chunk``s each rank's TP piece along its
shard dim (always dim 0 for FSDP1) over ``dp``; HSDP's replicate dim copies the result.
Composing the two chunk rules gives the truth (spec/07-fsdp.md, FSDP-1..3). DTensor's own
reading of a list of placements (left to right, ``_StridedShard`` included) is
:func:`placements_layout`, which hands over to ``shardspec.metadata.dtensor_math`` (DTENSOR-*);
FSDP-4/5 say where it and the truth part ways.

Empty FSDP boxes are canonical: a dim of size 0 sits at offset ``shape[d]`` (CHUNK-2 applied to
the global tensor), other dims keep their interval. Empty DTensor boxes follow DTENSOR-6.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from shardspec.metadata import Box, Layout, LayoutError, Shard, chunk_size
from shardspec.metadata.box import as_index_tuple
from shardspec.metadata.dtensor_math import local_boxes, mesh_layout
from shardspec.metadata.placements import Placement, Replicate, ShardDim, StridedShardDim, to_split

__all__ = [
    "canonical_box",
    "dtensor_boxes",
    "fsdp1_claimed_placements",
    "fsdp1_layout",
    "fsdp2_layout",
    "fsdp2_placements",
    "fsdp_box",
    "fsdp_tp_layout",
    "mesh_coords",
    "placements_for_fsdp",
    "placements_layout",
    "tp_box",
]


def mesh_coords(mesh_shape: Sequence[int]) -> list[tuple[int, ...]]:
    """Every coordinate of a mesh, row-major (the order of ``ranks``)."""
    return list(itertools.product(*(range(n) for n in mesh_shape)))


def canonical_box(shape: Sequence[int], offsets: Sequence[int], sizes: Sequence[int]) -> Box:
    """The box, with every zero-size dim moved to offset ``shape[d]``."""
    return Box(
        [shape[d] if sizes[d] == 0 else offsets[d] for d in range(len(shape))],
        sizes,
    )


def _check_shape(shape: Sequence[int]) -> tuple[int, ...]:
    return as_index_tuple(shape, "shape")


def _check_dim(shape: tuple[int, ...], dim: int, what: str) -> None:
    if not 0 <= dim < len(shape):
        raise LayoutError(f"{what} dim {dim} is out of range for shape {shape} (ndim {len(shape)})")


def _chunk_bound(n: int, k: int, i: int) -> tuple[int, int]:
    """Chunk ``i`` of ``chunk_bounds(n, k)`` without listing the other ``k - 1``: a mesh's
    layout takes one box per rank, which would make it O(ranks^2)."""
    split = chunk_size(n, k)
    return min(i * split, n), min((i + 1) * split, n)


def tp_box(shape: Sequence[int], tp: Placement, tp_size: int, t: int) -> Box:
    """The box TP coordinate ``t`` holds: ``Shard(d)`` chunks dim ``d`` over ``tp_size``,
    ``Replicate`` holds everything. (``_StridedShard`` is not a TP placement.)"""
    shp = _check_shape(shape)
    if tp_size < 1 or not 0 <= t < tp_size:
        raise LayoutError(f"TP coordinate {t} is not in a TP mesh of size {tp_size}")
    if isinstance(tp, Replicate):
        return Box.full(shp)
    if isinstance(tp, StridedShardDim):
        raise LayoutError(f"TP placement {tp} is not supported: TP shards with Shard or Replicate")
    _check_dim(shp, tp.dim, "TP shard")
    lo, hi = _chunk_bound(shp[tp.dim], tp_size, t)
    offs = [0] * len(shp)
    sizes = list(shp)
    offs[tp.dim], sizes[tp.dim] = lo, hi - lo
    return canonical_box(shp, offs, sizes)


def fsdp_box(
    shape: Sequence[int],
    tp: Placement,
    *,
    tp_size: int,
    dp_size: int,
    t: int,
    p: int,
    shard_dim: int = 0,
) -> Box:
    """The box of TP coordinate ``t`` and FSDP (shard) coordinate ``p``: chunk ``p`` of the
    TP box along ``shard_dim`` over ``dp_size`` (FSDP-1)."""
    shp = _check_shape(shape)
    if not shp:
        raise LayoutError(f"FSDP cannot shard a 0-d tensor (shape {shp}): torch.chunk needs a dim")
    _check_dim(shp, shard_dim, "FSDP shard")
    if dp_size < 1 or not 0 <= p < dp_size:
        raise LayoutError(f"FSDP coordinate {p} is not in a shard group of size {dp_size}")
    outer = tp_box(shp, tp, tp_size, t)
    offs, sizes = list(outer.offsets), list(outer.sizes)
    # The TP piece is chunked as a local tensor: its local extent, then back to global.
    n = sizes[shard_dim]
    base = offs[shard_dim] if n else 0
    lo, hi = _chunk_bound(n, dp_size, p)
    offs[shard_dim], sizes[shard_dim] = base + lo, hi - lo
    return canonical_box(shp, offs, sizes)


def _mesh_ranks(mesh_shape: tuple[int, ...], ranks: Sequence[int] | None) -> tuple[int, ...]:
    count = 1
    for n in mesh_shape:
        count *= n
    if ranks is None:
        return tuple(range(count))
    rks = as_index_tuple(ranks, "ranks")
    if len(rks) != count:
        raise LayoutError(f"a mesh of shape {mesh_shape} needs {count} ranks, got {len(rks)}")
    if len(set(rks)) != len(rks):
        raise LayoutError(f"ranks {rks} name a rank twice")
    return rks


def fsdp_tp_layout(
    shape: Sequence[int],
    tp: Placement,
    *,
    dp: int,
    tp_size: int,
    replicate: int = 1,
    shard_dim: int = 0,
    ranks: Sequence[int] | None = None,
) -> Layout:
    """Every rank's box on the mesh ``(replicate, dp, tp)``: one box per rank, in rank order;
    the ``replicate`` coordinates hold replicas (FSDP-1, FSDP-2)."""
    mesh_shape = (replicate, dp, tp_size)
    rks = _mesh_ranks(mesh_shape, ranks)
    shards = []
    for rank, (_, p, t) in zip(rks, mesh_coords(mesh_shape)):
        box = fsdp_box(shape, tp, tp_size=tp_size, dp_size=dp, t=t, p=p, shard_dim=shard_dim)
        shards.append(Shard(box, rank))
    return Layout(_check_shape(shape), shards)


def fsdp1_layout(
    shape: Sequence[int],
    tp: Placement,
    *,
    dp: int,
    tp_size: int,
    replicate: int = 1,
    ranks: Sequence[int] | None = None,
) -> Layout:
    """FSDP1 + TP: FSDP1 chunks every TP piece along dim 0 (its state dict and optimizer
    state dict, ``_chunk_tensor`` / ``_chunk_dtensor``)."""
    return fsdp_tp_layout(
        shape, tp, dp=dp, tp_size=tp_size, replicate=replicate, shard_dim=0, ranks=ranks
    )


def fsdp2_layout(
    shape: Sequence[int],
    tp: Placement,
    *,
    dp: int,
    tp_size: int,
    replicate: int = 1,
    shard_dim: int = 0,
    ranks: Sequence[int] | None = None,
) -> Layout:
    """FSDP2 (``fully_shard``) + TP: the local tensor of every sharded parameter is chunk
    ``p`` of the TP local tensor along ``shard_dim`` (``_chunk_with_empty`` in
    ``_fsdp_param.py``), the same composition as FSDP1 with a choosable dim."""
    return fsdp_tp_layout(
        shape, tp, dp=dp, tp_size=tp_size, replicate=replicate, shard_dim=shard_dim, ranks=ranks
    )


# DTensor's reading of placements: shardspec.metadata's rule (DTENSOR-1..7), not a copy ---------


def dtensor_boxes(
    shape: Sequence[int],
    mesh_shape: Sequence[int],
    placements: Sequence[Placement],
    coord: Sequence[int],
) -> tuple[Box, ...]:
    """The boxes one mesh coordinate holds under DTensor's reading of ``placements``, in
    local storage order (``shardspec.metadata.dtensor_math.local_boxes``, DTENSOR-7): the grid
    of each dim's runs, an empty piece at its parent's end (DTENSOR-6)."""
    shp = _check_shape(shape)
    mshape = as_index_tuple(mesh_shape, "mesh shape")
    return local_boxes(shp, mshape, [to_split(p, len(shp)) for p in placements], coord)


def placements_layout(
    shape: Sequence[int],
    mesh_shape: Sequence[int],
    placements: Sequence[Placement],
    ranks: Sequence[int] | None = None,
) -> Layout:
    """What a DTensor with these placements says every rank holds (FSDP-4), as
    ``shardspec.metadata.dtensor_layout`` reads torch placements, without torch (named apart
    from it: this one takes shardspec placements and a mesh shape)."""
    shp = _check_shape(shape)
    mshape = as_index_tuple(mesh_shape, "mesh shape")
    rks = _mesh_ranks(mshape, ranks)
    return mesh_layout(shp, mshape, rks, [to_split(p, len(shp)) for p in placements])


def fsdp2_placements(
    tp: Placement, tp_size: int, *, shard_dim: int = 0, hsdp: bool = False
) -> tuple[Placement, ...]:
    """The placements ``fully_shard`` gives a TP parameter on ``(replicate?, dp, tp)``:
    ``_StridedShard(shard_dim, tp_size)`` on dp when TP shards the same dim, else
    ``Shard(shard_dim)``."""
    same = isinstance(tp, ShardDim) and tp.dim == shard_dim and tp_size > 1
    dp_pl: Placement = StridedShardDim(shard_dim, tp_size) if same else ShardDim(shard_dim)
    return ((Replicate(),) if hsdp else ()) + (dp_pl, tp)


def fsdp1_claimed_placements(tp: Placement, *, hsdp: bool = False) -> tuple[Placement, ...]:
    """The placements upstream ``_chunk_dtensor`` (tensor/parallel/fsdp.py) gives a TP
    parameter: ``Shard(0)`` on dp whatever TP does."""
    return ((Replicate(),) if hsdp else ()) + (ShardDim(0), tp)


def placements_for_fsdp(
    shape: Sequence[int],
    tp: Placement,
    *,
    dp: int,
    tp_size: int,
    replicate: int = 1,
    shard_dim: int = 0,
) -> tuple[Placement, ...] | None:
    """DTensor placements on ``(replicate?, dp, tp)`` whose layout is exactly the FSDP truth
    (FSDP-5), or None when no such list exists among the candidates FSDP could use."""
    truth = fsdp_tp_layout(
        shape, tp, dp=dp, tp_size=tp_size, replicate=replicate, shard_dim=shard_dim
    )
    hsdp = replicate > 1
    mesh_shape = ((replicate,) if hsdp else ()) + (dp, tp_size)
    candidates = [fsdp2_placements(tp, tp_size, shard_dim=shard_dim, hsdp=hsdp)]
    if not (isinstance(tp, ShardDim) and tp.dim == shard_dim):
        candidates.append(((Replicate(),) if hsdp else ()) + (ShardDim(shard_dim), tp))
    for pls in candidates:
        if placements_layout(shape, mesh_shape, pls).equivalent(truth):  # LAYOUT-8
            return pls
    return None
