"""The suite catches a wrong implementation and shrinks the failure (CONF-5): the ``broken``
adapter starts non-first chunks of uneven dims one element early."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

from conformance.impls import get_impl
from conformance.strategies import chunk_args
from conformance.tests.test_chunk import check_chunk_rule


@pytest.mark.rule("CONF-5")
def test_broken_chunk_offsets_are_caught_and_shrunk() -> None:
    broken = get_impl("broken")
    failing: list[Any] = []

    @settings(max_examples=300, database=None)
    @given(chunk_args())
    def prop(args: Any) -> None:
        try:
            check_chunk_rule(broken.chunk_layout, *args)
        except AssertionError:
            failing.append(args)
            raise

    with pytest.raises(AssertionError, match=r"boxes_of\(\d+\)=.*but should be"):
        prop()
    shape, _dim, ranks = failing[-1]  # Hypothesis replays the shrunk example last
    assert len(shape) == 1, failing[-1]
    assert shape[0] <= 3 and len(ranks) <= 3, failing[-1]
    assert shape[0] % len(ranks) != 0


@pytest.mark.rule("CONF-5")
@settings(max_examples=50)
@given(chunk_args())
def test_ours_passes_the_same_check(args: Any) -> None:
    check_chunk_rule(get_impl("shardspec").chunk_layout, *args)


@pytest.mark.rule("CONF-5")
@pytest.mark.pool
def test_broken_packed_part_in_refit_is_caught(pools: Any) -> None:
    """The ``broken`` adapter reads the k part of a packed qkv one row late on one serving
    rank; the refit test fails it with the suite's message, naming the rank, the tensor and
    its k box (the second of the rank's three), and passes ours on the same case."""
    from conformance.cases import case
    from conformance.tests.test_refit import (
        GQA_TP2,
        test_every_serving_rank_holds_the_references_bytes,
    )

    prop = test_every_serving_rank_holds_the_references_bytes.hypothesis.inner_test
    with case():
        prop(get_impl("shardspec"), pools, GQA_TP2)
    want = r"round0\.rank2\..*qkv_proj\.weight\[1\]\.flat\[\d+\]=.*, but should be .* \[refit\("
    with pytest.raises(AssertionError, match=want):
        prop(get_impl("broken"), pools, GQA_TP2)
