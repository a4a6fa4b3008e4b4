"""A Hugging Face safetensors checkpoint as DCP's ``Metadata`` (CKPT-22).

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON (a dict
of tensor name -> ``{"dtype", "shape", "data_offsets"}``, plus an optional ``__metadata__``
dict of strings), then the data: each tensor stored contiguous, row-major, little-endian, at
bytes ``[8 + N + begin, 8 + N + end)`` of the file. A sharded checkpoint is a directory of such
files with an index JSON (``model.safetensors.index.json``: ``{"metadata": {...},
"weight_map": {tensor name: file name}}``).

The collective load reads metadata on one rank and broadcasts it, so the work is split in two:
:func:`read_headers` (the one rank: the index and every file's header and size, checked and
returned as canonical JSON bytes, no torch needed) and :func:`metadata_from_headers` (every
rank: the same bytes checked again and turned into DCP's ``Metadata``, one chunk per tensor,
each stored as a :class:`SafetensorsStorage` whose raw byte range and
:class:`~shardspec.checkpoint.dcp_files.SavedTensor` tell a reader where the tensor lies).
Checking again on every rank costs little (headers only) and means a blob built by hand or
damaged on the way is held to the same rules as a file.

What is refused is what the format refuses (the ``safetensors`` package's own validation),
stated with the file and the tensor: a header length past the file or over the format's
100 MB limit, a header that is not a JSON dict (or repeats a key: the package silently keeps
the last one), an unknown dtype, a shape whose bytes do not match the tensor's byte range,
ranges past the data, overlapping ranges, data bytes no tensor holds (the format forbids holes
and trailing bytes, so that a file cannot hide a second payload). One deliberate difference:
a zero-size tensor's empty range may sit anywhere in the data (an empty range holds nothing
and overlaps nothing, BOX-2), where the package wants it at a boundary between tensors.
Between files: every file the index names exists, every tensor sits in the file the index
assigns it, and no tensor name is in two files.

DCP's Hugging Face format (torch's ``HuggingFaceStorageWriter`` with ``save_distributed``, as
transformers' distributed checkpoints are written) is a directory of such files, one a rank
(``shard-00001-model-00001-of-00001.safetensors``), no index, each file's ``__metadata__``
holding ``DCP_SHARDING_INFO``: JSON of tensor name -> ``{"saved_offsets": [...]}``, where
that file's tensor lies in the checkpointed one (CKPT-28). A tensor may then be in several
files, one chunk each. The format records no global shape: it is the chunks' bounding box, and
the chunks must hold each of its elements exactly once (CKPT-1), so that a lost file inside
the box is refused here and a lost file at its end shows as a shape the loader refuses.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from .dcp_files import SavedTensor

if TYPE_CHECKING:
    import torch
    from torch.distributed.checkpoint.metadata import Metadata

__all__ = [
    "DTYPE_BITS",
    "MAX_HEADER_BYTES",
    "SafetensorsError",
    "SafetensorsStorage",
    "data_dir",
    "is_safetensors",
    "metadata_from_headers",
    "read_headers",
    "torch_dtype",
]

SUFFIX = ".safetensors"
INDEX_SUFFIX = ".safetensors.index.json"
# safetensors' own limit (MAX_HEADER_SIZE in its Rust source): a bigger header is refused
# before it is read, so a hostile length cannot make a rank allocate gigabytes.
MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"
# DCP's Hugging Face format (HuggingFaceStorageWriter, save_distributed): each file's
# __metadata__ places its tensors in the checkpointed ones (CKPT-28)
SHARDING_INFO_KEY = "DCP_SHARDING_INFO"
SAVED_OFFSETS_KEY = "saved_offsets"
_DCP_METADATA_FILE = ".metadata"
_HEADER_LEN = struct.Struct("<Q")

# Every dtype of the safetensors format (its Rust `Dtype` enum, safetensors 0.8) and its size
# in bits: the byte length of a tensor is prod(shape) * bits / 8, which must be whole.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

# The torch dtype (by attribute name, looked up when torch is imported) of each format dtype
# torch has one for. F4 is torch's float4_e2m1fn_x2, two values per byte, so its torch shape
# halves the last dim (as safetensors.torch loads it); F6_* have no torch dtype.
_TORCH_DTYPE_NAMES: dict[str, str] = {
    "BOOL": "bool",
    "F4": "float4_e2m1fn_x2",
    "U8": "uint8",
    "I8": "int8",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "C64": "complex64",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
}
_PACKED_X2 = "F4"


class SafetensorsError(ValueError):
    """A safetensors checkpoint that is not what the format allows; the message names the file
    (and the tensor, where there is one) and what is wrong."""


@dataclass(frozen=True)
class SafetensorsStorage:
    """Where a safetensors checkpoint keeps one tensor: bytes ``[offset, offset + length)`` of
    ``relative_path`` (relative to :func:`data_dir`; ``offset`` counts from the file's first
    byte, header included), holding ``saved_tensor``: contiguous, row-major, little-endian, its
    storage at the range's first byte. The field names are those of DCP's ``_StorageInfo``."""

    relative_path: str
    offset: int
    length: int
    saved_tensor: SavedTensor


@dataclass(frozen=True)
class _Tensor:
    """One tensor entry of a header, checked."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # in bytes from the data's start
    end: int
    # where the tensor lies in its checkpointed tensor (DCP's Hugging Face format, CKPT-28);
    # None: the file holds the whole tensor
    offsets: tuple[int, ...] | None = None


