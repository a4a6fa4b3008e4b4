"""FSDP state dicts <-> plain per-rank layouts, and resharding them to another mesh (FSDP-10).

The plain form of a state dict is, per sharded entry, a :class:`Layout` (global ranks) and
this rank's tensors in the layout's local order. FSDP1 (DTensor, flat or nested
ShardedTensor) and FSDP2 (DTensor) state dicts read into it; :func:`reshard_layouts` moves
every entry to new layouts with ``shardspec.reshard`` in one collective per round; and
:func:`to_state_dict` writes it back as DTensors on a mesh (or flat ShardedTensors where no
placements are exact), which FSDP2's ``load_state_dict`` and DCP take.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor.api import ShardedTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from shardspec.metadata import Box, ConversionError, Layout
from shardspec.metadata.dtensor import (
    dtensor_local_slices,
    from_dtensor,
    mesh_ranks,
    to_dtensor_placements,
)
from shardspec.metadata.placements import Placement, Replicate

from .flatten import flat_layout, layout_of
from .mesh import submesh_dims
from .rules import fsdp_tp_layout
from .sharded import make_sharded_tensor, one_owner_per_box

__all__ = ["model_layouts", "reshard_layouts", "to_layouts", "to_state_dict"]


def model_layouts(
    shapes: Mapping[str, Sequence[int]],
    tp_of: Mapping[str, Placement],
    *,
    dp: int,
    tp_size: int,
    replicate: int = 1,
    shard_dim: int = 0,
) -> dict[str, Layout]:
    """FSDP-1 for every parameter on the mesh ``(replicate, dp, tp)`` (row-major ranks); a
    parameter missing from ``tp_of`` is outside the TP plan (replicated over TP)."""
    out: dict[str, Layout] = {}
    # A model repeats a few (shape, TP placement) pairs over its layers: each is built once
    # (layouts are immutable; bench_state_dict measures it).
    seen: dict[tuple[tuple[int, ...], Placement | None], Layout] = {}
    for name, shape in shapes.items():
        memo = (tuple(shape), tp_of.get(name))
        if memo in seen:
            out[name] = seen[memo]
            continue
        if name in tp_of:
            out[name] = fsdp_tp_layout(
                shape,
                tp_of[name],
                dp=dp,
                tp_size=tp_size,
                replicate=replicate,
                shard_dim=shard_dim,
            )
        else:
            ranks = [
                (r * dp + p) * tp_size + t
                for t in range(tp_size)
                for r in range(replicate)
                for p in range(dp)
            ]
            out[name] = fsdp_tp_layout(
                shape,
                Replicate(),
                dp=dp,
                tp_size=1,
                replicate=replicate * tp_size,
                shard_dim=shard_dim,
                ranks=ranks,
            )
        seen[memo] = out[name]
    return out


def to_layouts(
    state_dict: Mapping[str, Any],
) -> tuple[dict[str, list[torch.Tensor]], dict[str, Layout], dict[str, Any]]:
    """Split a state dict into (this rank's tensors per entry, the layout per entry, the other
    entries). DTensor, flat and nested ShardedTensor entries are sharded; anything else
    (plain tensors, 0-d step counters, Python values) is returned untouched in the third."""
    me = dist.get_rank()
    local: dict[str, list[torch.Tensor]] = {}
    layouts: dict[str, Layout] = {}
    rest: dict[str, Any] = {}
    for key, value in state_dict.items():
        if isinstance(value, DTensor):
            layout = _root_layout(value)
            boxes = layout.boxes_of(me)
            # The local tensor itself: to_local() is an autograd Function (half a millisecond a
            # call here), and a state dict's entries are read, not differentiated.
            lt = getattr(value, "_local_tensor", None)
            if not isinstance(lt, torch.Tensor):
                lt = value.to_local()
            if len(boxes) == 1 and tuple(lt.shape) == boxes[0].sizes:
                local[key] = [lt]
            else:
                local[key] = [lt[s] for s in dtensor_local_slices(boxes)]
        elif isinstance(value, ShardedTensor):
            shards = value.local_shards()
            if len(shards) == 1 and isinstance(shards[0].tensor, ShardedTensor):
                layout = flat_layout(value)
                inner = shards[0].tensor.local_shards()
                (box,) = layout.boxes_of(me)
                local[key] = [inner[0].tensor if inner else torch.empty(box.sizes)]
            else:
                layout = layout_of(value)
                by_box = {
                    Box(s.metadata.shard_offsets, s.metadata.shard_sizes): s.tensor for s in shards
                }
                try:
                    local[key] = [by_box[b] for b in layout.boxes_of(me)]
                except KeyError as e:
                    raise ConversionError(
                        f"{key}: rank {me}'s local shards {list(by_box)} do not match its boxes "
                        f"{layout.boxes_of(me)} in the metadata"
                    ) from e
        else:
            rest[key] = value
            continue
        layouts[key] = layout
    return local, layouts, rest


def _root_layout(dt: DTensor) -> Layout:
    """The DTensor's layout on its root mesh: a DTensor on a submesh (FSDP2 puts parameters
    outside the TP plan on the dp submesh) is the same data on every slice of the root mesh,
    so every rank states the same layout, which resharding needs."""
    from shardspec.metadata.dtensor import dtensor_layout

    mesh = dt.device_mesh
    root = mesh._get_root_mesh()
    if root is None or root is mesh or root.ndim == mesh.ndim:
        return from_dtensor(dt)
    try:
        dims = submesh_dims(root, mesh)
    except ConversionError:
        return from_dtensor(dt)
    from torch.distributed.tensor import Replicate as TReplicate

    placements: list[Any] = [TReplicate()] * root.ndim
    for d, pl in zip(dims, dt.placements):
        placements[d] = pl
    return dtensor_layout(tuple(dt.shape), root, placements)


def reshard_layouts(
    local: Mapping[str, Sequence[torch.Tensor]],
    src: Mapping[str, Layout],
    dst: Mapping[str, Layout],
    group: dist.ProcessGroup | None = None,
) -> dict[str, list[torch.Tensor]]:
    """Every entry moved from ``src`` to ``dst`` with ``shardspec.reshard`` (layout ranks are
    ranks of ``group``, the world by default); this rank's tensors in ``dst``'s local order."""
    from shardspec.reshard import reshard_state_dict

    return reshard_state_dict(dict(local), dict(src), dict(dst), group)


def to_state_dict(
    local: Mapping[str, Sequence[torch.Tensor]], layouts: Mapping[str, Layout], mesh: DeviceMesh
) -> dict[str, Any]:
    """A state dict of DTensors on ``mesh`` (placements from the layout, when some are exact
    and every rank holds one block), else flat ShardedTensors over the world (one real owner
    per box)."""
    me = dist.get_rank()
    out: dict[str, Any] = {}
    for key, layout in layouts.items():
        tensors = list(local[key])
        boxes = layout.boxes_of(me)
        placements = None
        if all(len(layout.boxes_of(r)) == 1 for r in mesh_ranks(mesh)[1]):
            try:
                placements = to_dtensor_placements(layout, mesh)
            except ConversionError:
                placements = None
        if placements is not None and len(tensors) == 1:
            shape = torch.Size(layout.shape)
            stride = torch.empty(layout.shape, device="meta").stride()
            out[key] = DTensor.from_local(
                tensors[0].contiguous(),
                mesh,
                placements,
                run_check=False,
                shape=shape,
                stride=stride,
            )
            continue
        if len(boxes) != 1:
            raise ConversionError(
                f"{key}: rank {me} holds {len(boxes)} boxes and no DTensor placements describe "
                f"the layout; a ShardedTensor entry here needs one box per rank"
            )
        flat = one_owner_per_box(layout, me, set())
        out[key] = make_sharded_tensor(flat, me, [(boxes[0], tensors[0])], tensors[0], None)
    return out
