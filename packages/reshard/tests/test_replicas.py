"""Replicas that differ (spec/06-reshard.md RESHARD-13), on a pool of 4 gloo ranks: the
executor trusts the owners of a replicated source box to hold the same bytes; with
``check_replicas=True`` it compares them first and raises on every rank, naming the tensor,
the box and which ranks hold which copy, before any data moves."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.errors import UnsatisfiedAssumption
from reshard_cases import DTYPES, run_single
from reshard_fault_cases import all_raise, run_state_dict_kwargs

from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.metadata.strategies import shapes, valid_layouts
from shardspec.reshard import reference
from shardspec.testing import RankFailure, RankPool, get_pool
from shardspec.testing.tensors import random_tensor

WORLD = 4
SHAPE = (6, 4)
# Rows 0-2 on ranks 0 and 2, rows 3-5 on ranks 1 and 3: every row has two copies.
SRC = Layout(
    SHAPE,
    [
        Shard(Box((0, 0), (3, 4)), 0),
        Shard(Box((3, 0), (3, 4)), 1),
        Shard(Box((0, 0), (3, 4)), 2),
        Shard(Box((3, 0), (3, 4)), 3),
    ],
)
DST = chunk_layout(SHAPE, 1, range(WORLD))


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120)  # the session's pool of the executor tests


def _inputs(src: Layout, full: torch.Tensor) -> list[list[torch.Tensor]]:
    return [[full[b.slices()].clone() for b in src.boxes_of(r)] for r in range(WORLD)]


def _spoil(ins: list[list[torch.Tensor]], rank: int, index: int = 0) -> None:
    """Change one element of a rank's copy (its bits, whatever the dtype)."""
    t = ins[rank][index]
    raw = t.reshape(-1).view(torch.uint8)
    raw[0] ^= 1


@pytest.mark.rule("RESHARD-13")
def test_differing_replicas_raise_on_every_rank_naming_tensor_box_and_ranks(
    pool: RankPool,
) -> None:
    full = random_tensor(SHAPE, torch.float32, 41)
    ins = _inputs(SRC, full)
    _spoil(ins, 2)  # rank 2's copy of rows 0-2 differs from rank 0's
    args = [(ins[r], SRC, DST, {"check_replicas": True}) for r in range(WORLD)]
    msg = all_raise(pool.call_all(run_single, per_rank=args), "replicas", "No data was moved")
    assert str(Box((0, 0), (3, 4))) in msg, msg
    assert "rank 0 (digest" in msg and "rank 2 (digest" in msg, msg
    assert str(Box((3, 0), (3, 4))) not in msg, f"rows 3-5 agree: {msg}"
    assert "the tensor" in msg, msg
    # Nothing was left half-sent: the group runs the same call right after, correctly.
    good = _inputs(SRC, full)
    got = pool.call(
        run_single, per_rank=[(good[r], SRC, DST, {"check_replicas": True}) for r in range(WORLD)]
    )
    want = reference.reshard(dict(enumerate(good)), SRC, DST)
    for r in range(WORLD):
        assert all(reference.same_bits(a, b) for a, b in zip(got[r], want.get(r, []))), r


@pytest.mark.rule("RESHARD-13")
def test_a_state_dict_names_the_key_and_every_box_that_differs(pool: RankPool) -> None:
    full = {"w": random_tensor(SHAPE, torch.bfloat16, 42), "b": random_tensor((6,), torch.bool, 43)}
    src = {"w": SRC, "b": Layout.replicated((6,), range(WORLD))}
    dst = {"w": DST, "b": chunk_layout((6,), 0, range(WORLD))}
    states = [{k: _inputs(src[k], full[k])[r] for k in full} for r in range(WORLD)]
    _spoil([states[r]["w"] for r in range(WORLD)], 3)  # rows 3-5: rank 3 vs rank 1
    _spoil([states[r]["b"] for r in range(WORLD)], 1)
    _spoil([states[r]["b"] for r in range(WORLD)], 2)  # the same spoiled copy as rank 1's
    args = [(states[r], src, dst, {"check_replicas": True}) for r in range(WORLD)]
    msg = all_raise(pool.call_all(run_state_dict_kwargs, per_rank=args), "replicas")
    assert f"tensor 'w', box {Box((3, 0), (3, 4))}" in msg, msg
    assert "rank 1 (digest" in msg and "rank 3 (digest" in msg, msg
    assert f"tensor 'b', box {Box((0,), (6,))}" in msg, msg
    assert "ranks 0, 3 (digest" in msg and "ranks 1, 2 (digest" in msg, msg


@pytest.mark.rule("RESHARD-13", "RESHARD-5")
def test_ranks_that_disagree_on_check_replicas_raise_instead_of_hanging(pool: RankPool) -> None:
    full = random_tensor(SHAPE, torch.float32, 44)
    ins = _inputs(SRC, full)
    args = [(ins[r], SRC, DST, {"check_replicas": r == 1}) for r in range(WORLD)]
    all_raise(pool.call_all(run_single, per_rank=args), "check_replicas", "rank 1")


