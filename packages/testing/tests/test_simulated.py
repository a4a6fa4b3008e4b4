"""Simulated worlds: W threads on torch's threaded process group run rank functions and named
operations as the process pool does, at world sizes a 2-core machine cannot start processes
for (rank numbers above 255 included), with the same failure handling."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from testing_pool_cases import (
    all_reduce_rank,
    empty_sharded_tensor_device,
    group_device,
    group_recorded,
    hang_on,
    raise_on,
    uneven_all_to_all,
)

from shardspec.testing import RankCrash, RankError, scaled
from shardspec.testing.ops import Context, operation
from shardspec.testing.simulated import SimulatedPool


class Refusal(ValueError):
    """A named exception type, as a caller tells a refusal from a wrong answer by it."""


@operation("test.simulated.refuse", collective=True)
def _refuse(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> tuple[Any, list[Any]]:
    if ctx.rank in args["ranks"]:
        raise Refusal(f"rank {ctx.rank} refuses: no type holds it")
    return None, []


@pytest.mark.rule("CONF-10")
def test_a_world_of_300_ranks_has_a_real_group_and_rank_numbers_above_255() -> None:
    pool = SimulatedPool(300, timeout=120)
    try:
        got = pool.call(all_reduce_rank)
        assert [g[0] for g in got] == list(range(300))
        assert {g[2] for g in got} == {float(sum(range(300)))}
    finally:
        pool.close()


@pytest.mark.rule("CONF-10")
def test_uneven_all_to_all_single_lands_every_element() -> None:
    world = 9
    pool = SimulatedPool(world, timeout=120)
    try:
        got = pool.call(uneven_all_to_all)
    finally:
        pool.close()
    for dst in range(world):
        want = [1000.0 * s + dst for s in range(world) for _ in range((s + dst) % 3)]
        assert got[dst] == want, f"rank {dst}"


@pytest.mark.rule("CONF-10")
def test_a_simulated_group_names_its_device_as_gloo_does() -> None:
    """torch's chunk_tensor asks its group for a device; the threaded group registers none and
    raised "no backend has been registered" where a gloo group answers cpu."""
    pool = SimulatedPool(4, timeout=60)
    try:
        assert pool.call(group_device) == ["cpu"] * 4
    finally:
        pool.close()


@pytest.mark.rule("CONF-10")
def test_a_rank_holding_no_shard_of_a_sharded_tensor_answers_cpu_as_gloo_does() -> None:
    """ShardedTensor answers the device of a rank without shards by the group's backend name
    (gloo: cpu, anything else: CUDA); dcp.load asks it on every rank, and a CPU-only torch
    raised "Torch not compiled with CUDA enabled" on the threaded ranks."""
    pool = SimulatedPool(3, timeout=60)
    try:
        assert pool.call(empty_sharded_tensor_device) == ["cpu"] * 3
    finally:
        pool.close()


@pytest.mark.rule("CONF-10")
def test_a_simulated_world_starts_with_torchs_flight_recorder_on() -> None:
    """torch 2.15 attaches its flight recorder to every group that answers a device, and the
    recorder files entries under the group's name; a threaded group answering cpu without a
    name ("ProcessGroup name not set") did not start. The recorder stays on: where torch has
    the hooks, every rank's group carries one."""
    pool = SimulatedPool(3, timeout=60)
    try:
        got = pool.call(group_recorded)
        assert pool.call(group_device) == ["cpu"] * 3
    finally:
        pool.close()
    assert got in ([[False, False]] * 3, [[True, True]] * 3), got


@pytest.mark.rule("CONF-2", "CONF-3", "CONF-10")
def test_a_raising_or_hanging_rank_fails_the_call_and_the_world_comes_back() -> None:
    pool = SimulatedPool(16, timeout=5, error_grace=1)
    try:
        with pytest.raises(RankError, match="rank 3 raised ValueError: bad rank 3"):
            pool.call(raise_on, 3, False)
        t0 = time.monotonic()
        with pytest.raises(
            RankCrash, match=r"rank\(s\) \[5\] of a simulated world of 16 did not answer within 2 s"
        ):
            pool.call(hang_on, 5, timeout=2)
        assert time.monotonic() - t0 < scaled(2 + 10)
        generation = pool.generation
        assert [g[0] for g in pool.call(all_reduce_rank)] == list(range(16))
        assert pool.generation == generation + 1
    finally:
        pool.close()


@pytest.mark.rule("CONF-2")
def test_a_named_operation_that_raises_says_each_ranks_exception_type_and_message() -> None:
    # the conformance suite reads a refusal on every rank (CONVERT-5) from these fields: empty
    # ones made a simulated world's refusal a failure the process pool reported as a refusal
    pool = SimulatedPool(4, timeout=60, ops=(__name__,))
    try:
        with pytest.raises(RankError) as info:
            pool.run("test.simulated.refuse", {"ranks": [1, 3]})
        got = [(f.rank, f.type_name.rpartition(".")[2], f.message) for f in info.value.failures]
        assert got == [
            (1, "Refusal", "rank 1 refuses: no type holds it"),
            (3, "Refusal", "rank 3 refuses: no type holds it"),
        ]
    finally:
        pool.close()
