"""Rank-side functions for the DTensor construction tests (distribute, checked from_local)."""

from __future__ import annotations

from typing import Any

import torch

from shardspec.metadata import ConversionError
from shardspec.reshard.dtensor_io import distribute_dtensor, dtensor_from_local


def _mesh(ranks: Any) -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", ranks)


def distribute(
    rank: int, world: int, full: torch.Tensor, mesh: Any, placements: Any, src: int | None
) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """``distribute_dtensor`` from ``src`` (the other ranks pass zeros of the same shape): the
    local tensor, the DTensor's global shape and this rank's mesh coordinate."""
    mine = full if src is None or rank == src else torch.zeros_like(full)
    dt = distribute_dtensor(mine, _mesh(mesh), placements, src_rank=src)
    return dt.to_local().clone(), tuple(dt.shape), tuple(dt.device_mesh.get_coordinate() or ())


def from_local(
    rank: int, world: int, locals_: list[torch.Tensor], mesh: Any, placements: Any, shape: Any
) -> Any:
    """``dtensor_from_local`` of ``locals_[rank]``: the DTensor's full tensor, or the error."""
    try:
        dt = dtensor_from_local(locals_[rank], _mesh(mesh), placements, shape)
    except ConversionError as e:
        return f"ConversionError: {e}"
    return dt.full_tensor()
