"""Rank functions ("module:function") on a pool of 2 gloo ranks: results by rank, errors with
tracebacks (BaseException too), per-rank arguments, environment, values that cannot travel,
and the failure paths (hang, error then hang, death) that must kill the pool and leave no
process."""

from __future__ import annotations

import os

import pytest
import torch
from testing_pool_cases import (
    all_reduce_rank,
    environment,
    exit_on,
    pid,
    raise_on,
    raise_then_collective,
    round_trip,
    sleep,
    unsendable,
)

from shardspec.testing import RankCrash, RankError, RankFailure, RankPool, get_pool

WORLD = 2


def _gone(pids: list[int]) -> bool:
    # Reaped children no longer exist; a zombie would still answer signal 0.
    for p in pids:
        try:
            os.kill(p, 0)
        except ProcessLookupError:
            continue
        return False
    return True


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120, local_size=1, env={"SHARDSPEC_PROBE": "x"})


@pytest.mark.rule("CONF-1")
def test_results_come_back_by_rank_from_a_real_process_group(pool: RankPool) -> None:
    # all_reduce of the ranks 0 + 1 = 1 on every rank proves the group is real.
    assert pool.call(all_reduce_rank) == [(0, 2, 1.0), (1, 2, 1.0)]
    assert pool.call(all_reduce_rank, 5) == [(0, 7, 1.0), (1, 7, 1.0)]
    assert pool.call(all_reduce_rank, per_rank=[(10,), (20,)]) == [(0, 12, 1.0), (1, 22, 1.0)]
    assert pool.call("testing_pool_cases:all_reduce_rank") == [(0, 2, 1.0), (1, 2, 1.0)]


def test_environment_reaches_the_ranks(pool: RankPool) -> None:
    assert pool.call(environment, "LOCAL_WORLD_SIZE") == ["1", "1"]
    assert pool.call(environment, "SHARDSPEC_PROBE") == ["x", "x"]
    assert pool.call(environment, "GLOO_SOCKET_IFNAME") == ["lo", "lo"]


@pytest.mark.rule("CONF-8")
def test_values_travel_without_pickle_strides_included(pool: RankPool) -> None:
    from shardspec.metadata import chunk_layout

    t = torch.arange(12, dtype=torch.int16).reshape(3, 4).t()  # non-contiguous
    layout = chunk_layout((5, 3), 0, [1, 0])
    value = {"t": t, (1, "k"): [None, 1.5, float("nan")], "d": torch.bfloat16, "l": layout}
    for got in pool.call(round_trip, value):
        assert got["t"].stride() == t.stride() and torch.equal(got["t"], t)
        assert got[(1, "k")][:2] == [None, 1.5] and got[(1, "k")][2] != got[(1, "k")][2]
        assert got["d"] is torch.bfloat16 and got["l"] == layout
    with pytest.raises(TypeError, match=r"arguments of .*\[0\] is a builtins.object"):
        pool.call(round_trip, object())


@pytest.mark.parametrize("base", [False, True])
def test_an_error_on_a_rank_comes_back_with_its_traceback(pool: RankPool, base: bool) -> None:
    with pytest.raises(RankError, match="rank 1 raised") as info:
        pool.call(raise_on, 1, base)
    (failure,) = info.value.failures
    assert failure.rank == info.value.rank == 1
    assert failure.type_name == ("NotAnException" if base else "ValueError")
    assert failure.message == "bad rank 1"
    assert "testing_pool_cases.py" in failure.traceback
    ok, err = pool.call_all(raise_on, 0, base)[::-1]
    assert ok == 1
    assert isinstance(err, RankFailure)
    assert (err.type_name, err.message) == (failure.type_name, "bad rank 0")
    assert pool.alive, "an error that every rank returned from must not kill the pool"


def test_an_unsendable_result_is_an_error_not_a_dead_rank(pool: RankPool) -> None:
    with pytest.raises(RankError, match=r"cannot send the result.*function"):
        pool.call(unsendable)
    assert pool.call(all_reduce_rank) == [(0, 2, 1.0), (1, 2, 1.0)]


def test_per_rank_must_have_one_entry_per_rank(pool: RankPool) -> None:
    with pytest.raises(ValueError, match="per_rank has 1 entries for 2 ranks"):
        pool.call(all_reduce_rank, per_rank=[(1,)])


@pytest.mark.rule("CONF-3")
def test_failures_kill_the_pool_and_the_next_call_restarts_it() -> None:
    # Starting ranks takes seconds under load, so only the failing calls get short limits.
    with RankPool(WORLD, timeout=120, error_grace=2) as p:
        first = p.call(pid)
        with pytest.raises(RankCrash, match=r"rank\(s\) \[0, 1\] did not answer within 3"):
            p.call(sleep, 3600, timeout=3)  # a hang: caught whatever the machine's slowness
        assert not p.alive and _gone(first)
        second = p.call(pid)
        assert set(second).isdisjoint(first)
        with pytest.raises(
            RankError,
            match=r"rank 0 raised ValueError: rank 0 never joins; rank 1 still waiting in a "
            r"collective after \d+\.\d s",
        ):
            p.call(raise_then_collective)
        assert _gone(second)
        third = p.call(pid)
        with pytest.raises(RankCrash, match=r"rank 1 died \(exit code 3\)"):
            p.call(exit_on, 1)
        assert _gone(third)
        assert p.call(all_reduce_rank) == [(0, 2, 1.0), (1, 2, 1.0)]
        last = p.call(pid)
    assert _gone(last)
