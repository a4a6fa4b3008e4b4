"""Every per-rank condition is checked before the agreement and raises on every rank
(spec/06-reshard.md RESHARD-5, RESHARD-9, RESHARD-10), on a pool of 4 gloo ranks: one rank's
bad device, tensor kind or aliased ``out=`` never strands the others, and a rank that left
a call early cannot complete the others' call with its retry."""

from __future__ import annotations

import pytest
import torch
from reshard_fault_cases import (
    all_raise,
    run_aliased,
    run_outputs_aliased,
    run_retry_after_leaving,
    run_spoiled,
)

from shardspec.metadata import chunk_layout
from shardspec.reshard import reference
from shardspec.testing import RankPool, get_pool
from shardspec.testing.tensors import random_tensor

WORLD = 4
SHAPE = (8, 6)
# Every rank holds one (2, 6) box before and after: an out tensor can be an input's twin.
SRC = chunk_layout(SHAPE, 0, [0, 1, 2, 3])
DST = chunk_layout(SHAPE, 0, [1, 2, 3, 0])


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120)  # the session's pool of the executor tests


def _expected(full: torch.Tensor) -> dict[int, list[torch.Tensor]]:
    ins = {r: [full[b.slices()].clone() for b in SRC.boxes_of(r)] for r in range(WORLD)}
    return reference.reshard(ins, SRC, DST)


def _still_works(pool: RankPool, full: torch.Tensor) -> None:
    """Nothing was left half-sent: the group runs a good call right after, correctly."""
    got = pool.call(run_aliased, per_rank=[(SRC, DST, full, -1, "")] * WORLD)
    want = _expected(full)
    for r in range(WORLD):
        assert all(reference.same_bits(a, b) for a, b in zip(got[r], want[r]))


@pytest.mark.rule("RESHARD-9")
@pytest.mark.parametrize(
    "how",
    [
        "the input itself",
        "a slice of the input's storage",
        "a transposed view of the input",
        "an expanded tensor",
    ],
)
def test_out_sharing_memory_with_an_input_raises_on_every_rank(pool: RankPool, how: str) -> None:
    full = random_tensor(SHAPE, torch.float32, 21)
    answers = pool.call_all(run_aliased, per_rank=[(SRC, DST, full, 2, how)] * WORLD)
    all_raise(answers, "rank 2", "out #0", "no data was moved")
    _still_works(pool, full)


@pytest.mark.rule("RESHARD-9")
def test_out_sharing_memory_with_another_out_raises_on_every_rank(pool: RankPool) -> None:
    full = random_tensor(SHAPE, torch.int64, 22)
    answers = pool.call_all(run_outputs_aliased, per_rank=[(SRC, DST, full, 1)] * WORLD)
    all_raise(answers, "rank 1", "tensor 'b' out #0", "tensor 'a' out #0")


@pytest.mark.rule("RESHARD-9")
def test_views_of_one_storage_that_share_no_element_are_fine(pool: RankPool) -> None:
    # Input in the even columns, out in the odd columns of one buffer: their byte ranges
    # cross, their elements do not, and the result must be the reference's.
    full = random_tensor(SHAPE, torch.float64, 23)
    got = pool.call(
        run_aliased, per_rank=[(SRC, DST, full, 3, "interleaved, sharing no element")] * WORLD
    )
    want = _expected(full)
    for r in range(WORLD):
        assert all(reference.same_bits(a, b) for a, b in zip(got[r], want[r])), r


SPOILS = [
    ("device 'bogus'", "bogus"),
    ("device 'meta'", "meta"),
    ("a sparse shard", "torch.sparse_coo"),
    ("a meta shard", "meta device"),
    ("a lazy conjugate shard", "conjugate"),
    ("a tensor instead of a list", "must be a list of tensors"),
    ("a meta out tensor", "meta device"),
]
if not torch.cuda.is_available():
    SPOILS.append(("device 'cuda'", "CUDA is not available"))


@pytest.mark.rule("RESHARD-9")
@pytest.mark.parametrize(
    ("shape", "stride"),
    [((0,), (0,)), ((0, 2, 0), (0, 0, 1)), ((2, 0), (0, 1)), ((3, 0, 4), (0, 0, 0))],
)
def test_an_empty_out_shares_no_element_whatever_its_strides(
    shape: tuple[int, ...], stride: tuple[int, ...]
) -> None:
    from shardspec.reshard.checks import has_internal_overlap

    empty = torch.empty(0, dtype=torch.float64).as_strided(shape, stride)
    assert not has_internal_overlap(empty), f"{shape} with strides {stride} has no elements"
    assert has_internal_overlap(torch.zeros(1).expand(3)), "an expanded tensor does share"


@pytest.mark.rule("RESHARD-5", "RESHARD-10")
@pytest.mark.parametrize(("how", "says"), SPOILS, ids=[h for h, _ in SPOILS])
def test_one_rank_bad_argument_raises_on_every_rank(pool: RankPool, how: str, says: str) -> None:
    dtype = torch.complex64 if "conjugate" in how else torch.float32
    full = random_tensor(SHAPE, dtype, 24)
    answers = pool.call_all(run_spoiled, per_rank=[(SRC, DST, full, 1, how)] * WORLD)
    all_raise(answers, "rank 1", says)
    _still_works(pool, random_tensor(SHAPE, torch.float32, 25))


@pytest.mark.rule("RESHARD-10")
def test_a_retry_never_completes_another_ranks_call(pool: RankPool) -> None:
    """Rank 2 leaves its call before the agreement and retries with doubled data while the
    others still wait in the first call: the call numbers differ, so every rank raises
    instead of the others returning rank 2's retry data. The group is usable right after."""
    full = random_tensor(SHAPE, torch.float32, 26)
    answers = pool.call_all(run_retry_after_leaving, per_rank=[(SRC, DST, full, 2)] * WORLD)
    all_raise(answers, "different calls", "ranks 0, 1, 3 at call", "rank 2 at call")
    _still_works(pool, full)
