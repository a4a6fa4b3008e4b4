"""Validation (spec/01-layout.md BOX-2, LAYOUT-1..3): the implementation's validator accepts
exactly the layouts the brute-force oracle calls valid."""

from __future__ import annotations

import pytest
from hypothesis import example, given

from conformance import reference
from conformance.assertions import assert_verdict, describe_layout
from conformance.cases import case
from conformance.impls import Impl
from conformance.strategies import (
    layouts_with_buried_empty_shard,
    perturbed_layouts,
    valid_layouts,
)
from shardspec.metadata import Box, Layout, Shard


def check_validator(impl: Impl, layout: Layout) -> None:
    with case():
        accepted = impl.is_valid(layout)
        assert_verdict(
            f"{impl.name}.validate", accepted, reference.is_valid(layout), describe_layout(layout)
        )


# Valid (BOX-2: empty boxes overlap nothing; LAYOUT-2: identical boxes on two ranks are
# replicas), but torch's overlap check refuses it once there are three shards.
EMPTY_REPLICAS = Layout(
    (1, 0),
    [
        Shard(Box((0, 0), (0, 0)), 0),
        Shard(Box((0, 0), (1, 0)), 0),
        Shard(Box((0, 0), (1, 0)), 1),
    ],
)
ZERO_SIZE_DEFECT = (
    "validate_non_overlapping_shards_metadata counts zero-size shards as overlapping: "
    "the valid layout of a (1, 0) tensor with [0,0]+[1,0] on ranks 0 and 1 and [0,0]+[0,0] on "
    "rank 0 is refused"
)


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3")
@pytest.mark.known_defect("torch", ZERO_SIZE_DEFECT)
@given(perturbed_layouts())
@example(EMPTY_REPLICAS)
def test_validator_agrees_with_the_oracle(impl: Impl, layout: Layout) -> None:
    check_validator(impl, layout)


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3", "BOX-3")
@pytest.mark.known_defect("torch", ZERO_SIZE_DEFECT)
@given(valid_layouts())
@example(EMPTY_REPLICAS)
def test_validator_accepts_every_valid_layout(impl: Impl, layout: Layout) -> None:
    check_validator(impl, layout)


@pytest.mark.rule("BOX-2")
@pytest.mark.known_defect(
    "torch",
    "validate_non_overlapping_shards_metadata reports a zero-size shard lying inside another "
    "shard as an overlap",
)
@given(layouts_with_buried_empty_shard())
@example(Layout((2,), [Shard(Box((0,), (2,)), 0), Shard(Box((1,), (0,)), 1)]))
def test_empty_shard_inside_another_is_not_an_overlap(impl: Impl, layout: Layout) -> None:
    check_validator(impl, layout)
