"""The pools a process shares: :func:`get_pool` keeps one per world size and options, pooled
(:class:`~shardspec.testing.pool.RankPool`) or, under ``torchrun``, launched
(:class:`~shardspec.testing.launched.LaunchedPool`); :func:`shutdown_pools` closes them."""

from __future__ import annotations

import json
from typing import Any

from .launched import LaunchedPool, is_launched
from .pool import RankPool, close_pools

__all__ = ["get_pool", "shutdown_pools"]

_POOLS: dict[tuple[Any, ...], RankPool] = {}


def get_pool(world_size: int, **options: Any) -> RankPool:
    """The process-wide pool of ``world_size`` ranks with these :class:`RankPool` options
    (started on first use, shut down at exit or by :func:`shutdown_pools`)."""
    key = (world_size, json.dumps(options, sort_keys=True, default=str))
    pool = _POOLS.get(key)
    if pool is None:
        kind = LaunchedPool if is_launched() else RankPool
        pool = _POOLS[key] = kind(world_size, **options)
    return pool


def shutdown_pools() -> None:
    close_pools()
    _POOLS.clear()
