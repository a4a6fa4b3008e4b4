"""Inferring a spec from a layout, independently of the order of its shards."""

from __future__ import annotations

from .box import Box
from .chunk import chunk_bounds
from .errors import LayoutError, shorten
from .layout import Layout
from .specs import ChunkSpec, EnumerableSpec

__all__ = ["chunk_spec_of", "infer_spec"]


def infer_spec(layout: Layout) -> ChunkSpec | EnumerableSpec:
    """The spec of a valid layout: a :class:`ChunkSpec` exactly when the layout equals
    ``chunk_layout(shape, dim, ranks)`` for some dim and rank order, else an
    :class:`EnumerableSpec` holding the layout.

    Canonical answer (spec/03-specs.md, SPEC-4): the smallest dim that works, and among ranks
    holding identical boxes (the empty chunks at the end, or every chunk of a zero-size dim)
    the ascending rank order. Only the multiset of (box, rank) is read, so any order of the
    shards gives the same answer. Raises :class:`LayoutError` for an invalid layout.
    """
    if not isinstance(layout, Layout):
        raise LayoutError(
            f"infer_spec needs a Layout, got {type(layout).__name__}: {shorten(layout)}"
        )
    layout.validate()
    spec = chunk_spec_of(layout)
    return spec if spec is not None else EnumerableSpec(layout)


def chunk_spec_of(layout: Layout) -> ChunkSpec | None:
    """The canonical :class:`ChunkSpec` whose layout equals ``layout``, or None.

    Does not validate: a layout equal to a chunk layout is valid anyway (CHUNK-3).
    """
    shape = layout.shape
    k = len(layout.shards)
    if not shape or k == 0:
        return None
    # A chunk layout gives each rank one box; a rank with two boxes rules every dim out.
    by_box: dict[Box, list[int]] = {}
    seen_ranks: set[int] = set()
    for s in layout.shards:
        if s.rank in seen_ranks:
            return None
        seen_ranks.add(s.rank)
        by_box.setdefault(s.box, []).append(s.rank)
    for ranks in by_box.values():
        ranks.sort()
    nd = len(shape)
    for dim in range(nd):
        order = _match_dim(shape, dim, k, by_box)
        if order is not None:
            return ChunkSpec(dim, order)
    return None


def _match_dim(
    shape: tuple[int, ...], dim: int, k: int, by_box: dict[Box, list[int]]
) -> list[int] | None:
    """The rank order for which chunking ``dim`` over ``k`` ranks gives exactly these
    (box, rank) pairs, or None. Identical chunk boxes take their ranks in ascending order."""
    taken = dict.fromkeys(by_box, 0)
    order: list[int] = []
    nd = len(shape)
    before, after = (0,) * dim, (0,) * (nd - dim - 1)
    for start, stop in chunk_bounds(shape[dim], k):
        box = Box._trusted(
            (*before, start, *after), (*shape[:dim], stop - start, *shape[dim + 1 :])
        )
        ranks = by_box.get(box)
        if ranks is None:
            return None
        i = taken[box]
        if i == len(ranks):
            return None
        taken[box] = i + 1
        order.append(ranks[i])
    # k expected boxes were all found among k shards, so every shard is used exactly once.
    return order
