"""The checkpoint area through a real ``dcp.load`` (spec/09-checkpoint.md CKPT-1, CKPT-3):
every layout the chunk check judges is also loaded through the implementation's load planner
from an in-memory checkpoint. A valid one fills the tensor exactly; a damaged one is refused
before any read reaches storage (a planner path that skips the check reads overlapping or
missing data silently)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, strategies as st

from conformance.assertions import assert_equal, assert_tensor_bitwise, describe_layout
from conformance.cases import case
from conformance.impls import Impl
from conformance.strategies import perturbed_layouts, valid_layouts
from conformance.strategies.grids import large_layouts
from shardspec.metadata import Box, Layout, Shard

from .test_checkpoint import BURIED_EMPTY, EMPTY_AT_START, GAP, TWICE, chunks_valid


@pytest.mark.rule("CKPT-1", "CKPT-3")
@pytest.mark.known_defect(
    "torch",
    "DCP's load planning checks nothing: a checkpoint with a gap, an overlap or a chunk saved "
    "twice loads silently (stale or doubly written elements)",
    raises=AssertionError,
    match=r"refused=False, but should be True",
)
@given(st.one_of(perturbed_layouts(), valid_layouts(), large_layouts()))
@example(TWICE)
@example(BURIED_EMPTY)
@example(GAP)
@example(EMPTY_AT_START)
@example(Layout((3,), [Shard(Box((0,), (2,)), 0), Shard(Box((1,), (2,)), 1)]))  # overlap
def test_a_load_through_the_planner_fills_a_valid_checkpoint_and_refuses_a_damaged_one(
    impl: Impl, layout: Layout
) -> None:
    boxes = [s.box for s in layout.shards]
    ex = describe_layout(layout)
    # values that differ from the -1 the target starts with, so a missed element shows
    g = torch.arange(math.prod(layout.shape), dtype=torch.float32).reshape(layout.shape)
    valid = chunks_valid(layout)
    with case():
        got, reads = impl.checkpoint_load(layout.shape, boxes, g)
        if valid:
            if isinstance(got, BaseException):
                raise AssertionError(f"{impl.name} refused a valid checkpoint: {got!r} [{ex}]")
            assert_tensor_bitwise("loaded tensor", got, g, ex)
        else:
            assert_equal("refused", isinstance(got, BaseException), True, f"{ex}: loaded {got!r}")
            assert_equal("reads before the refusal", reads, 0, ex)
