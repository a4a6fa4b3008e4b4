"""The Hypothesis strategies every area draws from; those of one concern live beside this
module (``checkpoint``, ``agreement``, ``grids``, ``json``, ``streams``, ``scale``).

Re-exports ``shardspec.metadata.strategies`` (layouts: chunk, grid, guillotine, replicas,
shuffled order; DTensor meshes and placements) and adds what the suite needs on top: the
arguments of a chunking, layouts that are often invalid (for validators), an empty shard buried
inside another shard, dtypes, tensors with arbitrary bit patterns (NaN payloads, -0.0) that are
often non-contiguous, and DTensor cases sized for the rank pool. Everything shrinks towards
small shapes, few ranks and simple placements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.codec import placements_to_json
from shardspec.metadata import Box, Layout, Shard
from shardspec.metadata.strategies import *  # noqa: F403 - the shared strategies, re-exported
from shardspec.metadata.strategies import (
    chunk_layouts,
    grid_layouts,
    guillotine_layouts,
    permuted,
    shapes,
    valid_layouts,
    with_replicas,
)
from shardspec.testing.protocol import DTYPES

# The dtypes the suite draws: every kind of element the spec talks about (the wire carries more,
# float8 and unsigned kinds among them, which gloo's collectives do not all take).
DTYPE_NAMES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    "complex64",
)


def dtypes() -> st.SearchStrategy[torch.dtype]:
    """Every dtype the suite moves: float32/64, float16, bfloat16, int8..int64, uint8, bool,
    complex64. Shrinks towards float32."""
    return st.sampled_from([DTYPES[n] for n in DTYPE_NAMES])


@st.composite
def tensors(
    draw: st.DrawFn,
    shape: Sequence[int],
    dtype: st.SearchStrategy[torch.dtype] | None = None,
) -> torch.Tensor:
    """A tensor of ``shape`` with arbitrary bits (so NaN payloads, infinities and -0.0 turn
    up for floats), non-contiguous about half the time (a strided view into a larger buffer, or
    transposed storage)."""
    dt = draw(dtype if dtype is not None else dtypes())
    seed = draw(st.integers(0, 2**32 - 1))
    gen = torch.Generator().manual_seed(seed)
    numel = math.prod(shape)
    item = torch.empty((), dtype=dt).element_size()
    if dt == torch.bool:
        base = torch.randint(0, 2, (numel,), generator=gen, dtype=torch.uint8).bool()
    else:
        raw = torch.randint(0, 256, (numel * item,), generator=gen, dtype=torch.uint8)
        base = raw.view(dt) if numel else torch.empty(0, dtype=dt)
    t = base.reshape(tuple(shape))
    layout = draw(st.sampled_from(["contiguous", "strided", "transposed"]))
    if layout == "strided" and len(shape) >= 1:
        wide = torch.zeros((*shape[:-1], shape[-1] * 2 + 1), dtype=dt)
        view = wide[..., 1::2]
        view.copy_(t)
        t = view
    elif layout == "transposed" and len(shape) >= 2:
        t = t.transpose(0, -1).contiguous().transpose(0, -1)
    return t


@st.composite
def chunk_args(
    draw: st.DrawFn,
    shape: st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    max_ranks: int = 6,
) -> tuple[tuple[int, ...], int, list[int]]:
    """``(shape, dim, ranks)`` of a chunking: any dim (negative too), any number of ranks
    (more ranks than rows included), ranks in any order with gaps in the numbering."""
    shp = draw(shape if shape is not None else shapes(min_dims=1))
    dim = draw(st.integers(0, len(shp) - 1))
    if draw(st.integers(0, 4)) == 0:
        dim -= len(shp)
    k = draw(st.integers(1, max_ranks))
    ranks = draw(st.permutations(range(k + draw(st.integers(0, 2)))))
    return shp, dim, list(ranks[:k])


@st.composite
def uneven_chunk_args(
    draw: st.DrawFn, *, max_ranks: int = 6
) -> tuple[tuple[int, ...], int, list[int]]:
    """Chunkings with at least one empty chunk past ``ceil(n/k) * i > n``: more ranks than
    the rule can fill, the case where upstream builders disagree on the offset."""
    shp, dim, ranks = draw(chunk_args(shapes(min_dims=1, max_side=9), max_ranks=max_ranks))
    if shp[dim] == 0:  # a zero-size dim has every chunk at 0 == n: nothing to disagree on
        shp = shp[:dim] + (1,) + shp[dim + 1 :] if dim >= 0 else shp
        if dim < 0:
            d = dim % len(shp)
            shp = shp[:d] + (1,) + shp[d + 1 :]
    n, k = shp[dim], len(ranks)
    split = -(-n // k)
    if not any(i * split > n for i in range(k)):
        # too few ranks to leave an empty chunk past the end: add them
        k2 = k
        while not any(i * (-(-n // k2)) > n for i in range(k2)):
            k2 += 1
        ranks = ranks + [max(ranks) + 1 + j for j in range(k2 - k)]
    return shp, dim, ranks


@st.composite
def perturbed_layouts(draw: st.DrawFn, max_ranks: int = 5) -> Layout:
    """A valid layout, then maybe one mistake: a box moved, grown or shrunk, dropped,
    duplicated on its rank, or out of bounds. About half are invalid; the oracle decides."""
    layout = draw(valid_layouts(shapes(max_dims=3, max_side=5), max_ranks=max_ranks))
    shards = list(layout.shards)
    if not shards or not draw(st.booleans()):
        return layout
    i = draw(st.integers(0, len(shards) - 1))
    s = shards[i]
    kind = draw(st.sampled_from(["move", "resize", "drop", "duplicate"]))
    if kind == "drop":
        del shards[i]
    elif kind == "duplicate":
        shards.append(s)
    elif s.box.ndim:
        d = draw(st.integers(0, s.box.ndim - 1))
        offs, sizes = list(s.box.offsets), list(s.box.sizes)
        delta = draw(st.sampled_from([-1, 1, 2]))
        if kind == "move":
            offs[d] = max(0, offs[d] + delta)
        else:
            sizes[d] = max(0, sizes[d] + delta)
        shards[i] = Shard(Box(offs, sizes), s.rank)
    return Layout(layout.shape, shards)


@st.composite
def layouts_with_buried_empty_shard(draw: st.DrawFn) -> Layout:
    """A valid layout plus an empty box whose offsets lie strictly inside a non-empty box
    (valid by BOX-2: an empty box overlaps nothing), on a rank that does not hold that box."""
    shp = draw(shapes(min_dims=1, max_dims=3, min_side=2, max_side=5))
    layout = draw(st.one_of(chunk_layouts(st.just(shp)), grid_layouts(st.just(shp))))
    hosts = [s for s in layout.shards if all(n >= 2 for n in s.box.sizes)]
    if not hosts:
        hosts = [Shard(Box.full(shp), 0)]
        layout = Layout(shp, hosts)
    host = draw(st.sampled_from(hosts))
    offs, sizes = [], []
    for o, n in host.box:
        offs.append(draw(st.integers(o + 1, o + n - 1)))
        sizes.append(draw(st.integers(0, o + n - offs[-1])))
    d = draw(st.integers(0, len(shp) - 1))
    sizes[d] = 0
    rank = max(s.rank for s in layout.shards) + 1
    return draw(permuted(Layout(shp, [*layout.shards, Shard(Box(offs, sizes), rank)])))


def mesh_shapes(*, max_world: int = 4, max_dims: int = 3) -> st.SearchStrategy[tuple[int, ...]]:
    """Mesh shapes up to ``max_dims``-D with at most ``max_world`` devices (size-1 dims
    included), shrinking towards ``(1,)``."""

    @st.composite
    def build(draw: st.DrawFn) -> tuple[int, ...]:
        nd = draw(st.integers(1, max_dims))
        out: list[int] = []
        total = 1
        for _ in range(nd):
            k = draw(st.integers(1, max(1, max_world // total)))
            out.append(k)
            total *= k
        return tuple(out)

    return build()


def world_sizes() -> st.SearchStrategy[int]:
    """A world size of this run: 1 to SHARDSPEC_MAX_WORLD, or the simulated sizes
    (SHARDSPEC_SIM_WORLDS, e.g. 8..1024) when set. Shrinks towards the smallest."""
    from shardspec.testing.devices import world_sizes as sizes

    return st.sampled_from(sizes())


@st.composite
def factorizations(draw: st.DrawFn, world: int, max_dims: int = 4) -> tuple[int, ...]:
    """A mesh shape of exactly ``world`` devices, 1-D to ``max_dims``-D, size-1 dims
    included (HSDP x TP x ... meshes of a large world)."""
    nd = draw(st.integers(1, max_dims))
    out: list[int] = []
    left = world
    for _ in range(nd - 1):
        k = draw(st.sampled_from([d for d in range(1, left + 1) if left % d == 0]))
        out.append(k)
        left //= k
    out.append(left)
    return tuple(draw(st.permutations(out)))


# FSDP x TP meshes of up to 4 pool ranks: (dp, tp), and HSDP x TP with outer replicate dims.
POOLED_FSDP_MESHES = (
    (1, 1), (1, 2), (2, 1), (2, 2), (1, 3), (3, 1), (1, 4), (4, 1),
    (2, 1, 2), (2, 2, 1), (1, 2, 2), (2, 1, 1, 2),
)  # fmt: skip


@st.composite
def fsdp_meshes(draw: st.DrawFn) -> tuple[int, ...]:
    """A ``(*outer, dp, tp)`` mesh shape for FSDP x TP: 2-D, or 3-D / 4-D HSDP x TP (outer dims
    replicate). With simulated worlds, a factorization of one of them, largest world first (so
    a run of a few examples starts at 1024 ranks: rank numbers above 255), padded with size-1
    dims to at least 2-D; dp or tp larger than the tensor's rows, size-1 dims included."""
    from shardspec.testing.devices import simulated_worlds

    worlds = simulated_worlds()
    if not worlds:
        return draw(st.sampled_from(POOLED_FSDP_MESHES))
    world = draw(st.sampled_from(sorted(worlds, reverse=True)))
    dims = list(draw(factorizations(world)))
    if len(dims) < 2:
        dims.insert(draw(st.integers(0, 1)), 1)
    return tuple(dims)


