"""The chunks of one checkpointed tensor, checked: bounds, overlap and coverage (CKPT-1).

A DCP checkpoint records each tensor as a shape and a list of chunks (boxes), each distinct
box written once. The chunks of a tensor are valid exactly when, as a layout in which chunk
``i`` belongs to "rank" ``i``, they pass :meth:`Layout.validate` and no non-empty box is
written twice (two chunks of the same box would be replicas in a layout, but a checkpoint
holds each element once, so for a checkpoint they overlap), and no two chunks start at the
same offset unless both are empty (DCP keys a chunk's stored data by the tensor's key and the
chunk's offset, so of an empty chunk and a non-empty one at the same offset only one keeps its
data: saving drops the other, or loading reads the wrong one).

The verdict names the tensor and the culprit chunks by their index in the tensor's chunk list
(the index DCP's ``MetadataIndex`` uses): a gap names its first uncovered element and how many
elements no chunk holds; an overlap names both chunks and the region they share.
Plain integers: no torch here; the chunk boxes come in as (offsets, sizes) pairs.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

from shardspec.metadata.box import Box
from shardspec.metadata.columns import COLUMNS_FROM, ArrayRows, array_columns, plain_columns
from shardspec.metadata.errors import LayoutError
from shardspec.metadata.layout import Layout, Shard

__all__ = ["ChunkError", "check_chunks", "chunk_array_verdict", "chunk_verdict", "storable"]

ChunkBounds = tuple[Sequence[int], Sequence[int]]


class ChunkError(LayoutError):
    """The chunks of a checkpointed tensor break CKPT-1. ``fqn`` is the tensor's key,
    ``chunks`` the indices of the culprit chunks (``shards`` holds the same indices), ``kind``
    one of ``"value"``, ``"ndim"``, ``"bounds"``, ``"overlap"``, ``"offset"`` (two chunks at
    one offset, not both empty), ``"gap"``."""

    def __init__(
        self,
        fqn: str,
        message: str,
        *,
        kind: str,
        chunks: tuple[int, ...] = (),
        point: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__(
            f"checkpoint tensor {fqn!r}: {message}", kind=kind, shards=chunks, point=point
        )
        self.fqn = fqn
        self.chunks = chunks
        self.detail = message

    def __reduce__(self) -> tuple[Any, ...]:
        # DCP gathers a rank's planning error to the coordinator as a pickle: an exception
        # that cannot be rebuilt from its args would fail there and leave the other ranks
        # waiting in the scatter that never comes.
        return (
            _rebuild,
            (type(self), self.fqn, self.detail, self.kind, self.chunks, self.point),
        )


def _rebuild(
    cls: type[ChunkError],
    fqn: str,
    detail: str,
    kind: str,
    chunks: tuple[int, ...],
    point: tuple[int, ...] | None,
) -> ChunkError:
    return cls(fqn, detail, kind=kind, chunks=chunks, point=point)


def check_chunks(fqn: str, shape: Sequence[int], chunks: Sequence[ChunkBounds]) -> Layout:
    """The tensor's chunks as a layout (chunk ``i`` on "rank" ``i``), or :class:`ChunkError`
    naming the tensor and the culprit chunks."""
    problem = chunk_verdict(fqn, shape, chunks)
    if isinstance(problem, ChunkError):
        raise problem
    return problem


def _saved_size(n: Any) -> int:
    """A saved dim size as an int; int() would make 5.5 (or True) a size of 5 (or 1)."""
    if isinstance(n, bool):
        raise TypeError(f"{n!r} is not a size")
    return operator.index(n)


def chunk_verdict(
    fqn: str, shape: Sequence[int], chunks: Sequence[ChunkBounds]
) -> Layout | ChunkError:
    """Like :func:`check_chunks`, returning the error instead of raising it (for reports that
    go on to the next tensor)."""
    try:
        shape_t = tuple(_saved_size(n) for n in shape)
        if any(n < 0 for n in shape_t):
            raise ValueError(f"negative size in {shape_t}")
    except (TypeError, ValueError) as e:
        return ChunkError(fqn, f"bad shape {shape!r}: {e}", kind="value")
    if len(chunks) >= COLUMNS_FROM:
        fast = _plain_chunks(shape_t, chunks)
        if fast is not None:
            try:
                return fast.validate()
            except LayoutError as e:
                return _explain(fqn, fast, e)
    shards: list[Shard] = []
    first_of: dict[Box, int] = {}
    at_offset: dict[tuple[int, ...], int] = {}
    for i, (offsets, sizes) in enumerate(chunks):
        try:
            box = Box(tuple(offsets), tuple(sizes))
        except LayoutError as e:
            return ChunkError(fqn, f"chunk #{i} is malformed: {e}", kind="value", chunks=(i,))
        j = first_of.setdefault(box, i)
        if j != i and not box.is_empty:
            return ChunkError(
                fqn,
                f"chunks #{j} and #{i} are the same box {_show(box)} written twice "
                f"(tensor shape {shape_t})",
                kind="overlap",
                chunks=(j, i),
            )
        k = at_offset.setdefault(box.offsets, i)
        if k != i and not (box.is_empty and shards[k].box.is_empty):
            return ChunkError(
                fqn,
                f"chunks #{k} {_show(shards[k].box)} and #{i} {_show(box)} start at the same "
                "offset: DCP files a tensor's chunks by offset, so the checkpoint holds the "
                f"data of only one of them (tensor shape {shape_t})",
                kind="offset",
                chunks=(k, i),
            )
        shards.append(Shard(box, i))
    layout = Layout(shape_t, shards)
    try:
        layout.validate()
    except LayoutError as e:
        return _explain(fqn, layout, e)
    return layout


def _plain_chunks(shape: tuple[int, ...], chunks: Sequence[ChunkBounds]) -> Layout | None:
    """Many chunks checked at once: plain boxes inside the shape, no two at one offset.
    None when any is not, for the per-chunk loop to say which (the same box twice, or only
    empty chunks sharing an offset, which the loop allows)."""
    try:
        offsets = [tuple(o) for o, _ in chunks]
        sizes = [tuple(z) for _, z in chunks]
    except (TypeError, ValueError):
        return None
    columns = plain_columns(offsets, sizes, range(len(offsets)), shape)
    if columns is None:
        return None
    if len(set(offsets)) != len(offsets):
        return None
    return Layout._from_plain(shape, offsets, sizes, columns)


def chunk_array_verdict(
    fqn: str, shape: Sequence[int], offsets: Any, sizes: Any
) -> Layout | ChunkError:
    """:func:`chunk_verdict` of chunks given as two (m x ndim) int64 arrays (the metadata's
    column encoding): checked at once when they are plain, else row by row, naming the
    culprits as there."""
    import numpy as np

    shape_t = tuple(map(int, shape))  # the encoding holds a torch.Size of plain ints
    m = len(offsets)
    if m >= COLUMNS_FROM and min(shape_t, default=0) >= 0:
        columns = array_columns(offsets, sizes, np.arange(m, dtype=np.int64), shape_t)
        if columns is not None and len(np.unique(offsets, axis=0)) == m:
            fast = Layout._from_plain(shape_t, ArrayRows(offsets), ArrayRows(sizes), columns)
            try:
                return fast.validate()
            except LayoutError as e:
                return _explain(fqn, fast, e)
    return chunk_verdict(fqn, shape, list(zip(ArrayRows(offsets), ArrayRows(sizes))))


def storable(layout: Layout) -> Layout:
    """``layout`` without the empty shards that start where a non-empty shard does: what a
    checkpoint can hold of it (DCP files chunks by offset; CKPT-1). Nothing else changes."""
    starts = {s.box.offsets for s in layout.shards if not s.box.is_empty}
    keep = [s for s in layout.shards if not (s.box.is_empty and s.box.offsets in starts)]
    return layout if len(keep) == len(layout.shards) else Layout(layout.shape, keep)


def _explain(fqn: str, layout: Layout, e: LayoutError) -> ChunkError:
    shards, shape = layout.shards, layout.shape
    if e.kind == "gap":
        held = sum(b.numel for b in {s.box for s in shards})
        point = e.point if e.point is not None else (0,) * len(shape)
        return ChunkError(
            fqn,
            f"gap: {math.prod(shape) - held} of {math.prod(shape)} elements are in no chunk, "
            f"the first at {point} (tensor shape {shape}, {len(shards)} chunks)",
            kind="gap",
            point=point,
        )
    if e.kind == "overlap" and len(e.shards) == 2:
        a, b = e.shards
        ba, bb = shards[a].box, shards[b].box
        common = ba.intersect(bb)
        return ChunkError(
            fqn,
            f"chunks #{a} {_show(ba)} and #{b} {_show(bb)} overlap in "
            f"{_show(common) if common is not None else '?'} (tensor shape {shape})",
            kind="overlap",
            chunks=(a, b),
        )
    if e.kind in ("bounds", "ndim") and e.shards:
        (i,) = e.shards[:1]
        what = "out of bounds" if e.kind == "bounds" else "of the wrong rank (number of dims)"
        return ChunkError(
            fqn,
            f"chunk #{i} {_show(shards[i].box)} is {what} for tensor shape {shape}",
            kind=e.kind,
            chunks=(i,),
        )
    return ChunkError(fqn, str(e), kind=e.kind, chunks=e.shards)


def _show(box: Box) -> str:
    return f"offsets {box.offsets} sizes {box.sizes}"
