"""Flat layouts (spec/11-flat.md): a tensor cut into ranges of its row-major elements, as
DeepSpeed's ZeRO cuts parameters, and the boxes those ranges are.

ZeRO-1/2 concatenate a parameter group into one flat buffer, pad it and split it evenly over
the data-parallel ranks, so a parameter's piece on a rank is a range of its row-major elements
that may start and end mid-row: not a box. ZeRO-3 splits each parameter alone into
``ceil(numel / dp)`` elements per rank. Both are :class:`FlatLayout` s here; :meth:`to_layout`
gives the boxes each range covers (:func:`range_boxes`), and :func:`flat_from_layout` the ranges
of any layout's boxes, so a flat layout reshards, loads and compares like any other.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .box import Box, as_index, as_index_tuple
from .errors import LayoutError, shorten
from .layout import Layout
from .shard import Shard

__all__ = [
    "FlatLayout",
    "FlatPiece",
    "ZeroPartition",
    "box_range",
    "box_ranges",
    "flat_from_layout",
    "range_boxes",
    "zero3_layout",
    "zero12_partition",
]


@dataclass(frozen=True)
class FlatPiece:
    """Elements ``[start, stop)`` of the tensor in row-major order, held by ``rank`` from
    element ``at`` of that rank's flat buffer on (FLAT-1, FLAT-4)."""

    rank: int
    start: int
    stop: int
    at: int = 0

    def __post_init__(self) -> None:
        for name in ("rank", "start", "stop", "at"):
            value = as_index(getattr(self, name), f"FlatPiece.{name}")
            if value < 0:
                raise LayoutError(f"FlatPiece.{name} must be non-negative, got {value}")
            object.__setattr__(self, name, value)
        if self.stop < self.start:
            raise LayoutError(
                f"FlatPiece of rank {self.rank}: stop {self.stop} is before start {self.start}"
            )

    @property
    def numel(self) -> int:
        return self.stop - self.start


def _strides(shape: tuple[int, ...]) -> list[int]:
    out = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        out[d] = out[d + 1] * shape[d + 1]
    return out


def range_boxes(shape: Sequence[int], start: int, stop: int) -> list[Box]:
    """The canonical boxes of the flat range ``[start, stop)`` of a tensor of ``shape``, in
    row-major order (FLAT-2): at most ``2 * ndim - 1`` of them, none empty."""
    shape_t = as_index_tuple(shape, "shape")
    start, stop = as_index(start, "start"), as_index(stop, "stop")
    numel = math.prod(shape_t)
    if not 0 <= start <= stop <= numel:
        raise LayoutError(
            f"flat range [{start}, {stop}) is not within the {numel} elements of shape "
            f"{shorten(shape_t)}",
            kind="bounds",
        )
    out: list[Box] = []
    _cut(shape_t, start, stop, (), out)
    return out


def _cut(shape: tuple[int, ...], a: int, b: int, prefix: tuple[int, ...], out: list[Box]) -> None:
    """Append the boxes of ``[a, b)`` of ``shape``, each prefixed by the fixed leading
    indices ``prefix`` (held at size 1)."""
    if a >= b:
        return
    ones = (1,) * len(prefix)
    if not shape:
        out.append(Box._trusted(prefix, ones))
        return
    inner = math.prod(shape[1:])  # > 0: the range is not empty, so no dim is 0
    r0, o0 = divmod(a, inner)
    r1, o1 = divmod(b, inner)
    if r0 == r1:  # inside one row of dim 0
        _cut(shape[1:], o0, o1, (*prefix, r0), out)
        return
    if o0:  # the head: the rest of row r0
        _cut(shape[1:], o0, inner, (*prefix, r0), out)
        r0 += 1
    if r1 > r0:  # whole rows
        out.append(
            Box._trusted((*prefix, r0, *(0,) * (len(shape) - 1)), (*ones, r1 - r0, *shape[1:]))
        )
    if o1:  # the tail: the start of row r1
        _cut(shape[1:], 0, o1, (*prefix, r1), out)


