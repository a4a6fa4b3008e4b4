"""Run under torchrun by test_launched.py (not collected on its own): the driver's pools are
the other launcher ranks, formed into worlds of each size asked for, in turn."""

from __future__ import annotations

from testing_pool_cases import all_reduce_rank, environment

from shardspec.testing import get_pool
from shardspec.testing.launched import LaunchedPool


def test_pools_are_the_other_launcher_ranks() -> None:
    two = get_pool(2, timeout=120)
    assert isinstance(two, LaunchedPool)
    assert two.call(environment, "RANK") == ["1", "2"]
    assert two.call(all_reduce_rank) == [(0, 2, 1.0), (1, 2, 1.0)]
    one = get_pool(1, timeout=120)
    assert one.call(all_reduce_rank) == [(0, 1, 0.0)]
    assert two.call(all_reduce_rank, 3) == [(0, 5, 1.0), (1, 5, 1.0)]  # formed again
