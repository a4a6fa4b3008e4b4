"""DTensor placements <-> Layout (spec/02-dtensor.md, DTENSOR-*).

``dtensor_layout(shape, mesh, placements)`` gives, for every mesh coordinate, exactly the
elements DTensor's local tensor holds on that rank; ``to_dtensor_placements`` goes back;
``from_dtensor`` reads a DTensor or its ``DTensorSpec``. This module imports torch; it is
loaded lazily by ``shardspec.metadata`` (``from shardspec.metadata import dtensor_layout``).
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import (
    Partial,
    Placement,
    Replicate,
    Shard,
    _StridedShard,
)

from .box import Box, as_index_tuple
from .chunk import CACHED_UP_TO
from .dtensor_math import Split, local_boxes, local_slices, mesh_layout, solve_splits
from .errors import ConversionError, LayoutError
from .layout import Layout, require_layout

__all__ = [
    "dtensor_layout",
    "dtensor_local_box",
    "dtensor_local_boxes",
    "dtensor_local_slices",
    "from_dtensor",
    "mesh_ranks",
    "to_dtensor_placements",
]


def mesh_ranks(mesh: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(mesh shape, ranks in row-major order)`` of a DeviceMesh, an int tensor or array of
    ranks, or a nested list of ranks, as in ``DeviceMesh.mesh``. A ``torch.Size`` is a mesh
    shape, never a list of ranks: its ranks are ``0..n-1`` in row-major order, as
    ``init_device_mesh(device, mesh_shape)`` numbers them."""
    if isinstance(mesh, torch.Size):
        dims = as_index_tuple(mesh, "mesh shape")
        if 0 in dims or not dims:
            raise ConversionError(f"mesh shape {dims} has no ranks")
        return dims, tuple(range(math.prod(dims)))
    raw = mesh.mesh if hasattr(mesh, "mesh") and not isinstance(mesh, (list, tuple)) else mesh
    if hasattr(raw, "tolist") and hasattr(raw, "shape") and hasattr(raw, "reshape"):
        # a tensor or an array is a grid by construction: no walk over its W ranks in Python
        dims = tuple(int(n) for n in raw.shape)
        if dims and 0 not in dims:
            return dims, _unique_ranks(raw.reshape(-1).tolist(), raw)
    if hasattr(raw, "tolist"):
        raw = raw.tolist()
    if not isinstance(raw, (list, tuple)):
        raise ConversionError(
            f"a mesh is a nested list of ranks, an int tensor or a DeviceMesh; got {mesh!r}"
        )
    shape: list[int] = []
    probe: Any = raw
    while isinstance(probe, (list, tuple)):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    if 0 in shape:
        raise ConversionError(f"mesh {raw!r} has a dim of size 0; every mesh dim needs a rank")
    flat: list[Any] = []

    def walk(node: Any, depth: int) -> None:
        if depth == len(shape):
            if isinstance(node, (list, tuple)):
                raise ConversionError(f"mesh {raw!r} is ragged: it is not a {shape} grid")
            flat.append(node)
            return
        if not isinstance(node, (list, tuple)) or len(node) != shape[depth]:
            raise ConversionError(f"mesh {raw!r} is ragged: it is not a {shape} grid")
        for child in node:
            walk(child, depth + 1)

    walk(raw, 0)
    return tuple(shape), _unique_ranks(flat, raw)


def _unique_ranks(flat: list[Any], raw: Any) -> tuple[int, ...]:
    try:
        ranks = as_index_tuple(flat, "mesh ranks")
    except LayoutError as e:
        raise ConversionError(str(e)) from None
    if len(set(ranks)) != len(ranks):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        raise ConversionError(f"mesh {raw!r} names ranks {dup} more than once")
    return ranks


def _splits(placements: Sequence[Placement], ndim: int) -> tuple[Split | None, ...]:
    if isinstance(placements, Placement) or not isinstance(placements, Sequence):
        raise ConversionError(
            f"placements must be a sequence (list or tuple) with one placement per mesh dim, "
            f"got {placements!r}"
        )
    out: list[Split | None] = []
    for m, p in enumerate(placements):
        if isinstance(p, Partial):
            raise ConversionError(
                f"placement {p!r} on mesh dim {m} is Partial: a partial tensor has no layout "
                f"until it is reduced (redistribute it to Replicate or Shard first)"
            )
        if isinstance(p, Replicate):
            out.append(None)
            continue
        if isinstance(p, _StridedShard):
            factor = int(p.split_factor)
        elif isinstance(p, Shard):
            factor = 1
        else:
            raise ConversionError(
                f"placement {p!r} on mesh dim {m} is not Shard, _StridedShard, Replicate or Partial"
            )
        dim = int(p.dim)
        if ndim == 0 or not -ndim <= dim < ndim:
            raise ConversionError(
                f"placement {p!r} on mesh dim {m} shards dim {dim}, which a tensor with "
                f"{ndim} dims does not have"
            )
        out.append(Split(dim % ndim, factor))
    return tuple(out)


