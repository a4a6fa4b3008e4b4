"""Where the raw bytes of a tensor sit inside a DCP ``.distcp`` file (CKPT-13).

DCP's ``FileSystemWriter`` (torch 2.13, ``SerializationFormat.TORCH_SAVE``) writes each saved
chunk as one ``torch.save`` of a CPU tensor whose storage holds exactly its elements, at the
byte range ``_StorageInfo(relative_path, offset, length)`` of a file. ``torch.save`` writes a
stored (uncompressed) zip archive: ``<prefix>/data.pkl`` (the tensor's pickle: dtype, size,
stride, storage offset and the storage's key), then ``<prefix>/data/<key>`` (the storage's raw
bytes, 64-byte aligned), then the central directory. Its local headers use data descriptors
(their sizes are zero), so the sizes and offsets come from the central directory at the end.

:func:`locate_tensor` reads only that directory and the pickle, through a ``read_at(offset,
size)`` callable relative to the item's start, so a tool can then read any byte sub-range of
the storage itself. The pickle is read with an allow-list (torch's two tensor rebuild helpers,
storage classes, dtypes, ``OrderedDict``); anything else, a compressed entry or a tensor with
extra state (conjugate or negative bit, a subclass) is :class:`UnsupportedItem`: the caller
reads it with ``torch.load`` instead. Bytes that cannot be what ``torch.save`` wrote raise
:class:`DamagedItem`.

ByteCheckpoint writes no archive: the item is the tensor's raw storage bytes, and the tensor's
pickle sits in the metadata (``RawTensorStorage.tensor_pickle``). :func:`raw_tensor` reads that
pickle with the same allow-list and places the storage at the item's first byte (CKPT-19).
"""

from __future__ import annotations

import functools
import io
import pickle
import struct
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "DamagedItem",
    "HeaderCache",
    "SavedTensor",
    "UnsupportedItem",
    "locate_tensor",
    "raw_tensor",
    "read_file_range",
]

ReadAt = Callable[[int, int], "bytes | memoryview"]

_EOCD = struct.Struct("<4s4H2LH")  # end of central directory (22 bytes)
_EOCD64_LOCATOR = struct.Struct("<4sLQL")  # 20 bytes
_EOCD64 = struct.Struct("<4sQ2H2L4Q")  # 56 bytes
_CENTRAL = struct.Struct("<4s6H3L5H2L")  # one central directory entry (46 bytes)
_LOCAL = struct.Struct("<4s5H3L2H")  # one local file header (30 bytes)
# Enough of the item's end to hold torch's central directory in one read (7 entries).
TAIL_BYTES = 4096


class UnsupportedItem(Exception):
    """The item is not a plain ``torch.save`` of one tensor this module can read in place."""


class DamagedItem(ValueError):
    """The item's bytes cannot be the ``torch.save`` archive DCP wrote there."""


@dataclass(frozen=True)
class SavedTensor:
    """A saved tensor as the item's pickle describes it, and where its storage's bytes lie
    (``data_offset`` and ``data_length`` in bytes from the item's start)."""

    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int  # in elements
    itemsize: int
    data_offset: int
    data_length: int

    def element_span(self, offsets: tuple[int, ...], lengths: tuple[int, ...]) -> tuple[int, int]:
        """The storage elements ``[lo, hi)`` that hold the box ``offsets`` + ``lengths`` of
        the tensor (empty box: ``lo == hi``)."""
        if any(n == 0 for n in lengths):
            return 0, 0
        lo = self.storage_offset + sum(o * s for o, s in zip(offsets, self.stride))
        hi = lo + sum((n - 1) * s for n, s in zip(lengths, self.stride)) + 1
        return lo, hi

    def is_dense(self, lengths: tuple[int, ...]) -> bool:
        """Whether a box of ``lengths`` is one contiguous row-major run of the storage."""
        expected = 1
        for n, s in zip(reversed(lengths), reversed(self.stride)):
            if n == 1:
                continue
            if s != expected:
                return False
            expected *= n
        return True


