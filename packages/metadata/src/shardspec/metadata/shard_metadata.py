"""Converters between layouts and ``torch.distributed._shard``: ``ShardMetadata`` lists,
``ShardedTensorMetadata``, ``ChunkShardingSpec`` and ``EnumerableShardingSpec``.

Lossless for the layout: the boxes, their owning ranks and their order survive a round trip.
The owning rank of a ``ShardMetadata`` is ``placement.rank()``; we write placements as
``"rank:{r}/{device}"``. torch is imported when a converter is called, not before.
Where a torch type cannot hold a layout, or holds something a layout cannot, the converter
raises :class:`ConversionError` with the reason (spec/04-convert.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from .box import Box, as_index_tuple
from .chunk import chunk_layout
from .columns import COLUMNS_FROM, plain_columns
from .errors import ConversionError
from .infer import chunk_spec_of
from .layout import Layout, Shard, require_layout

if TYPE_CHECKING:
    import torch
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata
    from torch.distributed._shard.sharding_spec.api import EnumerableShardingSpec, ShardingSpec
    from torch.distributed._shard.sharding_spec.chunk_sharding_spec import ChunkShardingSpec

__all__ = [
    "Device",
    "from_shard_metadata",
    "from_sharded_tensor_metadata",
    "from_sharding_spec",
    "to_shard_metadata",
    "to_sharded_tensor_metadata",
    "to_sharding_spec",
]

# A device for every rank ("cpu", "cuda:0"), or a function rank -> device ("cuda:{r % 8}").
Device = str | Callable[[int], str]

_PAST_END_HINT = (
    "torch's ChunkShardingSpec.build_metadata puts empty shards past the end of the dim; "
    "convert the spec itself with from_sharding_spec(spec, shape), which applies the "
    "torch.chunk rule with empty chunks at offset n (CHUNK-2)"
)


def from_shard_metadata(
    shards: Sequence[ShardMetadata], shape: Sequence[int], *, validate: bool = True
) -> Layout:
    """The layout of ``shards`` (in their order) in a tensor of ``shape``.

    Raises :class:`ConversionError` for a placement without a rank or a box that does not
    fit ``shape``, and (``validate=True``) :class:`LayoutError` when the boxes break the
    layout rules (overlap, gap, the same box twice on a rank).
    """
    shp = as_index_tuple(shape, "shape")
    if hasattr(shards, "shards_metadata"):
        raise ConversionError(
            "from_shard_metadata takes a list of ShardMetadata; for a ShardedTensorMetadata "
            "call from_sharded_tensor_metadata(md)"
        )
    if hasattr(shards, "build_metadata"):
        raise ConversionError(
            "from_shard_metadata takes a list of ShardMetadata; for a sharding spec call "
            "from_sharding_spec(spec, shape)"
        )
    try:
        items = list(shards)
    except TypeError:
        raise ConversionError(
            f"from_shard_metadata takes a list of ShardMetadata, got {type(shards).__name__}"
        ) from None
    if len(items) >= COLUMNS_FROM:
        fast = _plain_layout(items, shp)
        if fast is not None:
            return fast.validate() if validate else fast
    out: list[Shard] = []
    for i, md in enumerate(items):
        if not all(hasattr(md, a) for a in ("shard_offsets", "shard_sizes", "placement")):
            raise ConversionError(f"shard #{i} is a {type(md).__name__}, not a ShardMetadata")
        rank = _rank_of(md.placement, i)
        box = Box(md.shard_offsets, md.shard_sizes)
        _check_fits(box, shp, i, rank, "ShardMetadata")
        out.append(Shard(box, rank))
    layout = Layout(shp, out)
    return layout.validate() if validate else layout


def to_shard_metadata(layout: Layout, device: Device = "cpu") -> list[ShardMetadata]:
    """One ``ShardMetadata`` per shard, in layout order, placed on ``rank:{r}/{device}``."""
    require_layout(layout, "to_shard_metadata")
    from torch.distributed._shard.metadata import ShardMetadata

    return [
        ShardMetadata(
            shard_offsets=list(s.box.offsets),
            shard_sizes=list(s.box.sizes),
            placement=_placement(s.rank, device),
        )
        for s in layout.shards
    ]


def from_sharded_tensor_metadata(md: ShardedTensorMetadata, *, validate: bool = True) -> Layout:
    """The layout of a ``ShardedTensor.metadata()`` (its tensor properties are not part of
    a layout and are dropped)."""
    return from_shard_metadata(md.shards_metadata, tuple(md.size), validate=validate)


def to_sharded_tensor_metadata(
    layout: Layout,
    dtype: torch.dtype | None = None,
    *,
    device: Device = "cpu",
    requires_grad: bool = False,
    pin_memory: bool = False,
    memory_format: torch.memory_format | None = None,
) -> ShardedTensorMetadata:
    """``ShardedTensorMetadata`` for ``layout``; ``dtype`` defaults to torch's default dtype."""
    require_layout(layout, "to_sharded_tensor_metadata")
    import torch
    from torch.distributed._shard.sharded_tensor.metadata import (
        ShardedTensorMetadata,
        TensorProperties,
    )

    props = TensorProperties(
        dtype=dtype if dtype is not None else torch.get_default_dtype(),
        layout=torch.strided,
        requires_grad=requires_grad,
        memory_format=memory_format if memory_format is not None else torch.contiguous_format,
        pin_memory=pin_memory,
    )
    return ShardedTensorMetadata(
        shards_metadata=to_shard_metadata(layout, device),
        size=torch.Size(layout.shape),
        tensor_properties=props,
    )


