"""What a peer's fresh worlds answered (``shardspec.testing.run_world``), for the adapters whose
ranks run world functions: one outcome per rank, and one failure naming every rank that did not
answer. Shared by the peers so that each reads a half-failed world the same way."""

from __future__ import annotations

from typing import Any

__all__ = ["raise_failed", "world_outcomes"]


def world_outcomes(
    fn: str, world: int, *args: Any, timeout: float, error_grace: float
) -> dict[int, tuple[str, Any]]:
    """``run_world``'s rank -> ``("ok", value)``, ``("error", text)`` or ``("missing", why)``,
    also when a rank raised while others waited in a collective (the pool's ``RankError``):
    those others are ``("missing", "still waiting in a collective")``."""
    from shardspec.testing import RankError, run_world

    try:
        return run_world(fn, world, *args, timeout=timeout, error_grace=error_grace)
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
