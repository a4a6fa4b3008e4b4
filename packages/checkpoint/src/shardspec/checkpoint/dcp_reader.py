"""A drop-in ``StorageReader`` for DCP checkpoints on a file system that reads each byte once.

``dcp.load(sd, storage_reader=FileSystemReader(path), planner=...)`` (spec/09-checkpoint.md,
CKPT-13 to CKPT-16). DCP's own ``FileSystemReader.read_data`` ``torch.load``s the whole saved
chunk once per read item and narrows it afterwards. This one, per rank and load:

* groups the read items by saved chunk and the chunks by file, sorted by offset; each chunk's
  bytes are read at most once, however many read items cut it (CKPT-13);
* reads a small chunk (up to :data:`WHOLE_ITEM_BYTES`) whole in one ``pread``; of a larger one
  it reads the archive's directory and pickle, then only the storage bytes the rank needs: a
  read item whose elements are one contiguous run of the storage goes straight into its
  destination when that is a contiguous CPU tensor of the same dtype, the others are copied
  from a private memory mapping of the bytes they span (or, where that cannot serve, from one
  buffer spanning them) (CKPT-14);
* runs the files' reads on a small pool of threads (``thread_count``, default
  ``min(4, cpu_count)``, one per ``bytes_per_thread`` to read), each holding at most one
  buffer no larger than one saved chunk (CKPT-15);
* sends what it cannot read so (a storage transform, a ``BYTE_IO`` object, an archive it does
  not know) through DCP's own ``read_data``, item by item;
* raises :class:`CheckpointReadError` naming the file, the tensor and the chunk for a missing
  or truncated file or a chunk whose bytes do not match the metadata (CKPT-16). ``dcp.load``
  gathers every rank's ``read_data`` outcome and raises on every rank when any failed;
* reads a ByteCheckpoint checkpoint too (CKPT-19): when the ``.metadata`` file's top-level
  class is ByteCheckpoint's (``dcp_metadata.metadata_format``), the metadata is read with the
  restricted reader, and each tensor chunk is its raw storage bytes laid out as the tensor
  pickle in the metadata says; its non-tensor values are ``torch.save`` archives, read by
  DCP's own reader.
"""

from __future__ import annotations

import dataclasses
import itertools
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader as _DcpFileSystemReader
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from .dcp_files import (
    DamagedItem,
    HeaderCache,
    SavedTensor,
    UnsupportedItem,
    locate_tensor,
    raw_tensor,
    read_file_range,
)
from .dcp_metadata import read_metadata

__all__ = [
    "BYTES_PER_THREAD",
    "PLAN_STAYS_LOCAL",
    "WHOLE_ITEM_BYTES",
    "CheckpointReadError",
    "FileSystemReader",
    "ReadStats",
]

# A saved chunk up to this size is read whole, header and data in one pread: cheaper than
# three small reads, and within the one-chunk buffer bound anyway.
WHOLE_ITEM_BYTES = 256 * 1024
# A thread's task: consecutive chunks of one file up to this many bytes or chunks, so that a
# few large files or one file of many chunks both spread over the pool.
_TASK_BYTES = 64 * 2**20
_TASK_CHUNKS = 2048
# One reading thread per this many bytes to read, up to thread_count: a small chunk is Python
# work under the GIL, which more threads only slow down (2,000 tensors of 7.5 KiB on 2 ranks
# took 1.9 s to read with 4 threads a rank), while large reads overlap their system calls.
BYTES_PER_THREAD = 16 * 2**20


