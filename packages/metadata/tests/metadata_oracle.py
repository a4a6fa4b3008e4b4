"""Brute-force oracles for the metadata tests: enumerate every element, no cleverness."""

from __future__ import annotations

import itertools

from shardspec.metadata import Box, Layout


def points(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(n) for n in shape)))


def box_points(box: Box) -> set[tuple[int, ...]]:
    return set(itertools.product(*(range(o, o + s) for o, s in box)))


def is_valid(layout: Layout) -> bool:
    """LAYOUT-1..3 by enumeration: in bounds, no (box, rank) twice, and every element held by
    exactly one distinct box (identical boxes on several ranks count once)."""
    nd = len(layout.shape)
    seen: set[tuple[Box, int]] = set()
    for s in layout.shards:
        if s.box.ndim != nd or not s.box.fits_in(layout.shape):
            return False
        if (s.box, s.rank) in seen:
            return False
        seen.add((s.box, s.rank))
    distinct = {s.box for s in layout.shards}
    count: dict[tuple[int, ...], int] = {}
    for b in distinct:
        for p in box_points(b):
            count[p] = count.get(p, 0) + 1
    return all(count.get(p, 0) == 1 for p in points(layout.shape))
