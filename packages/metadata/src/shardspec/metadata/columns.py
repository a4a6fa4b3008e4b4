"""A layout's shards as int64 arrays: what the vectorised validator works on.

Reading a million boxes out of Python objects costs more than every NumPy step after it, so a
large layout does it once, when it is built (see ``Layout``), not on each validation.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from .shard import Shard

__all__ = ["COLUMNS_FROM", "INT_LIMIT", "Columns", "plain_columns", "shard_columns"]

# Below this many shards the pure-Python checks beat NumPy's per-call overhead (measured by
# bench_validate.py); above it the layout keeps columns.
COLUMNS_FROM = 64

# The largest value a column may hold: the validator adds an offset to a size, and the sum of
# two values up to 2**62 - 1 still fits int64. Larger ones would wrap silently in NumPy.
INT_LIMIT = 2**62 - 1

_box_sizes = attrgetter("box.sizes")


class Columns:
    """``offsets`` and ``sizes`` (ndim x m: one contiguous row per dim) and ``ranks`` (m) of m
    shards, as int64."""

    __slots__ = ("offsets", "ranks", "sizes")

    def __init__(
        self,
        offsets: npt.NDArray[np.int64],
        sizes: npt.NDArray[np.int64],
        ranks: npt.NDArray[np.int64],
    ) -> None:
        self.offsets, self.sizes, self.ranks = offsets, sizes, ranks


def shard_columns(shards: Sequence[Shard], ndim: int) -> Columns | None:
    """The shards as columns, or None when they cannot be: a shard with another number of
    dims than ``ndim``, or a value above :data:`INT_LIMIT` (the validator then reports it from
    the shards themselves, in exact Python ints)."""
    import numpy as np

    m = len(shards)
    if set(map(len, map(_box_sizes, shards))) - {ndim}:
        return None
    width = 2 * ndim + 1
    try:
        rows = np.fromiter(
            chain.from_iterable(s.box.offsets + s.box.sizes + (s.rank,) for s in shards),
            dtype=np.int64,
            count=m * width,
        ).reshape(m, width)
    except OverflowError:
        return None
    if m and int(rows.max()) > INT_LIMIT:
        return None
    by_dim = rows.T.copy()  # per-dim rows are contiguous: every later pass is per dim
    return Columns(by_dim[:ndim], by_dim[ndim : 2 * ndim], by_dim[2 * ndim])


def plain_columns(
    offsets: Sequence[tuple[Any, ...]],
    sizes: Sequence[tuple[Any, ...]],
    ranks: Sequence[Any],
    shape: tuple[int, ...],
) -> Columns | None:
    """Columns of m boxes given as rows, when every box is one a Layout takes unchecked: ``ndim``
    values a row, plain Python ints from 0 to :data:`INT_LIMIT`, each box inside ``shape``, each
    rank a plain int from 0; else None, and the caller's per-box checks say what is wrong.

    What converters of thousands of upstream boxes (``ShardMetadata``, DCP chunks) check at
    once instead of box by box."""
    import numpy as np

    m, ndim = len(offsets), len(shape)
    if len(sizes) != m or len(ranks) != m:
        return None
    if m == 0 or {*map(len, offsets), *map(len, sizes)} != {ndim}:
        return None
    if {*map(type, chain.from_iterable(offsets)), *map(type, chain.from_iterable(sizes))} - {
        int
    } or set(map(type, ranks)) != {int}:
        return None  # bools, floats, numpy scalars: the per-box checks refuse or convert them
    try:
        count = m * ndim
        offs = np.fromiter(chain.from_iterable(offsets), np.int64, count).reshape(m, ndim).T.copy()
        szs = np.fromiter(chain.from_iterable(sizes), np.int64, count).reshape(m, ndim).T.copy()
        rks = np.fromiter(ranks, np.int64, m)
    except OverflowError:
        return None
    if ndim and (
        int(offs.min()) < 0
        or int(szs.min()) < 0
        or int(offs.max()) > INT_LIMIT
        or int(szs.max()) > INT_LIMIT
        or bool((offs + szs > np.array(shape, dtype=np.int64)[:, None]).any())
    ):
        return None
    if int(rks.min()) < 0 or int(rks.max()) > INT_LIMIT:
        return None
    return Columns(offs, szs, rks)
