"""Exceptions raised by the layout model."""

from __future__ import annotations

__all__ = ["ConversionError", "LayoutError"]


class LayoutError(ValueError):
    """A layout breaks a rule of the spec.

    Besides the message, the error carries what it found so that tools can act on it:
    ``kind`` is one of ``"value"`` (a bad number or type), ``"ndim"``, ``"bounds"``,
    ``"duplicate"``, ``"overlap"``, ``"gap"``; ``shards`` are the indices of the offending
    shards in ``layout.shards``; ``point`` is an uncovered element for a gap.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str = "value",
        shards: tuple[int, ...] = (),
        point: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.shards = shards
        self.point = point


class ConversionError(ValueError):
    """A layout cannot be expressed in (or read from) a foreign type without losing information."""