@pytest.mark.rule("RESHARD-13")
def test_without_the_check_replicas_are_trusted(pool: RankPool) -> None:
    """The documented default: no digests, no error; each piece comes from one owner."""
    full = random_tensor(SHAPE, torch.int32, 45)
    ins = _inputs(SRC, full)
    _spoil(ins, 2)
    answers = pool.call_all(run_single, per_rank=[(ins[r], SRC, DST, {}) for r in range(WORLD)])
    assert not any(isinstance(a, RankFailure) for a in answers), answers


Spoil = tuple[int, int] | None  # (rank, local index) of the copy to change, or none


@st.composite
def replica_cases(draw: st.DrawFn) -> tuple[Layout, Layout, torch.Tensor, Spoil]:
    """Source layouts with replicas (and without), any dtype; maybe one changed copy: a
    non-empty replica that is not its box's first owner's."""
    shape = draw(shapes(max_dims=3, max_side=5))
    # world=: replicas stay on the pool's ranks (the executor rightly refuses a layout naming
    # a rank beyond its group); an assume here threw away one draw in seven
    src = draw(valid_layouts(st.just(shape), world=WORLD))
    dst = draw(valid_layouts(st.just(shape), world=WORLD))
    full = random_tensor(shape, draw(st.sampled_from(DTYPES)), draw(st.integers(0, 2**31)))
    spoilable: list[tuple[int, int]] = []
    for r in range(WORLD):
        for i, box in enumerate(src.boxes_of(r)):
            owners = [s.rank for s in src.shards if s.box == box]
            if box.numel and len(owners) > 1 and r != owners[0]:
                spoilable.append((r, i))
    spoil = draw(st.none() | st.sampled_from(spoilable)) if spoilable else None
    return src, dst, full, spoil


def test_replica_cases_draw_nothing_the_executor_refuses() -> None:
    """Meta: 300 draws, none thrown away and every rank of both layouts inside the pool (the
    executor refuses a layout naming a rank beyond its group; an assume discarded those
    draws, one in seven), both layouts valid, and a spoilable replica among them."""

    spoiled = 0

    @settings(max_examples=300, database=None, deadline=None)
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        nonlocal spoiled
        try:
            src, dst, _, spoil = data.draw(replica_cases())
        except UnsatisfiedAssumption:
            raise AssertionError("replica_cases threw a draw away") from None
        assert max(src.ranks + dst.ranks, default=0) < WORLD, (src, dst)
        assert src.is_valid() and dst.is_valid()
        spoiled += spoil is not None

    prop()
    assert spoiled, "no changed replica in 300 draws"


@pytest.mark.rule("RESHARD-13", "RESHARD-1")
@settings(
    max_examples=40,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
    ],
)
@given(case=replica_cases())
def test_the_check_raises_exactly_when_a_replica_differs(
    pool: RankPool, case: tuple[Layout, Layout, torch.Tensor, Spoil]
) -> None:
    src, dst, full, spoil = case
    ins = _inputs(src, full)
    if spoil is not None:
        _spoil(ins, *spoil)
    args: list[tuple[Any, ...]] = [
        (ins[r], src, dst, {"check_replicas": True}) for r in range(WORLD)
    ]
    answers = pool.call_all(run_single, per_rank=args)
    if spoil is not None:
        all_raise(answers, "replicas", f"rank {spoil[0]} (digest")
        return
    assert not any(isinstance(a, RankFailure) for a in answers), answers
    want = reference.reshard(dict(enumerate(ins)), src, dst)
    for r in range(WORLD):
        assert len(answers[r]) == len(want.get(r, [])), r
        for a, b in zip(answers[r], want.get(r, [])):
            assert reference.same_bits(a, b), f"rank {r}: {a} should be {b}"


@pytest.mark.rule("RESHARD-13")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_a_strided_one_element_replica_has_the_digest_of_its_contiguous_copy(
    dtype: torch.dtype,
) -> None:
    """A one-element view with stride 2 passes ``.contiguous()`` unchanged and a dtype view
    refuses it: every rank raised "stride(-1) must be 1" instead of resharding (found by the
    conformance suite's check_replicas cases with strided inputs)."""
    from shardspec.reshard.agreement import replica_digests

    src = Layout.replicated((1,), [0, 1])
    one = torch.ones(1, dtype=dtype)
    strided = torch.zeros(3, dtype=dtype)[1::2]
    strided.copy_(one)
    assert strided.stride() == (2,)
    want = replica_digests(["t"], {"t": src}, {"t": [one]}, 0)
    assert replica_digests(["t"], {"t": src}, {"t": [strided]}, 0) == want
