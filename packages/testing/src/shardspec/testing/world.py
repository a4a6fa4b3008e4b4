"""A one-shot world: start W ranks, run one rank function on each, stop them.

For checks that need a fresh process group (a real FSDP model, a DCP checkpoint written by
every rank), on the same core as the pool: same start-up, loopback store, timeout, death
detection and kill by process group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .pool import RankPool
from .results import RankCrash, RankFailure

__all__ = ["run_world"]


def run_world(
    fn: Callable[..., Any] | str,
    world: int,
    *args: Any,
    timeout: float = 240.0,
    backend_name: str = "gloo",
    device: str = "cpu",
    error_grace: float | None = None,
) -> dict[int, tuple[str, Any]]:
    """Run ``fn(rank, world, *args)`` on ``world`` fresh ranks (gloo on CPU unless
    ``backend_name`` / ``device`` say otherwise: the world functions build their own meshes, so
    ``SHARDSPEC_BACKEND`` does not reach them); return rank -> ``("ok", value)``,
    ``("error", traceback)`` or ``("missing", why)``.

    A rank that dies or exceeds ``timeout`` is reported as missing and every rank is killed,
    so a hung collective cannot hang the test. Once a rank has raised, the others get
    ``error_grace`` seconds (default ``min(timeout, 30)``, stretched on a slow machine) to
    finish before they are called left waiting in a collective.
    """
    pool = RankPool(
        world,
        timeout=timeout,
        startup_timeout=timeout,
        error_grace=min(timeout, 30) if error_grace is None else error_grace,
        backend_name=backend_name,
        device=device,
    )
    try:
        answers = pool.call_all(fn, *args)
    except RankCrash as e:
        return {r: ("missing", str(e)) for r in range(world)}
    finally:
        pool.close()
    return {
        r: ("error", f"{a.type_name}: {a.message}\n{a.traceback}")
        if isinstance(a, RankFailure)
        else ("ok", a)
        for r, a in enumerate(answers)
    }
