"""Small refusals and shortcuts of the metadata package that no other test reaches: lazy
exports (CONVERT-11), JSON of the wrong type (CONVERT-9), spec refusals (SPEC-1, SPEC-2), a
saved shape that is no shape (CKPT-1), and the DTensor helpers' edge forms (DTENSOR-1,
DTENSOR-5, DTENSOR-7).

Expectations are worked by hand from the rules and the docstrings.
"""

from __future__ import annotations

import pytest
import torch

import shardspec.metadata
from shardspec.metadata import (
    Box,
    ChunkSpec,
    ConversionError,
    EnumerableSpec,
    Layout,
    LayoutError,
    Shard,
    chunk_layout,
    layout_from_json,
)
from shardspec.metadata.box import Box as BoxFromModule
from shardspec.metadata.dtensor import dtensor_local_slices, mesh_ranks
from shardspec.metadata.dtensor_math import local_slices
from shardspec.metadata.lazy import lazy_exports


@pytest.mark.rule("CONVERT-11")
def test_lazy_exports_refuse_a_missing_name_and_list_every_name() -> None:
    namespace: dict[str, object] = {"eager": 1}
    get, names = lazy_exports("shardspec.metadata", {"Box": "box"}, namespace)
    with pytest.raises(
        AttributeError, match=r"module 'shardspec\.metadata' has no attribute 'nope'"
    ):
        get("nope")
    assert "nope" not in namespace
    assert names() == ["Box", "eager"]
    assert get("Box") is BoxFromModule and namespace["Box"] is BoxFromModule
    assert names() == ["Box", "eager"]  # loaded once, listed once


@pytest.mark.rule("CONVERT-11")
def test_the_package_refuses_a_missing_attribute_and_lists_its_lazy_names() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'no_such_export'"):
        shardspec.metadata.no_such_export  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(shardspec.metadata, "no_such_export")
    listed = dir(shardspec.metadata)
    assert listed == sorted(listed)
    # Eager names, and lazy ones whether or not they were loaded yet.
    for name in ("Box", "Layout", "dtensor_layout", "to_chunk_list", "from_dtensor"):
        assert name in listed


@pytest.mark.rule("CONVERT-9")
@pytest.mark.parametrize("value", [None, 5, ["{}"], {"format": "x"}], ids=repr)
def test_layout_from_json_refuses_what_is_not_text(value: object) -> None:
    with pytest.raises(
        LayoutError, match=rf"layout JSON must be str or bytes, got {type(value).__name__}$"
    ):
        layout_from_json(value)  # type: ignore[arg-type]


@pytest.mark.rule("SPEC-1")
def test_chunk_spec_refuses_no_ranks_and_a_rank_named_twice() -> None:
    with pytest.raises(LayoutError, match="at least one rank"):
        ChunkSpec(0, [])
    with pytest.raises(LayoutError, match="at least one rank"):
        ChunkSpec(0, ())
    with pytest.raises(LayoutError, match=r"ChunkSpec ranks \(0, 1, 0\) name a rank twice"):
        ChunkSpec(0, [0, 1, 0])
    assert ChunkSpec(0, [2, 0]).ranks == (2, 0)


@pytest.mark.rule("SPEC-2")
def test_enumerable_spec_describes_only_its_own_shape() -> None:
    layout = Layout((4, 2), [Shard(Box((0, 0), (4, 2)), 0)])
    spec = EnumerableSpec(layout)
    assert spec.layout((4, 2)) is layout and spec.layout([4, 2]) is layout
    for other in ((4,), (2, 4), (8, 2), (4, 2, 1)):
        with pytest.raises(LayoutError, match="does not rescale"):
            spec.layout(other)


@pytest.mark.rule("DTENSOR-7")
def test_a_rank_with_no_boxes_has_no_local_slices() -> None:
    assert local_slices([]) == []
    assert dtensor_local_slices(()) == []
    # Rank 2 of a 2-row tensor chunked over ranks 0, 1, 2 holds one empty box, not none; a rank
    # outside the layout holds none.
    layout = chunk_layout((2,), 0, [0, 1, 2])
    assert dtensor_local_slices(layout.boxes_of(3)) == []
    assert dtensor_local_slices(layout.boxes_of(2)) == [(slice(0, 0),)]


@pytest.mark.rule("DTENSOR-5")
def test_a_torch_size_is_a_mesh_shape_numbered_row_major() -> None:
    assert mesh_ranks(torch.Size([2, 3])) == ((2, 3), (0, 1, 2, 3, 4, 5))
    assert mesh_ranks(torch.Size([4])) == ((4,), (0, 1, 2, 3))
    # A tuple is a list of ranks, not a shape.
    assert mesh_ranks((2, 3)) == ((2,), (2, 3))


@pytest.mark.rule("DTENSOR-1")
def test_a_mesh_with_no_ranks_or_of_no_mesh_type_is_refused() -> None:
    for shape in (torch.Size([]), torch.Size([2, 0]), torch.Size([0])):
        with pytest.raises(ConversionError, match="has no ranks"):
            mesh_ranks(shape)
    for empty in ([], [[]], [[], []]):
        with pytest.raises(ConversionError, match="size 0"):
            mesh_ranks(empty)
    for not_a_mesh in (5, "01", None):
        with pytest.raises(ConversionError, match="a mesh is a nested list of ranks"):
            mesh_ranks(not_a_mesh)
