"""A parsed ``.metadata``'s structure checked before anything reads it (CKPT-5).

The restricted unpickler (:mod:`.dcp_metadata`) decides which classes a file may name, not
what their fields hold: a damaged or hostile file can still give a chunk offsets that are
floats, a storage entry no length, a tensor no dtype, or name a data file outside the
checkpoint (``/etc/...``, ``../../...``). Every reader of the metadata (the load, ``dcp.load``
with our reader, the ``shardspec`` command, the offline rewrite) would then fail on its own
way, with an ``AttributeError`` deep in its code, or read a file the checkpoint does not
hold. :func:`check_structure` runs once per parse and refuses such a file with an
:class:`pickle.UnpicklingError` naming the file, the entry and what is wrong.

Checked: the tensors' dtypes, sizes and chunks (lists of chunks whose offsets and sizes are
sequences of non-negative ints, one per dim; whether they tile the tensor is CKPT-1's, checked
where the chunks are used); the storage entries (keyed by a ``MetadataIndex`` of a key the
metadata describes; a relative path inside the checkpoint, a non-negative int offset and
length, no transform but a list of names). A file of thousands of chunks is checked in a few
C-level passes over each field; only a file that fails them is walked entry by entry, to name
the first culprit.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from itertools import chain, repeat
from operator import attrgetter
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

__all__ = ["check_structure"]

_PROPERTIES, _DTYPE = attrgetter("properties"), attrgetter("dtype")
_SIZE, _CHUNKS = attrgetter("size"), attrgetter("chunks")
_OFFSETS, _SIZES = attrgetter("offsets"), attrgetter("sizes")
_FQN, _OFFSET = attrgetter("fqn"), attrgetter("offset")
_PATH, _LENGTH = attrgetter("relative_path"), attrgetter("length")
_TRANSFORMS = attrgetter("transform_descriptors")


def check_structure(
    md: Metadata, p: Path, *, values: bool = True, entries: tuple[type, ...] = ()
) -> None:
    """Raise :class:`pickle.UnpicklingError` naming ``p``, the entry and the problem when
    ``md``'s fields are not what DCP writes (see the module). ``values=False``: a tensor's size
    or a chunk's offsets and sizes may hold numbers or strings of any value, of any length (a
    report names them per tensor, CKPT-6); they are still sequences of those. ``entries``:
    storage entry classes taken beside DCP's ``_StorageInfo`` (the reader's stand-in for
    ByteCheckpoint's), checked by the same fields."""
    try:
        if _plain(md, entries):
            return
    except AttributeError:  # a field missing: the walk below names it
        pass
    problem = next(_problems(md, values), None)
    if problem is not None:
        raise pickle.UnpicklingError(f"{p}: not a readable DCP metadata file: {problem}")


