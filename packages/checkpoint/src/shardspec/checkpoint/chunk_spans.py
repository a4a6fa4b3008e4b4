"""Small saved chunks of a DCP checkpoint read by the spans of file they fill
(``reads="own"`` of :func:`shardspec.checkpoint.load`, CKPT-24).

Our reader reads a saved chunk up to ``WHOLE_ITEM_BYTES`` whole and copies the pieces a rank
needs out of it; through DCP's planner interface that costs a ``ReadItem`` per piece and some
0.1 ms of Python per chunk (a lock, a lookup, a ``pread``, the planner's resolve and commit):
for 2,000 tensors of 4 chunks, 0.8 s against 0.01 s of reading. The load owns its
destinations, so here the chunks a rank needs are read by the runs of adjacent chunks of each
file (one ``pread`` a run), their headers found once per geometry (:class:`HeaderCache`), and
the pieces copied into their destinations. Large chunks, transformed or non-DCP entries
(ByteCheckpoint, safetensors) stay with the reader.

A copy per piece costs some 40 us of Python (views, a narrow, the copy), as much as the rest of
the load for thousands of small tensors; but a model's tensors come in few geometries. So the
destinations whose pieces tile them are grouped by geometry (shape, pieces, their chunks'
strides), and per piece of a geometry one ``index_select`` takes, for every destination at
once, the bytes of its chunk that hold the piece (a row a destination: rows start at any byte,
so a chunk's data need not be aligned to its element in the span), read as the dtype and
strided into a staging tensor; one ``_foreach_copy_`` writes the destinations. A destination
the pieces do not tile (the rest of it is not the load's to write) is copied piece by piece.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .dcp_files import DamagedItem, HeaderCache, SavedTensor, read_file_range
from .dcp_reader import WHOLE_ITEM_BYTES, CheckpointReadError, _where, truncated

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch

__all__ = ["BATCH_BYTES", "SPAN_BYTES", "Piece", "SmallChunk", "read_into", "read_spans",
           "small_entry"]  # fmt: skip

# A run of adjacent chunks is read in one pread up to this many bytes.
SPAN_BYTES = 16 << 20
# Spans held in memory at once (their pieces are copied out before the next are read).
BATCH_BYTES = 256 << 20
# The windows of one gather (a piece's bytes per destination) are cut to this.
_INDEX_BYTES = 64 << 20


class ChunkAt(NamedTuple):
    """A saved chunk as error messages name it (``_where`` reads ``fqn`` and ``offset``, as
    of a ``MetadataIndex``): a tuple is made for each of thousands of small chunks a load
    reads, where a ``MetadataIndex`` costs several times that."""

    fqn: str
    offset: tuple[int, ...]
    position: int  # in the tensor's chunks


@dataclass
class Piece:
    """Where one overlap of a saved chunk goes: ``out`` (a destination tensor) at
    ``dst_offsets``, from ``src_offsets`` of the chunk, ``lengths`` long."""

    out: torch.Tensor
    dst_offsets: tuple[int, ...]
    src_offsets: tuple[int, ...]
    lengths: tuple[int, ...]


@dataclass
class SmallChunk:
    """A saved chunk a rank reads whole: its storage entry and the pieces it fills."""

    index: Any  # a MetadataIndex or a ChunkAt: what names the chunk in an error
    path: str  # the file's path
    offset: int
    length: int
    dtype: torch.dtype
    sizes: tuple[int, ...]  # as the metadata gives them
    pieces: list[Piece]


def small_entry(info: Any) -> bool:
    """Whether a storage entry is a plain DCP chunk small enough to be read here."""
    return (
        isinstance(getattr(info, "relative_path", None), str)
        and not getattr(info, "transform_descriptors", None)
        and getattr(info, "tensor_pickle", None) is None
        and getattr(info, "saved_tensor", None) is None
        and int(info.length) <= WHOLE_ITEM_BYTES
    )


def read_spans(chunks: Sequence[SmallChunk], trace: bool) -> tuple[int, list[Any]]:
    """Read ``chunks`` and fill their pieces. Returns the bytes read and, with ``trace``, the
    (file, start, stop) of each read. Raises :class:`CheckpointReadError` naming the file, the
    tensor and the chunk (a missing or short file, bytes that are not the chunk the metadata
    describes); :class:`UnsupportedItem` for a chunk that is no plain ``torch.save`` of a
    tensor (the caller reads those with the reader)."""
    import torch

    by_file: dict[str, list[SmallChunk]] = {}
    for c in chunks:
        by_file.setdefault(c.path, []).append(c)
    spans: list[tuple[str, list[SmallChunk]]] = []
    for path, cs in by_file.items():
        cs.sort(key=lambda c: c.offset)
        spans += [(path, span) for span in _spans(cs)]
    headers = HeaderCache()
    patterns: dict[_Geometry, Any] = {}  # each geometry's index, made once a call
    nread = 0
    ranges: list[Any] = []
    with torch.no_grad():
        for batch in _batches(spans):
            buf, at = _read_batch(batch)
            nread += buf.numel()
            if trace:
                ranges += [
                    (os.path.basename(path), span[0].offset, span[-1].offset + span[-1].length)
                    for path, span in batch
                ]
            raw = memoryview(buf.numpy())  # type: ignore[arg-type]
            located: list[tuple[SmallChunk, int, SavedTensor]] = []
            for (path, span), a in zip(batch, at):
                for c in span:
                    c_at = a + c.offset - span[0].offset
                    saved = _locate(headers, raw, c_at, c, path)
                    located.append((c, c_at + saved.data_offset, saved))
            _copy(buf, located, patterns)
    return nread, ranges


def _batches(
    spans: list[tuple[str, list[SmallChunk]]],
) -> list[list[tuple[str, list[SmallChunk]]]]:
    out: list[list[tuple[str, list[SmallChunk]]]] = []
    total = 0
    for path, span in spans:
        n = span[-1].offset + span[-1].length - span[0].offset
        if not out or total + n > BATCH_BYTES:
            out.append([])
            total = 0
        out[-1].append((path, span))
        total += n
    return out


def _read_batch(batch: list[tuple[str, list[SmallChunk]]]) -> tuple[torch.Tensor, list[int]]:
    """The spans of ``batch`` read into one buffer; where each starts in it."""
    import torch

    at, total, spans = [], 0, []
    for path, span in batch:
        at.append(total)
        stop = span[-1].offset + span[-1].length
        spans.append((path, span[0].offset, stop, total))
        total += stop - span[0].offset
    buf = torch.empty(total, dtype=torch.uint8)

    def name(i: int, size: int) -> tuple[Any, int, int]:
        c = next(c for c in batch[i][1] if c.offset + c.length > size)
        return c.index, c.offset, c.length

    read_into(buf.numpy(), spans, name)
    return buf, at


def read_into(
    view: npt.NDArray[np.uint8],
    spans: Sequence[tuple[str, int, int, int]],
    name: Callable[[int, int], tuple[Any, int, int]],
) -> None:
    """Each span ``(path, start, stop, at)`` of ``spans`` read into ``view[at:]``, in one
    ``pread`` (a file opened once for the spans that follow each other in it). ``name(i,
    size)`` is what an error names for span ``i``: the (index, offset, length) of its first
    chunk that ends past ``size`` bytes. A file missing or shorter than a span raises
    :class:`CheckpointReadError` naming the file and that chunk."""
    fd, open_path = -1, ""
    try:
        for i, (path, start, stop, at) in enumerate(spans):
            if path != open_path:
                if fd >= 0:
                    os.close(fd)
                    fd = -1
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError as e:
                    where = _where(path, name(i, 0)[0], f"cannot open the file: {e.strerror}")
                    raise CheckpointReadError(where) from e
                open_path, size = path, os.fstat(fd).st_size
            if stop > size:
                raise truncated(path, *name(i, size), size)
            try:
                read_file_range(fd, start, stop - start, view[at : at + stop - start])
            except (EOFError, OSError) as e:
                raise CheckpointReadError(_where(path, name(i, 0)[0], str(e))) from e
    finally:
        if fd >= 0:
            os.close(fd)


def _spans(cs: list[SmallChunk]) -> list[list[SmallChunk]]:
    """Runs of chunks that follow each other in the file (sorted by offset), each at most
    ``SPAN_BYTES`` long unless one chunk is longer."""
    out: list[list[SmallChunk]] = []
    for c in cs:
        if out:
            last = out[-1]
            start = last[0].offset
            prev = last[-1]
            if c.offset == prev.offset + prev.length and c.offset + c.length - start <= SPAN_BYTES:
                last.append(c)
                continue
        out.append([c])
    return out


def _locate(headers: HeaderCache, raw: memoryview, at: int, c: SmallChunk, path: str) -> Any:
    """The saved tensor of chunk ``c`` at byte ``at`` of ``raw``, checked against the
    metadata."""
    try:
        saved = headers.locate(raw[at : at + c.length])
    except (DamagedItem, EOFError) as e:  # UnsupportedItem goes to the caller as it is
        raise CheckpointReadError(_where(path, c.index, str(e))) from e
    if saved.dtype != c.dtype or saved.size != c.sizes:
        raise CheckpointReadError(
            _where(
                path,
                c.index,
                f"the saved bytes hold a {saved.dtype} tensor of size {saved.size}, the "
                f"metadata says {c.dtype} of size {c.sizes}",
            )
        )
    return saved


# (destination shape, its pieces: dst offsets, src offsets, lengths, the chunk's stride,
# storage offset, data length and itemsize), sorted by destination offsets
_Geometry = tuple[tuple[int, ...], tuple[tuple[Any, ...], ...]]


def _copy(
    buf: torch.Tensor,
    located: list[tuple[SmallChunk, int, SavedTensor]],
    patterns: dict[_Geometry, Any],
) -> None:
    """Copy every piece of the located chunks (each with where its data starts in ``buf``)
    into its destination."""
    import torch

    outs: dict[int, tuple[torch.Tensor, list[tuple[Piece, int, SavedTensor]]]] = {}
    for c, start, saved in located:
        for p in c.pieces:
            if 0 in p.lengths:
                continue
            entry = outs.get(id(p.out))
            if entry is None:
                entry = outs[id(p.out)] = (p.out, [])
            entry[1].append((p, start, saved))
    groups: dict[tuple[Any, ...], list[tuple[torch.Tensor, list[int]]]] = {}
    for out, ps in outs.values():
        ps.sort(key=lambda x: x[0].dst_offsets)
        geometry = (
            tuple(out.shape),
            tuple(
                (p.dst_offsets, p.src_offsets, p.lengths, s.stride, s.storage_offset,
                 s.data_length, s.itemsize)
                for p, _, s in ps
            ),
        )  # fmt: skip
        key = (out.dtype, out.device, geometry)
        groups.setdefault(key, []).append((out, [start for _, start, _ in ps]))
    for (dtype, device, geometry), members in groups.items():
        if geometry not in patterns:
            patterns[geometry] = _pattern(geometry)
        pattern = patterns[geometry]
        if pattern is None:
            for out, starts in members:
                for piece, start in zip(geometry[1], starts):
                    _copy_piece(buf, out, start, piece)
            continue
        per = sum(w for _, _, _, _, w in pattern)  # window bytes a destination
        step = max(1, _INDEX_BYTES // max(1, per))
        for i in range(0, len(members), step):
            part = members[i : i + step]
            starts_t = torch.tensor([starts for _, starts in part], dtype=torch.int64)
            staging = torch.empty((len(part), *geometry[0]), dtype=dtype)
            for k, (region, lengths, stride, lo, width) in enumerate(pattern):
                # row j of `windows`: the `width` bytes from byte j of the batch
                windows = buf.as_strided((buf.numel() - width + 1, width), (1, 1))
                rows = windows.index_select(0, starts_t[:, k] + lo).view(dtype)
                src = rows.as_strided((len(part), *lengths), (rows.shape[1], *stride))
                staging[(slice(None),) + region].copy_(src)
            dests = [out for out, _ in part]
            if device.type == "cpu":
                torch._foreach_copy_(dests, list(staging.unbind(0)))
            else:
                for dest, d in zip(dests, staging.unbind(0)):
                    dest.copy_(d)


_Window = tuple[tuple[slice, ...], tuple[int, ...], tuple[int, ...], int, int]


def _pattern(geometry: _Geometry) -> list[_Window] | None:
    """Per piece of a destination of ``geometry``: where it lies in the destination, its
    lengths, its chunk's strides, and the bytes of its chunk's data that hold it (from ``lo``,
    ``width`` long), so that a row of those bytes read as the dtype and strided is the piece.
    None when the pieces do not tile the destination (they are disjoint: the chunks are), or
    reach outside their chunk's data."""
    shape, pieces = geometry
    if math.prod(shape) == 0 or sum(math.prod(p[2]) for p in pieces) != math.prod(shape):
        return None
    out: list[_Window] = []
    for dst_off, src_off, lengths, stride, storage_offset, data_length, size in pieces:
        if any(st < 0 for st in stride):
            return None
        first = storage_offset + sum(o * st for o, st in zip(src_off, stride))
        last = first + sum((n - 1) * st for n, st in zip(lengths, stride))
        if first < 0 or (last + 1) * size > data_length:
            return None
        region = tuple(slice(o, o + n) for o, n in zip(dst_off, lengths))
        out.append((region, lengths, stride, first * size, (last + 1 - first) * size))
    return out


def _copy_piece(buf: torch.Tensor, out: torch.Tensor, start: int, piece: tuple[Any, ...]) -> None:
    """One piece into ``out``, its chunk's data at byte ``start`` of ``buf``."""
    dst_off, src_off, lengths, stride, storage_offset, data_length, size = piece
    data = buf[start : start + data_length]
    if start % size:  # a typed view needs its first element aligned: copied first
        data = data.clone()
    view = data.view(out.dtype)
    dst = out
    for d, (o, m) in enumerate(zip(dst_off, lengths)):
        if o or m != dst.shape[d]:
            dst = dst.narrow(d, o, m)
    first = storage_offset + sum(o * s for o, s in zip(src_off, stride))
    # as_strided counts its offset from the storage's start, not the view's
    dst.copy_(view.as_strided(lengths, stride, view.storage_offset() + first))
