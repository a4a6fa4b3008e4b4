"""Small saved chunks of a DCP checkpoint read by the spans of file they fill
(``reads="own"`` of :func:`shardspec.checkpoint.load`, CKPT-24).

Our reader reads a saved chunk up to ``WHOLE_ITEM_BYTES`` whole and copies the pieces a rank
needs out of it; through DCP's planner interface that costs a ``ReadItem`` per piece and some
0.1 ms of Python per chunk (a lock, a lookup, a ``pread``, the planner's resolve and commit):
for 2,000 tensors of 4 chunks, 0.8 s against 0.01 s of reading. The load owns its
destinations, so here the chunks a rank needs are read by the runs of adjacent chunks of each
file (one ``pread`` a run), their headers found once per geometry (:class:`HeaderCache`), and
each piece copied straight into its destination. Large chunks, transformed or non-DCP entries
(ByteCheckpoint, safetensors) stay with the reader.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .dcp_files import DamagedItem, HeaderCache, read_file_range
from .dcp_reader import WHOLE_ITEM_BYTES, CheckpointReadError, _where, truncated

if TYPE_CHECKING:
    import torch

__all__ = ["Piece", "SmallChunk", "read_spans", "small_entry"]

# A run of adjacent chunks is read in one pread up to this many bytes.
_SPAN_BYTES = 16 << 20


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

    index: Any  # MetadataIndex
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
    headers = HeaderCache()
    nread = 0
    ranges: list[Any] = []
    with torch.no_grad():
        for path, cs in by_file.items():
            cs.sort(key=lambda c: c.offset)
            fd = _open(path, cs[0])
            try:
                size = os.fstat(fd).st_size
                for span in _spans(cs):
                    end = span[-1].offset + span[-1].length
                    for c in span:
                        if c.offset + c.length > size:
                            raise truncated(path, c.index, c.offset, c.length, size)
                    buf = torch.empty(end - span[0].offset, dtype=torch.uint8)
                    try:
                        read_file_range(fd, span[0].offset, buf.numel(), buf.numpy())
                    except (EOFError, OSError) as e:
                        raise CheckpointReadError(_where(path, span[0].index, str(e))) from e
                    nread += buf.numel()
                    if trace:
                        ranges.append((os.path.basename(path), span[0].offset, end))
                    raw = memoryview(buf.numpy())  # type: ignore[arg-type]
                    typed: dict[torch.dtype, torch.Tensor] = {}
                    for c in span:
                        _fill(c, buf, raw, c.offset - span[0].offset, headers, path, typed)
            finally:
                os.close(fd)
    return nread, ranges


def _open(path: str, first: SmallChunk) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as e:
        raise CheckpointReadError(
            _where(path, first.index, f"cannot open the file: {e.strerror}")
        ) from e


def _spans(cs: list[SmallChunk]) -> list[list[SmallChunk]]:
    """Runs of chunks that follow each other in the file (sorted by offset), each at most
    ``_SPAN_BYTES`` long unless one chunk is longer."""
    out: list[list[SmallChunk]] = []
    for c in cs:
        if out:
            last = out[-1]
            start = last[0].offset
            prev = last[-1]
            if c.offset == prev.offset + prev.length and c.offset + c.length - start <= _SPAN_BYTES:
                last.append(c)
                continue
        out.append([c])
    return out


def _fill(
    c: SmallChunk,
    buf: torch.Tensor,
    raw: memoryview,
    at: int,
    headers: HeaderCache,
    path: str,
    typed: dict[torch.dtype, torch.Tensor],
) -> None:
    """Copy chunk ``c``, at byte ``at`` of the span ``buf`` (``raw`` its bytes), into its
    pieces. ``typed``: the span viewed as each dtype (for data aligned to its element)."""
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
    start, size = at + saved.data_offset, saved.itemsize
    if start % size == 0:
        view = typed.get(saved.dtype)
        if view is None:
            view = typed[saved.dtype] = buf[: buf.numel() - buf.numel() % size].view(saved.dtype)
        base = start // size
    else:  # a typed view needs its first element aligned: this chunk's data is copied first
        view = buf[start : start + saved.data_length].clone().view(saved.dtype)
        base = 0
    base += saved.storage_offset
    stride = saved.stride
    for p in c.pieces:
        if 0 in p.lengths:
            continue
        dst = p.out
        shape = dst.shape
        for d, (o, n) in enumerate(zip(p.dst_offsets, p.lengths)):
            if o or n != shape[d]:  # a narrow costs microseconds, and most dims are whole
                dst = dst.narrow(d, o, n)
        first = base + sum(o * s for o, s in zip(p.src_offsets, stride))
        dst.copy_(view.as_strided(p.lengths, stride, first))
