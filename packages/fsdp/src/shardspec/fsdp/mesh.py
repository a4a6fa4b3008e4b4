"""Which mesh dim plays which role (TP, FSDP, replica), and the layouts FSDP-1 gives on it.

The hooks (:mod:`shardspec.fsdp.extensions`) and the conversions (:mod:`shardspec.fsdp.convert`)
learn from torch only a root mesh, its submeshes and a process group; these helpers turn them
into mesh dims and build the rank -> box layouts of :mod:`shardspec.fsdp.rules` on the whole
mesh. The layouts are cached: every rank asks for the same few, each O(ranks) to build.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardspec.metadata import ConversionError, Layout, Shard, chunk_layout
from shardspec.metadata.placements import Placement, Replicate, ShardDim, StridedShardDim

from .rules import fsdp_box, mesh_coords, placements_layout

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "exact_placements",
    "fsdp_chunk_layout",
    "mesh_fsdp_layout",
    "ranks_along",
    "root_roles",
    "submesh_dims",
]

# Held while a cached layout is built: ranks that are threads of one process (a simulated
# world) ask for the same layout at once; one builds it, the others then take it from the cache.
_CACHE_LOCK = threading.RLock()


def submesh_dims(root: DeviceMesh, sub: DeviceMesh) -> list[int]:
    """The dims of ``root`` that ``sub`` was sliced from (by name)."""
    names = root.mesh_dim_names
    sub_names = sub.mesh_dim_names
    if names is None or sub_names is None:
        raise ConversionError(
            f"cannot tell which dims of mesh {root} the submesh {sub} uses: name the mesh dims "
            "(init_device_mesh(..., mesh_dim_names=...))"
        )
    out = []
    for n in sub_names:
        if n not in names:
            raise ConversionError(f"mesh dim {n!r} of {sub} is not a dim of {root}")
        out.append(names.index(n))
    return out


def root_roles(
    tp_mesh: DeviceMesh | None, fsdp_ranks: Sequence[int]
) -> tuple[DeviceMesh, int | None, int] | None:
    """(root mesh, its TP dim, its FSDP shard dim) for a TP mesh and the ranks of FSDP's
    process group, or None when the root mesh does not contain both."""
    if tp_mesh is None:
        return None
    root = tp_mesh._get_root_mesh()
    if root is None or root.ndim < 2:
        return None
    try:
        (tp_dim,) = submesh_dims(root, tp_mesh)
    except (ConversionError, ValueError):
        return None
    coord = root.get_coordinate()
    if coord is None:
        return None
    grid = root.mesh
    want = set(fsdp_ranks)
    for d in range(root.ndim):
        if d == tp_dim:
            continue
        index: list[Any] = list(coord)
        index[d] = slice(None)
        if set(grid[tuple(index)].reshape(-1).tolist()) == want:
            return root, tp_dim, d
    return None


def ranks_along(root: DeviceMesh, dim: int) -> list[int]:
    """The global ranks of this rank's line of ``root`` along mesh dim ``dim``."""
    coord = root.get_coordinate()
    assert coord is not None
    index: list[Any] = list(coord)
    index[dim] = slice(None)
    return [int(r) for r in root.mesh[tuple(index)].reshape(-1).tolist()]


def mesh_fsdp_layout(
    shape: Sequence[int],
    tp: Placement,
    mesh_shape: Sequence[int],
    ranks: Sequence[int],
    *,
    tp_dim: int | None,
    shard_dim: int,
    fsdp_tensor_dim: int = 0,
) -> Layout:
    """FSDP-1 on an arbitrary mesh: TP on mesh dim ``tp_dim`` (None: no TP), FSDP chunking
    over mesh dim ``shard_dim``, every other mesh dim replicating.

    Cached (the layout is immutable): a state dict's parameters share a few shapes, and every
    rank asks for the same layout, which costs O(ranks) to build."""
    with _CACHE_LOCK:
        return _mesh_fsdp_layout(
            tuple(shape), tp, tuple(mesh_shape), tuple(ranks), tp_dim, shard_dim, fsdp_tensor_dim
        )


@functools.lru_cache(maxsize=256)
def _mesh_fsdp_layout(
    shape: tuple[int, ...],
    tp: Placement,
    mesh_shape: tuple[int, ...],
    ranks: tuple[int, ...],
    tp_dim: int | None,
    shard_dim: int,
    fsdp_tensor_dim: int,
) -> Layout:
    tp_size = mesh_shape[tp_dim] if tp_dim is not None else 1
    tp_pl: Placement = tp if tp_dim is not None else Replicate()
    shards = []
    for rank, coord in zip(ranks, mesh_coords(mesh_shape)):
        t = coord[tp_dim] if tp_dim is not None else 0
        box = fsdp_box(
            shape,
            tp_pl,
            tp_size=tp_size,
            dp_size=mesh_shape[shard_dim],
            t=t,
            p=coord[shard_dim],
            shard_dim=fsdp_tensor_dim,
        )
        shards.append(Shard(box, rank))
    return Layout(tuple(shape), shards)


def exact_placements(
    shape: tuple[int, ...],
    mesh_shape: tuple[int, ...],
    tp: Placement,
    tp_dim: int | None,
    tp_size: int,
    shard_dim: int,
) -> tuple[Placement, ...] | None:
    """Placements on the root mesh whose DTensor layout is FSDP-1's (FSDP-5), or None.
    Cached as :func:`mesh_fsdp_layout` is: it compares layouts of every rank."""
    with _CACHE_LOCK:
        return _exact_placements(shape, mesh_shape, tp, tp_dim, tp_size, shard_dim)


@functools.lru_cache(maxsize=256)
def _exact_placements(
    shape: tuple[int, ...],
    mesh_shape: tuple[int, ...],
    tp: Placement,
    tp_dim: int | None,
    tp_size: int,
    shard_dim: int,
) -> tuple[Placement, ...] | None:
    truth = mesh_fsdp_layout(
        shape, tp, mesh_shape, range(math.prod(mesh_shape)), tp_dim=tp_dim, shard_dim=shard_dim
    )
    dp_options: list[Placement] = [ShardDim(0)]
    if isinstance(tp, ShardDim) and tp.dim == 0 and tp_size > 1:
        dp_options.insert(0, StridedShardDim(0, tp_size))
    for dp_pl in dp_options:
        pls: list[Placement] = [Replicate()] * len(mesh_shape)
        pls[shard_dim] = dp_pl
        if tp_dim is not None:
            pls[tp_dim] = tp
        got = placements_layout(shape, mesh_shape, pls)
        if got.equivalent(truth) and all(len(got.boxes_of(r)) == 1 for r in got.ranks):
            return tuple(pls)
    return None


def fsdp_chunk_layout(shape: tuple[int, ...], ranks: tuple[int, ...]) -> Layout:
    """FSDP's dim-0 chunks of ``shape`` over ``ranks`` (CHUNK-1..3), cached as
    :func:`mesh_fsdp_layout` is: every FSDP rank asks for the same layout."""
    with _CACHE_LOCK:
        return _fsdp_chunk_layout(shape, ranks)


@functools.lru_cache(maxsize=256)
def _fsdp_chunk_layout(shape: tuple[int, ...], ranks: tuple[int, ...]) -> Layout:
    return chunk_layout(shape, 0, ranks)
