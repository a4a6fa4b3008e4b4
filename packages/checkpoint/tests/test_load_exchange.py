"""The exchange of ``reads="once"`` (:mod:`shardspec.checkpoint.load_exchange`): its batches
under NCCL (hand-worked, and drawn: every key once, in order, each batch within the budget
unless one key alone is heavier). The device paths (a CPU state dict over NCCL, CUDA tensors
over gloo) run in the GPU phases of the conformance suite (``python -m conformance.gpu``)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, strategies as st

from shardspec.checkpoint.load_exchange import batches


@pytest.mark.rule("CKPT-24")
def test_batches_cut_in_order_at_the_budget_with_a_heavy_key_alone() -> None:
    weights = [("a", 3), ("b", 5), ("c", 1), ("d", 10), ("e", 2), ("f", 0)]
    assert batches(weights, 8) == [["a", "b"], ["c"], ["d"], ["e", "f"]]
    assert batches(weights, None) == [["a", "b", "c", "d", "e", "f"]]
    assert batches([], 8) == []
    assert batches([], None) == []


@pytest.mark.rule("CKPT-24")
@given(st.lists(st.integers(0, 50), max_size=30), st.integers(1, 60))
def test_batches_hold_every_key_once_in_order_within_the_budget(
    sizes: list[int], budget: int
) -> None:
    weights = [(f"k{i}", w) for i, w in enumerate(sizes)]
    got = batches(weights, budget)
    assert [k for b in got for k in b] == [k for k, _ in weights]
    w = dict(weights)
    for b in got:
        assert b, "no empty batch"
        assert len(b) == 1 or sum(w[k] for k in b) <= budget
    # greedy: a batch does not end while the next key would still fit
    for b, nxt in itertools.pairwise(got):
        assert sum(w[k] for k in b) + w[nxt[0]] > budget
