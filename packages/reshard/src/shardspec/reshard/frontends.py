"""Front ends for torch users: reshard a ``ShardedTensor`` or a ``DTensor``.

Both translate the torch object into a source :class:`Layout` with the converters of
``shardspec.metadata``, run :func:`shardspec.reshard.reshard` (so the result is the
reference's, bit for bit, with every element sent at most once) and wrap the result again:

* :func:`reshard_sharded_tensor` — to any ``ChunkShardingSpec``, ``EnumerableShardingSpec``
  or explicit Layout, returning a new ``ShardedTensor`` on the same process group.
* :func:`reshard_dtensor` — to any placements on any mesh, returning a new ``DTensor``.
* :func:`reshard_dtensor_to_layout` — to an explicit (uneven, irregular) Layout that no
  placements can express, returning :class:`LocalShards` (tensors + global offsets, what
  ``LocalShardsWrapper`` holds).

Torch objects name global ranks; the executor works on ranks of its group, so layouts are
translated with ``dist.get_group_rank`` when a subgroup is used. Every rank of the group
must call, including ranks that hold nothing before or after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardspec.metadata import ConversionError, Layout

from .executor import reshard

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed.tensor import DTensor

__all__ = [
    "LocalShards",
    "reshard_dtensor",
    "reshard_dtensor_to_layout",
    "reshard_sharded_tensor",
    "sharded_tensor_layout",
    "warn_if_gather_misorders",
]


@dataclass
class LocalShards:
    """One rank's shards of a layout: ``tensors[i]`` is the box at ``offsets[i]`` (global).

    This is what ``torch.distributed.tensor._shards_wrapper.LocalShardsWrapper`` holds;
    :meth:`to_wrapper` builds one (it needs at least one shard).
    """

    tensors: list[torch.Tensor]
    offsets: list[tuple[int, ...]]

    def to_wrapper(self) -> Any:
        from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper

        return LocalShardsWrapper(self.tensors, self.offsets)


def _to_group_ranks(layout: Layout, group: dist.ProcessGroup | None) -> Layout:
    import torch.distributed as dist

    if group is None or group is dist.GroupMember.WORLD:
        return layout
    mapping = {}
    for r in layout.ranks:
        g = dist.get_group_rank(group, r)
        if g < 0:
            raise ConversionError(f"global rank {r} of the layout is not in the process group")
        mapping[r] = g
    return layout.with_ranks(mapping)


# ---------------------------------------------------------------- ShardedTensor


def sharded_tensor_layout(st: ShardedTensor) -> tuple[Layout, list[torch.Tensor]]:
    """The layout of a ShardedTensor (global ranks) and this rank's tensors in its local order.

    Empty shards that torch placed past the end of their dim (``ChunkShardingSpec``'s
    ``build_metadata``, CHUNK-2) are moved to offset ``n``: they hold nothing either way.
    """
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata

    from shardspec.metadata.shard_metadata import from_sharded_tensor_metadata

    md = st.metadata()
    shape = tuple(md.size)
    fixed = []
    moved = False
    for s in md.shards_metadata:
        raw, sizes = tuple(s.shard_offsets), tuple(s.shard_sizes)
        offs = raw
        if 0 in sizes:
            offs = tuple(min(o, n - z) for o, n, z in zip(raw, shape, sizes))
            moved = moved or offs != raw
        fixed.append((raw, sizes, offs, s))
    clean = md
    if moved:  # new metadata only then: a ShardMetadata costs microseconds, and tensors of
        # thousands of shards are common (embedding tables, the 10,000-chunk benchmark)
        clean = ShardedTensorMetadata(
            shards_metadata=[
                type(s)(shard_offsets=list(offs), shard_sizes=list(sizes), placement=s.placement)
                for _, sizes, offs, s in fixed
            ],
            size=md.size,
            tensor_properties=md.tensor_properties,
        )
    layout = from_sharded_tensor_metadata(clean)
    # Local shards carry their own metadata; match them to this rank's boxes by it.
    by_meta: dict[tuple[tuple[int, ...], tuple[int, ...]], list[torch.Tensor]] = {}
    for local in st.local_shards():
        key = (tuple(local.metadata.shard_offsets), tuple(local.metadata.shard_sizes))
        by_meta.setdefault(key, []).append(local.tensor)
    import torch.distributed as dist

    me = dist.get_rank()
    tensors = []
    # this rank's shards only: a layout of 10^4 shards need not make the others' objects
    for i, shard in zip(layout.positions_of(me), layout.shards_of(me)):
        raw_offs, sizes, _, s = fixed[i]
        found = by_meta.get((raw_offs, sizes))
        if not found:
            raise ConversionError(
                f"rank {me} has no local shard for {shard.box} (ShardMetadata {s}) of its "
                f"ShardedTensor"
            )
        tensors.append(found.pop(0))
    return layout, tensors


def _check_torch_holds(dst: Layout, dtype: torch.dtype) -> None:
    """Raise ConversionError, on every rank alike and before any data moves, when torch's
    ShardedTensor refuses ``dst``'s global metadata (no sharding spec of torch's describes it,
    or torch's own checks reject it): the same checks, run on the metadata alone."""
    from torch.distributed._shard.sharded_tensor.api import ShardedTensorBase

    from shardspec.metadata.shard_metadata import to_sharded_tensor_metadata

    md = to_sharded_tensor_metadata(dst, dtype)
    try:
        ShardedTensorBase._init_from_local_shards_and_global_metadata([], md)
    except (ValueError, RuntimeError) as e:
        raise ConversionError(
            f"torch's ShardedTensor cannot hold the target layout of shape {dst.shape} with "
            f"{len(dst.shards)} shards ({e}); nothing was "
            "moved. shardspec.reshard.reshard moves the same data to this layout as plain "
            "tensors"
        ) from None