def read_file_range(fd: int, offset: int, size: int, into: Any = None) -> Any:
    """``size`` bytes of file ``fd`` from ``offset``, read into the writable buffer ``into``
    when given (returned), else as new ``bytes``; a short file raises ``EOFError``."""
    import os

    if into is None:
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise EOFError(f"{len(data)} of {size} bytes at offset {offset}")
        return data
    view = memoryview(into).cast("B")
    done = 0
    while done < size:
        n = os.preadv(fd, [view[done:size]], offset + done)
        if n <= 0:
            raise EOFError(f"{done} of {size} bytes at offset {offset}")
        done += n
    return into


def locate_tensor(read_at: ReadAt, length: int) -> SavedTensor:
    """The tensor saved in the ``length``-byte item that ``read_at`` reads, and where its
    storage bytes are. Raises :class:`UnsupportedItem` or :class:`DamagedItem`."""
    entries = _central_directory(read_at, length)
    pkl = next((e for name, e in entries.items() if name.endswith("/data.pkl")), None)
    if pkl is None:
        raise UnsupportedItem("no data.pkl in the archive")
    prefix = next(name for name, e in entries.items() if e is pkl)[: -len("data.pkl")]
    rec = _parse_pickle(bytes(read_at(_data_start(read_at, length, pkl), pkl[1])))
    key, dtype, itemsize, numel_bytes, storage_offset, size, stride = rec
    entry = entries.get(f"{prefix}data/{key}")
    if entry is None:
        raise DamagedItem(f"the pickle names storage {key!r}, which the archive lacks")
    start, n = _data_start(read_at, length, entry), entry[1]
    if n != numel_bytes:
        raise DamagedItem(f"storage {key!r} holds {n} bytes, its pickle says {numel_bytes}")
    saved = SavedTensor(dtype, size, stride, storage_offset, itemsize, start, n)
    lo, hi = saved.element_span((0,) * len(size), size)
    if hi * itemsize > n or lo < 0:
        raise DamagedItem(f"a tensor of size {size} stride {stride} overruns its {n}-byte storage")
    return saved


def raw_tensor(tensor_pickle: bytes, length: int) -> SavedTensor:
    """The tensor a ByteCheckpoint item of ``length`` raw storage bytes holds, as its pickle
    (saved in the metadata) describes it: the storage starts at the item's first byte. Raises
    :class:`UnsupportedItem` or :class:`DamagedItem` as :func:`locate_tensor` does."""
    _key, dtype, itemsize, numel_bytes, storage_offset, size, stride = _parse_pickle(
        bytes(tensor_pickle)
    )
    if numel_bytes != length:
        raise DamagedItem(
            f"the saved tensor's storage holds {numel_bytes} bytes, the metadata gives its "
            f"item {length}"
        )
    saved = SavedTensor(dtype, size, stride, storage_offset, itemsize, 0, numel_bytes)
    lo, hi = saved.element_span((0,) * len(size), size)
    if hi * itemsize > numel_bytes or lo < 0:
        raise DamagedItem(
            f"a tensor of size {size} stride {stride} overruns its {numel_bytes}-byte storage"
        )
    return saved


