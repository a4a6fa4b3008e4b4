"""The distributed executor on real gloo ranks (spec/06-reshard.md), one pool of 4 ranks for
the whole module; every rank's output is compared with the reference bit for bit."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.errors import UnsatisfiedAssumption
from reshard_cases import (
    DTYPES,
    Case,
    count_all_to_all,
    random_cases,
    random_layout,
    random_tensor,
    run_cases,
    run_single,
    run_state_dict,
)
from reshard_fault_cases import all_raise

from shardspec.metadata import Layout, chunk_layout
from shardspec.metadata.strategies import shapes, valid_layouts
from shardspec.reshard import plan, reference
from shardspec.testing import RankPool, get_pool

WORLD = 4


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120)  # one pool of WORLD ranks for the whole session


def run_and_compare(pool: RankPool, cases: list[Case]) -> None:
    answers = pool.call(
        run_cases, per_rank=[([c.rank_args(r) for c in cases],) for r in range(WORLD)]
    )
    for i, c in enumerate(cases):
        members = sorted(c.group_ranks) if c.group_ranks is not None else range(WORLD)
        expected = reference.reshard(c.inputs, c.src, c.dst)
        for group_rank, world_rank in enumerate(members):
            got = answers[world_rank][i]
            assert got[0] == "ok", f"[{c.name}] rank {world_rank} raised {got[1:]}"
            want = expected.get(group_rank, [])
            assert len(got[1]) == len(want), (
                f"[{c.name}] rank {world_rank} returned {len(got[1])} shards, should be {len(want)}"
            )
            for k, (a, b) in enumerate(zip(got[1], want)):
                assert reference.same_bits(a, b), (
                    f"[{c.name}] rank {world_rank} shard #{k}: {a} should be {b} "
                    f"(src={c.src}, dst={c.dst})"
                )


@pytest.mark.rule("RESHARD-1", "RESHARD-3", "RESHARD-4", "RESHARD-6")
@pytest.mark.parametrize("seed", [1, 2])
def test_random_cases_match_reference_bit_for_bit(pool: RankPool, seed: int) -> None:
    """Chunked, grid, guillotine and replicated layouts on any subset of the 4 ranks, every
    dtype, 0-d and zero-size tensors, non-contiguous inputs, with and without rounds."""
    cases = random_cases(seed, 150, WORLD)
    kinds = {c.full.dtype for c in cases}
    assert kinds == set(DTYPES)
    assert any(c.full.dim() == 0 for c in cases) and any(c.full.numel() == 0 for c in cases)
    assert any(c.max_buffer_bytes is not None for c in cases) and any(c.noncontig for c in cases)
    run_and_compare(pool, cases)


@st.composite
def pool_cases(draw: st.DrawFn) -> Case:
    shape = draw(shapes(max_dims=3, max_side=6))
    # world=: replicas stay on the pool's ranks (the executor rightly refuses a layout naming
    # a rank beyond its group); an assume here threw away one draw in seven
    src = draw(valid_layouts(st.just(shape), world=WORLD))
    dst = draw(valid_layouts(st.just(shape), world=WORLD))
    dtype = draw(st.sampled_from(DTYPES))
    budget = draw(st.sampled_from([None, 16, 64, 1000]))
    full = random_tensor(shape, dtype, draw(st.integers(0, 2**31)))
    return Case(f"hypothesis {shape} {dtype}", src, dst, full, draw(st.booleans()), budget)


def _refusal(src: Layout, dst: Layout) -> str | None:
    """What the executor would refuse in a pair of layouts on a group of WORLD ranks before
    moving data (a rank beyond the group, or a layout its planner rejects), or None."""
    for name, layout in (("source", src), ("destination", dst)):
        beyond = [r for r in layout.ranks if r >= WORLD]
        if beyond:
            return f"the {name} layout names ranks {beyond} beyond the {WORLD} of the group"
    for r in range(WORLD):
        plan(src, dst, r)  # raises LayoutError on what the planner refuses
    return None


def test_pool_cases_draw_nothing_the_executor_refuses() -> None:
    """Meta: 300 draws, none refused and none thrown away (the strategy drew replicas on
    ranks beyond the pool, which an assume discarded: one draw in seven), some with
    replicas among them."""
    seen_replicas = False

    @settings(max_examples=300, database=None, deadline=None)
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        nonlocal seen_replicas
        try:
            case = data.draw(pool_cases())
        except UnsatisfiedAssumption:
            raise AssertionError("pool_cases threw a draw away") from None
        assert _refusal(case.src, case.dst) is None
        boxes = [s.box for s in case.src.shards if s.box.numel]
        seen_replicas |= len(boxes) > len(set(boxes))

    prop()
    assert seen_replicas, "no source with replicas in 300 draws"


@pytest.mark.rule("RESHARD-1")
@settings(
    max_examples=60,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
    ],
)
@given(case=pool_cases())
def test_hypothesis_cases_on_ranks(pool: RankPool, case: Case) -> None:
    run_and_compare(pool, [case])


@pytest.mark.rule("RESHARD-1", "RESHARD-2")
def test_upstream_wrong_sender_case(pool: RankPool) -> None:
    """12x21 chunked on dim 0 over ranks 0-3 to placements [1, 2, 3, 0] (upstream aborts)."""
    full = random_tensor((12, 21), torch.float32, 7)
    cases = [
        Case(
            "12x21 dim0 -> [1,2,3,0]",
            chunk_layout((12, 21), 0, [0, 1, 2, 3]),
            chunk_layout((12, 21), 0, [1, 2, 3, 0]),
            full,
        ),
        Case(
            "12x21 dim0 -> dim1 [1,2,3,0]",
            chunk_layout((12, 21), 0, [0, 1, 2, 3]),
            chunk_layout((12, 21), 1, [1, 2, 3, 0]),
            full,
        ),
        Case(
            "12x21 uneven dim1 -> dim0 on 3 ranks",
            chunk_layout((12, 21), 1, [2, 0, 3, 1]),
            chunk_layout((12, 21), 0, [3, 1, 2]),
            full,
            noncontig=True,
        ),
    ]
    run_and_compare(pool, cases)


@pytest.mark.rule("RESHARD-1")
def test_subgroup_and_rank_subsets(pool: RankPool) -> None:
    """Layout ranks are group ranks: on the group of world ranks {1, 2, 3}, rank 0 is world 1
    and world rank 0 takes no part."""
    rng = random.Random(5)
    cases = []
    for i in range(20):
        shape = (rng.randint(0, 7), rng.randint(1, 5))
        full = random_tensor(shape, DTYPES[i % len(DTYPES)], i)
        cases.append(
            Case(
                f"subgroup#{i}",
                random_layout(rng, shape, 3),
                random_layout(rng, shape, 3),
                full,
                noncontig=bool(i % 2),
                group_ranks=(3, 1, 2),
            )
        )
    run_and_compare(pool, cases)


@pytest.mark.rule("RESHARD-1")
def test_rank_without_source_learns_the_dtype(pool: RankPool) -> None:
    full = random_tensor((5, 3), torch.bfloat16, 3)
    src = Layout.replicated((5, 3), [0])
    dst = chunk_layout((5, 3), 0, [3, 2, 1, 0])
    inputs = [([full.clone()] if r == 0 else [], src, dst, {}) for r in range(WORLD)]
    got = pool.call(run_single, per_rank=inputs)
    want = reference.reshard({0: [full]}, src, dst)
    for r in range(WORLD):
        assert got[r][0].dtype == torch.bfloat16, f"rank {r} made {got[r][0].dtype}"
        assert reference.same_bits(got[r][0], want[r][0]), f"rank {r}: {got[r][0]}"


# ---------------------------------------------------------------- rounds and data volume


@pytest.mark.rule("RESHARD-2", "RESHARD-6")
@pytest.mark.parametrize(
    ("src", "dst", "budget"),
    [
        (chunk_layout((64, 64), 0, range(4)), chunk_layout((64, 64), 1, range(4)), 1000),
        (Layout.replicated((64, 64), [0]), Layout.replicated((64, 64), [1]), 1000),
        (chunk_layout((63, 17), 1, [2, 0, 3, 1]), chunk_layout((63, 17), 0, [1, 3]), 333),
        (chunk_layout((64, 64), 0, range(4)), chunk_layout((64, 64), 1, range(4)), None),
    ],
)
@pytest.mark.parametrize("transport", ["all_to_all", "messages"])
def test_rounds_bound_the_buffers_and_each_element_is_sent_once(
    pool: RankPool, src: Layout, dst: Layout, budget: int | None, transport: str
) -> None:
    full = random_tensor(src.shape, torch.float32, 11)
    inputs = {r: [full[b.slices()].clone() for b in src.boxes_of(r)] for r in src.ranks}
    answers = pool.call(
        count_all_to_all,
        per_rank=[(inputs.get(r, []), src, dst, budget, transport) for r in range(WORLD)],
    )
    want = reference.reshard(inputs, src, dst)
    calls = {a[0] for a in answers}
    assert len(calls) == 1, f"ranks made different numbers of collectives: {calls}"
    sent = [sum(p.numel for p in plan(src, dst, r).sends(r)) * 4 for r in range(WORLD)]
    pieces = [len(plan(src, dst, r).sends(r)) for r in range(WORLD)]
    for r, a in enumerate(answers):
        # Each element the rank must send, once, plus under 16 bytes of alignment per piece.
        assert sent[r] <= a[3] <= sent[r] + 15 * pieces[r], (
            f"rank {r} sent {a[3]} bytes for {sent[r]} bytes in {pieces[r]} pieces"
        )
    recv = [sum(p.numel for p in plan(src, dst, r).receives(r)) * 4 for r in range(WORLD)]
    if budget is None:
        assert calls == {1}
    else:
        # Hand bound: the bytes a rank moves, over what a round may hold, rounded up.
        assert calls.pop() >= max(-(-max(s, q) // budget) for s, q in zip(sent, recv))
        for r, a in enumerate(answers):
            assert a[1] <= budget, f"rank {r} used a {a[1]}-byte buffer, budget {budget}"
    for r in range(WORLD):
        for k, (a, b) in enumerate(zip(answers[r][2], want.get(r, []))):
            assert reference.same_bits(a, b), f"rank {r} shard #{k} differs"


# ---------------------------------------------------------------- the state-dict form


@pytest.mark.rule("RESHARD-1", "RESHARD-6")
@pytest.mark.parametrize("budget", [None, 200])
def test_state_dict_of_mixed_tensors(pool: RankPool, budget: int | None) -> None:
    rng = random.Random(17)
    src: dict[str, Layout] = {}
    dst: dict[str, Layout] = {}
    full: dict[str, torch.Tensor] = {}
    for i in range(40):
        shape = () if i % 10 == 0 else (rng.randint(0, 6), rng.randint(1, 5))[: rng.randint(1, 2)]
        key = f"layer{i}.{'weight' if i % 3 else 'bias'}"
        src[key] = random_layout(rng, shape, WORLD)
        dst[key] = random_layout(rng, shape, WORLD)
        full[key] = random_tensor(shape, DTYPES[i % len(DTYPES)], i)
    per_rank = []
    for r in range(WORLD):
        state = {k: [full[k][b.slices()].clone() for b in src[k].boxes_of(r)] for k in src}
        per_rank.append((state, src, dst, budget))
    got = pool.call(run_state_dict, per_rank=per_rank)
    for k in src:
        inputs = {r: per_rank[r][0][k] for r in range(WORLD)}
        want = reference.reshard(inputs, src[k], dst[k])
        for r in range(WORLD):
            assert len(got[r][k]) == len(want.get(r, [])), f"{k} rank {r}"
            for a, b in zip(got[r][k], want.get(r, [])):
                assert reference.same_bits(a, b), f"{k} on rank {r}: {a} should be {b}"


# ---------------------------------------------------------------- agreement before data moves


def _inputs(src: Layout, full: torch.Tensor) -> dict[int, list[torch.Tensor]]:
    return {r: [full[b.slices()].clone() for b in src.boxes_of(r)] for r in range(WORLD)}


@pytest.mark.rule("RESHARD-5")
def test_one_rank_with_a_different_dst_makes_every_rank_raise(pool: RankPool) -> None:
    src = chunk_layout((12, 21), 0, range(4))
    dst = chunk_layout((12, 21), 1, range(4))
    other = chunk_layout((12, 21), 1, [1, 0, 2, 3])
    ins = _inputs(src, random_tensor((12, 21), torch.float32, 1))
    args = [(ins[r], src, other if r == 2 else dst, {}) for r in range(WORLD)]
    all_raise(pool.call_all(run_single, per_rank=args), "destination layouts", "vs rank 2 (digest")
    # The group is still usable afterwards: nothing was left half-sent.
    ok = pool.call(run_single, per_rank=[(ins[r], src, dst, {}) for r in range(WORLD)])
    assert len(ok) == WORLD


@pytest.mark.rule("RESHARD-5")
def test_disagreements_on_shape_dtype_and_budget_raise_everywhere(pool: RankPool) -> None:
    src = chunk_layout((8, 4), 0, range(4))
    dst = chunk_layout((8, 4), 1, range(4))
    full = random_tensor((8, 4), torch.float32, 2)
    ins = _inputs(src, full)
    # A different shape on rank 3 (its layouts describe a (8, 5) tensor).
    src5, dst5 = chunk_layout((8, 5), 0, range(4)), chunk_layout((8, 5), 1, range(4))
    ins5 = _inputs(src5, random_tensor((8, 5), torch.float32, 2))
    args = [(ins5[r], src5, dst5, {}) if r == 3 else (ins[r], src, dst, {}) for r in range(WORLD)]
    all_raise(pool.call_all(run_single, per_rank=args), "keys and shapes")
    # A different dtype on rank 1.
    args = [
        ([t.double() for t in ins[r]] if r == 1 else ins[r], src, dst, {}) for r in range(WORLD)
    ]
    all_raise(pool.call_all(run_single, per_rank=args), "dtype", "torch.float64", "torch.float32")
    # A different max_buffer_bytes on rank 0.
    args = [(ins[r], src, dst, {"max_buffer_bytes": 64 if r == 0 else None}) for r in range(WORLD)]
    all_raise(pool.call_all(run_single, per_rank=args), "max_buffer_bytes")


@pytest.mark.rule("RESHARD-5")
def test_bad_local_input_on_one_rank_raises_everywhere(pool: RankPool) -> None:
    src = chunk_layout((8, 4), 0, range(4))
    dst = chunk_layout((8, 4), 1, range(4))
    ins = _inputs(src, random_tensor((8, 4), torch.float32, 3))
    wrong_shape = [([torch.zeros(3, 4)] if r == 1 else ins[r], src, dst, {}) for r in range(WORLD)]
    all_raise(pool.call_all(run_single, per_rank=wrong_shape), "rank 1", "shape (3, 4)")
    too_many = [(ins[r] * 2 if r == 2 else ins[r], src, dst, {}) for r in range(WORLD)]
    all_raise(pool.call_all(run_single, per_rank=too_many), "rank 2", "2 local shards")
    mismatched = chunk_layout((8, 5), 1, range(4))  # every rank: shape mismatch in the plan
    all_raise(
        pool.call_all(run_single, per_rank=[(ins[r], src, mismatched, {}) for r in range(WORLD)]),
        "LayoutError",
    )
    not_a_layout = [(ins[r], "rows" if r == 3 else src, dst, {}) for r in range(WORLD)]
    all_raise(pool.call_all(run_single, per_rank=not_a_layout), "rank 3")
    big = chunk_layout((8, 4), 0, range(6))  # names ranks 4 and 5 in a group of 4
    all_raise(
        pool.call_all(run_single, per_rank=[(ins[r], src, big, {}) for r in range(WORLD)]),
        "ranks [4, 5]",
    )
