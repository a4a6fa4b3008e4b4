"""The saved chunks of a stack's runs read at once (``reads="once"``, CKPT-24).

A stack's run is saved chunk ``i`` of each of its members (:mod:`.load_stacks`): thousands of
small archives of one geometry. Read as any small chunks (:mod:`.chunk_spans`) each costs some
30 us of Python (its header located, a piece made and grouped, a copy into its row), which put
the read of 2,000 tensors at 25-47x the floor of reading their bytes (spec/09-checkpoint.md,
"Measured"). Here a run's chunks are columns from the start (file, offset and length per
member, one gather from the metadata's table): sorted and cut into spans of adjacent chunks
with NumPy, each span read in one ``pread``, the archives' headers compared with the one parsed
per chunk length in one comparison of all their bytes, and their data gathered into the run's
rows with one ``index_select``. The checks are :class:`~.dcp_files.HeaderCache`'s: an archive
whose bytes up to its data and whose end record equal a parsed one's holds the same tensor at
the same place; one that differs is located alone, and one that is no plain ``torch.save`` of a
tensor raises :class:`~.dcp_files.UnsupportedItem` (the caller has the reader read them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .chunk_spans import BATCH_BYTES, SPAN_BYTES, ChunkAt, read_into
from .dcp_files import _EOCD, DamagedItem, HeaderCache, SavedTensor
from .dcp_reader import CheckpointReadError, _where

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch

__all__ = ["StackRun", "read_stacks"]


@dataclass
class StackRun:
    """Saved chunk ``position`` of a stack's members ``fqns``, each read whole into its row of
    ``out``."""

    out: torch.Tensor  # (len(fqns), *sizes), contiguous, the saved dtype
    fqns: Sequence[str]
    position: int
    offsets: tuple[int, ...]  # the chunk's, in each member (errors name it)
    entries: npt.NDArray[np.int64]  # per member: file number, offset, length


def read_stacks(
    runs: Sequence[StackRun], path: Callable[[int], str]
) -> tuple[int, list[tuple[str, int, int]]]:
    """Read every member's chunk of ``runs`` into its row (``path`` of a file number of their
    entries: its path). Returns the bytes read and the
    (file, start, stop) of each read (a few a file). Raises :class:`CheckpointReadError` naming
    the file, the tensor and the chunk, as :func:`.chunk_spans.read_spans` does."""
    import numpy as np
    import torch

    if not runs:
        return 0, []
    run_of = np.concatenate([np.full(len(r.fqns), i, np.int64) for i, r in enumerate(runs)])
    row_of = np.concatenate([np.arange(len(r.fqns), dtype=np.int64) for r in runs])
    files = np.concatenate([r.entries[:, 0] for r in runs])
    offsets = np.concatenate([r.entries[:, 1] for r in runs])
    lengths = np.concatenate([r.entries[:, 2] for r in runs])
    paths = {int(f): path(int(f)) for f in np.unique(files).tolist()}
    order = np.lexsort((offsets, files))
    run_of, row_of = run_of[order], row_of[order]
    files, offsets, lengths = files[order], offsets[order], lengths[order]
    spans = _spans(files, offsets, lengths)
    headers = HeaderCache()
    nread, ranges = 0, list[tuple[str, int, int]]()
    with torch.no_grad():
        for lo, hi in _batches(spans, offsets, lengths):
            # rows [spans[lo][0], spans[hi - 1][1]) of the sorted chunks
            first, last = int(spans[lo][0]), int(spans[hi - 1][1])
            span_list = spans[lo:hi].tolist()
            starts = np.array([offsets[a] for a, _ in span_list], dtype=np.int64)
            stops = np.array([offsets[b - 1] + lengths[b - 1] for _, b in span_list], np.int64)
            at = np.concatenate([[0], np.cumsum(stops - starts)])
            buf = torch.empty(int(at[-1]), dtype=torch.uint8)
            _read(buf, span_list, starts, stops, at, files, paths, runs, run_of, row_of,
                  offsets, lengths)  # fmt: skip
            nread += buf.numel()
            ranges += [
                (os.path.basename(paths[int(files[a])]), int(s), int(e))
                for (a, _), s, e in zip(span_list, starts.tolist(), stops.tolist())
            ]
            # where each chunk starts in buf
            span_no = np.repeat(np.arange(len(span_list)), [b - a for a, b in span_list])
            where = at[span_no] + offsets[first:last] - starts[span_no]
            sel = slice(first, last)
            _fill(buf, where, lengths[sel], run_of[sel], row_of[sel], runs, headers, paths,
                  files[sel])  # fmt: skip
    return nread, ranges


def _spans(
    files: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """(first, stop) rows of each run of chunks that follow each other in one file (sorted by
    file and offset), cut where it passes a multiple of ``SPAN_BYTES`` from its start."""
    import numpy as np

    n = len(offsets)
    new = np.ones(n, dtype=bool)
    new[1:] = (files[1:] != files[:-1]) | (offsets[1:] != offsets[:-1] + lengths[:-1])
    begin = offsets[new][np.cumsum(new) - 1]
    part = (offsets - begin) // SPAN_BYTES
    new[1:] |= part[1:] != part[:-1]
    heads = np.flatnonzero(new)
    out: npt.NDArray[np.int64] = np.stack([heads, np.append(heads[1:], n)], axis=1)
    return out


def _batches(
    spans: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
) -> list[tuple[int, int]]:
    """Consecutive spans of at most ``BATCH_BYTES`` together (a longer one alone), as
    [lo, hi) of ``spans``."""
    sizes = (offsets[spans[:, 1] - 1] + lengths[spans[:, 1] - 1] - offsets[spans[:, 0]]).tolist()
    out: list[tuple[int, int]] = []
    total = 0
    for i, n in enumerate(sizes):
        if not out or total + n > BATCH_BYTES:
            out.append((i, i))
            total = 0
        out[-1] = (out[-1][0], i + 1)
        total += n
    return out


def _name(runs: Sequence[StackRun], run: int, row: int) -> Any:
    """What names a member's chunk in an error (as :class:`ChunkAt`)."""
    r = runs[run]
    return ChunkAt(r.fqns[row], r.offsets, r.position)


