"""The data a DCP checkpoint's metadata points at: its files and its saved chunks (CKPT-8, CKPT-9).

DCP's ``FileSystemWriter`` stores each saved chunk as the output of ``torch.save`` (a zip
archive) at a byte range of a ``.distcp`` file, and the metadata names that range as
``_StorageInfo(relative_path, offset, length, transform_descriptors)``.
:func:`check_files` checks what can be checked without reading data: every named file exists
and is long enough for every range in it. :func:`read_saved_chunk` reads one chunk: the zip
archive's CRC-32s (``torch.load`` does not check them, so a flipped bit in the tensor's bytes
would load as a wrong value), then ``torch.load(weights_only=True)`` of that range alone, then
the dtype and shape the metadata gives. Memory is one chunk at a time. Nothing is unpickled
beyond what ``weights_only`` allows. torch is imported on first use.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .report import ChunkReport, TensorReport

if TYPE_CHECKING:
    import torch

__all__ = [
    "ChunkDataError",
    "FileProblem",
    "StoredFile",
    "check_files",
    "read_saved_chunk",
    "same_stored_bytes",
]


@dataclass(frozen=True)
class StoredFile:
    """A data file the metadata names: its size on disk (None: missing), the end of the
    furthest byte range the metadata gives in it, and the keys it holds data of."""

    file: str
    size: int | None
    needed: int
    keys: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.size is not None and self.size >= self.needed

    def problem(self) -> str | None:
        if self.size is None:
            return f"{self.file}: missing (it holds data of {_keys(self.keys)})"
        if self.size < self.needed:
            return (
                f"{self.file}: truncated, {self.size} bytes but the metadata names bytes up to "
                f"{self.needed} (it holds data of {_keys(self.keys)})"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "size": self.size,
            "needed": self.needed,
            "ok": self.ok,
            "keys": list(self.keys),
            "problem": self.problem(),
        }


@dataclass(frozen=True)
class FileProblem:
    """A key whose data the metadata places in no file (no storage entry for the chunk)."""

    key: str
    chunk: int | None  # index in the tensor's chunk list; None for a non-tensor value

    def message(self) -> str:
        what = f"chunk #{self.chunk} of tensor" if self.chunk is not None else "value"
        return f"{what} {self.key!r}: the metadata names no file holding its data"


class ChunkDataError(Exception):
    """A saved chunk could not be read as the metadata describes it. ``file``, ``key`` and
    ``offsets`` (the chunk's offsets in the tensor) say which; ``reason`` what is wrong."""

    def __init__(
        self, file: str | None, key: str, offsets: tuple[int, ...], chunk: int, reason: str
    ) -> None:
        super().__init__(
            f"{file or '(no file)'}: tensor {key!r} chunk #{chunk} at offsets {offsets}: {reason}"
        )
        self.file = file
        self.key = key
        self.offsets = offsets
        self.chunk = chunk
        self.reason = reason


def _keys(keys: tuple[str, ...], limit: int = 5) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def check_files(
    root: str | os.PathLike[str],
    tensors: Iterable[TensorReport],
    objects: Iterable[dict[str, Any]],
) -> tuple[list[StoredFile], list[FileProblem]]:
    """Every file the metadata names, with its size on disk against the furthest byte the
    metadata places in it, sorted by name; and the keys whose data is in no file."""
    needed: dict[str, int] = {}
    keys: dict[str, dict[str, None]] = {}
    unlisted: list[FileProblem] = []

    def note(file: str | None, end: int, key: str, chunk: int | None) -> None:
        if file is None:
            unlisted.append(FileProblem(key, chunk))
            return
        needed[file] = max(needed.get(file, 0), end)
        keys.setdefault(file, {})[key] = None

    for t in tensors:
        for i, c in enumerate(t.chunks):
            note(c.file, (c.file_offset or 0) + (c.stored_bytes or 0), t.fqn, i)
    for o in objects:
        note(o["file"], (o.get("file_offset") or 0) + (o.get("stored_bytes") or 0), o["fqn"], None)
    files = []
    for name in sorted(needed):
        try:
            size: int | None = os.stat(Path(root) / name).st_size
        except FileNotFoundError:
            size = None
        files.append(StoredFile(name, size, needed[name], tuple(keys[name])))
    return files, unlisted


class _FileSlice(io.RawIOBase):
    """Bytes ``[start, start + length)`` of an open file, as a seekable stream of its own
    (zipfile and torch.load seek relative to the end of the archive)."""

    def __init__(self, f: IO[bytes], start: int, length: int) -> None:
        super().__init__()
        self._f, self._start, self._len, self._pos = f, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._len}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self._len - self._pos))
        if n == 0:
            return 0
        self._f.seek(self._start + self._pos)
        got = self._f.readinto(memoryview(b)[:n]) or 0  # type: ignore[attr-defined]
        self._pos += got
        return got


