"""A layout's shards as int64 arrays: what the vectorised validator works on.

Reading a million boxes out of Python objects costs more than every NumPy step after it, so a
large layout does it once, when it is built (see ``Layout``), not on each validation.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from .shard import Shard

__all__ = [
    "COLUMNS_FROM",
    "INT_LIMIT",
    "ArrayRows",
    "Columns",
    "array_columns",
    "plain_columns",
    "shard_columns",
]

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
        offs = np.fromiter(chain.from_iterable(offsets), np.int64, count).reshape(m, ndim)
        szs = np.fromiter(chain.from_iterable(sizes), np.int64, count).reshape(m, ndim)
        rks = np.fromiter(ranks, np.int64, m)
    except OverflowError:
        return None
    return array_columns(offs, szs, rks, shape)


def array_columns(
    offsets: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    ranks: npt.NDArray[np.int64],
    shape: tuple[int, ...],
) -> Columns | None:
    """:func:`plain_columns` of boxes already in int64 arrays: ``offsets`` and ``sizes``
    (m x ndim, row i is box i), ``ranks`` (m). None when a value is out of range or a box
    leaves ``shape``, as there. The arrays are copied: the columns never share memory with
    what a caller may change."""
    import numpy as np

    m, ndim = len(ranks), len(shape)
    if m == 0 or offsets.shape != (m, ndim) or sizes.shape != (m, ndim):
        return None
    # one contiguous row per dim, as shard_columns lays them out
    offs = np.array(offsets.T, dtype=np.int64, order="C", copy=True)
    szs = np.array(sizes.T, dtype=np.int64, order="C", copy=True)
    rks = np.array(ranks, dtype=np.int64, copy=True)
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


class ArrayRows(Sequence[tuple[int, ...]]):
    """The rows of an (m x ndim) int64 array as tuples of Python ints, each made when read:
    the rows a layout built by ``Layout._from_plain`` keeps, for boxes that arrived as arrays
    (a checkpoint's saved chunks) rather than as Python tuples."""

    __slots__ = ("_rows",)

    def __init__(self, rows: npt.NDArray[np.int64]) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return int(self._rows.shape[0])

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [tuple(r) for r in self._rows[i].tolist()]
        return tuple(self._rows[i].tolist())

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return map(tuple, self._rows.tolist())
