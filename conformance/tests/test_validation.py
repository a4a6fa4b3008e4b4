"""Validation (spec/01-layout.md BOX-2, LAYOUT-1..3): the implementation's validator accepts
exactly the layouts the brute-force oracle calls valid."""

from __future__ import annotations

import pytest
from hypothesis import given

from conformance import reference
from conformance.assertions import assert_verdict, describe_layout
from conformance.cases import case
from conformance.impls import Impl
from conformance.strategies import (
    layouts_with_buried_empty_shard,
    perturbed_layouts,
    valid_layouts,
)
from shardspec.metadata import Layout


def check_validator(impl: Impl, layout: Layout) -> None:
    with case():
        accepted = impl.is_valid(layout)
        assert_verdict(
            f"{impl.name}.validate", accepted, reference.is_valid(layout), describe_layout(layout)
        )


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3")
@given(perturbed_layouts())
def test_validator_agrees_with_the_oracle(impl: Impl, layout: Layout) -> None:
    check_validator(impl, layout)


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3", "BOX-3")
@given(valid_layouts())
def test_validator_accepts_every_valid_layout(impl: Impl, layout: Layout) -> None:
    check_validator(impl, layout)


@pytest.mark.rule("BOX-2")
@pytest.mark.known_defect(
    "torch",
    "validate_non_overlapping_shards_metadata reports a zero-size shard lying inside another "
    "shard as an overlap",
)
@given(layouts_with_buried_empty_shard())
def test_empty_shard_inside_another_is_not_an_overlap(impl: Impl, layout: Layout) -> None:
    check_validator(impl, layout)