@st.composite
def fsdp_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], list[Any]]:
    """``(shape, (*outer, dp, tp) mesh, TP placement)`` for FSDP x TP (:func:`fsdp_meshes`),
    TP ``["R"]`` or ``["S", d]``. On simulated worlds the shape is drawn with the mesh: dim 0
    against the ranks that cut it (dp, times tp when TP shards dim 0 too), a TP dim against tp
    (:mod:`conformance.strategies.scale`), so most ranks hold data and some hold none."""
    from conformance.strategies.scale import long_sides
    from shardspec.testing.devices import simulated_worlds

    mesh = draw(fsdp_meshes())
    if not simulated_worlds():
        shape = draw(shapes(min_dims=1, max_dims=3, max_side=7))
        tp = draw(st.one_of(st.just(["R"]), st.integers(0, len(shape) - 1).map(lambda d: ["S", d])))
        return shape, mesh, tp
    *_, dp, tps = mesh
    nd = draw(st.integers(1, 3))
    # the simplest draw: TP on dim 0, so dim 0 is cut into dp * tp parts
    tp = draw(st.one_of(st.integers(0, nd - 1).map(lambda d: ["S", d]), st.just(["R"])))
    cuts = [dp * (tps if tp == ["S", 0] else 1)] + [
        tps if tp == ["S", d] else 0 for d in range(1, nd)
    ]
    shape = tuple(draw(long_sides(c)) if c else draw(st.integers(1, 3)) for c in cuts)
    return shape, mesh, tp


