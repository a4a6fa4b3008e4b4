"""Making DTensors the spec's way: from a whole tensor, and from local shards.

* :func:`distribute_dtensor` — ``distribute_tensor`` through the planner: the source rank's
  tensor goes to each rank's boxes of the placements (DTENSOR-1..7) in one exchange, on any
  mesh, ranks in any order.
* :func:`dtensor_from_local` — ``DTensor.from_local`` that checks: every rank's local shape
  must be the one the placements give its coordinate, else every rank raises the same
  :class:`~shardspec.metadata.ConversionError` naming the ranks, before any data moves.

Every rank of the default group must call both (as :func:`reshard_dtensor` by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardspec.metadata import Box, ConversionError, Layout, Shard

from .errors import rank_ranges
from .executor import reshard

if TYPE_CHECKING:
    import torch
    from torch.distributed.tensor import DTensor

__all__ = ["distribute_dtensor", "dtensor_from_local", "local_shape_of", "wrap_local"]


def local_shape_of(boxes: Sequence[Box], ndim: int) -> tuple[int, ...]:
    """The shape of a local tensor stored as the block grid of ``boxes`` (DTENSOR-7)."""
    from shardspec.metadata.dtensor import dtensor_local_slices

    slices = dtensor_local_slices(boxes) if boxes else []
    return tuple(max(sl[d].stop for sl in slices) if slices else 0 for d in range(ndim))


def wrap_local(
    parts: Sequence[torch.Tensor],
    boxes: Sequence[Box],
    shape: Sequence[int],
    device_mesh: Any,
    placements: Sequence[Any],
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> DTensor:
    """A DTensor of global ``shape`` whose local tensor holds ``parts`` (one per box of
    ``boxes``, this rank's boxes in local storage order) at their DTENSOR-7 places."""
    import torch

    from shardspec.metadata.dtensor import dtensor_local_slices

    local = torch.empty(local_shape_of(boxes, len(shape)), dtype=dtype, device=device)
    for sl, t in zip(dtensor_local_slices(boxes) if boxes else [], parts):
        local[sl] = t
    return _as_dtensor(local, device_mesh, placements, shape)


def _as_dtensor(
    local: torch.Tensor, device_mesh: Any, placements: Sequence[Any], shape: Sequence[int]
) -> DTensor:
    """``local`` as this rank's part of a contiguous ``shape`` DTensor (already checked)."""
    import torch
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local,
        device_mesh,
        placements,
        run_check=False,
        shape=torch.Size(shape),
        stride=torch.empty(tuple(shape), device="meta").stride(),
    )


def distribute_dtensor(
    tensor: torch.Tensor,
    device_mesh: Any,
    placements: Sequence[Any],
    *,
    src_rank: int | None = 0,
    max_buffer_bytes: int | None = None,
) -> DTensor:
    """A DTensor of ``tensor`` on ``device_mesh`` with ``placements``.

    ``src_rank`` (a global rank) is the one whose ``tensor`` is sent; the others' give only
    its shape and dtype. With ``src_rank=None`` every rank slices its own copy and nothing
    moves. Unlike ``distribute_tensor``'s scatter, the data lands at each rank's mesh
    coordinate on a mesh whose ranks are not in ascending order.
    """
    import torch.distributed as dist

    from shardspec.metadata.dtensor import dtensor_layout

    shape = tuple(tensor.shape)
    dst = dtensor_layout(shape, device_mesh, placements)
    me = dist.get_rank()
    boxes = dst.boxes_of(me)
    if src_rank is None:
        parts = [tensor[b.slices()] for b in boxes]
    else:
        world = dist.get_world_size()
        if not 0 <= src_rank < world:
            raise ConversionError(f"src_rank {src_rank} is not a rank of the world of {world}")
        src = Layout(shape, [Shard(Box((0,) * len(shape), shape), src_rank)])
        mine = [tensor] if me == src_rank else []
        parts = reshard(
            mine,
            src,
            dst,
            max_buffer_bytes=max_buffer_bytes,
            dtype=tensor.dtype,
            device=tensor.device,
        )
    return wrap_local(
        parts, boxes, shape, device_mesh, placements, dtype=tensor.dtype, device=tensor.device
    )


def dtensor_from_local(
    local: torch.Tensor, device_mesh: Any, placements: Sequence[Any], shape: Sequence[int]
) -> DTensor:
    """``DTensor.from_local(local, device_mesh, placements, shape=shape)`` after checking, on
    every rank at once, that each rank's ``local`` has the shape the placements give its
    coordinate of a ``shape`` tensor (DTENSOR-5): an uneven split that is not the chunk rule's
    would otherwise be described at the wrong offsets.

    Raises :class:`ConversionError` on every rank, naming each rank whose local shape is
    wrong and the shape it should have, when any rank's is.
    """
    import torch
    import torch.distributed as dist

    from shardspec.metadata.box import as_index_tuple
    from shardspec.metadata.dtensor import dtensor_layout

    shp = as_index_tuple(shape, "shape")
    dst = dtensor_layout(shp, device_mesh, placements)
    me, world = dist.get_rank(), dist.get_world_size()
    want = local_shape_of(dst.boxes_of(me), len(shp))
    have = tuple(local.shape)
    # Ranks send their local shapes rather than a verdict, so the error names every bad one.
    width = len(shp) + 1
    mine = torch.full((width,), -1, dtype=torch.int64, device=local.device)
    if len(have) == len(shp):
        mine[0] = 1
        mine[1:] = torch.tensor(have, dtype=torch.int64, device=local.device)
    else:
        mine[0] = len(have)
    seen = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(seen, mine)
    # One line per (held, expected) pair, however many ranks share it (a thousand ranks
    # that all hold (0,) make one line, not a thousand).
    wrong: dict[tuple[object, tuple[int, ...]], list[int]] = {}
    for r, row in enumerate(seen):
        expected = local_shape_of(dst.boxes_of(r), len(shp))
        if int(row[0]) != 1 or tuple(int(x) for x in row[1:]) != expected:
            got = tuple(int(x) for x in row[1:]) if int(row[0]) == 1 else f"{int(row[0])}-d"
            wrong.setdefault((got, expected), []).append(r)
    bad = [
        f"{rank_ranges(rs)} holds {got}, the placements give it {expected}"
        if len(rs) == 1
        else f"{rank_ranges(rs)} hold {got} each, the placements give each {expected}"
        for (got, expected), rs in wrong.items()
    ]
    if bad:
        raise ConversionError(
            f"local shards of a {shp} tensor on mesh {tuple(device_mesh.mesh.shape)} with "
            f"placements {tuple(placements)} do not follow the chunk rule: " + "; ".join(bad)
        )
    assert have == want  # the loop above checked this rank too
    return _as_dtensor(local, device_mesh, placements, shp)