def reshard_sharded_tensor(
    st: ShardedTensor,
    spec: Any,
    *,
    max_buffer_bytes: int | None = None,
) -> ShardedTensor:
    """A new ShardedTensor with the same values laid out by ``spec`` (a ``ChunkShardingSpec``,
    an ``EnumerableShardingSpec``, or a Layout in global ranks), on ``st``'s process group.

    Unlike ``ShardedTensor.reshard``, any source layout (uneven, several shards per rank)
    goes to any destination, across dims, on gloo.
    """
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed._shard.sharded_tensor.shard import Shard as TorchShard

    from shardspec.metadata.shard_metadata import from_sharding_spec, to_sharded_tensor_metadata

    group = st._process_group
    src, local = sharded_tensor_layout(st)
    shape = src.shape
    dst = spec if isinstance(spec, Layout) else from_sharding_spec(spec, shape)
    props = st.metadata().tensor_properties
    _check_torch_holds(dst, props.dtype)
    out = reshard(
        local,
        _to_group_ranks(src, group),
        _to_group_ranks(dst, group),
        group,
        max_buffer_bytes=max_buffer_bytes,
        dtype=props.dtype,
    )
    device = out[0].device if out else local[0].device if local else None
    dev = "cpu" if device is None else str(device)
    md = to_sharded_tensor_metadata(dst, props.dtype, device=dev)
    me = dist.get_rank()
    mine = [m for m, s in zip(md.shards_metadata, dst.shards) if s.rank == me]
    shards = [TorchShard(t, m) for t, m in zip(out, mine)]
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        shards, md, process_group=group
    )


# ---------------------------------------------------------------- DTensor


def _dtensor_local_parts(dt: DTensor, layout: Layout, rank: int) -> list[torch.Tensor]:
    from shardspec.metadata.dtensor import dtensor_local_slices

    local = dt.to_local()
    boxes = layout.boxes_of(rank)
    if not boxes:
        return []
    return [local[sl] for sl in dtensor_local_slices(boxes)]


