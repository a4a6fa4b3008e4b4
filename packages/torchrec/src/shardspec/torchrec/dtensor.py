"""TorchRec's DTensor output <-> Layout (TORCHREC-15).

With ``ShardingEnv(output_dtensor=True)`` TorchRec's state dict holds each sharded table as
``DTensor.from_local(LocalShardsWrapper(...), mesh, placements, shape=...)``. The placements
it writes (``torchrec_placements``) do not describe table_wise, table_row_wise or grid
layouts; the truth is only in each rank's wrapper offsets. :func:`gather_layout` collects
them into the real Layout; :func:`claimed_layout` is what the placements say.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardspec.metadata import Box, ConversionError, Layout, Shard

from .wrapper import LocalShardsWrapper

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = [
    "as_wrapper",
    "claimed_layout",
    "gather_layout",
    "layout_from_local_boxes",
    "to_dtensor",
    "torchrec_placements",
]


def as_wrapper(x: Any, global_shape: Sequence[int] | None = None) -> LocalShardsWrapper:
    """Our wrapper for this rank's part of ``x``: a DTensor (its local tensor), our wrapper,
    or upstream's / TorchRec's ``LocalShardsWrapper`` (anything with ``local_shards()`` and
    ``local_offsets()``), checked on the way in."""
    from torch.distributed.tensor import DTensor

    if isinstance(x, DTensor):
        global_shape = tuple(x.shape) if global_shape is None else global_shape
        x = x._local_tensor
    if isinstance(x, LocalShardsWrapper):
        return x
    if hasattr(x, "local_shards") and hasattr(x, "local_offsets"):
        shards = list(x.local_shards())
        offsets = [tuple(o) for o in x.local_offsets()]
        if not shards:
            # Upstream reports a rank with no shards as one [0, 0] chunk and no tensors.
            offsets = []
        return LocalShardsWrapper(
            shards,
            offsets,
            global_shape=global_shape,
            ndim=None if global_shape is None else len(global_shape),
        )
    raise ConversionError(
        f"expected a DTensor holding a LocalShardsWrapper, or a LocalShardsWrapper; got {type(x)}"
    )


def layout_from_local_boxes(
    shape: Sequence[int], boxes_by_rank: Mapping[int, Sequence[Box]]
) -> Layout:
    """The layout with ``boxes_by_rank[r]`` on rank ``r`` (in that local order), ranks
    ascending."""
    return Layout(shape, [Shard(b, r) for r in sorted(boxes_by_rank) for b in boxes_by_rank[r]])


def gather_layout(
    x: Any,
    global_shape: Sequence[int] | None = None,
    group: dist.ProcessGroup | None = None,
) -> Layout:
    """The real layout of a table from every rank's wrapper offsets (a collective: call it on
    every rank of ``group``). Ranks in the layout are ranks within ``group``; ranks that hold
    only empty shards keep them (a rank with no shard owns nothing).
    """
    import torch
    import torch.distributed as dist

    w = as_wrapper(x, global_shape)
    shape = w.global_shape if global_shape is None else tuple(global_shape)
    if shape is None:
        raise ConversionError("gather_layout needs the global shape (a DTensor carries it)")
    nd = len(shape)
    world = dist.get_world_size(group)
    mine = [v for b in w.local_boxes for v in (*b.offsets, *b.sizes)]
    # An NCCL group takes CUDA tensors only; any other backend here takes CPU ones.
    dev = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend(group) == "nccl"
        else torch.device("cpu")
    )
    count = torch.tensor([len(w.local_boxes)], dtype=torch.int64, device=dev)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    most = max(int(c.item()) for c in counts)
    buf = torch.full((max(most, 1) * 2 * nd,), -1, dtype=torch.int64, device=dev)
    buf[: len(mine)] = torch.tensor(mine, dtype=torch.int64, device=dev)
    bufs = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(bufs, buf, group=group)
    by_rank: dict[int, list[Box]] = {}
    for r in range(world):
        vals = bufs[r].tolist()
        n = int(counts[r].item())
        by_rank[r] = [
            Box(vals[i * 2 * nd : i * 2 * nd + nd], vals[i * 2 * nd + nd : (i + 1) * 2 * nd])
            for i in range(n)
        ]
    return layout_from_local_boxes(shape, by_rank)


def claimed_layout(dtensor: Any) -> Layout:
    """What a DTensor's placements say its layout is (compare with :func:`gather_layout`)."""
    from shardspec.metadata.dtensor import from_dtensor

    return from_dtensor(dtensor)


def torchrec_placements(sharding_type: Any) -> tuple[Any, ...]:
    """The placements TorchRec 1.8 writes on a 1-D mesh for ``sharding_type`` (not 2-D
    parallel): TW ``Replicate()``, RW ``Shard(0)``, CW/TWCW/TWRW/grid ``Shard(1)``."""
    from torch.distributed.tensor import Replicate, Shard as DShard

    name = getattr(sharding_type, "value", sharding_type)
    table: dict[str, Any] = {
        "table_wise": Replicate(),
        "row_wise": DShard(0),
        "column_wise": DShard(1),
        "table_column_wise": DShard(1),
        "table_row_wise": DShard(1),
        "grid_shard": DShard(1),
    }
    if name not in table:
        raise ConversionError(f"TorchRec writes no DTensor for sharding type {sharding_type!r}")
    return (table[name],)


def to_dtensor(
    layout: Layout,
    local_shards: Sequence[torch.Tensor],
    mesh: Any,
    rank: int,
    *,
    placements: Sequence[Any] | None = None,
) -> Any:
    """A DTensor of ``layout`` whose local tensor is our wrapper of this rank's shards.

    ``placements`` default to ones that describe ``layout`` exactly (``to_dtensor_placements``);
    when none do (table_wise on part of a mesh, table_row_wise, grid), pass the ones TorchRec
    uses (:func:`torchrec_placements`): the wrapper's offsets stay the truth either way.
    """
    import torch
    from torch.distributed.tensor import DTensor

    from shardspec.metadata.dtensor import to_dtensor_placements

    boxes = layout.boxes_of(rank)
    if len(boxes) != len(local_shards):
        raise ConversionError(
            f"rank {rank} holds {len(boxes)} boxes of the layout but {len(local_shards)} tensors"
        )
    if placements is None:
        placements = to_dtensor_placements(layout, mesh)
    wrapper = LocalShardsWrapper(
        list(local_shards), [b.offsets for b in boxes], global_shape=layout.shape
    )
    stride = []
    acc = 1
    for n in reversed(layout.shape):
        stride.append(acc)
        acc *= max(n, 1)
    return DTensor.from_local(
        wrapper,
        mesh,
        list(placements),
        run_check=False,
        shape=torch.Size(layout.shape),
        stride=tuple(reversed(stride)),
    )
