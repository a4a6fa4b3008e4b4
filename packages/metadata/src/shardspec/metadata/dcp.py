"""Converters between layouts and DCP checkpoint metadata
(``torch.distributed.checkpoint.metadata``: ``TensorStorageMetadata``, ``ChunkStorageMetadata``).

A DCP chunk records a box but not who wrote it: the owners are not in the checkpoint.
Writing stores each distinct box once (replicas are saved once, by one of their owners);
:func:`chunk_owners` gives the owners of each written chunk, so that
``from_tensor_storage_metadata(to_tensor_storage_metadata(L), ranks=chunk_owners(L)) == L``.
torch is imported when a converter is called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .box import Box, _to_int, as_index_tuple
from .errors import ConversionError
from .layout import Layout, Shard, require_layout
from .shard_metadata import _check_fits

if TYPE_CHECKING:
    import torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata

__all__ = [
    "chunk_owners",
    "from_tensor_storage_metadata",
    "to_chunk_list",
    "to_tensor_storage_metadata",
]


def from_tensor_storage_metadata(
    md: TensorStorageMetadata,
    ranks: Sequence[int | Sequence[int]] | None = None,
    *,
    validate: bool = True,
) -> Layout:
    """The layout of a checkpointed tensor.

    ``ranks[i]`` is the owner of chunk ``i`` (an int) or its owners (a sequence: replicas).
    Without ``ranks``, chunk ``i`` is given to "rank" ``i``: that number is the chunk's index
    in the checkpoint, not a process rank, since DCP does not record who wrote a chunk.
    Shards come out in chunk order (owners of one chunk in the order given).
    """
    if hasattr(md, "state_dict_metadata"):
        raise ConversionError(
            "from_tensor_storage_metadata takes one tensor's TensorStorageMetadata; pick it "
            "from the checkpoint's Metadata with metadata.state_dict_metadata[fqn]"
        )
    if not (hasattr(md, "size") and hasattr(md, "chunks")):
        raise ConversionError(
            f"from_tensor_storage_metadata takes a TensorStorageMetadata, got {type(md).__name__}"
        )
    shape = as_index_tuple(md.size, "TensorStorageMetadata size")
    chunks = list(md.chunks)
    if ranks is not None and (isinstance(ranks, (str, bytes)) or not isinstance(ranks, Sequence)):
        raise ConversionError(
            f"ranks must be a sequence with the owner(s) of each chunk, got {ranks!r}"
        )
    if ranks is not None and len(ranks) != len(chunks):
        raise ConversionError(
            f"ranks gives owners for {len(ranks)} chunks but the metadata has {len(chunks)}"
        )
    shards: list[Shard] = []
    for i, c in enumerate(chunks):
        box = Box(tuple(c.offsets), tuple(c.sizes))
        owners: Sequence[int] = (i,) if ranks is None else _owners(ranks[i], i)
        _check_fits(box, shape, i, owners[0], "chunk")
        shards += [Shard(box, r) for r in owners]
    layout = Layout(shape, shards)
    return layout.validate() if validate else layout


def to_tensor_storage_metadata(
    layout: Layout, dtype: torch.dtype | None = None
) -> TensorStorageMetadata:
    """DCP metadata for a valid layout: one chunk per distinct box (empty boxes included),
    in order of first appearance. Replicas are stored once: a checkpoint holds each element
    once. ``dtype`` defaults to torch's default dtype."""
    require_layout(layout, "to_tensor_storage_metadata")
    import torch
    from torch.distributed.checkpoint.metadata import TensorProperties, TensorStorageMetadata

    layout.validate()
    return TensorStorageMetadata(
        properties=TensorProperties(
            dtype=dtype if dtype is not None else torch.get_default_dtype()
        ),
        size=torch.Size(layout.shape),
        chunks=[_chunk(b) for b in _distinct_boxes(layout)],
    )


def chunk_owners(layout: Layout) -> list[tuple[int, ...]]:
    """For each chunk :func:`to_tensor_storage_metadata` writes, the ranks that own its box
    (in shard order): the ``ranks`` argument that reads the checkpoint back losslessly."""
    require_layout(layout, "chunk_owners")
    owners: dict[Box, list[int]] = {}
    for s in layout.shards:
        owners.setdefault(s.box, []).append(s.rank)
    return [tuple(v) for v in owners.values()]


def to_chunk_list(layout: Layout, rank: int) -> list[ChunkStorageMetadata]:
    """What ``__create_chunk_list__`` should return on ``rank``: one chunk per box the rank
    holds, in its local storage order, empty boxes included (``[]`` if it holds none)."""
    require_layout(layout, "to_chunk_list")
    return [_chunk(b) for b in layout.boxes_of(_owner(rank, 0, "rank"))]


def _distinct_boxes(layout: Layout) -> list[Box]:
    return list(dict.fromkeys(s.box for s in layout.shards))


def _chunk(box: Box) -> ChunkStorageMetadata:
    import torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    return ChunkStorageMetadata(offsets=torch.Size(box.offsets), sizes=torch.Size(box.sizes))


def _owners(entry: int | Sequence[int], index: int) -> tuple[int, ...]:
    if isinstance(entry, (bool, str, bytes)):
        raise ConversionError(
            f"ranks[{index}] must be a rank or a sequence of ranks, got {entry!r}"
        )
    if hasattr(entry, "__index__"):  # int, numpy and torch integers
        return (_owner(entry, index),)
    if not isinstance(entry, Sequence):
        raise ConversionError(
            f"ranks[{index}] must be a rank or a sequence of ranks, got {entry!r}"
        )
    owners = tuple(_owner(r, index) for r in entry)
    if not owners:
        raise ConversionError(f"ranks[{index}] names no owner for chunk {index}")
    return owners


def _owner(r: object, index: int, what: str = "") -> int:
    i = _to_int(r)
    if i is None or i < 0:
        where = what or f"ranks[{index}]"
        raise ConversionError(f"{where} must hold ranks (integers), got {r!r}")
    return i
