"""Shards: one box of a layout and the rank that holds it."""

from __future__ import annotations

from typing import Any

from .box import Box, _to_int
from .errors import LayoutError, shorten

__all__ = ["Shard"]


class Shard:
    """One box of a layout and the rank that holds it. Immutable; compares and hashes by
    (box, rank)."""

    __slots__ = ("box", "rank")
    __match_args__ = ("box", "rank")
    box: Box
    rank: int

    def __init__(self, box: Box, rank: int) -> None:
        # Written out rather than a frozen dataclass: layouts hold millions of shards, and the
        # generated __init__ plus __post_init__ cost twice this.
        if type(box) is not Box and not isinstance(box, Box):
            raise LayoutError(f"Shard.box must be a Box, got {type(box).__name__}: {shorten(box)}")
        if type(rank) is not int:  # numpy / torch ints from upstream code become plain ints
            plain = _to_int(rank)
            if plain is None:
                raise LayoutError(f"Shard.rank must be a non-negative int, got {shorten(rank)}")
            rank = plain
        if rank < 0:
            raise LayoutError(f"Shard.rank must be a non-negative int, got {shorten(rank)}")
        _set_box(self, box)
        _set_rank(self, rank)

    @classmethod
    def _trusted(cls, box: Box, rank: int) -> Shard:
        # For callers that checked every box and rank already, by the thousand at once
        # (plain_columns): the checks above cost more than building the shard.
        s = object.__new__(cls)
        _set_box(s, box)
        _set_rank(s, rank)
        return s

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Shard is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Shard is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Shard, (self.box, self.rank))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shard):
            return NotImplemented
        return self.rank == other.rank and self.box == other.box

    def __hash__(self) -> int:
        return hash((self.box, self.rank))

    def __repr__(self) -> str:
        box = repr(self.box)  # "Box(offsets=..., sizes=...)", long ints shortened
        return f"Shard(rank={shorten(self.rank)}, {box[4:-1]})"


# The slots' own setters: Shard.__setattr__ refuses every write after construction.
_set_box = Shard.__dict__["box"].__set__
_set_rank = Shard.__dict__["rank"].__set__