def _read(
    buf: torch.Tensor,
    span_list: list[list[int]],
    starts: npt.NDArray[np.int64],
    stops: npt.NDArray[np.int64],
    at: npt.NDArray[np.int64],
    files: npt.NDArray[np.int64],
    paths: dict[int, str],
    runs: Sequence[StackRun],
    run_of: npt.NDArray[np.int64],
    row_of: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
) -> None:
    """The spans read into ``buf``; a file that is missing or ends before a chunk named."""
    import numpy as np

    def name(i: int, size: int) -> tuple[Any, int, int]:
        a, b = span_list[i]
        past = a + int(np.argmax(offsets[a:b] + lengths[a:b] > size))
        index = _name(runs, int(run_of[past]), int(row_of[past]))
        return index, int(offsets[past]), int(lengths[past])

    spans = [
        (paths[int(files[a])], s, e, x)
        for (a, _), s, e, x in zip(span_list, starts.tolist(), stops.tolist(), at.tolist())
    ]
    read_into(buf.numpy(), spans, name)


def _fill(
    buf: torch.Tensor,
    where: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    run_of: npt.NDArray[np.int64],
    row_of: npt.NDArray[np.int64],
    runs: Sequence[StackRun],
    headers: HeaderCache,
    paths: dict[int, str],
    files: npt.NDArray[np.int64],
) -> None:
    """Each chunk (at byte ``where`` of ``buf``) checked and copied into its row."""
    import numpy as np

    raw = memoryview(buf.numpy())  # type: ignore[arg-type]
    kinds: dict[SavedTensor, int] = {}  # each saved tensor found, numbered
    kind_of = np.empty(len(where), dtype=np.int64)
    for length in np.unique(lengths).tolist():
        ix = np.flatnonzero(lengths == length)
        head = int(ix[0])
        saved = _locate(headers, raw, where, length, head, runs, run_of, row_of, paths, files)
        same = _same_bytes(buf, where[ix], raw, int(where[head]), saved.data_offset, length)
        kind_of[ix[same]] = kinds.setdefault(saved, len(kinds))
        for i in ix[~same].tolist():
            other = _locate(headers, raw, where, length, i, runs, run_of, row_of, paths, files)
            kind_of[i] = kinds.setdefault(other, len(kinds))
    for saved, k in kinds.items():
        ix = np.flatnonzero(kind_of == k)
        # the metadata's dtype and size, of the first row of each run among them
        for j in np.unique(run_of[ix], return_index=True)[1].tolist():
            i = int(ix[j])
            r = runs[int(run_of[i])]
            sizes = tuple(r.out.shape[1:])
            if saved.dtype != r.out.dtype or saved.size != sizes:
                raise CheckpointReadError(
                    _where(
                        paths[int(files[i])],
                        _name(runs, int(run_of[i]), int(row_of[i])),
                        f"the saved bytes hold a {saved.dtype} tensor of size {saved.size}, "
                        f"the metadata says {r.out.dtype} of size {sizes}",
                    )
                )
        _gather(buf, saved, where[ix] + saved.data_offset, run_of[ix], row_of[ix], runs)


