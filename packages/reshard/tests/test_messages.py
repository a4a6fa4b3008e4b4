"""Errors readable at scale (spec/06-reshard.md RESHARD-5): an error that several ranks share
is shown once, after its ranks written compactly ("ranks 0-1023: ..."), and tensors are named
as the caller wrote them, never by an internal key."""

from __future__ import annotations

import pytest
import torch
from reshard_cases import run_single
from reshard_fault_cases import all_raise, run_state_dict_kwargs

from shardspec.metadata import chunk_layout
from shardspec.reshard.agreement import shared_problems
from shardspec.reshard.errors import rank_ranges
from shardspec.testing import RankPool, get_pool
from shardspec.testing.tensors import random_tensor

WORLD = 4


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120)  # the session's pool of the executor tests


@pytest.mark.rule("RESHARD-5")
@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([5], "rank 5"),
        (range(1024), "ranks 0-1023"),
        ([7, 0, 2, 5, 6], "ranks 0, 2, 5-7"),
        ([3, 4], "ranks 3, 4"),
        ([0, 1, 2, 9, 10, 11, 300], "ranks 0-2, 9-11, 300"),
        (range(0, 40, 2), "ranks 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, and 8 more up to 38"),
    ],
)
def test_rank_lists_are_compact(ranks: list[int], text: str) -> None:
    assert rank_ranges(ranks) == text


@pytest.mark.rule("RESHARD-5")
def test_ranks_with_the_same_fault_share_one_line() -> None:
    problems = {r: f"local shard #0 on rank {r} has shape (0,)" for r in range(1024)}
    problems[7] = "rank 7: device 'bogus' is not a device"
    problems[70] = "rank 17 holds other data"  # another rank's number is kept as it is
    got = shared_problems(problems)
    assert got.count("has shape (0,)") == 1, got
    assert got.startswith("ranks 0-6, 8-69, 71-1023: local shard #0 on this rank has shape"), got
    assert "rank 7: this rank: device 'bogus'" in got, got
    assert "rank 70: rank 17 holds other data" in got, got
    many = shared_problems({r: f"shape {r}" for r in range(1000)})
    assert len(many) < 400 and "and 992 other messages from ranks 8-999" in many, many


@pytest.mark.rule("RESHARD-5")
def test_one_error_of_every_rank_is_shown_once(pool: RankPool) -> None:
    src, dst = chunk_layout((8, 4), 0, range(WORLD)), chunk_layout((8, 4), 1, range(WORLD))
    ins = [[torch.zeros(b.sizes)] for r in range(WORLD) for b in src.boxes_of(r)]
    args = [(ins[r], src, dst, {"max_buffer_bytes": 0}) for r in range(WORLD)]
    msg = all_raise(pool.call_all(run_single, per_rank=args), "ranks 0-3: ")
    assert msg.count("max_buffer_bytes must be a positive int") == 1, msg
    # The same fault on every rank, each rank naming itself: still one line.
    wrong = [([torch.zeros(3, 4)], src, dst, {}) for r in range(WORLD)]
    msg = all_raise(pool.call_all(run_single, per_rank=wrong), "ranks 0-3: ", "shape (3, 4)")
    assert msg.count("shape (3, 4)") == 1, msg


@pytest.mark.rule("RESHARD-5")
def test_a_single_tensor_and_named_keys_are_named_as_the_caller_wrote_them(
    pool: RankPool,
) -> None:
    shape = (8, 4)
    src = chunk_layout(shape, 0, [0, 1])  # ranks 2 and 3 hold nothing and learn the dtype
    dst = chunk_layout(shape, 1, range(WORLD))
    full = random_tensor(shape, torch.float32, 51)
    ins = [[full[b.slices()].clone() for b in src.boxes_of(r)] for r in range(WORLD)]
    outs = [[torch.zeros(b.sizes) for b in dst.boxes_of(r)] for r in range(WORLD)]
    outs[3] = [torch.zeros(8, 1, dtype=torch.int32)]
    args = [(ins[r], src, dst, {"out": outs[r]}) for r in range(WORLD)]
    msg = all_raise(pool.call_all(run_single, per_rank=args), "dtype of the tensor")
    assert "''" not in msg, msg
    # A key built by a caller (shardspec.fsdp.reshard_for's optimizer states) shows the
    # caller's name for it, never the key's control characters.
    key = "\0optim\x000.bias\0exp_avg"
    name = "optimizer state 'exp_avg' of parameter '0.bias'"
    states = [{key: ins[r]} for r in range(WORLD)]
    states[1] = {key: [torch.zeros(3, 4)]}
    args2 = [(states[r], {key: src}, {key: dst}, {"names": {key: name}}) for r in range(WORLD)]
    msg = all_raise(pool.call_all(run_state_dict_kwargs, per_rank=args2), name, "rank 1")
    assert "\0" not in msg and "\\x00" not in msg, msg


@pytest.mark.rule("RESHARD-5")
def test_at_64_simulated_ranks_the_error_stays_one_line() -> None:
    from shardspec.testing.simulated import SimulatedPool

    world = 64
    src, dst = chunk_layout((2 * world, 3), 0, range(world)), chunk_layout((2 * world, 3), 1, [0])
    pool = SimulatedPool(world, timeout=120)
    try:
        answers = pool.call_all(run_single, per_rank=[([torch.zeros(1, 3)], src, dst, {})] * world)
    finally:
        pool.close()
    msg = all_raise(answers, "ranks 0-63: ")
    assert msg.count("has shape (1, 3)") == 1 and len(msg) < 400, msg