@st.composite
def placement_lists(draw: st.DrawFn, ndim: int, mesh_ndim: int) -> list[Any]:
    """JSON placements (``["S", d]``, ``["R"]``, ``["SS", d, f]``), drawn with the shared
    ``dtensor_placements`` strategy."""
    from shardspec.metadata.strategies import dtensor_placements

    return placements_to_json(draw(dtensor_placements(ndim, mesh_ndim, max_split_factor=3)))


@st.composite
def dtensor_pool_cases(
    draw: st.DrawFn,
    *,
    max_world: int = 4,
    strided: bool = True,
    negative_dims: bool = True,
    worlds: Sequence[int] = (),
) -> tuple[tuple[int, ...], tuple[int, ...], list[Any]]:
    """``(shape, mesh shape, JSON placements)`` for a mesh of the pool's ranks in row-major
    order: 0-d to 4-d shapes with zero-size dims, meshes up to 3-D, nested and strided
    shards, more ranks than rows. ``worlds`` (or the simulated worlds of the run): draw the
    mesh from these world sizes (up to 4-D, the largest first) instead of the run's pools, and
    the shape with the world (:mod:`conformance.strategies.scale`)."""
    from conformance.strategies.scale import largest_first, scale_shapes
    from shardspec.testing.devices import simulated_worlds

    scale = list(worlds) or simulated_worlds()
    if scale:  # a mesh of exactly one world, up to 4-D, largest world first
        mesh = draw(factorizations(draw(largest_first(scale))))
        shp = draw(scale_shapes(math.prod(mesh), max_dims=4))
    else:
        shp = draw(shapes(max_dims=4, max_side=6))
        mesh = draw(mesh_shapes(max_world=max_world))
    placements = draw(placement_lists(len(shp), len(mesh)))
    if scale and draw(st.integers(0, 3)) == 0:
        # the simplest draw shards the long dim over the largest mesh dim: data on most ranks
        long = max(range(len(shp)), key=lambda d: shp[d])
        placements[max(range(len(mesh)), key=lambda m: mesh[m])] = ["S", long]
    if not strided:
        placements = [p if p[0] != "SS" else ["S", p[1]] for p in placements]
    if not negative_dims:
        placements = [[p[0], p[1] % len(shp), *p[2:]] if p[0] != "R" else p for p in placements]
    return shp, mesh, placements