def from_sharding_spec(
    spec: ShardingSpec, shape: Sequence[int], *, validate: bool = True
) -> Layout:
    """The layout ``spec`` gives a tensor of ``shape``.

    A ``ChunkShardingSpec`` is read with the torch.chunk rule (CHUNK-1, CHUNK-2), chunk ``i``
    on ``placements[i].rank()``: empty chunks sit at offset ``n``, not past the end where
    torch's ``build_metadata`` puts them. A rank listed twice gets two boxes.
    An ``EnumerableShardingSpec`` is its shards, in order.
    """
    from torch.distributed._shard.sharding_spec.api import EnumerableShardingSpec
    from torch.distributed._shard.sharding_spec.chunk_sharding_spec import ChunkShardingSpec

    shp = as_index_tuple(shape, "shape")
    if isinstance(spec, EnumerableShardingSpec):
        return from_shard_metadata(spec.shards, shp, validate=validate)
    if not isinstance(spec, ChunkShardingSpec):
        raise ConversionError(
            f"cannot convert a {type(spec).__name__}: only ChunkShardingSpec and "
            "EnumerableShardingSpec describe a layout"
        )
    dim: Any = spec.dim
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise ConversionError(f"ChunkShardingSpec dim must be an int, got {dim!r}")
    nd = len(shp)
    if not -nd <= dim < nd:
        raise ConversionError(
            f"ChunkShardingSpec dim {dim} is out of range for shape {shp} (ndim {nd})"
        )
    dim %= nd
    if not spec.placements:
        raise ConversionError("ChunkShardingSpec has no placements")
    ranks = [_rank_of(p, i) for i, p in enumerate(spec.placements)]
    layout = chunk_layout(shp, dim, ranks)
    return layout.validate() if validate else layout


