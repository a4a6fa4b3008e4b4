"""Exceptions raised by the resharding executor."""

from __future__ import annotations

__all__ = ["ReshardError"]


class ReshardError(ValueError):
    """The ranks of a reshard cannot proceed: they disagree on the layouts, shape, dtype or
    buffer bound, or some rank passed local shards that do not match its source boxes.

    Every rank of the group raises this error with the same message (the check is collective),
    so a bad input on one rank never leaves the others waiting in a collective.
    """