@st.composite
def large_mesh_cases(
    draw: st.DrawFn,
) -> tuple[tuple[int, ...], tuple[int, ...], list[Any]]:
    """``(shape, mesh shape, JSON placements)`` on 64 to 1,040 mesh coordinates, where an
    implementation may build a DTensor's whole layout another way than box by box: small dims
    (more coordinates than rows, empty pieces), 1-D to 3-D meshes, every placement kind."""
    sides = draw(
        st.lists(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 16, 64, 65]), min_size=1, max_size=3).filter(
            lambda ks: 64 <= math.prod(ks) <= 1040
        )
    )
    shp = draw(shapes(max_dims=3, max_side=70))
    return shp, tuple(sides), draw(placement_lists(len(shp), len(sides)))


@st.composite
def large_mesh_nested_empty_cases(
    draw: st.DrawFn,
) -> tuple[tuple[int, ...], tuple[int, ...], list[Any]]:
    """Dim 0 of ``n`` rows cut on a large mesh by two ``Shard(0)``: ``k1`` parts, each cut into
    ``k2 > its rows`` parts, so the first part's empty pieces sit at its end, inside the dim
    (DTENSOR-6), on 64 or more coordinates."""
    k1 = draw(st.integers(2, 8))
    k2 = draw(st.integers(max(8, -(-64 // k1)), 128))
    n = draw(st.integers(2, min(k2, 4 * k1)))
    shp = (n, draw(st.integers(1, 3)))
    if draw(st.booleans()):
        return shp, (k1, k2), [["S", 0], ["S", 0]]
    return shp, (k1, 2, k2), [["S", 0], ["R"], ["S", -2]]


__all__ = [
    "DTYPE_NAMES",
    "chunk_args",
    "chunk_layouts",
    "dtensor_pool_cases",
    "dtypes",
    "factorizations",
    "fsdp_cases",
    "fsdp_meshes",
    "grid_layouts",
    "guillotine_layouts",
    "large_mesh_cases",
    "large_mesh_nested_empty_cases",
    "layouts_with_buried_empty_shard",
    "mesh_shapes",
    "nested_empty_cases",
    "permuted",
    "perturbed_layouts",
    "placement_lists",
    "shapes",
    "tensors",
    "uneven_chunk_args",
    "valid_layouts",
    "with_replicas",
    "world_sizes",
]


@st.composite
def nested_empty_cases(
    draw: st.DrawFn,
) -> tuple[tuple[int, ...], tuple[int, ...], list[Any]]:
    """``[Shard(0), Shard(0)]`` on an ``a x b`` mesh where the second level has more ranks
    than the first piece has rows, so a nested empty piece sits before the end of the dim."""
    a = draw(st.integers(2, 3))
    n = draw(st.integers(2, 7))
    first = -(-n // a)
    b = draw(st.integers(first + 1, max(first + 1, 16 // a)))
    extra = draw(shapes(max_dims=1, min_side=1, max_side=3))
    return (n, *extra), (a, b), [["S", 0], ["S", 0]]
