"""The torch-free placements and their JSON form (DTENSOR-11)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, strategies as st

from shardspec.metadata import LayoutError
from shardspec.metadata.placements import (
    Placement,
    Replicate,
    ShardDim,
    StridedShardDim,
    from_torch,
    placement_from_json,
    placement_to_json,
    to_torch,
)

placements: st.SearchStrategy[Placement] = st.one_of(
    st.builds(ShardDim, st.integers(-9, 9)),
    st.builds(StridedShardDim, st.integers(-9, 9), st.integers(1, 9)),
    st.just(Replicate()),
)


@pytest.mark.rule("DTENSOR-11")
@given(placements)
def test_json_and_torch_round_trip(p: Placement) -> None:
    text = json.dumps(placement_to_json(p))
    assert placement_from_json(json.loads(text)) == p
    assert from_torch(to_torch(p)) == p


@pytest.mark.rule("DTENSOR-11")
def test_json_forms_are_the_documented_ones() -> None:
    assert placement_to_json(ShardDim(1)) == ["S", 1]
    assert placement_to_json(StridedShardDim(0, 2)) == ["SS", 0, 2]
    assert placement_to_json(Replicate()) == ["R"]


@pytest.mark.rule("DTENSOR-11")
@pytest.mark.parametrize(
    "bad",
    [["S", 1.5], ["SS", 0, 0], ["S", True], ["X", 0], ["S"], ["R", 0], "S", None, ["SS", 0]],
)
def test_malformed_json_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(LayoutError, match=r"placement|ShardDim|StridedShardDim"):
        placement_from_json(bad)


@pytest.mark.rule("DTENSOR-11", "DTENSOR-1")
def test_a_negative_dim_counts_from_the_end_once_the_ndim_is_known() -> None:
    from shardspec.metadata.dtensor_math import Split
    from shardspec.metadata.placements import to_split

    assert placement_from_json(["S", -1]) == ShardDim(-1)
    assert to_split(ShardDim(-1), 3) == Split(2)
    assert to_split(StridedShardDim(-3, 2), 3) == Split(0, 2)
    with pytest.raises(LayoutError, match="give the tensor's ndim"):
        to_split(ShardDim(-1))
    with pytest.raises(LayoutError, match="out of range for a 2-d tensor"):
        to_split(ShardDim(-3), 2)