def box_range(shape: Sequence[int], box: Box) -> tuple[int, int] | None:
    """The flat range of ``box`` in a tensor of ``shape`` when its elements are one range
    (FLAT-3: every dim after its first of size above 1 is whole), else None; None for an
    empty box, which is no range."""
    shape_t = as_index_tuple(shape, "shape")
    _check_box(shape_t, box)
    if box.numel == 0:
        return None
    wide = next((d for d, n in enumerate(box.sizes) if n > 1), len(shape_t))
    if any(box.sizes[d] != shape_t[d] for d in range(wide + 1, len(shape_t))):
        return None  # checked here, not by listing box_ranges: a tall column has one a row
    first = sum(o * s for o, s in zip(box.offsets, _strides(shape_t)))
    return first, first + box.numel


def box_ranges(shape: Sequence[int], box: Box) -> list[tuple[int, int]]:
    """The maximal flat ranges of ``box`` in a tensor of ``shape``, in row-major order
    (FLAT-3): with ``j`` the last dim the box does not hold whole (0 if it holds them all),
    one range of ``prod(box.sizes[j:])`` elements per index of the dims before ``j``; none for
    an empty box."""
    shape_t = as_index_tuple(shape, "shape")
    _check_box(shape_t, box)
    if box.numel == 0:
        return []
    nd = len(shape_t)
    if nd == 0:
        return [(0, 1)]
    j = max((d for d in range(nd) if box.sizes[d] != shape_t[d]), default=0)
    strides = _strides(shape_t)
    run = box.sizes[j] * strides[j]
    base = sum(o * s for o, s in zip(box.offsets, strides))
    out: list[tuple[int, int]] = []
    for index in _indices(box.sizes[:j]):
        first = base + sum(i * s for i, s in zip(index, strides))
        out.append((first, first + run))
    return out


def _indices(sizes: Sequence[int]) -> Iterable[tuple[int, ...]]:
    if not sizes:
        yield ()
        return
    for i in range(sizes[0]):
        for rest in _indices(sizes[1:]):
            yield (i, *rest)


def _check_box(shape: tuple[int, ...], box: Box) -> None:
    if not isinstance(box, Box):
        raise LayoutError(f"a Box is needed, got {type(box).__name__}: {shorten(box)}")
    if len(box.offsets) != len(shape) or any(
        o + s > n for o, s, n in zip(box.offsets, box.sizes, shape)
    ):
        raise LayoutError(f"{box} does not lie within shape {shorten(shape)}", kind="bounds")


