"""What a peer's fresh worlds answered (``shardspec.testing.run_world``), for the adapters whose
ranks run world functions: one outcome per rank, and one failure naming every rank that did not
answer. Shared by the peers so that each reads a half-failed world the same way."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["HUNG_LIMIT", "raise_failed", "world_outcomes"]

# A world in which no rank answers costs its whole timeout; after this many, a session whose
# peer runtime is stuck (an op build waiting on a lock, a rendezvous that never forms) fails
# its remaining worlds at once rather than spending a timeout on each.
HUNG_LIMIT = 2
_HUNG: list[str] = []


def world_outcomes(
    fn: str, world: int, *args: Any, timeout: float, error_grace: float
) -> dict[int, tuple[str, Any]]:
    """``run_world``'s rank -> ``("ok", value)``, ``("error", text)`` or ``("missing", why)``,
    also when a rank raised while others waited in a collective (the pool's ``RankError``):
    those others are ``("missing", "still waiting in a collective")``. After ``HUNG_LIMIT``
    worlds of this process in which no rank answered within the timeout, every rank of a
    further world is ``("missing", ...)`` at once, naming those worlds."""
    from shardspec.testing import RankError, run_world

    if len(_HUNG) >= HUNG_LIMIT:
        why = (
            f"not started: {len(_HUNG)} earlier worlds of this process hung with no rank "
            f"answering ({'; '.join(_HUNG)}), so the peer's runtime is taken to be stuck"
        )
        return dict.fromkeys(range(world), ("missing", why))
    t0 = time.monotonic()
    try:
        out = run_world(fn, world, *args, timeout=timeout, error_grace=error_grace)
        # a world whose ranks died returns at once; only one that ran out its timeout counts
        if all(s == "missing" for s, _ in out.values()) and time.monotonic() - t0 >= timeout:
            _HUNG.append(f"{getattr(fn, '__name__', fn)} on {world} ranks")
        return out
    except RankError as e:
        waiting = ("missing", "still waiting in a collective")
        out: dict[int, tuple[str, Any]] = dict.fromkeys(range(world), waiting)
        for f in e.failures:
            out[f.rank] = ("error", f"{f.type_name}: {f.message}" if f.message else f.type_name)
        return out


def raise_failed(what: str, results: dict[int, tuple[str, Any]], example: str) -> None:
    """Raise AssertionError ``the <what> failed [<example>]:`` with one line a rank that did not
    answer ``ok``: the last line of its error (its exception) or why it is missing."""
    bad = [
        f"rank {r}: {_last_line(v)}" for r, (status, v) in sorted(results.items()) if status != "ok"
    ]
    if bad:
        raise AssertionError(f"the {what} failed [{example}]:\n" + "\n".join(bad))


def _last_line(value: Any) -> str:
    lines = [ln for ln in str(value).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else str(value)