def reshard_dtensor(
    dt: DTensor,
    device_mesh: Any,
    placements: Sequence[Any],
    *,
    group: dist.ProcessGroup | None = None,
    max_buffer_bytes: int | None = None,
) -> DTensor:
    """The DTensor with ``dt``'s values on ``device_mesh`` with ``placements``.

    The meshes may differ (other ranks, other shapes); every rank of ``group`` (default: the
    world) must call. Shard(0) -> Shard(1) and friends take one ``all_to_all_single`` instead
    of DTensor's CPU fallback through an all-gather.

    On a mesh whose ranks are not in ascending order along a sharded mesh dim (``[3, 2, 1,
    0]``) the result's local shards are right, but torch's own ``full_tensor()`` and
    ``redistribute`` to ``Replicate`` on it concatenate the pieces in group-rank order, not
    mesh order, and return wrong values with no error (an upstream defect:
    ``conformance/repros/dtensor-all-gather-non-ascending-mesh.py``). A ``UserWarning`` says
    so when the result is such a DTensor; gather with this function instead
    (``placements=[Replicate()] * mesh.ndim``), which places every piece by its coordinate.
    """
    import torch.distributed as dist

    from shardspec.metadata.dtensor import dtensor_layout, from_dtensor

    from .dtensor_io import wrap_local

    shape = tuple(dt.shape)
    src = from_dtensor(dt)
    dst = dtensor_layout(shape, device_mesh, placements)
    me = dist.get_rank()
    parts = reshard(
        _dtensor_local_parts(dt, src, me),
        _to_group_ranks(src, group),
        _to_group_ranks(dst, group),
        group,
        max_buffer_bytes=max_buffer_bytes,
        dtype=dt.dtype,
        device=dt.to_local().device,
    )
    device = dt.to_local().device
    warn_if_gather_misorders(device_mesh, placements)
    return wrap_local(
        parts, dst.boxes_of(me), shape, device_mesh, placements, dtype=dt.dtype, device=device
    )


def warn_if_gather_misorders(device_mesh: Any, placements: Sequence[Any]) -> None:
    """Warn when torch's all-gather of a DTensor on ``device_mesh`` with ``placements``
    returns wrong values: a sharded mesh dim whose ranks are not ascending along it (torch
    concatenates by group rank, which is ascending global rank, not by mesh coordinate)."""
    import warnings

    mesh = device_mesh.mesh
    for d, p in enumerate(placements):
        if not p.is_shard():
            continue
        lines = mesh.movedim(d, -1).reshape(-1, mesh.shape[d])
        if bool((lines[:, 1:] <= lines[:, :-1]).any()):
            warnings.warn(
                f"reshard_dtensor: the result's shards are right, but mesh dim {d} is sharded "
                f"({p}) over ranks out of ascending order (mesh {mesh.tolist()}): torch's own "
                "full_tensor() / redistribute() on this DTensor concatenate the pieces in "
                "group-rank order and return wrong values with no error (upstream defect, "
                "conformance/repros/dtensor-all-gather-non-ascending-mesh.py); gather with "
                "reshard_dtensor(dt, mesh, [Replicate()] * mesh.ndim) instead",
                UserWarning,
                stacklevel=3,
            )
            return


def reshard_dtensor_to_layout(
    dt: DTensor,
    dst: Layout,
    *,
    group: dist.ProcessGroup | None = None,
    max_buffer_bytes: int | None = None,
) -> LocalShards:
    """This rank's shards of ``dst`` (global ranks) with their global offsets, for layouts no
    DTensor placements can express (uneven row-wise tables, several boxes per rank)."""
    import torch.distributed as dist

    from shardspec.metadata.dtensor import from_dtensor

    src = from_dtensor(dt)
    me = dist.get_rank()
    out = reshard(
        _dtensor_local_parts(dt, src, me),
        _to_group_ranks(src, group),
        _to_group_ranks(dst, group),
        group,
        max_buffer_bytes=max_buffer_bytes,
        dtype=dt.dtype,
        device=dt.to_local().device,
    )
    return LocalShards(out, [b.offsets for b in dst.boxes_of(me)])
