"""The shardspec rank runtime for tests: one process-lifecycle core for pooled ranks (W
long-lived processes per world size), one-shot worlds, and the shared oracles.

See the package README for the three ways to get ranks and the wire format."""

from .devices import backend, device_type, launcher_rank, max_world_size, rank_device, skip_reason
from .pool import RankPool
from .pool_cache import get_pool, shutdown_pools
from .results import PoolError, RankCrash, RankError, RankFailure, RankResult
from .timing import scaled, slowness
from .world import run_world

__all__ = [
    "PoolError",
    "RankCrash",
    "RankError",
    "RankFailure",
    "RankPool",
    "RankResult",
    "backend",
    "device_type",
    "get_pool",
    "launcher_rank",
    "max_world_size",
    "rank_device",
    "run_world",
    "scaled",
    "shutdown_pools",
    "skip_reason",
    "slowness",
]
