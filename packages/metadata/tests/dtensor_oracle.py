"""Brute-force oracles for DTensor layouts: split a real tensor the way DTensor does, no box math.

``local_tensor`` applies the placements mesh dim by mesh dim to ``arange(numel)`` with
``torch.chunk`` (Shard) and chunk-of-chunks-then-cat (_StridedShard), as ``distribute_tensor``
does; ``torch_local_tensors`` asks torch's own ``distribute_tensor``, once per rank, in this
process.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard, _StridedShard

from shardspec.metadata import Box


def arange(shape: Sequence[int]) -> torch.Tensor:
    return torch.arange(math.prod(shape)).reshape(tuple(shape))


def _chunks(t: torch.Tensor, k: int, dim: int) -> list[torch.Tensor]:
    pieces = list(torch.chunk(t, k, dim))
    empty_shape = list(t.shape)
    empty_shape[dim] = 0
    pieces += [t.new_zeros(empty_shape)] * (k - len(pieces))
    return pieces


def local_tensor(
    shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[Any], coord: Sequence[int]
) -> torch.Tensor:
    t = arange(shape)
    for m, p in enumerate(placements):
        k = mesh_shape[m]
        if isinstance(p, Replicate):
            continue
        assert not isinstance(p, Partial)
        dim = p.dim % t.ndim
        if isinstance(p, _StridedShard):
            firsts = _chunks(t, p.split_factor, dim)
            seconds = [_chunks(f, k, dim) for f in firsts]
            t = torch.cat([s[coord[m]] for s in seconds], dim)
        else:
            assert isinstance(p, Shard)
            t = _chunks(t, k, dim)[coord[m]]
    return t


def coords(mesh_shape: Sequence[int]) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(k) for k in mesh_shape)))


def assemble(shape: Sequence[int], boxes: Sequence[Box]) -> torch.Tensor:
    """The local tensor that ``boxes`` describe under DTENSOR-7, built independently of the
    code under test: each dim's indices are the union of the boxes' intervals, ascending, and
    the local tensor is the global arange indexed by their outer product."""
    g = arange(shape)
    if not shape:
        return g
    idx = []
    for d in range(len(shape)):
        ivs = sorted({(b.offsets[d], b.sizes[d]) for b in boxes})
        idx.append(torch.tensor([i for o, s in ivs for i in range(o, o + s)], dtype=torch.long))
    return (
        g[torch.meshgrid(*idx, indexing="ij")]
        if all(len(i) for i in idx)
        else (g.new_zeros([len(i) for i in idx]))
    )


def flat_mesh(mesh: Any) -> tuple[tuple[int, ...], list[int]]:
    t = torch.as_tensor(mesh)
    return tuple(t.shape), t.flatten().tolist()


def device_mesh(mesh: Any, rank: int) -> Any:
    """torch's DeviceMesh over ``mesh`` as seen by ``rank``, without a process group: the
    private ``_rank`` sets the coordinate a real rank would compute from ``get_rank()``, and
    ``_init_backend=False`` skips creating the subgroups, which no local split needs."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", torch.as_tensor(mesh), _init_backend=False, _rank=rank)


def torch_dtensor(shape: Sequence[int], mesh: Any, placements: Sequence[Any], rank: int) -> Any:
    """``distribute_tensor(arange(shape), mesh, placements)`` on ``rank``.

    ``src_data_rank=None`` makes the rank split locally instead of receiving a scatter from
    coordinate 0: the same pieces (``_split_tensor``), without a collective.
    """
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(
        arange(shape), device_mesh(mesh, rank), list(placements), src_data_rank=None
    )


def torch_local_tensors(
    shape: Sequence[int], mesh: Any, placements: Sequence[Any]
) -> dict[int, torch.Tensor]:
    """rank -> the local tensor torch's ``distribute_tensor`` gives that rank."""
    ranks = torch.as_tensor(mesh).flatten().tolist()
    return {r: torch_dtensor(shape, mesh, placements, r)._local_tensor for r in ranks}


def torch_shape_and_offset(
    shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[Any], coord: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """torch's ``compute_local_shape_and_global_offset`` for one coordinate (its plain-data
    form, which the public function calls with the mesh's coordinate)."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    norm = []
    for p in placements:
        if isinstance(p, _StridedShard):
            norm.append(_StridedShard(p.dim % len(shape), split_factor=p.split_factor))
        elif isinstance(p, Shard):
            norm.append(Shard(p.dim % len(shape)))
        else:
            norm.append(p)
    s, o = _compute_local_shape_and_global_offset(
        tuple(shape), tuple(mesh_shape), list(coord), norm
    )
    return tuple(int(x) for x in s), tuple(int(x) for x in o)