def read_saved_chunk(
    root: str | os.PathLike[str], tensor: TensorReport, index: int
) -> torch.Tensor:
    """Chunk ``index`` of ``tensor`` as saved under checkpoint directory ``root``, checked
    against the metadata (CRC-32s, dtype, shape); :class:`ChunkDataError` otherwise."""
    import torch

    c: ChunkReport = tensor.chunks[index]

    def bad(reason: str) -> ChunkDataError:
        return ChunkDataError(c.file, tensor.fqn, c.offsets, index, reason)

    if c.file is None or c.file_offset is None or c.stored_bytes is None:
        raise bad("the metadata names no file holding it")
    path = Path(root) / c.file
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed by the with below; missing is our error)
    except FileNotFoundError:
        raise bad("the file is missing") from None
    with f:
        end = c.file_offset + c.stored_bytes
        size = os.fstat(f.fileno()).st_size
        if size < end:
            raise bad(f"the file is truncated: {size} bytes, the chunk ends at byte {end}")
        stream: IO[bytes] = io.BufferedReader(_FileSlice(f, c.file_offset, c.stored_bytes))
        if c.transforms:
            stream = _untransformed(stream, c.transforms, bad)
        try:
            with zipfile.ZipFile(stream) as z:
                broken = z.testzip()
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise bad(f"not a readable torch.save archive ({e})") from None
        if broken is not None:
            raise bad(f"corrupted: record {broken!r} fails its CRC-32 check")
        stream.seek(0)
        try:
            value = torch.load(stream, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises RuntimeError, UnpicklingError, ...
            raise bad(f"torch.load failed ({type(e).__name__}: {e})") from None
    if not isinstance(value, torch.Tensor):
        raise bad(f"holds a {type(value).__name__}, not a tensor")
    dtype = str(value.dtype).removeprefix("torch.")
    if dtype != tensor.dtype:
        raise bad(f"holds {dtype} data, the metadata says {tensor.dtype}")
    # Two empty chunks may start at one offset (CKPT-1), and DCP files chunks by offset: they
    # share one stored archive, of either's shape. Holding nothing, any empty shape is theirs.
    empty = value.numel() == 0 and 0 in c.sizes
    if tuple(value.shape) != c.sizes and not empty:
        raise bad(f"holds shape {tuple(value.shape)}, the metadata says {c.sizes}")
    return value


def _untransformed(stream: IO[bytes], descriptors: tuple[str, ...], bad: Any) -> IO[bytes]:
    # Compressed (or otherwise transformed) chunks decode through torch's own extension
    # registry, as DCP's reader does; the result is read into memory because the decoders
    # do not seek, and the archive must.
    from torch.distributed.checkpoint._extension import (
        ExtensionRegistry,
        StreamTransformExtension,
    )

    try:
        extensions = ExtensionRegistry().from_descriptor_list(descriptors)
        for ex in extensions:
            if isinstance(ex, StreamTransformExtension):
                stream = ex.transform_from(stream)
        return io.BytesIO(stream.read())
    except Exception as e:
        raise bad(f"cannot decode its transforms {list(descriptors)} ({e})") from None


def same_stored_bytes(
    root_a: str | os.PathLike[str],
    a: dict[str, Any],
    root_b: str | os.PathLike[str],
    b: dict[str, Any],
    block: int = 1 << 20,
) -> bool:
    """Whether two non-tensor values (``object_reports`` entries) are stored as the same bytes,
    compared a block at a time; nothing is unpickled. An unreadable side raises ``OSError``
    naming its file."""
    sides = []
    for root, o in ((root_a, a), (root_b, b)):
        if o.get("file") is None or o.get("file_offset") is None or o.get("stored_bytes") is None:
            raise FileNotFoundError(f"value {o['fqn']!r}: the metadata names no file holding it")
        sides.append((Path(root) / o["file"], int(o["file_offset"]), int(o["stored_bytes"])))
    (pa, oa, na), (pb, ob, nb) = sides
    if na != nb:
        return False
    with open(pa, "rb") as fa, open(pb, "rb") as fb:
        fa.seek(oa)
        fb.seek(ob)
        left = na
        while left > 0:
            n = min(block, left)
            xa, xb = fa.read(n), fb.read(n)
            if len(xa) != n or len(xb) != n:
                short = pa if len(xa) != n else pb
                raise OSError(f"{short}: truncated, value {a['fqn']!r} runs past its end")
            if xa != xb:
                return False
            left -= n
    return True