class HeaderCache:
    """:func:`locate_tensor` for whole items in memory, remembering what it found: the chunks
    of one shape and dtype are archives whose bytes up to the storage's are equal (the local
    headers carry no sizes or checksums) and whose end records are equal, so an item whose
    length, end record and leading bytes match a parsed one has its storage at the same place.
    Only the central directory, which holds the data's checksum, differs."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, bytes], list[tuple[bytes, SavedTensor]]] = {}

    def locate(self, item: memoryview) -> SavedTensor:
        length = len(item)
        key = (length, bytes(item[max(0, length - _EOCD.size) :]))
        known = self._seen.get(key)
        if known is not None:
            for prefix, saved in known:
                # a copy and a bytes compare: memoryview's == goes byte by byte (4 us for
                # 700 bytes, against 1 us; thousands of chunks a load)
                if item[: len(prefix)].tobytes() == prefix:
                    return saved
        saved = locate_tensor(lambda off, n: _within(item, off, n), length)
        entries = self._seen.setdefault(key, [])
        if len(entries) < 8:
            entries.append((bytes(item[: saved.data_offset]), saved))
        return saved


def _within(item: memoryview, off: int, n: int) -> memoryview:
    if off < 0 or off + n > len(item):
        raise DamagedItem(f"a read of [{off}, {off + n}) outside the {len(item)}-byte item")
    return item[off : off + n]


def _central_directory(read_at: ReadAt, length: int) -> dict[str, tuple[int, int]]:
    """name -> (local header offset, stored size) of every stored entry of the archive."""
    if length < _EOCD.size:
        raise DamagedItem(f"{length} bytes cannot hold a zip archive")
    # torch writes no archive comment: the end record is the last 22 bytes. Read just those
    # (then the directory), so that no byte of the storage is read for the headers.
    tail_start = length - _EOCD.size
    tail = bytes(read_at(tail_start, _EOCD.size))
    at = 0
    if tail[:4] != b"PK\x05\x06":
        tail_start = length - min(length, TAIL_BYTES)
        tail = bytes(read_at(tail_start, length - tail_start))
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or at + _EOCD.size > len(tail):
            # Not torch.save's zip format (or a damaged one): torch.load decides which.
            raise UnsupportedItem("no zip end record in the item's last bytes")
    _, _, _, _, count, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, at)
    if count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        loc = tail_start + at - _EOCD64_LOCATOR.size
        if loc < 0:
            raise DamagedItem("a zip64 archive without its zip64 locator")
        locator = bytes(read_at(loc, _EOCD64_LOCATOR.size))
        if locator[:4] != b"PK\x06\x07":
            raise DamagedItem("a zip64 archive without its zip64 locator")
        _, _, eocd64_at, _ = _EOCD64_LOCATOR.unpack(locator)
        if eocd64_at + _EOCD64.size > length:
            raise DamagedItem("the zip64 end record lies past the item")
        rec = bytes(read_at(eocd64_at, _EOCD64.size))
        if rec[:4] != b"PK\x06\x06":
            raise DamagedItem("a zip64 archive without its zip64 end record")
        fields = _EOCD64.unpack(rec)
        count, cd_size, cd_offset = fields[7], fields[8], fields[9]
    if cd_offset + cd_size > length:
        raise DamagedItem(f"the zip directory ends at {cd_offset + cd_size}, past the item")
    if cd_offset >= tail_start:
        cd = tail[cd_offset - tail_start : cd_offset - tail_start + cd_size]
    else:
        cd = bytes(read_at(cd_offset, cd_size))
    out: dict[str, tuple[int, int]] = {}
    pos = 0
    for _ in range(count):
        if cd[pos : pos + 4] != b"PK\x01\x02" or pos + _CENTRAL.size > len(cd):
            raise DamagedItem("a broken zip directory entry")
        f = _CENTRAL.unpack_from(cd, pos)
        method, csize, nlen, elen, clen, lh = f[4], f[8], f[10], f[11], f[12], f[16]
        name = cd[pos + 46 : pos + 46 + nlen].decode("utf-8", "replace")
        extra = cd[pos + 46 + nlen : pos + 46 + nlen + elen]
        if csize == 0xFFFFFFFF or lh == 0xFFFFFFFF or f[9] == 0xFFFFFFFF:
            csize, lh = _zip64_sizes(extra, f[9], csize, lh)
        if method != 0:
            raise UnsupportedItem(f"entry {name!r} is compressed (method {method})")
        out[name] = (lh, csize)
        pos += 46 + nlen + elen + clen
    return out


def _zip64_sizes(extra: bytes, usize: int, csize: int, lh: int) -> tuple[int, int]:
    try:
        return _zip64_fields(extra, usize, csize, lh)
    except (struct.error, IndexError) as e:  # a field shorter than its tag says
        raise DamagedItem(f"a broken zip64 extra field ({e})") from e


def _zip64_fields(extra: bytes, usize: int, csize: int, lh: int) -> tuple[int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            vals = list(struct.unpack_from(f"<{n // 8}Q", extra, pos + 4))
            if usize == 0xFFFFFFFF:
                vals.pop(0)
            if csize == 0xFFFFFFFF:
                csize = vals.pop(0)
            if lh == 0xFFFFFFFF:
                lh = vals.pop(0)
            return csize, lh
        pos += 4 + n
    raise DamagedItem("a zip64 entry without its zip64 sizes")


def _data_start(read_at: ReadAt, length: int, entry: tuple[int, int]) -> int:
    lh, csize = entry
    head = bytes(read_at(lh, _LOCAL.size))
    if head[:4] != b"PK\x03\x04":
        raise DamagedItem(f"no zip entry header at offset {lh}")
    f = _LOCAL.unpack(head)
    start: int = lh + _LOCAL.size + f[9] + f[10]
    if start + csize > length:
        raise DamagedItem(f"an entry of {csize} bytes at {start} runs past the item's end")
    return start


_Record = tuple[str, "torch.dtype", int, int, int, tuple[int, ...], tuple[int, ...]]


class _Ref:
    __slots__ = ("dtype", "key", "numel")

    def __init__(self, key: str, dtype: Any, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel


class _Rebuilt:
    __slots__ = ("args",)

    def __init__(self, *args: Any) -> None:
        self.args = args


def _rebuild_v2(*args: Any) -> _Rebuilt:
    return _Rebuilt("v2", *args)


def _rebuild_v3(*args: Any) -> _Rebuilt:
    return _Rebuilt("v3", *args)


class _TensorUnpickler(pickle.Unpickler):
    """Unpickles the ``data.pkl`` of a saved tensor without running anything it names."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_v2
        if module == "torch._utils" and name == "_rebuild_tensor_v3":
            return _rebuild_v3
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module == "torch.storage" and name == "UntypedStorage":
            return "untyped"
        if module == "torch":
            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype):
                return value
            dtype = _storage_dtypes().get(name)
            if dtype is not None:
                return dtype
        raise UnsupportedItem(f"the tensor's pickle names {module}.{name}")

    def persistent_load(self, pid: Any) -> _Ref:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise UnsupportedItem(f"unknown persistent id {pid!r}")
        _, kind, key, _location, numel = pid
        return _Ref(str(key), None if kind == "untyped" else kind, int(numel))


