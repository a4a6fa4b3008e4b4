"""The flat area: flat layouts, ranges of row-major elements, and ZeRO's partitions (FLAT-*:
spec/11-flat.md).

Its tests: ``conformance/tests/test_flat.py``. An adapter takes part by subclassing
:class:`Flat` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`. A piece is ``(rank, start, stop, at)``: elements
``[start, stop)`` of the tensor in row-major order, held by ``rank`` from element ``at`` of its
flat buffer on.
"""

from __future__ import annotations

from collections.abc import Sequence

from conformance.interface.base import Adapter
from shardspec.metadata import Box

Piece = tuple[int, int, int, int]


class Flat(Adapter):
    """Flat layouts and ZeRO's partitions (FLAT-*: spec/11-flat.md)."""

    area = "flat"

    def flat_range_boxes(self, shape: Sequence[int], start: int, stop: int) -> list[Box]:
        """The boxes of the flat range ``[start, stop)`` of a tensor of ``shape``, in
        row-major order (FLAT-2's canonical boxes)."""
        raise self.unsupported("the boxes of a flat range")

    def flat_is_valid(self, shape: Sequence[int], pieces: Sequence[Piece]) -> bool:
        """True when the implementation accepts the flat layout of ``pieces`` (FLAT-4)."""
        raise self.unsupported("flat layout validation")

    def flat_boxes_by_rank(
        self, shape: Sequence[int], pieces: Sequence[Piece]
    ) -> dict[int, list[Box]]:
        """Each rank's boxes of the (valid) flat layout of ``pieces``, in its buffer's order
        (FLAT-5); a rank that holds no element maps to its empty boxes, if any."""
        raise self.unsupported("flat layouts as boxes")

    def flat_pieces_of_boxes(
        self, shape: Sequence[int], boxes: Sequence[tuple[Box, int]]
    ) -> list[Piece]:
        """The flat layout of a (valid) layout's ``(box, rank)`` pairs (FLAT-5)."""
        raise self.unsupported("layouts as flat ranges")

    def zero12_pieces(
        self, shapes: Sequence[Sequence[int]], dp: int, alignment: int, round_robin: bool
    ) -> list[list[Piece]]:
        """ZeRO-1/2's partition of a parameter group of ``shapes`` over ``dp`` ranks (FLAT-6):
        each parameter's non-empty pieces, ``at`` their place in the rank's partition."""
        raise self.unsupported("ZeRO-1/2 partitions")

    def zero3_pieces(self, shape: Sequence[int], dp: int) -> list[Piece]:
        """ZeRO-3's partition of one parameter of ``shape`` over ``dp`` ranks (FLAT-7): one
        piece a rank, empty past the data."""
        raise self.unsupported("ZeRO-3 partitions")