def _locate(
    headers: HeaderCache,
    raw: memoryview,
    where: npt.NDArray[np.int64],
    length: int,
    i: int,
    runs: Sequence[StackRun],
    run_of: npt.NDArray[np.int64],
    row_of: npt.NDArray[np.int64],
    paths: dict[int, str],
    files: npt.NDArray[np.int64],
) -> SavedTensor:
    at = int(where[i])
    try:
        return headers.locate(raw[at : at + length])
    except (DamagedItem, EOFError) as e:  # UnsupportedItem goes to the caller as it is
        name = _name(runs, int(run_of[i]), int(row_of[i]))
        raise CheckpointReadError(_where(paths[int(files[i])], name, str(e))) from e


def _same_bytes(
    buf: torch.Tensor,
    starts: npt.NDArray[np.int64],
    raw: memoryview,
    head: int,
    data_offset: int,
    length: int,
) -> npt.NDArray[np.bool_]:
    """Whether each archive of ``length`` bytes at ``starts`` has the bytes of the one at
    ``head`` up to its data (``data_offset``) and in its end record."""
    import numpy as np

    # NumPy, not torch: torch's comparison and reduction of 2,000 rows of a few hundred bytes
    # took 3.2 ms on one thread here (more beside other ranks' threads), NumPy's 0.45 ms
    view = buf.numpy()
    same = np.ones(len(starts), dtype=bool)
    tail = min(_EOCD.size, length)
    for lo, n in ((0, data_offset), (length - tail, tail)):
        if n <= 0:
            continue
        want = np.frombuffer(raw[head + lo : head + lo + n], dtype=np.uint8)
        windows = np.lib.stride_tricks.as_strided(view, (view.size - n + 1, n), (1, 1))
        same &= (windows[starts + lo] == want).all(axis=1)
    return same


def _gather(
    buf: torch.Tensor,
    saved: SavedTensor,
    data: npt.NDArray[np.int64],
    run_of: npt.NDArray[np.int64],
    row_of: npt.NDArray[np.int64],
    runs: Sequence[StackRun],
) -> None:
    """The saved tensors whose data starts at bytes ``data`` of ``buf`` copied into their
    rows: a row of bytes each, read as the dtype and strided as saved."""
    import numpy as np
    import torch

    size, itemsize = saved.size, saved.itemsize
    first = saved.storage_offset
    last = first + sum((n - 1) * st for n, st in zip(size, saved.stride))
    width = (last + 1 - first) * itemsize
    windows = buf.as_strided((buf.numel() - width + 1, width), (1, 1))
    dense = saved.is_dense(size)  # then its window is the rows' bytes as they are
    for run in np.unique(run_of).tolist():
        mine = run_of == run
        rows, at = row_of[mine], data[mine]
        order = np.argsort(rows, kind="stable")
        rows, at = rows[order], at[order]
        out = runs[run].out
        # the rows of a run are read in order, or in a range of them where a batch cut it:
        # written in place by one index_select (index_copy_ goes element by element, 10x)
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        into = out[lo:hi] if hi - lo == len(rows) else None
        index = torch.from_numpy(at + first * itemsize)
        if dense and into is not None:
            torch.index_select(windows, 0, index, out=into.view(hi - lo, -1).view(torch.uint8))
            continue
        got = windows.index_select(0, index)
        src = got.view(out.dtype).as_strided(
            (len(rows), *size), (got.shape[1] // itemsize, *saved.stride)
        )
        if into is not None:
            into.copy_(src)
        else:
            out[torch.from_numpy(rows)] = src