class FlatLayout:
    """A tensor of ``shape`` cut into flat ranges held by ranks (FLAT-4). Construction checks
    types; :meth:`validate` checks the rules."""

    __slots__ = ("pieces", "shape")
    shape: tuple[int, ...]
    pieces: tuple[FlatPiece, ...]

    def __init__(self, shape: Sequence[int], pieces: Iterable[FlatPiece]) -> None:
        self.shape = as_index_tuple(shape, "FlatLayout shape")
        self.pieces = tuple(pieces)
        for i, p in enumerate(self.pieces):
            if not isinstance(p, FlatPiece):
                raise LayoutError(
                    f"FlatLayout piece #{i} must be a FlatPiece, got {type(p).__name__}: "
                    f"{shorten(p)}"
                )

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FlatLayout):
            return NotImplemented
        return self.shape == other.shape and sorted(self.pieces, key=_key) == sorted(
            other.pieces, key=_key
        )

    def __hash__(self) -> int:
        return hash((self.shape, tuple(sorted(self.pieces, key=_key))))

    def __repr__(self) -> str:
        return f"FlatLayout({self.shape}, {shorten(list(self.pieces))})"

    def pieces_of(self, rank: int) -> tuple[FlatPiece, ...]:
        return tuple(p for p in self.pieces if p.rank == rank)

    def validate(self) -> None:
        """Raise :class:`LayoutError` naming the pieces (and their ranks) that break FLAT-4:
        a range past the tensor's end, two ranges that overlap without being identical
        replicas on different ranks, an element no range holds, or two pieces of one rank
        that overlap in its flat buffer. O(n log n) in the pieces."""
        n = self.numel
        ps = self.pieces
        for i, p in enumerate(ps):
            if p.stop > n:
                raise LayoutError(
                    f"piece #{i} (rank {p.rank}) holds [{p.start}, {p.stop}), past the "
                    f"{n} elements of shape {shorten(self.shape)}",
                    kind="bounds",
                    shards=(i,),
                )
        order = sorted((i for i in range(len(ps)) if ps[i].numel), key=lambda i: _key(ps[i]))
        covered = 0
        prev: int | None = None
        for i in order:
            p = ps[i]
            if prev is not None and (ps[prev].start, ps[prev].stop) == (p.start, p.stop):
                # the copies of a range sort by rank: one rank twice sits side by side
                if ps[prev].rank == p.rank:
                    raise LayoutError(
                        f"pieces #{prev} and #{i} both give rank {p.rank} [{p.start}, {p.stop})",
                        kind="duplicate",
                        shards=(prev, i),
                    )
                prev = i
                continue  # a replica on another rank
            if p.start > covered:
                raise LayoutError(
                    f"no piece holds elements [{covered}, {p.start}) of shape "
                    f"{shorten(self.shape)} (the next piece, #{i} of rank {p.rank}, starts at "
                    f"{p.start})",
                    kind="gap",
                    shards=(i,),
                    point=_unravel(self.shape, covered),
                )
            if p.start < covered:
                assert prev is not None
                q = ps[prev]
                raise LayoutError(
                    f"piece #{prev} (rank {q.rank}, [{q.start}, {q.stop})) and piece #{i} "
                    f"(rank {p.rank}, [{p.start}, {p.stop})) overlap; replicas must be "
                    f"identical ranges",
                    kind="overlap",
                    shards=(prev, i),
                )
            covered, prev = p.stop, i
        if covered < n:
            raise LayoutError(
                f"no piece holds elements [{covered}, {n}) of shape {shorten(self.shape)}",
                kind="gap",
                point=_unravel(self.shape, covered),
            )
        by_rank: dict[int, list[int]] = {}
        for i, p in enumerate(ps):
            if p.numel:
                by_rank.setdefault(p.rank, []).append(i)
        for rank, idx in by_rank.items():
            idx.sort(key=lambda i: ps[i].at)
            for a, b in itertools.pairwise(idx):
                if ps[a].at + ps[a].numel > ps[b].at:
                    raise LayoutError(
                        f"pieces #{a} and #{b} of rank {rank} overlap in its flat buffer "
                        f"([{ps[a].at}, {ps[a].at + ps[a].numel}) and [{ps[b].at}, "
                        f"{ps[b].at + ps[b].numel}))",
                        kind="overlap",
                        shards=(a, b),
                    )

    def to_layout(self) -> Layout:
        """The boxes each piece covers, on its rank, each rank's in flat-buffer order
        (FLAT-5): an equivalent :class:`Layout`. The pieces' buffer positions (``at``) are
        not part of a layout and are dropped."""
        order = sorted(range(len(self.pieces)), key=lambda i: (self.pieces[i].at, i))
        shards = [
            Shard(box, p.rank)
            for p in (self.pieces[i] for i in order)
            for box in range_boxes(self.shape, p.start, p.stop)
        ]
        # a rank that holds no element is still one of the layout's ranks (LAYOUT-8), except
        # of a 0-d tensor, whose one box is its one element (BOX-3): no box says "nothing"
        zeros = (0,) * len(self.shape)
        if self.shape:
            shards += [
                Shard(Box(zeros, zeros), r)
                for r in sorted({p.rank for p in self.pieces} - {s.rank for s in shards})
            ]
        return Layout(self.shape, shards)


def _key(p: FlatPiece) -> tuple[int, int, int, int]:
    return (p.start, p.stop, p.rank, p.at)


def _unravel(shape: tuple[int, ...], i: int) -> tuple[int, ...]:
    out = []
    for n in reversed(shape):
        i, r = divmod(i, n) if n else (i, 0)
        out.append(r)
    return tuple(reversed(out))