@functools.cache
def _storage_dtypes() -> dict[str, Any]:
    from torch.storage import _dtype_to_storage_type_map

    return {name: dtype for dtype, name in _dtype_to_storage_type_map().items()}


@functools.lru_cache(maxsize=256)
def _parse_pickle(data: bytes) -> _Record:
    """(key, dtype, itemsize, storage bytes, storage offset, size, stride) of the pickled
    tensor; the pickles of same-shaped chunks are equal, so they are parsed once."""
    import torch

    try:
        obj = _TensorUnpickler(io.BytesIO(data)).load()
    except UnsupportedItem:
        raise
    except Exception as e:
        raise DamagedItem(f"unreadable tensor pickle ({type(e).__name__}: {e})") from e
    if not isinstance(obj, _Rebuilt):
        raise UnsupportedItem(f"the item holds a {type(obj).__name__}, not a tensor")
    version, *args = obj.args
    if version == "v2":
        if len(args) not in (6, 7):
            raise UnsupportedItem("unexpected _rebuild_tensor_v2 arguments")
        ref, offset, size, stride, _grad, hooks = args[:6]
        meta = args[6] if len(args) == 7 else None
        dtype = ref.dtype if isinstance(ref, _Ref) else None
    else:
        if len(args) not in (7, 8):
            raise UnsupportedItem("unexpected _rebuild_tensor_v3 arguments")
        ref, offset, size, stride, _grad, hooks, dtype = args[:7]
        meta = args[7] if len(args) == 8 else None
    if not isinstance(ref, _Ref) or not isinstance(dtype, torch.dtype):
        raise UnsupportedItem("the tensor's storage is not a plain storage")
    if hooks or meta:
        # Conjugate / negative bits or hooks: torch.load applies them; we would not.
        raise UnsupportedItem(f"the tensor carries extra state {meta or hooks!r}")
    if dtype in (torch.qint8, torch.qint32, torch.quint8, torch.quint4x2, torch.quint2x4):
        raise UnsupportedItem(f"quantized dtype {dtype}")
    if not (_ints(size) and _ints(stride) and len(size) == len(stride) and _int(offset)):
        # a damaged pickle can still load, as other objects in those places
        raise DamagedItem(
            f"the tensor pickle's storage offset, size and stride are not integers of one "
            f"rank each ({offset!r}, {size!r}, {stride!r})"
        )
    itemsize = dtype.itemsize
    nbytes = ref.numel if ref.dtype is None else ref.numel * itemsize
    return (
        ref.key,
        dtype,
        itemsize,
        nbytes,
        int(offset),
        tuple(int(x) for x in size),
        tuple(int(x) for x in stride),
    )


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _ints(xs: object) -> bool:
    return isinstance(xs, tuple) and all(map(_int, xs))