class _PlanStaysLocal:
    """A load plan's ``planner_data`` from a planner whose global step returns every plan
    unchanged (our ``LoadPlanner``)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _PlanStaysLocal)

    def __hash__(self) -> int:
        return 0


PLAN_STAYS_LOCAL = _PlanStaysLocal()


@dataclass(frozen=True)
class _KeptPlan:
    """What a rank sends through DCP's plan gather and scatter in place of its read items,
    which it keeps (CKPT-18): their count, to check it gets its own plan back."""

    items: int


class CheckpointReadError(RuntimeError):
    """A saved chunk could not be read: the message names the file, the tensor and the
    chunk (its offsets), and what is wrong."""


@dataclass
class ReadStats:
    """What the last ``read_data`` did on this rank (for tests and benchmarks)."""

    chunks: int = 0  # saved chunks read by this reader
    items: int = 0  # read items it filled
    fallback_items: int = 0  # read items sent through DCP's own read_data
    bytes_read: int = 0
    buffer_peak: int = 0  # sum over threads of the largest buffer each held
    threads: int = 0
    ranges: list[tuple[str, int, int]] = field(default_factory=list)  # when trace_reads


@dataclass
class _Chunk:
    index: MetadataIndex
    path: str  # relative path of the file
    offset: int
    length: int
    items: list[ReadItem]
    raw: SavedTensor | None = None  # a ByteCheckpoint chunk: its raw storage's tensor
    why: str = ""  # why our parse handed it to DCP's reader (said if that one fails too)


class FileSystemReader(_DcpFileSystemReader):  # type: ignore[misc]
    """DCP's ``FileSystemReader`` (same constructor) whose ``read_data`` reads each saved
    byte at most once and only the bytes a rank needs.

    Keyword-only extras: ``thread_count`` (reading threads at most, default
    ``min(4, cpu_count)``; one per ``bytes_per_thread`` to read, default 16 MiB),
    ``whole_item_bytes`` (a saved chunk up to this size is read whole in one ``pread``),
    ``trace_reads`` (record every byte range read in ``stats.ranges``). After each load,
    ``stats`` (:class:`ReadStats`) says what was read."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        _extension_registry: Any = None,
        *,
        thread_count: int | None = None,
        whole_item_bytes: int = WHOLE_ITEM_BYTES,
        bytes_per_thread: int = BYTES_PER_THREAD,
        trace_reads: bool = False,
    ) -> None:
        super().__init__(path, _extension_registry)
        if thread_count is not None and thread_count < 1:
            raise ValueError(f"thread_count must be at least 1, got {thread_count}")
        self.thread_count = thread_count or min(4, os.cpu_count() or 1)
        if bytes_per_thread < 1:
            raise ValueError(f"bytes_per_thread must be at least 1, got {bytes_per_thread}")
        self.whole_item_bytes = whole_item_bytes
        self.bytes_per_thread = bytes_per_thread
        self.trace_reads = trace_reads
        self.stats = ReadStats()
        self._md: Metadata | None = None
        self._kept: LoadPlan | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's ``read_metadata`` through the restricted reader (CKPT-5), not DCP's plain
        ``pickle.load``, which runs whatever a hostile file names; a ByteCheckpoint
        ``.metadata`` (its top-level class says so) as DCP's ``Metadata`` (CKPT-19)."""
        md = read_metadata(os.fspath(self._get_metadata_path(kwargs.get("rank"))))
        meta = getattr(md, "storage_meta", None) or StorageMeta()
        meta.load_id = self.load_id
        md.storage_meta = meta
        return md

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._md = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        plan = super().prepare_local_plan(plan)
        self._kept = None
        if (
            plan.planner_data == PLAN_STAYS_LOCAL
            and plan.storage_data is None
            and type(self).prepare_global_plan is FileSystemReader.prepare_global_plan
        ):
            # Neither the planner's global step nor ours reads the items: keep them here. DCP
            # pickles every rank's plan to the coordinator and back, which for thousands of
            # tensors costs more than reading them (CKPT-18).
            self._kept = plan
            return dataclasses.replace(plan, items=[], storage_data=_KeptPlan(len(plan.items)))
        return plan

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if isinstance(plan.storage_data, _KeptPlan):
            kept = getattr(self, "_kept", None)
            if kept is None or plan.items or len(kept.items) != plan.storage_data.items:
                raise CheckpointReadError(
                    f"{self.path}: the load plan came back without the read items this "
                    f"rank kept ({plan.storage_data.items}); was this reader's "
                    f"prepare_local_plan called for this load?"
                )
            plan, self._kept = kept, None
        self.stats = stats = ReadStats()
        chunks: dict[MetadataIndex, _Chunk] = {}
        fallback: list[ReadItem] = []
        for req in plan.items:
            info = self.storage_data.get(req.storage_index)
            if info is None:
                raise CheckpointReadError(
                    f"{self.path}: tensor '{req.storage_index.fqn}' chunk at offsets "
                    f"{tuple(req.storage_index.offset or ())}: the checkpoint's metadata has no "
                    f"storage entry for it"
                )
            pickled = getattr(info, "tensor_pickle", None)
            # A storage entry that describes its raw bytes itself (a safetensors tensor).
            described = getattr(info, "saved_tensor", None)
            if (
                pickled is None
                and described is None
                and (
                    req.type == LoadItemType.BYTE_IO
                    or getattr(info, "transform_descriptors", None)
                    or not isinstance(getattr(info, "relative_path", None), str)
                )
            ):
                fallback.append(req)
                continue
            c = chunks.get(req.storage_index)
            if c is None:
                c = chunks[req.storage_index] = _Chunk(
                    req.storage_index, info.relative_path, info.offset, info.length, []
                )
                if described is not None:
                    c.raw = described
                elif pickled is not None:
                    # ByteCheckpoint: raw storage bytes, which DCP's reader cannot read
                    c.raw = self._raw_tensor(req.storage_index, info)
            c.items.append(req)
        by_file: dict[str, list[_Chunk]] = {}
        for c in chunks.values():
            by_file.setdefault(c.path, []).append(c)
        tasks: list[tuple[str, int, list[_Chunk]]] = []
        for rel, cs in by_file.items():
            full = str(self.fs.concat_path(self.path, rel))
            size = self._file_size(full, cs)
            cs.sort(key=lambda c: c.offset)
            for batch in _batches(cs):
                tasks.append((full, size, batch))
        state = _Shared(planner, self._expected, stats, self.trace_reads, self.whole_item_bytes)
        span = sum(c.length for c in chunks.values())  # at most this many bytes to read
        threads = min(self.thread_count, len(tasks), max(1, span // self.bytes_per_thread))
        if threads <= 1:
            stats.threads = 1 if tasks else 0
            scratch = _Scratch(state)
            for task in tasks:
                _run_task(state, scratch, *task)
        else:
            stats.threads = threads
            local = threading.local()

            def run(task: tuple[str, int, list[_Chunk]]) -> None:
                scratch = getattr(local, "scratch", None)
                if scratch is None:
                    scratch = local.scratch = _Scratch(state)
                _run_task(state, scratch, *task)

            with ThreadPoolExecutor(stats.threads, thread_name_prefix="dcp-read") as pool:
                futures = [pool.submit(run, t) for t in tasks]
                try:
                    for f in futures:
                        f.result()
                finally:
                    for f in futures:
                        f.cancel()
        why: dict[MetadataIndex, str] = {}
        for c in sorted(state.unsupported, key=lambda c: (c.path, c.offset)):
            fallback += c.items
            why[c.index] = c.why
        stats.chunks = len(chunks) - len(state.unsupported)
        stats.items = len(plan.items) - len(fallback)
        stats.fallback_items = len(fallback)
        for req in fallback:
            self._read_through_dcp(req, planner, why.get(req.storage_index, ""))
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def map_rows(
        self, index: MetadataIndex, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> tuple[torch.Tensor, int, list[tuple[str, int, int]]] | None:
        """The box ``offsets`` + ``lengths`` of saved chunk ``index`` (a run of whole rows of
        it: one dense byte range), as a tensor over a private mapping of the file's bytes;
        with the bytes read (the chunk's header and the data) and every (file, start, stop)
        read, as :attr:`ReadStats.ranges` counts them. None when the chunk is not one this
        reader reads in place (a transform, a ByteCheckpoint or safetensors entry, a box that
        is no dense range): the caller reads it another way.

        Why a mapping and not a read into a new tensor: a new tensor is fresh anonymous memory
        whose every page the kernel zero-fills on first touch, which cost 5x the read itself
        here (0.095 s against 0.020 s for 128 MiB, spec/09-checkpoint.md "Measured"); the
        mapping's pages are the page cache's own. The same checks as a read: a truncated
        file, and bytes that do not hold the tensor the metadata names, raise
        :class:`CheckpointReadError` naming the file, the tensor and the chunk."""
        info = self.storage_data.get(index)
        if (
            info is None
            or getattr(info, "tensor_pickle", None) is not None
            or getattr(info, "saved_tensor", None) is not None
            or getattr(info, "transform_descriptors", None)
            or not isinstance(getattr(info, "relative_path", None), str)
        ):
            return None
        full = str(self.fs.concat_path(self.path, info.relative_path))
        offset, length = int(info.offset), int(info.length)
        try:
            fd = os.open(full, os.O_RDONLY)
        except OSError as e:
            raise CheckpointReadError(
                _where(full, index, f"cannot open the file: {e.strerror}")
            ) from e
        try:
            size = os.fstat(fd).st_size
            if offset + length > size:
                raise truncated(full, index, offset, length, size)
            ranges: list[tuple[str, int, int]] = []

            def read_at(off: int, n: int) -> Any:
                if off < 0 or off + n > length:
                    raise DamagedItem(f"a read of [{off}, {off + n}) outside the item")
                ranges.append((full, offset + off, offset + off + n))
                return read_file_range(fd, offset + off, n)

            try:
                saved = locate_tensor(read_at, length)
            except UnsupportedItem:
                return None
            except (DamagedItem, EOFError, OSError) as e:
                raise CheckpointReadError(_where(full, index, str(e))) from e
            want = self._expected(index)
            if want is not None and (saved.dtype, saved.size) != want:
                raise CheckpointReadError(
                    _where(
                        full,
                        index,
                        f"the saved bytes hold a {saved.dtype} tensor of size {saved.size}, "
                        f"the metadata says {want[0]} of size {want[1]}",
                    )
                )
            lo, hi = saved.element_span(offsets, lengths)
            if hi <= lo or not saved.is_dense(lengths):
                return None
            start = offset + saved.data_offset + lo * saved.itemsize
            n = (hi - lo) * saved.itemsize
            if lo < 0 or hi * saved.itemsize > saved.data_length:
                return None
            base = start - start % mmap.ALLOCATIONGRANULARITY
            try:
                mm = mmap.mmap(fd, start + n - base, offset=base, access=mmap.ACCESS_COPY)
            except (OSError, ValueError):
                return None
        finally:
            os.close(fd)  # a mapping outlives its descriptor
        # The tensor keeps the mapping alive; the mapping is unmapped when the tensor dies. A
        # chunk after another in its file may start at any byte: frombuffer takes that offset
        # (a typed view of a byte tensor would not), and the CPU's copies read it unaligned.
        typed = torch.frombuffer(mm, dtype=saved.dtype, offset=start - base, count=hi - lo)
        ranges.append((full, start, start + n))
        return typed.view(lengths), sum(b - a for _, a, b in ranges), ranges

    def _raw_tensor(self, index: MetadataIndex, info: Any) -> SavedTensor:
        try:
            return raw_tensor(info.tensor_pickle, info.length)
        except (DamagedItem, UnsupportedItem) as e:
            full = str(self.fs.concat_path(self.path, info.relative_path))
            raise CheckpointReadError(
                _where(full, index, f"its saved tensor pickle cannot be read here: {e}")
            ) from e

    def _read_through_dcp(self, req: ReadItem, planner: LoadPlanner, why: str = "") -> None:
        info = self.storage_data[req.storage_index]
        try:
            super().read_data(LoadPlan([req]), planner).wait()
        except Exception as e:
            # What our parse found first (e.g. "the item holds a dict, not a tensor") names the
            # fault; DCP's own error is often an AttributeError from deep inside it.
            found = f"{why}; " if why else ""
            raise CheckpointReadError(
                _where(
                    str(self.fs.concat_path(self.path, getattr(info, "relative_path", "?"))),
                    req.storage_index,
                    f"{found}DCP's reader failed: {type(e).__name__}: {e}",
                )
            ) from e

    def _file_size(self, full: str, cs: list[_Chunk]) -> int:
        try:
            return os.stat(full).st_size
        except OSError as e:
            first = min(cs, key=lambda c: c.offset)
            more = f" (and {len(cs) - 1} more chunks)" if len(cs) > 1 else ""
            raise CheckpointReadError(
                _where(full, first.index, f"cannot open the file: {e.strerror}{more}")
            ) from e

    def _expected(self, index: MetadataIndex) -> tuple[torch.dtype, tuple[int, ...]] | None:
        """The dtype and sizes the metadata gives chunk ``index``, or None when unknown."""
        md = self._md
        smd = md.state_dict_metadata.get(index.fqn) if md is not None else None
        if not isinstance(smd, TensorStorageMetadata):
            return None
        off = tuple(index.offset or ())
        i = index.index
        # The index's own position first: a scan of every chunk per chunk read is quadratic
        # in a tensor's chunks (10,000 of them: 0.5 s a load).
        if i is not None and i < len(smd.chunks) and tuple(smd.chunks[i].offsets) == off:
            return smd.properties.dtype, tuple(smd.chunks[i].sizes)
        for c in smd.chunks:
            if tuple(c.offsets) == off:
                return smd.properties.dtype, tuple(c.sizes)
        return None


def _where(path: str, index: MetadataIndex, what: str) -> str:
    return f"{path}: tensor '{index.fqn}' chunk at offsets {tuple(index.offset or ())}: {what}"


def truncated(
    path: str, index: MetadataIndex, offset: int, length: int, size: int
) -> CheckpointReadError:
    """The error for a chunk whose bytes ``[offset, offset + length)`` end past the file."""
    return CheckpointReadError(
        _where(
            path,
            index,
            f"the file is truncated: the chunk's bytes [{offset}, {offset + length}) end past "
            f"the file's {size} bytes",
        )
    )


def _batches(cs: list[_Chunk]) -> Iterator[list[_Chunk]]:
    batch: list[_Chunk] = []
    size = 0
    for c in cs:
        batch.append(c)
        size += c.length
        if size >= _TASK_BYTES or len(batch) >= _TASK_CHUNKS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


class _Shared:
    """What every reading thread shares: the planner (called under a lock, as planners are
    not promised to be thread-safe) and the counters."""

    def __init__(
        self,
        planner: LoadPlanner,
        expected: Callable[[MetadataIndex], tuple[torch.dtype, tuple[int, ...]] | None],
        stats: ReadStats,
        trace: bool,
        whole_item_bytes: int,
    ) -> None:
        self.planner = planner
        self.whole_item_bytes = whole_item_bytes
        self.expected = expected
        self.stats = stats
        self.trace = trace
        self.lock = threading.Lock()
        self.unsupported: list[_Chunk] = []


class _Scratch:
    """One thread's reusable read buffer: grows to the largest span it is asked for (at most
    one saved chunk) and is never freed while the thread reads."""

    def __init__(self, state: _Shared) -> None:
        self.state = state
        self.buf = torch.empty(0, dtype=torch.uint8)
        self.headers = HeaderCache()

    def get(self, n: int) -> torch.Tensor:
        if n > self.buf.numel():
            grow = n - self.buf.numel()
            self.buf = torch.empty(0, dtype=torch.uint8)
            self.buf = torch.empty(n, dtype=torch.uint8)
            with self.state.lock:
                self.state.stats.buffer_peak += grow
        return self.buf[:n]


def _run_task(state: _Shared, scratch: _Scratch, path: str, size: int, cs: list[_Chunk]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        for c in cs:
            try:
                _read_chunk(state, scratch, fd, path, size, c)
            except UnsupportedItem as e:
                if c.raw is not None:
                    raise CheckpointReadError(_where(path, c.index, str(e))) from e
                # Found before anything was copied: DCP's own path reads it instead.
                c.why = str(e)
                with state.lock:
                    state.unsupported.append(c)
            except CheckpointReadError:
                raise
            except (DamagedItem, EOFError, OSError) as e:
                raise CheckpointReadError(_where(path, c.index, str(e))) from e
    finally:
        os.close(fd)


def _read_chunk(
    state: _Shared, scratch: _Scratch, fd: int, path: str, file_size: int, c: _Chunk
) -> None:
    stats = state.stats
    if c.offset + c.length > file_size:
        raise truncated(path, c.index, c.offset, c.length, file_size)

    def pread(off: int, n: int, into: Any = None) -> Any:
        with state.lock:
            stats.bytes_read += n
            if state.trace:
                stats.ranges.append((path, c.offset + off, c.offset + off + n))
        return read_file_range(fd, c.offset + off, n, into)

    def mapped(off: int, n: int) -> tuple[Any, torch.Tensor] | None:
        """The item's bytes [off, off + n) as a uint8 tensor over a private mapping of the
        file (pages are read when touched), with the mapping to close; None if it cannot."""
        start = c.offset + off
        base = start - start % mmap.ALLOCATIONGRANULARITY
        try:
            mm = mmap.mmap(fd, start + n - base, offset=base, access=mmap.ACCESS_COPY)
        except (OSError, ValueError):
            return None
        with state.lock:
            stats.bytes_read += n
            if state.trace:
                stats.ranges.append((path, start, start + n))
        return mm, torch.frombuffer(mm, dtype=torch.uint8)[start - base :]

    whole: torch.Tensor | None = None
    if c.raw is not None:
        saved = c.raw  # raw storage bytes from the item's first byte (ByteCheckpoint)
        if c.length <= state.whole_item_bytes:
            whole = scratch.get(c.length)
            pread(0, c.length, whole.numpy())
    elif c.length <= state.whole_item_bytes:
        whole = scratch.get(c.length)
        pread(0, c.length, whole.numpy())
        saved = scratch.headers.locate(memoryview(whole.numpy()))  # type: ignore[arg-type]
    else:

        def read_at(off: int, n: int) -> Any:
            if off < 0 or off + n > c.length:
                raise DamagedItem(f"a read of [{off}, {off + n}) outside the item")
            return pread(off, n)

        saved = locate_tensor(read_at, c.length)
    want = state.expected(c.index)
    if want is not None and (saved.dtype, saved.size) != want:
        raise DamagedItem(
            f"the saved bytes hold a {saved.dtype} tensor of size {saved.size}, the metadata "
            f"says {want[0]} of size {want[1]}"
        )
    with state.lock:
        targets = [state.planner.resolve_tensor(r).detach() for r in c.items]
    boxes = [(tuple(r.storage_offsets), tuple(r.lengths)) for r in c.items]
    for t, (_, lengths) in zip(targets, boxes):
        if tuple(t.shape) != lengths:
            raise DamagedItem(f"a read of size {lengths} into a destination of {tuple(t.shape)}")
    if whole is not None:
        data = whole[saved.data_offset : saved.data_offset + saved.data_length]
        for t, (off, lengths) in zip(targets, boxes):
            lo, hi = saved.element_span(off, lengths)
            if hi > lo:
                t.copy_(_strided(data, saved, 0, off, lengths))
    else:
        _read_parts(saved, targets, boxes, scratch, pread, mapped)
    with state.lock:
        for r, t in zip(c.items, targets):
            state.planner.commit_tensor(r, t)


def _strided(
    data: torch.Tensor,
    saved: SavedTensor,
    base: int,
    off: tuple[int, ...],
    lengths: tuple[int, ...],
) -> torch.Tensor:
    """The box ``off`` + ``lengths`` of the saved tensor, from ``data``: its storage's bytes
    from element ``base`` on."""
    typed = data.view(saved.dtype)
    start = saved.storage_offset + sum(o * s for o, s in zip(off, saved.stride)) - base
    # as_strided's offset counts from the storage's start, not from the view's.
    return typed.as_strided(lengths, saved.stride, typed.storage_offset() + start)


def _direct_bytes(t: torch.Tensor, saved: SavedTensor) -> Any:
    """The destination's bytes as a writable buffer when the saved bytes can be read straight
    into it, else None."""
    if (
        t.device.type != "cpu"
        or t.dtype != saved.dtype
        or not t.is_contiguous()
        or t.is_conj()
        or t.is_neg()
        or type(t) is not torch.Tensor
    ):
        return None
    # A contiguous tensor's elements are one run of memory, but its size-1 dims may carry
    # any stride (even 0): flatten by as_strided, not reshape, to get stride 1.
    return t.as_strided((t.numel(),), (1,)).view(torch.uint8).numpy()


def _read_parts(
    saved: SavedTensor,
    targets: list[torch.Tensor],
    boxes: list[tuple[tuple[int, ...], tuple[int, ...]]],
    scratch: _Scratch,
    pread: Callable[..., Any],
    mapped: Callable[[int, int], tuple[Any, torch.Tensor] | None],
) -> None:
    """Fill ``targets`` from a large chunk, reading only the storage bytes they need."""
    size = saved.itemsize
    spans = [saved.element_span(off, n) for off, n in boxes]
    order = sorted(
        (s for s in range(len(spans)) if spans[s][1] > spans[s][0]), key=spans.__getitem__
    )
    # A span overlapping another is served from the shared buffer, so no byte is read twice.
    overlapping: set[int] = set()
    for a, b in itertools.pairwise(order):
        if spans[b][0] < spans[a][1]:
            overlapping |= {a, b}
    direct: dict[int, Any] = {}
    for i in order:
        if i not in overlapping and saved.is_dense(boxes[i][1]):
            dest = _direct_bytes(targets[i], saved)
            if dest is not None:
                direct[i] = dest
    buffered = [i for i in order if i not in direct]
    if buffered:
        # The buffer spans its items' first to last byte: a direct item inside that span is
        # served from it too, or its bytes would be read twice.
        lo = min(spans[i][0] for i in buffered)
        hi = max(spans[i][1] for i in buffered)
        for i in [i for i in direct if spans[i][0] < hi and spans[i][1] > lo]:
            del direct[i]
            buffered.append(i)
    for i, dest in direct.items():
        lo, hi = spans[i]
        pread(saved.data_offset + lo * size, (hi - lo) * size, dest)
    if not buffered:
        return
    lo = min(spans[i][0] for i in buffered)
    hi = max(spans[i][1] for i in buffered)
    if all(_byte_copyable(targets[i], saved) for i in buffered):
        m = mapped(saved.data_offset + lo * size, (hi - lo) * size)
        if m is not None:
            # Straight from the page cache: only the pages holding needed elements are
            # touched, and nothing is staged (CKPT-15).
            mm, raw = m
            try:
                for i in buffered:
                    off, lengths = boxes[i]
                    _byte_view(targets[i]).copy_(_strided_bytes(raw, saved, lo, off, lengths))
            finally:
                del raw, m
                mm.close()
            return
    buf = scratch.get((hi - lo) * size)
    pread(saved.data_offset + lo * size, (hi - lo) * size, buf.numpy())
    for i in buffered:
        off, lengths = boxes[i]
        targets[i].copy_(_strided(buf, saved, lo, off, lengths))


def _byte_copyable(t: torch.Tensor, saved: SavedTensor) -> bool:
    return (
        t.device.type == "cpu"
        and t.dtype == saved.dtype
        and not t.is_conj()
        and not t.is_neg()
        and type(t) is torch.Tensor
        and (t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] == 1)
    )


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` as bytes with a trailing dim of its element size (any strides)."""
    size = t.element_size()
    shape = (*t.shape, size)
    stride = tuple(s * size for s in t.stride()) + (1,)
    flat = t.as_strided((1,), (1,)).view(torch.uint8) if t.numel() else t.view(torch.uint8)
    return flat.as_strided(shape, stride, t.storage_offset() * size)


def _strided_bytes(
    raw: torch.Tensor,
    saved: SavedTensor,
    base: int,
    off: tuple[int, ...],
    lengths: tuple[int, ...],
) -> torch.Tensor:
    """The box ``off`` + ``lengths`` of the saved tensor as bytes (trailing dim of the element
    size), from ``raw``: the storage's bytes from element ``base`` on, at any alignment."""
    size = saved.itemsize
    start = saved.storage_offset + sum(o * s for o, s in zip(off, saved.stride)) - base
    stride = tuple(s * size for s in saved.stride) + (1,)
    return raw.as_strided((*lengths, size), stride, raw.storage_offset() + start * size)
