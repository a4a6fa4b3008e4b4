"""Exceptions raised by the resharding executor, and how its messages name ranks."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ReshardError", "rank_ranges"]

# Beyond this many runs a rank list is cut: at 1024 ranks a message that lists them one by one
# is longer than anything a reader looks at.
_MAX_RUNS = 12


class ReshardError(ValueError):
    """The ranks of a reshard cannot proceed: they disagree on the layouts, shape, dtype or
    buffer bound, or some rank passed local shards that do not match its source boxes.

    Every rank of the group raises this error with the same message (the check is collective),
    so a bad input on one rank never leaves the others waiting in a collective.
    """


def rank_ranges(ranks: Iterable[int]) -> str:
    """``ranks`` as a reader takes them in: ``"rank 5"``, ``"ranks 0-1023"``,
    ``"ranks 0, 2, 5-7"`` (runs of three or more consecutive ranks as a range; past 12 runs,
    the rest is counted, not listed)."""
    rs = sorted(set(ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    runs: list[tuple[int, int]] = []
    for r in rs:
        if runs and runs[-1][1] == r - 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    parts: list[str] = []
    for lo, hi in runs[:_MAX_RUNS]:
        if hi - lo >= 2:
            parts.append(f"{lo}-{hi}")
        else:
            parts.extend(str(r) for r in range(lo, hi + 1))
    if len(runs) > _MAX_RUNS:
        rest = sum(hi - lo + 1 for lo, hi in runs[_MAX_RUNS:])
        parts.append(f"and {rest} more up to {rs[-1]}")
    return f"ranks {', '.join(parts)}" if rs else "no ranks"
