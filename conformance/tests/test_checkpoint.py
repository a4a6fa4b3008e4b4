"""Checkpoints (spec/09-checkpoint.md): a tensor's saved chunks are accepted exactly when they
are in bounds, pairwise disjoint, cover the tensor and hold no non-empty box twice (CKPT-1,
decided by enumeration), on small layouts and on large near-grids; and a load plans exactly
the non-empty overlaps of each local chunk with the saved chunks (CKPT-3)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, strategies as st

from conformance import reference
from conformance.assertions import assert_equal, assert_verdict, describe_layout
from conformance.cases import case
from conformance.impls import Impl
from conformance.strategies import perturbed_layouts, valid_layouts
from conformance.strategies_grids import large_layouts
from shardspec.metadata import Box, Layout, Shard


def chunks_valid(layout: Layout) -> bool:
    """CKPT-1 by enumeration: chunk i on "rank" i is a valid layout, and no non-empty box is
    saved twice (a checkpoint holds each element once)."""
    as_chunks = Layout(layout.shape, [Shard(s.box, i) for i, s in enumerate(layout.shards)])
    boxes = [s.box for s in layout.shards if not s.box.is_empty]
    return len(set(boxes)) == len(boxes) and reference.is_valid(as_chunks)


TWICE = Layout((4,), [Shard(Box((0,), (4,)), 0), Shard(Box((0,), (4,)), 1)])
BURIED_EMPTY = Layout((4,), [Shard(Box((0,), (4,)), 0), Shard(Box((2,), (0,)), 1)])
GAP = Layout((4, 2), [Shard(Box((0, 0), (3, 2)), 0)])


@pytest.mark.rule("CKPT-1")
@pytest.mark.known_defect(
    "torch",
    "DCP's save-plan check (_validate_global_plan) calls a zero-size chunk inside another an "
    "overlap, and its load planning checks nothing",
)
@given(st.one_of(perturbed_layouts(), valid_layouts(), large_layouts()))
@example(TWICE)
@example(BURIED_EMPTY)
@example(GAP)
def test_saved_chunks_are_accepted_exactly_when_valid(impl: Impl, layout: Layout) -> None:
    boxes = [s.box for s in layout.shards]
    with case():
        assert_verdict(
            f"{impl.name}.check_chunks",
            impl.checkpoint_accepts(layout.shape, boxes),
            chunks_valid(layout),
            describe_layout(layout),
        )


@st.composite
def load_cases(draw: st.DrawFn) -> tuple[Layout, Layout, int]:
    saved = draw(valid_layouts(replicas=False))
    local = draw(valid_layouts(st.just(saved.shape)))
    return saved, local, draw(st.sampled_from(sorted(local.ranks) or [0]))


ZERO_LENGTH_READ = (
    Layout((2,), [Shard(Box((0,), (1,)), 0), Shard(Box((1,), (0,)), 0), Shard(Box((1,), (1,)), 0)]),
    Layout((2,), [Shard(Box((0,), (2,)), 0)]),
    0,
)


@pytest.mark.rule("CKPT-3")
@pytest.mark.known_defect(
    "torch",
    "create_read_items_for_chunk_list emits a zero-length read for a zero-size saved chunk "
    "inside a local chunk (its overlap test counts a touching empty box)",
)
@given(load_cases())
@example(ZERO_LENGTH_READ)
def test_a_load_reads_exactly_the_overlaps(impl: Impl, c: tuple[Layout, Layout, int]) -> None:
    saved, local, rank = c
    saved_boxes = [s.box for s in saved.shards]
    mine = list(local.boxes_of(rank))
    ex = f"saved {describe_layout(saved)}, local chunks of rank {rank} in {describe_layout(local)}"
    want = sorted(
        (i, j, inter)
        for i, a in enumerate(saved_boxes)
        for j, b in enumerate(mine)
        if (inter := _intersection(a, b)) is not None
    )
    with case():
        got = sorted(impl.checkpoint_reads(saved.shape, saved_boxes, mine))
        assert_equal("reads (saved chunk, local chunk, region)", got, want, ex)


def _intersection(a: Box, b: Box) -> Box | None:
    offs = [max(p, q) for p, q in zip(a.offsets, b.offsets)]
    ends = [min(p + m, q + n) for p, m, q, n in zip(a.offsets, a.sizes, b.offsets, b.sizes)]
    if any(e <= o for o, e in zip(offs, ends)) or a.is_empty or b.is_empty:
        return None
    return Box(offs, [e - o for o, e in zip(offs, ends)])