_cached_splits = functools.lru_cache(maxsize=1024)(_splits)


def _splits_cached(placements: Sequence[Placement], ndim: int) -> tuple[Split | None, ...]:
    # torch's placement types check isinstance through a slow metaclass; a state dict repeats
    # a handful of placement tuples, which are hashable.
    if isinstance(placements, (list, tuple)):
        try:
            return _cached_splits(tuple(placements), ndim)
        except TypeError:  # an unhashable placement: _splits says what is wrong with it
            pass
    return _splits(placements, ndim)


def dtensor_layout(shape: Sequence[int], mesh: Any, placements: Sequence[Placement]) -> Layout:
    """The layout of a DTensor of global ``shape`` on ``mesh`` with ``placements``.

    Every mesh coordinate contributes the boxes its local tensor holds, in local storage
    order (one box, or several for some ``_StridedShard`` combinations, DTENSOR-7), owned by
    the rank at that coordinate; coordinates are taken in row-major order. Replicate gives the
    same boxes on several ranks. ``Partial`` raises :class:`ConversionError`.
    """
    shp = as_index_tuple(shape, "shape")
    mesh_shape, ranks = _mesh_ranks_cached(mesh)
    splits = _splits_cached(placements, len(shp))
    if len(ranks) <= CACHED_UP_TO:
        return _cached_mesh_layout(shp, mesh_shape, ranks, splits)
    return mesh_layout(shp, mesh_shape, ranks, splits)


# A state dict asks for the same few (shape, mesh, placements) thousands of times; a Layout is
# immutable, so one object serves them all (building the layouts of a state dict
# costs a small fraction of resharding it: bench_state_dict).
_cached_mesh_layout = functools.lru_cache(maxsize=1024)(mesh_layout)

# DeviceMesh.mesh rebuilds a tensor of ranks on every read (a CuTe layout walk: about 0.1 ms);
# a mesh's ranks never change, so they are read once per mesh object.
_MESH_RANKS: dict[int, tuple[weakref.ref[Any], tuple[tuple[int, ...], tuple[int, ...]]]] = {}