def flat_from_layout(layout: Layout) -> FlatLayout:
    """The flat ranges of ``layout``'s boxes (FLAT-5): each box's maximal ranges
    (:func:`box_ranges`), those of a rank that meet merged where no other rank holds either,
    each rank's pieces packed back to back in its flat buffer in row-major order.
    ``flat_from_layout(f.to_layout())`` is ``f`` for a flat layout with no replicas whose
    ranks' ranges do not meet and sit in row-major order in their buffers, back to back
    from 0."""
    per_rank: dict[int, list[tuple[int, int]]] = {}
    for s in layout.shards:
        per_rank.setdefault(s.rank, []).extend(box_ranges(layout.shape, s.box))
    # Replicas stay as they are: merged with its neighbour on one rank, a replicated range
    # would overlap its copies on the others without being theirs (FLAT-4).
    copies = Counter(r for ranges in per_rank.values() for r in set(ranges))
    pieces = []
    for rank in sorted(per_rank):
        merged: list[list[int]] = []
        last_alone = False
        for a, b in sorted(per_rank[rank]):
            alone = copies[(a, b)] == 1
            if merged and merged[-1][1] == a and alone and last_alone:
                merged[-1][1] = b
            else:
                merged.append([a, b])
            last_alone = alone
        at = 0
        for a, b in merged:
            pieces.append(FlatPiece(rank, a, b, at))
            at += b - a
        if not merged:  # empty boxes only: an empty piece at the end, as CHUNK-2 places them
            n = math.prod(layout.shape)
            pieces.append(FlatPiece(rank, n, n, 0))
    return FlatLayout(layout.shape, pieces)


@dataclass(frozen=True)
class ZeroPartition:
    """ZeRO-1/2's partition of one parameter group (FLAT-6): each parameter's flat layout,
    the group's element count before and after padding, and each rank's partition size."""

    layouts: tuple[FlatLayout, ...]
    numel: int
    padded: int
    partition: int

    def padding_of(self, rank: int) -> tuple[int, int]:
        """The range of ``rank``'s partition, in its own elements, that is padding."""
        lo = rank * self.partition
        return (min(max(self.numel - lo, 0), self.partition), self.partition)


def zero12_partition(
    shapes: Sequence[Sequence[int]],
    dp: int,
    *,
    alignment: int = 2,
    round_robin: bool = False,
) -> ZeroPartition:
    """ZeRO stage 1 and 2's partition of a parameter group of ``shapes`` over ``dp`` ranks
    (FLAT-6): the parameters (reordered round robin over the ranks when ``round_robin``, as
    DeepSpeed's ``round_robin_gradients``) back to back in one buffer, padded to a multiple of
    ``alignment * dp`` elements (DeepSpeed's ``nccl_start_alignment_factor`` is 2), and rank
    r's partition its ``r``-th of ``dp`` equal parts. The layouts follow ``shapes``' order."""
    dp = as_index(dp, "dp")
    alignment = as_index(alignment, "alignment")
    if dp <= 0 or alignment <= 0:
        raise LayoutError(f"dp and alignment must be positive, got dp={dp}, alignment={alignment}")
    shape_ts = [as_index_tuple(s, f"shape of parameter {k}") for k, s in enumerate(shapes)]
    order = list(range(len(shape_ts)))
    if round_robin:
        order = [k for j in range(dp) for k in order if k % dp == j]
    numels = [math.prod(s) for s in shape_ts]
    total = sum(numels)
    unit = alignment * dp
    padded = -(-total // unit) * unit
    part = padded // dp
    starts = {}
    at = 0
    for k in order:
        starts[k] = at
        at += numels[k]
    layouts = []
    for k, shape in enumerate(shape_ts):
        lo, hi = starts[k], starts[k] + numels[k]
        pieces = []
        for r in range(dp):
            a, b = max(lo, r * part), min(hi, (r + 1) * part)
            if a < b:
                pieces.append(FlatPiece(r, a - lo, b - lo, a - r * part))
        if not pieces:  # a parameter with no elements: the rank its place falls in holds it
            r = min(lo // part, dp - 1) if part else 0
            pieces.append(FlatPiece(r, 0, 0, lo - r * part))
        layouts.append(FlatLayout(shape, pieces))
    return ZeroPartition(tuple(layouts), total, padded, part)


def zero3_layout(shape: Sequence[int], dp: int) -> FlatLayout:
    """ZeRO-3's partition of one parameter of ``shape`` over ``dp`` ranks (FLAT-7): its
    elements padded to a multiple of ``dp``, rank r holding ``[r * p, (r + 1) * p)`` with
    ``p = ceil(numel / dp)``, cut at the end (an empty piece past it), from element 0 of its
    partition of ``p``."""
    shape_t = as_index_tuple(shape, "shape")
    dp = as_index(dp, "dp")
    if dp <= 0:
        raise LayoutError(f"dp must be positive, got {dp}")
    n = math.prod(shape_t)
    p = -(-n // dp)
    return FlatLayout(
        shape_t, [FlatPiece(r, min(r * p, n), min((r + 1) * p, n), 0) for r in range(dp)]
    )
