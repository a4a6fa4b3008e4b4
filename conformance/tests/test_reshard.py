"""Resharding (spec/06-reshard.md): any valid layout to any other, on 1 to 4 ranks, every
dtype, strided inputs, with and without a buffer bound; every rank's output against the global
tensor, bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import example, given, strategies as st

from conformance import reference
from conformance.assertions import assert_equal, assert_tensor_bitwise, describe_layout
from conformance.cases import case
from conformance.impls import Impl
from conformance.strategies import (
    dtypes,
    shapes,
    tensors,
    valid_layouts,
    with_replicas,
    world_sizes,
)
from shardspec.metadata import Layout, chunk_layout
from shardspec.testing.devices import simulated_worlds


@st.composite
def layouts_on(draw: st.DrawFn, shape: tuple[int, ...], world: int) -> Layout:
    """Any valid layout whose ranks are ranks of a pool of ``world`` (replicas included);
    a third are chunkings over every rank in some order, the case torch's resharding takes."""
    if shape and draw(st.integers(0, 2)) == 0:
        dim = draw(st.integers(0, len(shape) - 1))
        return chunk_layout(shape, dim, draw(st.permutations(range(world))))
    layout = draw(valid_layouts(st.just(shape), max_ranks=world, replicas=False))
    if draw(st.booleans()):
        layout = draw(with_replicas(layout, max_extra_ranks=0))
    return layout


@st.composite
def reshard_cases(draw: st.DrawFn, max_world: int = 4) -> dict[str, Any]:
    world = draw(world_sizes() if simulated_worlds() else st.integers(1, max_world), label="world")
    shape = draw(shapes(max_dims=3, max_side=6), label="shape")
    return {
        "world": world,
        "src": draw(layouts_on(shape, world), label="src"),
        "dst": draw(layouts_on(shape, world), label="dst"),
        "tensor": draw(tensors(shape, dtypes()), label="tensor"),
        "noncontig": draw(st.booleans(), label="noncontig"),
        "max_buffer_bytes": draw(st.sampled_from([None, 16, 64, 4096]), label="budget"),
    }


def _known_case(dim: int, ranks: list[int]) -> dict[str, Any]:
    """The 12x21 tensor chunked on dim 0 over ranks 0-3, to a chunking of ``dim`` over
    ``ranks``: the examples of spec/06-reshard.md's upstream note."""
    return {
        "world": 4,
        "src": chunk_layout((12, 21), 0, [0, 1, 2, 3]),
        "dst": chunk_layout((12, 21), dim, ranks),
        "tensor": torch.arange(12 * 21, dtype=torch.float32).reshape(12, 21),
        "noncontig": False,
        "max_buffer_bytes": None,
    }


@pytest.mark.rule("RESHARD-1", "RESHARD-6")
@pytest.mark.pool
@pytest.mark.known_defect(
    "torch",
    "ShardedTensor.reshard picks the wrong sender when only the rank order changes "
    "(reshuffle_local_shard) and uses list all_to_all, which gloo rejects for uneven sizes "
    "(reshard_local_shard)",
)
@given(reshard_cases())
@example(_known_case(0, [1, 2, 3, 0]))  # upstream: the wrong sender, gloo aborts
@example(_known_case(1, [0, 1, 2, 3]))  # upstream: list all_to_all, 21 = 6+6+6+3 columns
def test_reshard_equals_the_global_tensor_sliced(impl: Impl, pools: Any, c: dict[str, Any]) -> None:
    src, dst, t = c["src"], c["dst"], c["tensor"]
    ex = (
        f"reshard({describe_layout(src)} -> {describe_layout(dst)}, dtype={t.dtype}, "
        f"world={c['world']}, noncontig={c['noncontig']}, "
        f"max_buffer_bytes={c['max_buffer_bytes']})"
    )
    with case():
        results = impl.reshard(
            pools(c["world"]),
            src,
            dst,
            t,
            max_buffer_bytes=c["max_buffer_bytes"],
            noncontig=c["noncontig"],
            example=ex,
        )
        for r in results:
            boxes = dst.boxes_of(r.rank)
            assert_equal(f"rank{r.rank}.len(out)", len(r.tensors), len(boxes), ex)
            for k, box in enumerate(boxes):
                want = reference.gather(t, reference.indices_of_boxes([box], t.dim()))
                assert_tensor_bitwise(f"rank{r.rank}.out[{k}]", r.tensors[k], want, ex)