def data_dir(path: str | os.PathLike[str]) -> Path:
    """The directory the relative paths of a safetensors checkpoint at ``path`` (a directory
    or one ``.safetensors`` file) are relative to. Decided by the name (a directory named
    ``*.safetensors`` aside), so that a rank that cannot see the file gets the same answer."""
    p = Path(path)
    return p.parent if p.name.endswith(SUFFIX) and not p.is_dir() else p


def is_safetensors(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a safetensors checkpoint: a ``.safetensors`` file, or a directory
    with a ``*.safetensors.index.json`` or ``*.safetensors`` files and no DCP ``.metadata``
    (a DCP checkpoint that also holds safetensors files is read as DCP)."""
    p = Path(path)
    if p.is_file():
        return p.name.endswith(SUFFIX)
    if not p.is_dir() or (p / _DCP_METADATA_FILE).exists():
        return False
    return any(
        (c.name.endswith(INDEX_SUFFIX) or c.name.endswith(SUFFIX)) and c.is_file()
        for c in p.iterdir()
    )


def read_headers(path: str | os.PathLike[str]) -> bytes:
    """The checkpoint's index and every file's header and size, checked, as canonical JSON
    bytes (the one rank's job; every rank then calls :func:`metadata_from_headers`):
    ``{"files": {relative name: {"data_start", "file_size", "header"}}, "weight_map": {tensor
    name: relative name} or null}``. Raises :class:`SafetensorsError` naming the file (and
    tensor) for anything the format does not allow."""
    root = data_dir(path)
    weight_map, names = _files_of(Path(path))
    files: dict[str, dict[str, Any]] = {}
    for rel in names:
        named_by = ""
        if weight_map is not None:
            some = sorted(k for k, v in weight_map.items() if v == rel)
            more = f" and {len(some) - 1} more" if len(some) > 1 else ""
            named_by = f"the index assigns it tensor {some[0]!r}{more}"
        files[rel] = _read_file(root, rel, named_by)
    blob: dict[str, Any] = {"files": files, "weight_map": weight_map}
    _check_blob(blob, root)
    return json.dumps(blob, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def metadata_from_headers(blob: bytes, path: str | os.PathLike[str]) -> Metadata:
    """DCP's ``Metadata`` of the checkpoint at ``path`` from :func:`read_headers`'s bytes
    (every rank's step): each tensor one chunk covering it, or, in DCP's Hugging Face format,
    a chunk per file that holds it at the offsets the file gives and the chunks' bounding box
    as its shape (CKPT-28); each chunk stored as a :class:`SafetensorsStorage`. The bytes are
    checked as :func:`read_headers` checks a file; a tensor whose dtype torch cannot hold, or
    whose chunks disagree on dtype or dims, leave an element of the box in no chunk or hold
    one twice, raises :class:`SafetensorsError`."""
    import torch
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    root = data_dir(path)
    try:
        parsed = json.loads(bytes(blob), parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise SafetensorsError(f"{path}: the broadcast headers are not JSON ({e})") from e
    by_name: dict[str, list[tuple[str, int, _Tensor]]] = {}
    for entry in sorted(_check_blob(parsed, root), key=lambda x: (x[2].name, x[0])):
        by_name.setdefault(entry[2].name, []).append(entry)
    sdm: dict[str, Any] = {}
    storage: dict[Any, SafetensorsStorage] = {}
    for name, entries in by_name.items():
        dtype, chunks = None, []
        for rel, data_start, t in entries:
            where = f"{root / rel}: tensor {name!r}"
            this = torch_dtype(t.dtype, where=where)
            if dtype is not None and this != dtype:
                raise SafetensorsError(
                    f"{where}: {t.dtype}, where {root / entries[0][0]} holds it as "
                    f"{entries[0][2].dtype}"
                )
            dtype = this
            shape = _torch_shape(t, where)
            offsets = t.offsets if t.offsets is not None else (0,) * len(shape)
            chunks.append((rel, offsets, shape))
            length = t.end - t.begin
            saved = SavedTensor(
                dtype=this,
                size=shape,
                stride=_contiguous_stride(shape),
                storage_offset=0,
                itemsize=this.itemsize,
                data_offset=0,
                data_length=length,
            )
            storage[MetadataIndex(name, list(offsets), len(chunks) - 1)] = SafetensorsStorage(
                rel, data_start + t.begin, length, saved
            )
        assert dtype is not None
        size = _bounding_size(name, chunks, root)
        sdm[name] = TensorStorageMetadata(
            TensorProperties(dtype=dtype),
            torch.Size(size),
            [
                ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(n))
                for _, o, n in chunks
            ],
        )
    return Metadata(state_dict_metadata=sdm, storage_data=storage)


def _bounding_size(
    name: str, chunks: list[tuple[str, tuple[int, ...], tuple[int, ...]]], root: Path
) -> tuple[int, ...]:
    """The shape of a tensor stored as ``chunks`` (file, offsets, sizes): DCP's Hugging Face
    format records none, so it is the chunks' bounding box, and the chunks must hold each of
    its elements once (CKPT-28; CKPT-1's check, its culprits named by file)."""
    from .chunks import ChunkError, check_chunks

    ndims = {len(o) for _, o, _ in chunks}
    if len(ndims) > 1:
        shown = ", ".join(f"{root / f} at {list(o)}" for f, o, _ in chunks)
        raise SafetensorsError(f"tensor {name!r}: its chunks differ in dims ({shown})")
    size = tuple(max((o[d] + n[d] for _, o, n in chunks), default=0) for d in range(ndims.pop()))
    if len(chunks) == 1 and chunks[0][1] == (0,) * len(size):
        return size
    try:
        check_chunks(name, size, [(o, n) for _, o, n in chunks])
    except ChunkError as e:
        culprits = ", ".join(
            f"#{i} in {root / chunks[i][0]} at {list(chunks[i][1])} of {list(chunks[i][2])}"
            for i in e.chunks
            if 0 <= i < len(chunks)
        )
        more = f"; chunks {culprits}" if culprits else ""
        raise SafetensorsError(
            f"{e}: the format records no shape, so it is the chunks' bounding box{more}"
        ) from e
    return size


def torch_dtype(name: str, *, where: str = "") -> torch.dtype:
    """The torch dtype of the format's dtype string ``name`` (``F4`` is torch's two-per-byte
    ``float4_e2m1fn_x2``); one torch has none for, or an unknown one, raises
    :class:`SafetensorsError` prefixed with ``where``."""
    import torch

    prefix = f"{where}: " if where else ""
    if name not in DTYPE_BITS:
        raise SafetensorsError(f"{prefix}unknown dtype {name!r} (known: {', '.join(DTYPE_BITS)})")
    attr = _TORCH_DTYPE_NAMES.get(name)
    dtype = getattr(torch, attr, None) if attr is not None else None
    if not isinstance(dtype, torch.dtype):
        raise SafetensorsError(
            f"{prefix}dtype {name} has no torch dtype in torch {torch.__version__}"
        )
    return dtype


# ---- reading (one rank) ----


def _files_of(p: Path) -> tuple[dict[str, str] | None, list[str]]:
    """(the index's weight_map or None, the relative names of the files to read)."""
    if p.is_file():
        if not p.name.endswith(SUFFIX):
            raise SafetensorsError(f"{p}: not a {SUFFIX} file")
        return None, [p.name]
    if not p.is_dir():
        raise SafetensorsError(f"{p}: no such file or directory")
    if (p / _DCP_METADATA_FILE).exists():
        raise SafetensorsError(f"{p}: holds a DCP {_DCP_METADATA_FILE} file; read it as DCP")
    indexes = sorted(c.name for c in p.iterdir() if c.name.endswith(INDEX_SUFFIX) and c.is_file())
    if len(indexes) > 1:
        raise SafetensorsError(
            f"{p}: {len(indexes)} index files ({', '.join(indexes)}); which one is the "
            "checkpoint is ambiguous"
        )
    if indexes:
        weight_map = _read_index(p / indexes[0])
        return weight_map, sorted(set(weight_map.values()))
    # No index: every file of the directory is part of it (torch's HuggingFaceStorageReader
    # reads the same set).
    names = sorted(c.name for c in p.iterdir() if c.name.endswith(SUFFIX) and c.is_file())
    if not names:
        raise SafetensorsError(f"{p}: no {SUFFIX} file and no *{INDEX_SUFFIX}")
    return None, names


def _read_index(index: Path) -> dict[str, str]:
    try:
        raw = index.read_bytes()
    except OSError as e:
        raise SafetensorsError(f"{index}: cannot be read ({e.strerror})") from e
    doc = _parse_json(raw, str(index), "index")
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise SafetensorsError(f'{index}: not an index (a JSON dict with a "weight_map" dict)')
    weight_map: dict[str, str] = {}
    for name, rel in doc["weight_map"].items():
        if not isinstance(rel, str):
            raise SafetensorsError(
                f"{index}: the weight_map gives tensor {name!r} the file {rel!r}, not a file name"
            )
        weight_map[name] = rel
    return weight_map


def _read_file(root: Path, rel: str, named_by: str) -> dict[str, Any]:
    """``{"data_start", "file_size", "header"}`` of one file: its header read, not checked;
    ``named_by`` says why the file is expected, for the error when it is missing."""
    f = root / rel
    _check_relative(rel, f"{root}: the file name {rel!r}")
    try:
        with open(f, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(_HEADER_LEN.size)
            if len(head) < _HEADER_LEN.size:
                raise SafetensorsError(f"{f}: {size} bytes, shorter than the 8-byte header length")
            (n,) = _HEADER_LEN.unpack(head)
            # Both limits before reading: the length is untrusted.
            if n > MAX_HEADER_BYTES:
                raise SafetensorsError(
                    f"{f}: header length {n} is over the format's limit of {MAX_HEADER_BYTES} bytes"
                )
            if _HEADER_LEN.size + n > size:
                raise SafetensorsError(
                    f"{f}: header length {n} runs past the end of the {size}-byte file"
                )
            raw = fh.read(n)
    except FileNotFoundError as e:
        raise SafetensorsError(f"{f}: missing ({named_by or 'no such file'})") from e
    except OSError as e:
        raise SafetensorsError(f"{f}: cannot be read ({e.strerror})") from e
    if len(raw) != n:  # the file shrank while being read
        raise SafetensorsError(f"{f}: header length {n} runs past the end of the file")
    header = _parse_json(raw, str(f), "header")
    return {"data_start": _HEADER_LEN.size + n, "file_size": size, "header": header}


def _parse_json(raw: bytes, where: str, what: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(f"{where}: the {what} is not UTF-8 ({e})") from e
    try:
        return json.loads(
            text, object_pairs_hook=_no_duplicate_keys, parse_constant=_refuse_constant
        )
    except _DuplicateKey as e:
        raise SafetensorsError(f"{where}: the {what} holds the key {e.key!r} twice") from None
    except ValueError as e:
        raise SafetensorsError(f"{where}: the {what} is not JSON ({e})") from e


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of two equal keys (and so does safetensors): a header naming a
    # tensor twice would silently describe another tensor than one of its readers sees.
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _refuse_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity, which JSON does not.
    raise ValueError(f"{name} is not JSON")


def _check_relative(rel: str, where: str) -> None:
    """A file name from the index stays inside the checkpoint's directory."""
    parts = PurePosixPath(rel).parts
    if not rel or "\\" in rel or PurePosixPath(rel).is_absolute() or ".." in parts:
        raise SafetensorsError(f"{where} is not a relative path inside the checkpoint")


# ---- checking (every rank) ----


def _check_blob(blob: Any, root: Path) -> list[tuple[str, int, _Tensor]]:
    """Every tensor of the checkpoint as (relative file, data start, entry), after checking
    each file's header and the files against each other and the weight_map."""
    if not isinstance(blob, dict) or set(blob) != {"files", "weight_map"}:
        raise SafetensorsError(f"{root}: the headers are not read_headers' form")
    files, weight_map = blob["files"], blob["weight_map"]
    if not isinstance(files, dict) or not (weight_map is None or isinstance(weight_map, dict)):
        raise SafetensorsError(f"{root}: the headers are not read_headers' form")
    where_is: dict[str, str] = {}  # the first file that holds each tensor
    chunked: dict[str, tuple[int, ...] | None] = {}
    out: list[tuple[str, int, _Tensor]] = []
    for rel in sorted(files):
        _check_relative(rel, f"{root}: the file name {rel!r}")
        entry = files[rel]
        if not isinstance(entry, dict) or set(entry) != {"data_start", "file_size", "header"}:
            raise SafetensorsError(f"{root / rel}: its entry is not read_headers' form")
        data_start, file_size = entry["data_start"], entry["file_size"]
        if not _is_int(data_start) or not _is_int(file_size) or not 8 <= data_start <= file_size:
            raise SafetensorsError(
                f"{root / rel}: data start {data_start!r} and size {file_size!r} do not fit"
            )
        for t in _check_header(entry["header"], file_size - data_start, str(root / rel)):
            first = where_is.get(t.name)
            if first is not None and (
                t.offsets is None or chunked[t.name] is None or weight_map is not None
            ):
                why = (
                    "the index gives each tensor one file"
                    if weight_map is not None
                    else f"not both give its place in {SHARDING_INFO_KEY}"
                )
                raise SafetensorsError(
                    f"tensor {t.name!r} is in two files: {root / first} and {root / rel} ({why})"
                )
            if first is None:
                where_is[t.name], chunked[t.name] = rel, t.offsets
            out.append((rel, data_start, t))
    if weight_map is not None:
        _check_weight_map(weight_map, where_is, set(files), root)
    return out


def _check_weight_map(
    weight_map: dict[str, Any], where_is: dict[str, str], files: set[str], root: Path
) -> None:
    for name, rel in sorted(weight_map.items()):
        if not isinstance(rel, str) or rel not in files:
            raise SafetensorsError(
                f"{root}: the index assigns tensor {name!r} to {rel!r}, whose header was not read"
            )
        found = where_is.get(name)
        if found is None:
            raise SafetensorsError(
                f"{root / rel}: has no tensor {name!r}, which the index assigns to it"
            )
        if found != rel:
            raise SafetensorsError(
                f"{root / found}: holds tensor {name!r}, which the index assigns to {rel}"
            )
    for name, rel in sorted(where_is.items()):
        if name not in weight_map:
            raise SafetensorsError(
                f"{root / rel}: holds tensor {name!r}, which the index does not list"
            )


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)  # JSON true is no offset


def _check_header(header: Any, data_len: int, where: str) -> list[_Tensor]:
    """The tensors of one file's header; ``data_len`` bytes follow the header."""
    if not isinstance(header, dict):
        raise SafetensorsError(f"{where}: the header is a JSON {type(header).__name__}, not a dict")
    tensors: list[_Tensor] = []
    places: dict[str, tuple[int, ...]] | None = None
    for name, info in header.items():
        if name == METADATA_KEY:
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise SafetensorsError(
                    f"{where}: {METADATA_KEY} must map strings to strings, got {info!r}"
                )
            places = _sharding_info(info, where)
            continue
        tensors.append(_check_tensor(name, info, data_len, f"{where}: tensor {name!r}"))
    if places is not None:
        tensors = _placed(tensors, places, where)
    # The format's own rule: the data is the tensors' ranges back to back, no overlap, no hole,
    # nothing after the last. Empty ranges hold nothing and may sit anywhere.
    filled = sorted((t for t in tensors if t.end > t.begin), key=lambda t: (t.begin, t.end))
    pos, prev = 0, None
    for t in filled:
        if t.begin < pos:
            assert prev is not None
            raise SafetensorsError(
                f"{where}: tensors {prev.name!r} (bytes [{prev.begin}, {prev.end})) and "
                f"{t.name!r} (bytes [{t.begin}, {t.end})) overlap"
            )
        if t.begin > pos:
            raise SafetensorsError(
                f"{where}: data bytes [{pos}, {t.begin}) belong to no tensor (the format "
                f"allows no holes; the next tensor is {t.name!r})"
            )
        pos, prev = t.end, t
    if pos != data_len:
        raise SafetensorsError(
            f"{where}: data bytes [{pos}, {data_len}) after the last tensor belong to no tensor"
        )
    return tensors


def _sharding_info(info: dict[str, str], where: str) -> dict[str, tuple[int, ...]] | None:
    """The chunk offsets a file of DCP's Hugging Face format gives its tensors (CKPT-28):
    ``__metadata__[DCP_SHARDING_INFO]`` is a JSON dict of tensor name -> ``{"saved_offsets":
    [ints]}``; None when the file has none."""
    raw = info.get(SHARDING_INFO_KEY)
    if raw is None:
        return None
    key = f"{METADATA_KEY}[{SHARDING_INFO_KEY}]"
    doc = _parse_json(raw.encode(), where, key)
    if not isinstance(doc, dict):
        raise SafetensorsError(f"{where}: {key} is a JSON {type(doc).__name__}, not a dict")
    out: dict[str, tuple[int, ...]] = {}
    for name, entry in doc.items():
        offsets = entry.get(SAVED_OFFSETS_KEY) if isinstance(entry, dict) else None
        if not isinstance(offsets, list) or not all(_is_int(o) and o >= 0 for o in offsets):
            raise SafetensorsError(
                f"{where}: {key} gives tensor {name!r} {_short(entry)}, not "
                f'{{"{SAVED_OFFSETS_KEY}": [non-negative ints]}}'
            )
        out[name] = tuple(offsets)
    return out


def _placed(
    tensors: list[_Tensor], places: dict[str, tuple[int, ...]], where: str
) -> list[_Tensor]:
    """``tensors`` with the offsets ``places`` gives them: one for each, one per dim (of the
    tensor's torch shape), and none for a tensor the file lacks."""
    key = f"{METADATA_KEY}[{SHARDING_INFO_KEY}]"
    names = {t.name for t in tensors}
    stray = sorted(set(places) - names)
    if stray:
        raise SafetensorsError(f"{where}: {key} places tensor {stray[0]!r}, which the file lacks")
    out = []
    for t in tensors:
        offsets = places.get(t.name)
        if offsets is None:
            raise SafetensorsError(f"{where}: tensor {t.name!r} has no place in {key}")
        if len(offsets) != len(t.shape):
            raise SafetensorsError(
                f"{where}: {key} places tensor {t.name!r} of shape {list(t.shape)} at "
                f"{list(offsets)}: {len(offsets)} offsets for {len(t.shape)} dims"
            )
        out.append(_Tensor(t.name, t.dtype, t.shape, t.begin, t.end, offsets))
    return out


def _check_tensor(name: str, info: Any, data_len: int, where: str) -> _Tensor:
    # Keys beyond these three are ignored, as safetensors ignores them.
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise SafetensorsError(
            f"{where}: not a dict with dtype, shape and data_offsets: {_short(info)}"
        )
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise SafetensorsError(
            f"{where}: unknown dtype {_short(dtype)} (known: {', '.join(DTYPE_BITS)})"
        )
    if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
        raise SafetensorsError(f"{where}: shape {_short(shape)} is not a list of non-negative ints")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise SafetensorsError(
            f"{where}: data_offsets {_short(offsets)} are not two ints with 0 <= begin <= end"
        )
    begin, end = offsets
    if end > data_len:
        raise SafetensorsError(
            f"{where}: data_offsets [{begin}, {end}) run past the file's {data_len} data bytes"
        )
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        raise SafetensorsError(
            f"{where}: {dtype} of shape {shape} is {bits} bits, not a whole number of bytes"
        )
    if end - begin != bits // 8:
        raise SafetensorsError(
            f"{where}: data_offsets [{begin}, {end}) hold {end - begin} bytes, but {dtype} of "
            f"shape {shape} needs {bits // 8}"
        )
    return _Tensor(name, dtype, tuple(shape), begin, end)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _torch_shape(t: _Tensor, where: str) -> tuple[int, ...]:
    """The tensor's shape in torch: F4 packs two values per element of float4_e2m1fn_x2."""
    if t.dtype != _PACKED_X2:
        return t.shape
    if not t.shape or t.shape[-1] % 2:
        raise SafetensorsError(
            f"{where}: {t.dtype} of shape {list(t.shape)} cannot be torch's float4_e2m1fn_x2, "
            "whose last dim holds two values per element: it must be even"
        )
    return (*t.shape[:-1], t.shape[-1] // 2)


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, step = [], 1
    for s in reversed(shape):
        stride.append(step)
        step *= max(s, 1)
    return tuple(reversed(stride))
