"""Boxes: half-open intervals per dimension (offsets + sizes)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set as AbstractSet
from typing import Any

from .errors import LayoutError, shorten

__all__ = ["Box", "as_index", "as_index_tuple", "require_sequence"]


def as_index_tuple(values: Iterable[Any], what: str) -> tuple[int, ...]:
    """Return ``values`` as a tuple of non-negative Python ints, refusing anything else.

    bool is refused because ``True`` silently passing as ``1`` hides swapped arguments, and
    floats are refused because a layout with ``2.0`` rows is a bug upstream of us. Only an
    ordered, re-readable sequence is taken (tuple, list, ``torch.Size``, range, a 1-d integer
    array or tensor): a str or bytes is text, a set or dict has no order of its own, and a
    generator is used up by the first reader.
    """
    plain = _plain_index_tuple(values)
    if plain is not None:
        return plain
    require_sequence(values, what, "integers")
    try:
        items = tuple(values)
    except Exception:  # an int where a sequence belongs, a 0-d array: say so, not "not iterable"
        raise LayoutError(
            f"{what} must be a sequence of integers, got {shorten(values)} "
            f"({type(values).__name__})"
        ) from None
    out: list[int] = []
    for v in items:
        i = _to_int(v)
        if i is None:
            raise LayoutError(
                f"{what} must be integers, got {type(v).__name__} {shorten(v)} in {shorten(items)}"
            )
        if i < 0:
            raise LayoutError(f"{what} must be non-negative, got {shorten(i)} in {shorten(items)}")
        out.append(i)
    return tuple(out)


def require_sequence(values: object, what: str, items: str) -> None:
    """Refuse what iterates but is no ordered sequence of ``items`` (see
    :func:`as_index_tuple`), with a :class:`LayoutError` that says what came instead."""
    why = None
    if isinstance(values, (str, bytes, bytearray, memoryview)):
        why = "text or bytes"
    elif isinstance(values, (AbstractSet, Mapping)):
        why = "unordered"
    elif isinstance(values, Iterator):
        why = "a one-shot iterator: pass a tuple or list"
    if why is not None:
        raise LayoutError(
            f"{what} must be a sequence of {items}, got {shorten(values)} "
            f"({type(values).__name__}: {why})"
        )


def _plain_index_tuple(values: Any) -> tuple[int, ...] | None:
    """``values`` as a tuple when it is a tuple or list of non-negative Python ints (what
    nearly every caller passes), else None for :func:`as_index_tuple` to convert or refuse.
    Boxes are built by the million, and this check is a third of the cost of the general
    one."""
    if type(values) is tuple:
        items: tuple[int, ...] = values
    elif type(values) is list:
        items = tuple(values)
    else:
        return None
    for v in items:
        if type(v) is not int or v < 0:
            return None
    return items


def _to_int(v: Any) -> int | None:
    """``v`` as a Python int when it is an integer (Python, numpy or 0-d torch), else None.

    Booleans of every kind are refused: ``True`` passing as ``1`` hides swapped arguments.
    """
    if type(v) is int:
        return v
    if (
        isinstance(v, bool)
        or not hasattr(v, "__index__")
        or str(getattr(v, "dtype", "")) in ("bool", "torch.bool")
    ):
        return None
    try:
        return int(v.__index__())
    except Exception:  # a multi-element tensor or array has __index__ but refuses it
        return None


def as_index(value: Any, what: str) -> int:
    """``value`` as a Python int (possibly negative): anything with ``__index__`` (numpy and
    0-d torch integers, as upstream callers hand them over), never a bool or a float."""
    i = _to_int(value)
    if i is None:
        raise LayoutError(f"{what} must be an int, got {type(value).__name__} {shorten(value)}")
    return i


class Box:
    """An immutable box: for each dim ``d`` the half-open interval
    ``[offsets[d], offsets[d] + sizes[d])``.

    A box with any size 0 is empty: it holds no element and overlaps nothing. A 0-d tensor
    has exactly one box, ``Box((), ())``, which holds its one element.
    """

    __slots__ = ("_hash", "offsets", "sizes")
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    _hash: int

    def __init__(self, offsets: Sequence[int], sizes: Sequence[int]) -> None:
        offs = _plain_index_tuple(offsets)
        if offs is None:
            offs = as_index_tuple(offsets, "Box offsets")
        szs = _plain_index_tuple(sizes)
        if szs is None:
            szs = as_index_tuple(sizes, "Box sizes")
        if len(offs) != len(szs):
            raise LayoutError(
                f"Box offsets {offs} and sizes {szs} have different lengths "
                f"({len(offs)} vs {len(szs)})"
            )
        _set_offsets(self, offs)
        _set_sizes(self, szs)
        _set_hash(self, hash((offs, szs)))

    @classmethod
    def _trusted(cls, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> Box:
        # Hot paths (chunk rule, planners) build millions of boxes from arithmetic that is
        # already known to give non-negative ints; skipping the checks there halves the cost.
        b = object.__new__(cls)
        _set_offsets(b, offsets)
        _set_sizes(b, sizes)
        _set_hash(b, hash((offsets, sizes)))
        return b

    @classmethod
    def from_bounds(cls, starts: Sequence[int], stops: Sequence[int]) -> Box:
        """The box ``[starts[d], stops[d])`` in every dim."""
        starts = as_index_tuple(starts, "Box starts")
        stops = as_index_tuple(stops, "Box stops")
        if len(starts) != len(stops):
            raise LayoutError(f"starts {starts} and stops {stops} differ in length")
        if any(b < a for a, b in zip(starts, stops)):
            raise LayoutError(f"stops {tuple(stops)} lie before starts {tuple(starts)}")
        return cls(starts, [b - a for a, b in zip(starts, stops)])

    @classmethod
    def full(cls, shape: Sequence[int]) -> Box:
        """The box covering a whole tensor of ``shape``."""
        return cls((0,) * len(shape), shape)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Box is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Box is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Box, (self.offsets, self.sizes))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Box):
            return NotImplemented
        return self.offsets == other.offsets and self.sizes == other.sizes

    def __hash__(self) -> int:
        return self._hash

    def __lt__(self, other: Box) -> bool:
        return (self.offsets, self.sizes) < (other.offsets, other.sizes)

    def __repr__(self) -> str:
        return f"Box(offsets={show_ints(self.offsets)}, sizes={show_ints(self.sizes)})"

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    @property
    def stops(self) -> tuple[int, ...]:
        """Exclusive upper bound per dim."""
        return tuple(o + s for o, s in zip(self.offsets, self.sizes))

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @property
    def is_empty(self) -> bool:
        return 0 in self.sizes

    def slices(self) -> tuple[slice, ...]:
        """Index a global tensor with this to get the box's elements."""
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.sizes))

    def contains_point(self, point: Sequence[int]) -> bool:
        return all(o <= p < o + s for p, o, s in zip(point, self.offsets, self.sizes))

    def fits_in(self, shape: Sequence[int]) -> bool:
        """True when the box lies within a tensor of ``shape`` (empty boxes included)."""
        return len(shape) == self.ndim and all(
            o + s <= n for o, s, n in zip(self.offsets, self.sizes, shape)
        )

    def intersect(self, other: Box) -> Box | None:
        """The common part of two boxes, or None when they share no element.

        Empty boxes share no element with anything, so the result is never an empty box.
        """
        if not isinstance(other, Box) or self.ndim != other.ndim:
            why = "ndim differs" if isinstance(other, Box) else "it is not a Box"
            raise LayoutError(f"cannot intersect {self} with {shorten(other)}: {why}")
        offs: list[int] = []
        sizes: list[int] = []
        for a, sa, b, sb in zip(self.offsets, self.sizes, other.offsets, other.sizes):
            lo = a if a > b else b
            hi = min(a + sa, b + sb)
            if hi <= lo:
                return None
            offs.append(lo)
            sizes.append(hi - lo)
        return Box._trusted(tuple(offs), tuple(sizes))

    def overlaps(self, other: Box) -> bool:
        return self.intersect(other) is not None

    def relative_to(self, outer: Box) -> Box:
        """This box in the coordinates of ``outer`` (which must contain it)."""
        if not isinstance(outer, Box):
            raise LayoutError(f"{self} can only be made relative to a Box, got {shorten(outer)}")
        if (
            not all(
                o >= oo and o + s <= oo + os_
                for o, s, oo, os_ in zip(self.offsets, self.sizes, outer.offsets, outer.sizes)
            )
            or self.ndim != outer.ndim
        ):
            raise LayoutError(f"{self} does not lie inside {outer}")
        return Box._trusted(tuple(o - oo for o, oo in zip(self.offsets, outer.offsets)), self.sizes)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """Iterate (offset, size) per dim."""
        return iter(zip(self.offsets, self.sizes))


def show_ints(values: tuple[int, ...]) -> str:
    # Exact for every box a tensor can have; only ints too long to print are shortened.
    if all(v.bit_length() <= 256 for v in values):
        return repr(values)
    return "(" + ", ".join(map(shorten, values)) + ("," if len(values) == 1 else "") + ")"


# The slots' own setters: Box.__setattr__ refuses every write after construction.
_set_offsets = Box.__dict__["offsets"].__set__
_set_sizes = Box.__dict__["sizes"].__set__
_set_hash = Box.__dict__["_hash"].__set__