def to_sharding_spec(
    layout: Layout,
    *,
    device: Device = "cpu",
    kind: Literal["auto", "chunk", "enumerable"] = "auto",
) -> ChunkShardingSpec | EnumerableShardingSpec:
    """A torch sharding spec for a valid layout.

    ``kind="auto"``: a ``ChunkShardingSpec`` when :func:`infer_spec` finds a chunk spec, else
    an ``EnumerableShardingSpec``. ``"chunk"`` / ``"enumerable"`` force the kind and raise
    :class:`ConversionError` (with the reason) when that kind cannot express the layout.
    ``from_sharding_spec(to_sharding_spec(L), L.shape) == L`` for every layout converted.
    """
    require_layout(layout, "to_sharding_spec")
    from torch.distributed._shard.sharding_spec.api import EnumerableShardingSpec
    from torch.distributed._shard.sharding_spec.chunk_sharding_spec import ChunkShardingSpec

    if kind not in ("auto", "chunk", "enumerable"):
        raise ValueError(f"kind must be 'auto', 'chunk' or 'enumerable', got {kind!r}")
    layout.validate()
    if kind != "enumerable":
        chunk = chunk_spec_of(layout)
        if chunk is not None:
            placements: list[Any] = [_placement(r, device) for r in chunk.ranks]
            return ChunkShardingSpec(dim=chunk.dim, placements=placements)
        if kind == "chunk":
            raise ConversionError(
                f"a ChunkShardingSpec cannot express this layout: {_why_not_chunk(layout)}"
            )
    replica = _first_replica(layout)
    if replica is not None:
        box, r1, r2 = replica
        raise ConversionError(
            f"torch's EnumerableShardingSpec cannot express replicas: {box} is held by ranks "
            f"{r1} and {r2}, and torch treats identical shards as overlapping"
        )
    if not layout.shards:
        raise ConversionError(
            f"torch's EnumerableShardingSpec needs at least one shard; layout of shape "
            f"{layout.shape} has none"
        )
    try:
        return EnumerableShardingSpec(to_shard_metadata(layout, device))
    except ValueError as e:
        raise ConversionError(
            f"torch's EnumerableShardingSpec refuses this valid layout ({e}); its overlap "
            "check counts zero-size shards (a zero-size shard inside another, or identical "
            "zero-size shards) as overlapping (upstream defect, BOX-2)"
        ) from e


def _placement(rank: int, device: Device) -> str:
    dev = device(rank) if callable(device) else device
    return f"rank:{rank}/{dev}"


def _plain_layout(items: list[Any], shape: tuple[int, ...]) -> Layout | None:
    """The layout of many ``ShardMetadata`` checked all at once (plain_columns), or None for
    the per-shard loop to convert them or say which one is wrong."""
    try:
        offsets = [tuple(md.shard_offsets) for md in items]
        sizes = [tuple(md.shard_sizes) for md in items]
        ranks = [md.placement.rank() for md in items]
    except (AttributeError, TypeError):
        return None
    columns = plain_columns(offsets, sizes, ranks, shape)
    return None if columns is None else Layout._from_plain(shape, offsets, sizes, columns)


def _rank_of(placement: Any, index: int) -> int:
    rank = placement.rank() if placement is not None else None
    if rank is None:
        raise ConversionError(
            f"shard #{index} has placement {placement!r} without a rank; a layout names the "
            "owning rank of every box (write placements as 'rank:<r>/<device>')"
        )
    return int(rank)


def _check_fits(box: Box, shape: tuple[int, ...], index: int, rank: int, what: str) -> None:
    if box.ndim != len(shape):
        raise ConversionError(
            f"{what} #{index} on rank {rank}: {box} has {box.ndim} dims but the tensor "
            f"shape {shape} has {len(shape)}"
        )
    for d, (o, s) in enumerate(box):
        if o + s > shape[d]:
            hint = f"; {_PAST_END_HINT}" if s == 0 else ""
            raise ConversionError(
                f"{what} #{index} on rank {rank}: {box} ends at {o + s} in dim {d}, past the "
                f"dim's size {shape[d]} (tensor shape {shape}){hint}"
            )


def _first_replica(layout: Layout) -> tuple[Box, int, int] | None:
    owner: dict[Box, int] = {}
    for s in layout.shards:
        if s.box.is_empty:
            continue
        first = owner.setdefault(s.box, s.rank)
        if first != s.rank:
            return s.box, first, s.rank
    return None


def _why_not_chunk(layout: Layout) -> str:
    replica = _first_replica(layout)
    if replica is not None:
        box, r1, r2 = replica
        return (
            f"it has replicas ({box} on ranks {r1} and {r2}); a chunk spec gives each rank "
            "a distinct chunk"
        )
    if layout.ndim == 0:
        return "a 0-d tensor cannot be chunked"
    seen: set[int] = set()
    for s in layout.shards:
        if s.rank in seen:
            return f"rank {s.rank} holds several boxes; a chunk spec gives each rank one"
        seen.add(s.rank)
    return (
        f"its {len(layout.shards)} boxes are not the torch.chunk split of any dim of "
        f"shape {layout.shape} (CHUNK-1)"
    )
