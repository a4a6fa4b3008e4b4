"""Layouts: a global shape and the boxes each rank owns.

The rules are checked by :mod:`.validate` and the text picture drawn by :mod:`.picture`; both
work on a shape and its shards, below this module, so that the methods here only hand them on.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set as AbstractSet
from itertools import repeat
from typing import Any

from .box import Box, as_index_tuple, show_ints
from .columns import COLUMNS_FROM, Columns, shard_columns
from .errors import LayoutError, shorten
from .picture import MAX_COLS, MAX_ROWS, draw
from .shard import Shard
from .validate import validate_layout

__all__ = ["Layout", "Shard", "render", "require_layout"]


class Layout:
    """A global shape and the shards (box + owning rank) that make up the tensor.

    The order of ``shards`` is kept: a rank that owns several boxes stores them in this order
    (its local storage order). Equality ignores the order: two layouts are equal when they have
    the same shape and the same multiset of (box, rank) pairs, so that the same sharding written
    two ways compares equal.

    Construction checks types only; call :meth:`validate` for the layout rules. A large layout
    also keeps its boxes as int64 arrays, read once here so that validating it does not read a
    million Python objects again.
    """

    # __weakref__: callers cache what they derive from a layout by its identity and must drop
    # the entry when the layout dies, not pin it.
    __slots__ = (
        "__weakref__",
        "_by_rank",
        "_columns",
        "_counter",
        "_fingerprint",
        "_plain",
        "_shards",
        "_some_ranks",
        "shape",
    )
    shape: tuple[int, ...]
    _shards: tuple[Shard, ...] | None
    # A layout made by _from_plain keeps its boxes as the rows it was given, and builds the
    # Shard objects only when asked for them: a checkpoint load of 10^4 saved chunks needs
    # the columns and the 2,500 boxes of its own rank, not 20,000 objects.
    _plain: tuple[Sequence[tuple[int, ...]], Sequence[tuple[int, ...]]] | None
    _columns: Columns | None
    _counter: Counter[tuple[Box, int]] | None
    _by_rank: dict[int, tuple[Shard, ...]] | None
    _some_ranks: dict[int, tuple[Shard, ...]] | None
    _fingerprint: bytes | None

    def __init__(self, shape: Sequence[int], shards: Iterable[Shard]) -> None:
        shape_t = as_index_tuple(shape, "Layout shape")
        object.__setattr__(self, "shape", shape_t)
        if type(shards) is tuple:
            shards_t: tuple[Shard, ...] = shards
        else:
            shards_t = _shard_tuple(shards)
        if not all(map(isinstance, shards_t, repeat(Shard))):
            for i, s in enumerate(shards_t):
                if not isinstance(s, Shard):
                    raise LayoutError(
                        f"Layout shard #{i} must be a Shard, got {type(s).__name__}: {shorten(s)}"
                    )
        object.__setattr__(self, "_shards", shards_t)
        columns = shard_columns(shards_t, len(shape_t)) if len(shards_t) >= COLUMNS_FROM else None
        object.__setattr__(self, "_columns", columns)
        _clear_caches(self, None)

    @classmethod
    def from_boxes(cls, shape: Sequence[int], boxes: Iterable[tuple[Box, int]]) -> Layout:
        """Build from ``(box, rank)`` pairs."""
        return cls(shape, (Shard(b, r) for b, r in boxes))

    @classmethod
    def replicated(cls, shape: Sequence[int], ranks: Iterable[int]) -> Layout:
        """Every rank in ``ranks`` holds the whole tensor."""
        full = Box.full(as_index_tuple(shape, "Layout shape"))
        return cls(shape, (Shard(full, r) for r in as_index_tuple(ranks, "ranks")))

    @classmethod
    def _from_plain(
        cls,
        shape: tuple[int, ...],
        offsets: Sequence[tuple[int, ...]],
        sizes: Sequence[tuple[int, ...]],
        columns: Columns,
    ) -> Layout:
        """The layout of the rows ``columns`` was made of by :func:`.columns.plain_columns`
        (which checked them all): the boxes are built unchecked."""
        layout = object.__new__(cls)
        object.__setattr__(layout, "shape", shape)
        if len(offsets) >= COLUMNS_FROM:
            object.__setattr__(layout, "_shards", None)
            object.__setattr__(layout, "_columns", columns)
            _clear_caches(layout, (offsets, sizes))
        else:
            ranks = columns.ranks.tolist()
            shards = tuple(map(Shard._trusted, map(Box._trusted, offsets, sizes), ranks))
            object.__setattr__(layout, "_shards", shards)
            object.__setattr__(layout, "_columns", None)
            _clear_caches(layout, None)
        return layout

    @property
    def shards(self) -> tuple[Shard, ...]:
        """The shards, in order."""
        shards = self._shards
        if shards is None:
            assert self._plain is not None and self._columns is not None
            offsets, sizes = self._plain
            ranks = self._columns.ranks.tolist()
            shards = tuple(map(Shard._trusted, map(Box._trusted, offsets, sizes), ranks))
            object.__setattr__(self, "_shards", shards)
            object.__setattr__(self, "_plain", None)
        return shards

    def positions_of(self, rank: int) -> list[int]:
        """Where ``rank``'s shards are in :attr:`shards`, in order (empty if none)."""
        if self._columns is not None:
            import numpy as np

            positions: list[int] = np.flatnonzero(self._columns.ranks == rank).tolist()
            return positions
        return [i for i, s in enumerate(self.shards) if s.rank == rank]

    def box_arrays(self) -> tuple[Any, Any]:
        """The boxes' offsets and sizes as (m, ndim) int64 NumPy arrays, in shard order (for
        vectorised geometry over thousands of boxes; read-only). Raises :class:`LayoutError` when a
        value does not fit int64."""
        import numpy as np

        if self._columns is not None:
            offs, sizes = self._columns.offsets.T, self._columns.sizes.T
            offs.flags.writeable = sizes.flags.writeable = False  # views of the layout's own
            return offs, sizes
        m, nd = len(self.shards), self.ndim
        try:
            offs = np.array([s.box.offsets for s in self.shards], dtype=np.int64)
            sizes = np.array([s.box.sizes for s in self.shards], dtype=np.int64)
        except OverflowError as e:
            raise LayoutError(f"box_arrays: a box of {self!r} does not fit int64") from e
        return offs.reshape(m, nd), sizes.reshape(m, nd)

    def rank_array(self) -> Any:
        """The shards' ranks as an (m,) int64 NumPy array, in shard order (read-only; beside
        :meth:`box_arrays`). Raises :class:`LayoutError` when a rank does not fit int64."""
        import numpy as np

        if self._columns is not None:
            ranks = self._columns.ranks[:]
            ranks.flags.writeable = False
            return ranks
        try:
            return np.array([s.rank for s in self.shards], dtype=np.int64)
        except OverflowError as e:
            raise LayoutError(f"rank_array: a rank of {self!r} does not fit int64") from e

    def fingerprint(self) -> bytes:
        """A 16-byte digest of the shape and the shards in order (local storage order is part
        of a layout's identity here, unlike ``==``): what ranks compare to agree they hold the
        same layout. Equal for equal (shape, shard sequence) however the layout was built."""
        if self._fingerprint is None:
            object.__setattr__(self, "_fingerprint", _fingerprint(self))
        assert self._fingerprint is not None
        return self._fingerprint

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Layout is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Layout is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Layout, (self.shape, self.shards))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks that own at least one box (empty boxes included), ascending."""
        if self._shards is None and self._columns is not None:
            import numpy as np

            return tuple(np.unique(self._columns.ranks).tolist())
        return tuple(sorted(self._rank_index()))

    def shards_of(self, rank: int) -> tuple[Shard, ...]:
        """The shards ``rank`` holds, in local storage order (empty if none)."""
        if self._shards is None and self._by_rank is None:
            # Built from rows: only this rank's shards are made (and kept).
            some = self._some_ranks
            if some is None:
                some = {}
                object.__setattr__(self, "_some_ranks", some)
            mine = some.get(rank)
            if mine is None:
                assert self._plain is not None
                offsets, sizes = self._plain
                mine = some[rank] = tuple(
                    Shard._trusted(Box._trusted(offsets[i], sizes[i]), rank)
                    for i in self.positions_of(rank)
                )
            return mine
        return self._rank_index().get(rank, ())

    def boxes_of(self, rank: int) -> tuple[Box, ...]:
        return tuple(s.box for s in self.shards_of(rank))

    def _rank_index(self) -> dict[int, tuple[Shard, ...]]:
        if self._by_rank is None:
            grouped: dict[int, list[Shard]] = {}
            for s in self.shards:
                grouped.setdefault(s.rank, []).append(s)
            object.__setattr__(self, "_by_rank", {r: tuple(v) for r, v in grouped.items()})
        assert self._by_rank is not None
        return self._by_rank

    def _multiset(self) -> Counter[tuple[Box, int]]:
        if self._counter is None:
            object.__setattr__(self, "_counter", Counter((s.box, s.rank) for s in self.shards))
        assert self._counter is not None
        return self._counter

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return self.shape == other.shape and self._multiset() == other._multiset()

    def __hash__(self) -> int:
        return hash((self.shape, frozenset(self._multiset().items())))

    def equivalent(self, other: Layout) -> bool:
        """Same shape, same ranks, and every rank holds the same elements (LAYOUT-8).

        In the spirit of JAX's ``Sharding.is_equivalent_to``: what is compared is which
        elements each rank holds, not how the layout was written. Shard order, empty boxes
        (they hold nothing, wherever they sit) and how a rank's elements are cut into boxes
        do not matter; a rank that holds only empty boxes still takes part. A rank's boxes
        must be pairwise disjoint on both sides, as in every valid layout, else
        :class:`LayoutError`.
        """
        if not isinstance(other, Layout):
            raise LayoutError(f"equivalent needs a Layout, got {type(other).__name__}")
        mine, theirs = self._rank_index(), other._rank_index()
        if self.shape != other.shape or mine.keys() != theirs.keys():
            return False
        for rank, shards in mine.items():
            a = Counter(s.box for s in shards if not s.box.is_empty)
            b = Counter(s.box for s in theirs[rank] if not s.box.is_empty)
            if a != b and not _same_elements(list(a.elements()), list(b.elements()), rank):
                return False
        return True

    def __len__(self) -> int:
        if self._shards is None and self._columns is not None:
            return len(self._columns.ranks)
        return len(self.shards)

    def __iter__(self) -> Iterator[Shard]:
        return iter(self.shards)

    def __repr__(self) -> str:
        if len(self.shards) > 8:
            body = (
                ", ".join(repr(s) for s in self.shards[:8]) + f", ... ({len(self.shards)} shards)"
            )
        else:
            body = ", ".join(repr(s) for s in self.shards)
        return f"Layout(shape={show_ints(self.shape)}, shards=[{body}])"

    def validate(self) -> Layout:
        """Check every layout rule; raise :class:`LayoutError` naming the offending shards.

        Returns ``self`` so that ``layout = Layout(...).validate()`` reads naturally.
        """
        shards: Sequence[Shard] = self.shards if self._shards is not None else _Lazy(self)
        validate_layout(self.shape, shards, self._columns)
        return self

    def is_valid(self) -> bool:
        try:
            self.validate()
        except LayoutError:
            return False
        return True

    def render(self, *, max_rows: int = MAX_ROWS, max_cols: int = MAX_COLS) -> str:
        """A text picture of which rank holds which region (see :mod:`.picture`); an invalid
        layout is shown as a table of its boxes, under the reason."""
        try:
            self.validate()
        except LayoutError as e:
            return draw(self.shape, self.shards, e, max_rows=max_rows, max_cols=max_cols)
        return draw(self.shape, self.shards, None, max_rows=max_rows, max_cols=max_cols)

    def with_ranks(self, mapping: dict[int, int] | Sequence[int]) -> Layout:
        """The same boxes with rank ``r`` renamed to ``mapping[r]``."""
        out = []
        for s in self.shards:
            try:
                new = mapping[s.rank]
            except (KeyError, IndexError, TypeError):
                raise LayoutError(
                    f"with_ranks: the mapping {shorten(mapping)} gives no new rank for rank "
                    f"{s.rank}"
                ) from None
            out.append(Shard(s.box, new))
        return Layout(self.shape, out)


def _clear_caches(
    layout: Layout, plain: tuple[Sequence[tuple[int, ...]], Sequence[tuple[int, ...]]] | None
) -> None:
    object.__setattr__(layout, "_plain", plain)
    object.__setattr__(layout, "_counter", None)
    object.__setattr__(layout, "_by_rank", None)
    object.__setattr__(layout, "_some_ranks", None)
    object.__setattr__(layout, "_fingerprint", None)


class _Lazy(Sequence[Shard]):
    """A layout's shards for the validator, which reads only their count unless it reports a
    fault: the Shard objects are made on the first index."""

    __slots__ = ("_layout",)

    def __init__(self, layout: Layout) -> None:
        self._layout = layout

    def __len__(self) -> int:
        return len(self._layout)

    def __getitem__(self, i: Any) -> Any:
        return self._layout.shards[i]


# The fingerprint's encoding: shape, then each shard's offsets, sizes and rank, as int64
# little-endian rows. Where a value does not fit int64 the rows are the repr of the tuples
# instead, under another tag, so the two encodings never meet.
_ROWS, _TEXT = b"shardspec-layout-rows\0", b"shardspec-layout-text\0"


def _fingerprint(layout: Layout) -> bytes:
    import hashlib
    import sys
    from array import array
    from itertools import chain

    h = hashlib.blake2b(digest_size=16)
    columns = layout._columns
    if columns is not None:
        import numpy as np

        rows = np.concatenate([columns.offsets, columns.sizes, columns.ranks[None, :]])
        body = np.ascontiguousarray(rows.T, dtype="<i8").tobytes()
    else:
        try:
            values = array(
                "q",
                chain.from_iterable(s.box.offsets + s.box.sizes + (s.rank,) for s in layout.shards),
            )
        except OverflowError:
            text = repr([(s.box.offsets, s.box.sizes, s.rank) for s in layout.shards])
            h.update(_TEXT + repr(layout.shape).encode() + b"\0" + text.encode())
            return h.digest()
        if sys.byteorder != "little":
            values.byteswap()
        body = values.tobytes()
    h.update(_ROWS + repr(layout.shape).encode() + b"\0")
    h.update(body)
    return h.digest()


def _shard_tuple(shards: Iterable[Shard]) -> tuple[Shard, ...]:
    # Shard order is local storage order, so an unordered collection cannot stand for it; a
    # generator is fine here (it is read once, in order).
    if isinstance(shards, (str, bytes, bytearray, memoryview, AbstractSet, Mapping)):
        raise LayoutError(
            f"Layout shards must be an ordered iterable of Shard (a list or tuple), got "
            f"{type(shards).__name__}: {shorten(shards)}"
        )
    try:
        return tuple(shards)
    except LayoutError:
        raise
    except Exception as e:  # Layout(shape, 5): name the argument, not "int is not iterable"
        raise LayoutError(
            f"Layout shards must be an iterable of Shard, got {type(shards).__name__}: "
            f"{shorten(shards)} ({type(e).__name__}: {shorten(str(e))})"
        ) from None


def render(layout: Layout, *, max_rows: int = MAX_ROWS, max_cols: int = MAX_COLS) -> str:
    """A multi-line picture of ``layout`` (no trailing newline): :meth:`Layout.render`, for a
    value that must first be checked to be a layout."""
    require_layout(layout, "render")
    return layout.render(max_rows=max_rows, max_cols=max_cols)


def require_layout(value: object, where: str) -> None:
    """Refuse anything but a :class:`Layout` with a :class:`LayoutError` that says what came
    instead (a shard list, a torch spec), rather than an AttributeError further in."""
    if not isinstance(value, Layout):
        raise LayoutError(f"{where} needs a Layout, got {type(value).__name__}: {shorten(value)}")


def _same_elements(a: list[Box], b: list[Box], rank: int) -> bool:
    """Whether two sets of non-empty boxes, each pairwise disjoint, hold the same elements:
    equal volumes, and every element of one lies in the other (the volume of the pairwise
    intersections is the whole volume)."""
    for side in (a, b):
        for i, x in enumerate(side):
            for y in side[i + 1 :]:
                if x.overlaps(y):
                    raise LayoutError(
                        f"rank {rank} holds overlapping boxes {x} and {y}; equivalence is "
                        f"defined for layouts whose boxes on one rank are disjoint"
                    )
    volume = sum(x.numel for x in a)
    if volume != sum(y.numel for y in b):
        return False
    common = 0
    for x in a:
        for y in b:
            both = x.intersect(y)
            if both is not None:
                common += both.numel
    return common == volume
