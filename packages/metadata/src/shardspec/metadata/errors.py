"""Exceptions raised by the layout model."""

from __future__ import annotations

import reprlib

__all__ = ["ConversionError", "LayoutError", "shorten"]


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


class _Shortener(reprlib.Repr):
    """``reprlib`` limits, plus ints too long to print (``str`` refuses past 4300 digits)."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 256:
            return f"<{'negative ' if x < 0 else ''}int of {x.bit_length()} bits>"
        return repr(x)  # up to 78 digits: exact, a bound a reader may want to compare


_SHORTENER = _Shortener()
_SHORTENER.maxstring = 60
_SHORTENER.maxother = 60
_SHORTENER.maxlist = _SHORTENER.maxtuple = 12
_SHORTENER.maxdict = _SHORTENER.maxset = _SHORTENER.maxfrozenset = 6
_SHORTENER.maxlevel = 4
_MAX_SHOWN = 200


def shorten(value: object) -> str:
    """``repr(value)`` cut to a readable length, for error messages about input.

    A malformed value can be megabytes long (a whole JSON document, a list of a million
    ranks); a message that repeats it whole is no help and can itself exhaust a log. Never
    raises: a value whose repr fails is named by its type.
    """
    try:
        text = _SHORTENER.repr(value)
    except Exception:  # a hostile __repr__ must not replace the error being reported
        return f"<{type(value).__name__}>"
    if len(text) > _MAX_SHOWN:
        text = text[: _MAX_SHOWN - 3] + "..."
    return text