def _mesh_ranks_cached(mesh: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if not isinstance(mesh, DeviceMesh):
        return mesh_ranks(mesh)
    hit = _MESH_RANKS.get(id(mesh))
    if hit is not None and hit[0]() is mesh:
        return hit[1]
    found = mesh_ranks(mesh)
    key = id(mesh)
    try:
        ref = weakref.ref(mesh, lambda _: _MESH_RANKS.pop(key, None))
    except TypeError:  # not weakly referenceable: nothing to key a cache entry on safely
        return found
    _MESH_RANKS[key] = (ref, found)
    return found


def dtensor_local_boxes(
    shape: Sequence[int],
    mesh_shape: Sequence[int],
    placements: Sequence[Placement],
    coordinate: Sequence[int] | Callable[[int], int],
) -> tuple[Box, ...]:
    """The boxes of the local tensor at mesh ``coordinate``, in local storage order.

    ``mesh_shape`` is the mesh's shape, or the mesh itself (``DeviceMesh``, tensor of ranks,
    nested list); ``coordinate`` is one index per mesh dim (``DeviceMesh.get_coordinate()``),
    or a function from mesh dim to index.
    """
    shp = as_index_tuple(shape, "shape")
    mshape = _mesh_shape(mesh_shape)
    coord = _coordinate(coordinate, len(mshape))
    return local_boxes(shp, mshape, _splits(placements, len(shp)), coord)


def _coordinate(coordinate: Sequence[int] | Callable[[int], int], ndim: int) -> tuple[int, ...]:
    if callable(coordinate):  # torch's private form: a function from mesh dim to coordinate
        coordinate = [coordinate(m) for m in range(ndim)]
    try:
        return as_index_tuple(coordinate, "mesh coordinate")
    except LayoutError as e:
        raise ConversionError(str(e)) from None


def _mesh_shape(mesh: Any) -> tuple[int, ...]:
    """The shape of a mesh given as its shape (a tuple, list or ``torch.Size``) or as the mesh
    itself (a ``DeviceMesh``, a tensor or array of ranks, a nested list of ranks), as callers
    of torch's ``compute_local_shape_and_global_offset(shape, mesh, placements)`` pass it."""
    is_mesh = (hasattr(mesh, "mesh") or hasattr(mesh, "tolist")) and not isinstance(
        mesh, (list, tuple)
    )
    if is_mesh or (
        isinstance(mesh, (list, tuple)) and any(isinstance(x, (list, tuple)) for x in mesh)
    ):
        return mesh_ranks(mesh)[0]
    try:
        return as_index_tuple(mesh, "mesh shape")
    except LayoutError as e:
        raise ConversionError(str(e)) from None


def dtensor_local_box(
    shape: Sequence[int],
    mesh_shape: Sequence[int],
    placements: Sequence[Placement],
    coordinate: Sequence[int] | Callable[[int], int],
) -> Box:
    """The one box the local tensor at ``coordinate`` holds (its local shape and global offset).

    Raises :class:`ConversionError` when the local tensor is not one block of the global
    tensor (some ``_StridedShard`` combinations); use :func:`dtensor_local_boxes` there.
    """
    boxes = dtensor_local_boxes(shape, mesh_shape, placements, coordinate)
    if len(boxes) != 1:
        mshape = _mesh_shape(mesh_shape)
        raise ConversionError(
            f"the local tensor at coordinate {_coordinate(coordinate, len(mshape))} of mesh "
            f"{mshape} with placements {tuple(placements)} is not one block of shape "
            f"{tuple(shape)}: it holds {len(boxes)} boxes {list(boxes)}; use dtensor_local_boxes"
        )
    return boxes[0]


def dtensor_local_slices(boxes: Sequence[Box]) -> list[tuple[slice, ...]]:
    """Where each of a rank's boxes (as ``dtensor_layout`` lists them) sits in its local
    tensor: ``local[slices[i]]`` holds the elements of ``boxes[i]`` (DTENSOR-7)."""
    return list(_cached_local_slices(tuple(boxes)))


@functools.lru_cache(maxsize=1024)
def _cached_local_slices(boxes: tuple[Box, ...]) -> tuple[tuple[slice, ...], ...]:
    return tuple(local_slices(boxes))


def to_dtensor_placements(layout: Layout, mesh: Any) -> tuple[Placement, ...]:
    """Placements on ``mesh`` under which a DTensor of ``layout.shape`` holds exactly ``layout``.

    Replicate where a mesh dim changes nothing, ``Shard(d)`` where possible, otherwise
    ``_StridedShard(d, split_factor=f)`` with the smallest such ``f``. Raises
    :class:`ConversionError` naming the reason when no placements do (DTENSOR-9).
    """
    require_layout(layout, "to_dtensor_placements")
    mesh_shape, ranks = mesh_ranks(mesh)
    splits = solve_splits(layout, mesh_shape, ranks)
    out: list[Placement] = []
    for s in splits:
        if s is None:
            out.append(Replicate())
        elif s.split_factor == 1:
            out.append(Shard(s.dim))
        else:
            out.append(_StridedShard(s.dim, split_factor=s.split_factor))
    return tuple(out)


def from_dtensor(spec_or_dtensor: Any) -> Layout:
    """The layout of a DTensor, or of a ``DTensorSpec`` (which must carry its tensor_meta):
    its global shape on its mesh with its placements."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    if isinstance(spec_or_dtensor, DTensor):
        return dtensor_layout(
            tuple(spec_or_dtensor.shape),
            spec_or_dtensor.device_mesh,
            spec_or_dtensor.placements,
        )
    if isinstance(spec_or_dtensor, DTensorSpec):
        meta = spec_or_dtensor.tensor_meta
        if meta is None:
            raise ConversionError(
                f"{spec_or_dtensor!r} has no tensor_meta, so its global shape is unknown"
            )
        return dtensor_layout(tuple(meta.shape), spec_or_dtensor.mesh, spec_or_dtensor.placements)
    raise ConversionError(
        f"from_dtensor takes a DTensor or a DTensorSpec, got {type(spec_or_dtensor).__name__}"
    )
