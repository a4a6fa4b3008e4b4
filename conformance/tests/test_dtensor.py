"""DTensor boxes: the boxes an implementation assigns to each mesh coordinate, against an
index-list oracle (one process), and real ``distribute_tensor`` on the pool's ranks against
those boxes, bit for bit, for every dtype."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, strategies as st

from conformance import reference
from conformance.assertions import assert_equal, assert_tensor_bitwise
from conformance.cases import case
from conformance.codec import placement_repr
from conformance.impls import Impl
from conformance.strategies import dtensor_pool_cases, dtypes, tensors


def _describe(shape: Any, mesh: Any, placements: Any) -> str:
    return (
        f"dtensor(shape={tuple(shape)}, mesh={tuple(mesh)}, "
        f"placements=[{', '.join(placement_repr(p) for p in placements)}])"
    )


@pytest.mark.rule("DTENSOR-1", "DTENSOR-2", "DTENSOR-3", "DTENSOR-4", "DTENSOR-5", "DTENSOR-7")
@given(dtensor_pool_cases(max_world=16))
def test_local_boxes_match_the_oracle(impl: Impl, dcase: Any) -> None:
    shape, mesh, placements = dcase
    ex = _describe(shape, mesh, placements)
    with case():
        for coord in reference.mesh_coordinates(mesh):
            boxes = impl.dtensor_local_boxes(shape, mesh, placements, coord)
            got = reference.indices_of_boxes(boxes, len(shape))
            want = reference.dtensor_indices(shape, mesh, placements, coord)
            assert_equal(f"indices_at{coord}", got, want, ex)


@pytest.mark.rule("CONF-1", "DTENSOR-5", "DTENSOR-7")
@pytest.mark.pool
# Dims are normalised here: distribute_tensor asserts on a _StridedShard with a negative dim
# (it normalises Shard dims only), which is torch's input handling, not placement.
@given(dtensor_pool_cases(max_world=4, negative_dims=False), st.data())
def test_distribute_tensor_holds_the_boxes(
    impl: Impl, pools: Any, dcase: Any, data: st.DataObject
) -> None:
    shape, mesh, placements = dcase
    t = data.draw(tensors(shape, dtypes()), label="tensor")
    ex = _describe(shape, mesh, placements) + f" dtype={t.dtype}"
    world = math.prod(mesh)
    with case():
        # ask the implementation first, so an unsupported case costs no dispatch
        coords = reference.mesh_coordinates(mesh)
        boxes = [impl.dtensor_local_boxes(shape, mesh, placements, c) for c in coords]
        results = pools(world).run(
            "dtensor.distribute", {"mesh": list(mesh), "placements": placements}, [t], example=ex
        )
        for r in results:
            assert_equal(
                f"rank{r.rank}.coordinate", tuple(r.value["coordinate"]), coords[r.rank], ex
            )
            want = reference.gather(t, reference.indices_of_boxes(boxes[r.rank], len(shape)))
            assert_tensor_bitwise(f"rank{r.rank}.local", r.tensors[0], want, ex)
