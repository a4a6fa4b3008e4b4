"""The suite's strategies reach the edges (a strategy that never produces an empty shard is a
bug), and the assertion helpers fail with the one message shape."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import find, settings, strategies as st
from hypothesis.errors import NoSuchExample

from conformance import reference
from conformance.assertions import (
    assert_equal,
    assert_layouts_equal,
    assert_tensor_bitwise,
    assert_verdict,
)
from conformance.strategies import (
    DTYPE_NAMES,
    chunk_args,
    dtensor_pool_cases,
    dtypes,
    layouts_with_buried_empty_shard,
    perturbed_layouts,
    tensors,
    uneven_chunk_args,
    valid_layouts,
)
from shardspec.metadata import Box, Layout, chunk_layout

FIND = settings(max_examples=2000, database=None)
LARGE = dtensor_pool_cases(negative_dims=False, worlds=(8, 64, 512, 1024))


def reaches(strategy: st.SearchStrategy[Any], condition: Callable[[Any], bool]) -> None:
    try:
        find(strategy, condition, settings=FIND)
    except NoSuchExample:  # pragma: no cover - the failure this test exists for
        pytest.fail(f"{strategy!r} never produced an example with {condition.__name__}")


def _has_empty_shard(layout: Layout) -> bool:
    return any(s.box.is_empty for s in layout.shards) and layout.numel > 0


def _has_replica(layout: Layout) -> bool:
    boxes = [s.box for s in layout.shards if not s.box.is_empty]
    return len(set(boxes)) < len(boxes)


def _more_ranks_than_rows(args: Any) -> bool:
    shape, dim, ranks = args
    return 0 < shape[dim] < len(ranks)


@pytest.mark.parametrize(
    ("strategy", "condition"),
    [
        (valid_layouts(), _has_empty_shard),
        (valid_layouts(), _has_replica),
        (valid_layouts(), lambda lay: lay.ndim == 0),
        (valid_layouts(), lambda lay: lay.ndim == 4),
        (valid_layouts(), lambda lay: 0 in lay.shape and lay.ndim > 1),
        (perturbed_layouts(), lambda lay: not reference.is_valid(lay)),
        (perturbed_layouts(), reference.is_valid),
        (chunk_args(), _more_ranks_than_rows),
        (chunk_args(), lambda a: a[1] < 0),
        (chunk_args(), lambda a: a[2] != sorted(a[2])),
        (uneven_chunk_args(), _more_ranks_than_rows),
        (dtensor_pool_cases(), lambda c: len(c[1]) == 3 and math.prod(c[1]) > 1),
        (dtensor_pool_cases(), lambda c: any(p[0] == "SS" and p[2] > 1 for p in c[2])),
        (dtensor_pool_cases(), lambda c: ["R"] in c[2] and any(p[0] == "S" for p in c[2])),
        (dtensor_pool_cases(), lambda c: len([p for p in c[2] if p[0] == "S"]) >= 2),
        # the meshes of the one-program (LocalTensorMode) tests: 4-D, size-1 dims, more ranks
        # than rows on a sharded dim, the largest world drawn
        (LARGE, lambda c: len(c[1]) == 4 and 1 in c[1] and math.prod(c[1]) == 1024),
        (LARGE, lambda c: any(p[0] == "S" and c[0][p[1]] < c[1][i] for i, p in enumerate(c[2]))),
    ],
)
def test_strategies_reach_the_edges(strategy: Any, condition: Callable[[Any], bool]) -> None:
    reaches(strategy, condition)


def test_every_buried_empty_shard_is_valid_and_buried() -> None:
    from hypothesis import given

    @settings(max_examples=100, database=None)
    @given(layouts_with_buried_empty_shard())
    def prop(layout: Layout) -> None:
        assert reference.is_valid(layout)
        empties = [s.box for s in layout.shards if s.box.is_empty]
        assert any(
            all(o < e < o + n for e, (o, n) in zip(b.offsets, s.box))
            for b in empties
            for s in layout.shards
            if not s.box.is_empty
        )

    prop()


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_every_dtype_is_drawn(name: str) -> None:
    reaches(dtypes(), lambda d: str(d) == f"torch.{name}")


def test_tensors_are_often_non_contiguous_and_hold_odd_floats() -> None:
    reaches(tensors((2, 3)), lambda t: not t.is_contiguous())
    reaches(tensors((4,), st.just(torch.float32)), lambda t: bool(torch.isnan(t).any()))
    reaches(tensors((4,), st.just(torch.float16)), lambda t: bool(torch.signbit(t).any()))


def test_helpers_share_one_message_shape() -> None:
    with pytest.raises(AssertionError, match=r"^out\.shape=\(3,\), but should be \(4,\) \[ex\]$"):
        assert_equal("out.shape", (3,), (4,), "ex")
    with pytest.raises(AssertionError, match=r"^v=\'rejected\', but should be \'accepted\' \[e\]$"):
        assert_verdict("v", False, True, "e")
    with pytest.raises(AssertionError, match=r"^got\.boxes_of\(0\)=.*, but should be .* \[e\]$"):
        assert_layouts_equal(
            "got", chunk_layout((5,), 0, [0, 1]), chunk_layout((5,), 0, [1, 0]), "e"
        )


def test_bitwise_helper_sees_nan_payloads_and_negative_zero() -> None:
    a = torch.tensor([0.0, 1.0])
    with pytest.raises(AssertionError, match=r"t\.flat\[0\]=-0\.0, but should be 0\.0"):
        assert_tensor_bitwise("t", torch.tensor([-0.0, 1.0]), a, "e")
    nan1 = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    nan2 = torch.tensor([0x7FC00002], dtype=torch.int32).view(torch.float32)
    with pytest.raises(AssertionError, match="bytes differ"):
        assert_tensor_bitwise("t", nan1, nan2, "e")
    assert_tensor_bitwise("t", nan1, nan1.clone(), "e")
    with pytest.raises(AssertionError, match=r"t\.dtype="):
        assert_tensor_bitwise("t", a, a.double(), "e")


def test_oracles_on_hand_worked_cases() -> None:
    assert reference.chunk_intervals(5, 4) == [(0, 2), (2, 4), (4, 5), (5, 5)]
    assert reference.chunk_intervals(0, 2) == [(0, 0), (0, 0)]
    assert reference.is_valid(chunk_layout((5, 2), 0, [0, 1, 2, 3]))
    overlap = Layout.from_boxes((4,), [(Box((0,), (3,)), 0), (Box((2,), (2,)), 1)])
    assert not reference.is_valid(overlap)
    # the _StridedShard example of torch's placement docs: [SS(0, sf=2), S(0)] on 2x2, 8 rows
    rows = {
        c: reference.dtensor_indices((8,), (2, 2), [["SS", 0, 2], ["S", 0]], c)[0]
        for c in reference.mesh_coordinates((2, 2))
    }
    assert rows == {(0, 0): [0, 1], (0, 1): [4, 5], (1, 0): [2, 3], (1, 1): [6, 7]}
