"""Shapes drawn with the world size, for the simulated worlds of `nox -s conformance_scale`.

A shape of sides up to 6 on a world of 1024 ranks puts data on 6 of them, all below 256: a
defect that only touches rank numbers above 255, or layouts of many data-holding shards, never
meets data there. Here one dim (the *long* one) is drawn against the number of parts it is cut
into: from three quarters of it (more parts than rows: most parts hold data, the last ones are
empty) to twice it (a dim longer than the world); the other dims stay small. The simplest draw
is the large end (the largest world, the long dim first, three quarters of its parts), so that
a run of three examples, which starts with the simplest, meets data on ranks above 255 in a
layout of more than 16 shards every time.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

__all__ = ["largest_first", "long_sides", "scale_shapes"]


def largest_first(worlds: Sequence[int]) -> st.SearchStrategy[int]:
    """One of ``worlds``, shrinking towards the largest."""
    return st.sampled_from(sorted(worlds, reverse=True))


def long_sides(parts: int) -> st.SearchStrategy[int]:
    """A side cut into ``parts``: from three quarters of ``parts`` (at least 1) to twice it."""
    return st.integers(max(1, 3 * parts // 4), max(1, 2 * parts))


@st.composite
def scale_shapes(
    draw: st.DrawFn, parts: int, *, max_dims: int = 3, long_dim: int | None = None
) -> tuple[int, ...]:
    """A 1-d to ``max_dims``-d shape whose ``long_dim`` (drawn when None, dim 0 first) has a
    :func:`long_sides` size for ``parts``; the other sides are 1 to 3."""
    nd = draw(st.integers(1, max_dims) if long_dim is None else st.integers(long_dim + 1, max_dims))
    long = draw(st.integers(0, nd - 1)) if long_dim is None else long_dim
    return tuple(
        draw(long_sides(parts)) if d == long else draw(st.integers(1, 3)) for d in range(nd)
    )
