"""Hypothesis strategies for layouts (needs ``hypothesis``; install the ``testing`` extra).

One module for every test in the monorepo and the conformance suite, so that a strategy that
misses an edge (no empty shards, no zero-size dims, no replicas) is a bug fixed in one place.
Every strategy shrinks towards small shapes, few ranks and shard order as built.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from hypothesis import strategies as st

from .box import Box
from .chunk import chunk_layout
from .layout import Layout, Shard

__all__ = [
    "chunk_layouts",
    "device_meshes",
    "dtensor_cases",
    "dtensor_placements",
    "grid_layouts",
    "guillotine_layouts",
    "partitions",
    "permuted",
    "shapes",
    "valid_layouts",
    "with_replicas",
]


def shapes(
    *, min_dims: int = 0, max_dims: int = 4, min_side: int = 0, max_side: int = 7
) -> st.SearchStrategy[tuple[int, ...]]:
    """Tensor shapes, zero-size dims included unless ``min_side`` > 0."""
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(
        tuple
    )


@st.composite
def chunk_layouts(
    draw: st.DrawFn,
    shape: st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    max_ranks: int = 6,
) -> Layout:
    """``chunk_layout`` over a random dim with a random order of distinct ranks (any number
    of ranks, more ranks than rows included)."""
    shp = draw(shape if shape is not None else shapes(min_dims=1))
    dim = draw(st.integers(0, len(shp) - 1))
    k = draw(st.integers(1, max_ranks))
    ranks = draw(st.permutations(range(k)))
    return chunk_layout(shp, dim, ranks)


@st.composite
def partitions(draw: st.DrawFn, n: int, *, max_parts: int = 4) -> list[tuple[int, int]]:
    """A partition of ``[0, n)`` into consecutive intervals, empty ones allowed."""
    parts = draw(st.integers(1, max_parts))
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=parts - 1, max_size=parts - 1)))
    edges = [0, *cuts, n]
    return list(pairwise(edges))


@st.composite
def grid_layouts(
    draw: st.DrawFn,
    shape: st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    max_ranks: int = 6,
) -> Layout:
    """The cells of a product of per-dim partitions, each owned by a random rank (a rank may
    own several cells; empty cells are kept as empty boxes)."""
    shp = draw(shape if shape is not None else shapes())
    per_dim = [draw(partitions(n)) for n in shp]
    cells: list[Box] = [Box((), ())]
    for intervals in per_dim:
        cells = [Box((*c.offsets, a), (*c.sizes, b - a)) for c in cells for (a, b) in intervals]
    nranks = draw(st.integers(1, max_ranks))
    shards = [Shard(c, draw(st.integers(0, nranks - 1))) for c in cells]
    return _dedupe_rank_boxes(Layout(shp, shards))


@st.composite
def guillotine_layouts(
    draw: st.DrawFn,
    shape: st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    max_ranks: int = 6,
    max_cuts: int = 6,
) -> Layout:
    """Random guillotine partitions: repeatedly cut one piece in two along some dim (cuts at
    the edge make empty pieces). Not a product grid in general, so it exercises the general
    validator and planner paths."""
    shp = draw(shape if shape is not None else shapes(min_dims=1))
    pieces = [Box.full(shp)]
    for _ in range(draw(st.integers(0, max_cuts))):
        i = draw(st.integers(0, len(pieces) - 1))
        piece = pieces[i]
        d = draw(st.integers(0, len(shp) - 1))
        lo, size = piece.offsets[d], piece.sizes[d]
        at = draw(st.integers(0, size))
        left = Box(piece.offsets, piece.sizes[:d] + (at,) + piece.sizes[d + 1 :])
        right = Box(
            piece.offsets[:d] + (lo + at,) + piece.offsets[d + 1 :],
            piece.sizes[:d] + (size - at,) + piece.sizes[d + 1 :],
        )
        pieces[i : i + 1] = [left, right]
    nranks = draw(st.integers(1, max_ranks))
    shards = [Shard(p, draw(st.integers(0, nranks - 1))) for p in pieces]
    return _dedupe_rank_boxes(Layout(shp, shards))


def _dedupe_rank_boxes(layout: Layout) -> Layout:
    # Two empty pieces can coincide; on one rank that would be the same box twice (invalid),
    # so keep the first.
    seen: set[tuple[Box, int]] = set()
    out = []
    for s in layout.shards:
        if (s.box, s.rank) not in seen:
            seen.add((s.box, s.rank))
            out.append(s)
    return Layout(layout.shape, out)


@st.composite
def with_replicas(
    draw: st.DrawFn, layout: Layout, *, max_extra_ranks: int = 3, world: int | None = None
) -> Layout:
    """Add replicas: copies of some boxes on ranks that do not already hold them, up to
    ``max_extra_ranks`` above the layout's top rank, and below ``world`` when given (the
    ranks of a process group, which a resharding refuses to go beyond)."""
    shards = list(layout.shards)
    if not shards:
        return layout
    top = max(s.rank for s in shards) + max_extra_ranks
    if world is not None:
        top = min(top, world - 1)
    for s in draw(st.lists(st.sampled_from(layout.shards), max_size=4)):
        rank = draw(st.integers(0, top))
        if all(not (t.box == s.box and t.rank == rank) for t in shards):
            shards.append(Shard(s.box, rank))
    return Layout(layout.shape, shards)


@st.composite
def permuted(draw: st.DrawFn, layout: Layout) -> Layout:
    """The same layout with its shards in a random order."""
    return Layout(layout.shape, draw(st.permutations(layout.shards)))


@st.composite
def valid_layouts(
    draw: st.DrawFn,
    shape: st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    max_ranks: int = 6,
    replicas: bool = True,
    shuffle: bool = True,
    world: int | None = None,
) -> Layout:
    """Any valid layout: chunked, grid or guillotine, with replicas and shuffled order.
    ``world``: every rank below it (a layout of a process group of that many ranks; without
    it, replicas may name ranks up to three above ``max_ranks``)."""
    if world is not None:
        max_ranks = min(max_ranks, world)
    shp = draw(shape if shape is not None else shapes())
    fixed = st.just(shp)
    options = [grid_layouts(fixed, max_ranks=max_ranks)]
    if shp:
        options += [
            chunk_layouts(fixed, max_ranks=max_ranks),
            guillotine_layouts(fixed, max_ranks=max_ranks),
        ]
    layout = draw(st.one_of(options))
    if replicas and draw(st.booleans()):
        layout = draw(with_replicas(layout, world=world))
    if shuffle:
        layout = draw(permuted(layout))
    return layout


def rank_sequences(k: int, *, max_rank: int | None = None) -> st.SearchStrategy[Sequence[int]]:
    """``k`` distinct ranks in any order, drawn from ``range(max_rank or k)``."""
    pool = range(max(k, max_rank or k))
    return st.permutations(pool).map(lambda p: list(p[:k]))


def _nest(flat: list[int], shape: Sequence[int]) -> list[Any]:
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0]
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


@st.composite
def device_meshes(
    draw: st.DrawFn,
    *,
    max_dims: int = 4,
    max_ranks: int = 16,
    max_side: int = 4,
    spare_ranks: int = 8,
) -> list[Any]:
    """A ``DeviceMesh.mesh``-style nested list of distinct ranks: 1-D to ``max_dims``-D,
    size-1 dims included, at most ``max_ranks`` ranks, numbered in a random order from
    ``range(W + spare)`` (not just ``arange``). Shrinks towards a 1-D mesh of rank 0."""
    nd = draw(st.integers(1, max_dims))
    shape: list[int] = []
    total = 1
    for _ in range(nd):
        k = draw(st.integers(1, max(1, min(max_side, max_ranks // total))))
        shape.append(k)
        total *= k
    pool = draw(st.permutations(range(total + draw(st.integers(0, spare_ranks)))))
    return _nest(list(pool[:total]), shape)


@st.composite
def dtensor_placements(
    draw: st.DrawFn, ndim: int, mesh_ndim: int, *, max_split_factor: int = 6
) -> list[Any]:
    """torch placements, one per mesh dim: ``Replicate()``, ``Shard(d)`` and
    ``_StridedShard(d, split_factor=f)`` on any dim (negative dims too), so that nested shards
    of one dim on several mesh dims are common. Needs torch."""
    from torch.distributed.tensor.placement_types import Replicate, Shard as TShard, _StridedShard

    out: list[Any] = []
    for _ in range(mesh_ndim):
        kind = draw(st.sampled_from(["R", "S", "SS"] if ndim else ["R"]))
        if kind == "R":
            out.append(Replicate())
            continue
        dim = draw(st.integers(0, ndim - 1))
        if draw(st.integers(0, 4)) == 0:
            dim -= ndim  # torch accepts negative dims
        if kind == "S":
            out.append(TShard(dim))
        else:
            sf = draw(st.integers(1, max_split_factor))
            out.append(_StridedShard(dim, split_factor=sf))
    return out


@st.composite
def dtensor_cases(
    draw: st.DrawFn,
    shape: st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    max_mesh_dims: int = 4,
    max_ranks: int = 16,
) -> tuple[tuple[int, ...], list[Any], list[Any]]:
    """``(shape, mesh, placements)`` for DTensor: 0-d to 4-d shapes with zero-size dims,
    meshes up to 4-D (size-1 dims, shuffled rank numbers), every placement combination,
    and more ranks than rows. Needs torch."""
    shp = draw(shape if shape is not None else shapes(max_dims=4, max_side=7))
    mesh = draw(device_meshes(max_dims=max_mesh_dims, max_ranks=max_ranks))
    mesh_ndim = 1
    probe = mesh[0]
    while isinstance(probe, list):
        mesh_ndim += 1
        probe = probe[0]
    placements = draw(dtensor_placements(len(shp), mesh_ndim))
    return shp, mesh, placements