def _plain(md: Metadata, entries: tuple[type, ...]) -> bool:
    """Whether every field is as DCP writes it, in C-level passes (False: walk to find out)."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    (BytesStorageMetadata, ChunkStorageMetadata, MetadataIndex, StorageMeta, TensorProperties,
     TensorStorageMetadata) = _classes()  # fmt: skip
    sdm, storage = md.state_dict_metadata, md.storage_data
    if type(sdm) is not dict or type(storage) is not dict:
        return False
    if type(getattr(md, "storage_meta", None)) not in (type(None), StorageMeta):
        return False
    if {*map(type, sdm)} - {str}:
        return False
    values = list(sdm.values())
    if {*map(type, values)} - {TensorStorageMetadata, BytesStorageMetadata}:
        return False
    tensors = [v for v in values if type(v) is TensorStorageMetadata]
    props = list(map(_PROPERTIES, tensors))
    if {*map(type, props)} - {TensorProperties} or {*map(type, map(_DTYPE, props))} - {torch.dtype}:
        return False
    shapes = list(map(_SIZE, tensors))  # a torch.Size holds ints (torch makes it so)
    if {*map(type, shapes)} - {torch.Size} or min(chain.from_iterable(shapes), default=0) < 0:
        return False
    lists = list(map(_CHUNKS, tensors))
    if {*map(type, lists)} - {list}:
        return False
    chunks = list(chain.from_iterable(lists))
    if {*map(type, chunks)} - {ChunkStorageMetadata}:
        return False
    offsets, sizes = list(map(_OFFSETS, chunks)), list(map(_SIZES, chunks))
    if {*map(type, offsets), *map(type, sizes)} - {torch.Size}:
        return False
    ndims = list(chain.from_iterable(map(repeat, map(len, shapes), map(len, lists))))
    if list(map(len, offsets)) != ndims or list(map(len, sizes)) != ndims:
        return False
    if min(chain(chain.from_iterable(offsets), chain.from_iterable(sizes)), default=0) < 0:
        return False
    keys, infos = list(storage), list(storage.values())
    if {*map(type, keys)} - {MetadataIndex} or {*map(type, map(_FQN, keys))} - {str}:
        return False
    if {*map(type, map(_OFFSET, keys))} - {torch.Size, type(None)}:
        return False
    if {*map(_FQN, keys)} - sdm.keys():
        return False
    if {*map(type, infos)} - {_StorageInfo, *entries}:
        return False
    at, lengths = list(map(_OFFSET, infos)), list(map(_LENGTH, infos))
    if {*map(type, at), *map(type, lengths)} - {int} or min(chain(at, lengths), default=0) < 0:
        return False
    if {*map(type, map(_TRANSFORMS, infos))} - {type(None)}:
        return False
    paths = {*map(_PATH, infos)}
    return not {*map(type, paths)} - {str} and all(map(_inside, paths))


def _problems(md: Metadata, values: bool) -> Iterator[str]:
    """Each problem of ``md``'s fields, walked entry by entry (the first names the culprit)."""
    import torch

    (BytesStorageMetadata, ChunkStorageMetadata, MetadataIndex, StorageMeta, TensorProperties,
     TensorStorageMetadata) = _classes()  # fmt: skip
    sdm = getattr(md, "state_dict_metadata", None)
    storage = getattr(md, "storage_data", None)
    if not isinstance(sdm, dict):
        yield f"its state_dict_metadata is a {type(sdm).__name__}, not a dict"
        return
    if not isinstance(storage, dict):
        yield f"its storage_data is a {type(storage).__name__}, not a dict"
        return
    meta = getattr(md, "storage_meta", None)
    if meta is not None and not isinstance(meta, StorageMeta):
        yield f"its storage_meta is a {type(meta).__name__}, not a StorageMeta"
    for fqn, smd in sdm.items():
        if not isinstance(fqn, str):
            yield f"a key of its state_dict_metadata is {fqn!r}, not a str"
            continue
        if isinstance(smd, BytesStorageMetadata):
            continue
        if not isinstance(smd, TensorStorageMetadata):
            yield f"'{fqn}' is described by a {type(smd).__name__}"
            continue
        props = getattr(smd, "properties", None)
        if not isinstance(props, TensorProperties):
            yield f"tensor '{fqn}' has properties {_short(props)}, not a TensorProperties"
        elif not isinstance(getattr(props, "dtype", None), torch.dtype):
            yield f"tensor '{fqn}' has dtype {_short(getattr(props, 'dtype', None))}"
        shape: Any = getattr(smd, "size", None)
        if not (_indices(shape, None) if values else _numbers(shape)):
            yield f"tensor '{fqn}' has size {_short(shape)}, not a sequence of non-negative ints"
            continue
        chunks = getattr(smd, "chunks", None)
        if not isinstance(chunks, list):
            yield f"tensor '{fqn}' has chunks {_short(chunks)}, not a list"
            continue
        for i, c in enumerate(chunks):
            if not isinstance(c, ChunkStorageMetadata):
                yield f"chunk {i} of tensor '{fqn}' is {_short(c)}"
                continue
            for field in ("offsets", "sizes"):
                v = getattr(c, field, None)
                if not (_indices(v, len(shape)) if values else _numbers(v)):
                    yield (
                        f"chunk {i} of tensor '{fqn}' has {field} {_short(v)}, not {len(shape)} "
                        "non-negative ints"
                    )
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(getattr(index, "fqn", 0), str):
            yield f"a storage entry is keyed by {_short(index)}, not a MetadataIndex"
            continue
        fqn = getattr(index, "fqn", "")
        name = f"the storage entry of '{fqn}' at {_short(getattr(index, 'offset', None))}"
        if fqn not in sdm:
            yield f"{name} is of a key the metadata does not describe"
        offset = getattr(index, "offset", None)
        if offset is not None and not _indices(offset, None):
            yield f"{name}: its offset is not a sequence of non-negative ints"
        path = getattr(info, "relative_path", None)
        if not isinstance(path, str):
            yield f"{name} names the file {_short(path)}, not a str"
        elif not _inside(path):
            yield f"{name} names the file {path!r}, outside the checkpoint's directory"
        for field in ("offset", "length"):
            v = getattr(info, field, None)
            if type(v) is not int or v < 0:
                yield f"{name} has {field} {_short(v)}, not a non-negative int"
        transforms = getattr(info, "transform_descriptors", None)
        if transforms is not None and (
            not isinstance(transforms, (list, tuple))
            or not all(isinstance(t, str) for t in transforms)
        ):
            yield f"{name} has transform_descriptors {_short(transforms)}, not a list of names"


def _classes() -> tuple[type, ...]:
    """DCP's metadata classes the check names, in the order the checks unpack them."""
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )

    return (BytesStorageMetadata, ChunkStorageMetadata, MetadataIndex, StorageMeta,
            TensorProperties, TensorStorageMetadata)  # fmt: skip


def _indices(v: Any, n: int | None) -> bool:
    """Whether ``v`` is a sequence of ``n`` (any number: None) non-negative ints."""
    import torch

    if not isinstance(v, (torch.Size, tuple, list)) or (n is not None and len(v) != n):
        return False
    return all(type(x) is int and x >= 0 for x in v)


def _numbers(v: Any) -> bool:
    """Whether ``v`` is a sequence of numbers or strings (what a report can name)."""
    import torch

    return isinstance(v, (torch.Size, tuple, list)) and all(
        type(x) in (int, float, str, bool) for x in v
    )


def _inside(path: str) -> bool:
    """Whether a storage entry's relative path stays inside the checkpoint's directory."""
    if not path or "\0" in path:
        return False
    p = PurePosixPath(path)
    return not p.is_absolute() and ".." not in p.parts


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."
