"""What a call to the ranks gives back or raises, whichever way the ranks run (pooled,
launched, simulated, one program): each rank's :class:`RankResult` or :class:`RankFailure`,
and the errors :class:`RankError` (a rank raised), :class:`RankCrash` (a rank died or hung)
and :class:`PoolError` (the ranks did not start)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "PoolError",
    "RankCrash",
    "RankError",
    "RankFailure",
    "RankResult",
    "failure_from",
]


class PoolError(RuntimeError):
    """The pool could not start (a worker failed to import, connect or join the group)."""


class RankError(AssertionError):
    """One or more ranks raised; the message carries every failing rank's traceback and the
    example, and :attr:`failures` each rank's :class:`RankFailure`."""

    def __init__(self, message: str, failures: Sequence[RankFailure] = ()) -> None:
        super().__init__(message)
        self.failures = list(failures)

    @property
    def rank(self) -> int:
        """The lowest rank that raised."""
        return self.failures[0].rank if self.failures else -1


class RankCrash(BaseException):
    """A rank died or hung; the pool was torn down and restarts on the next call."""


@dataclass
class RankResult:
    """What one rank returned from a named operation: a JSON value and tensors."""

    rank: int
    value: Any
    tensors: list[torch.Tensor] = field(default_factory=list)


@dataclass
class RankFailure:
    """What one rank raised: the exception's type name, message and traceback."""

    rank: int
    type_name: str
    message: str
    traceback: str
    phase: str


def failure_from(rank: int, reply: dict[str, Any]) -> RankFailure:
    """The :class:`RankFailure` a rank's error reply describes."""
    tb = str(reply.get("error", ""))
    last = tb.strip().splitlines()[-1] if tb.strip() else ""
    type_name, _, message = last.partition(": ")
    return RankFailure(
        rank,
        str(reply.get("type", type_name)),
        str(reply.get("message", message)),
        tb,
        str(reply.get("phase", "")),
    )
