"""A DCP checkpoint's metadata as columns: what rank 0 of a collective load sends the others
(CKPT-23).

DCP's ``.metadata`` is one pickle of every saved chunk of the job, and unpickling costs
several microseconds a chunk (a ``ChunkStorageMetadata``, a ``MetadataIndex`` and a
``_StorageInfo``, each with its ``torch.Size``). Were every rank to unpickle it, each would
pay for the whole job's chunks on every load. So rank 0 parses the file (the restricted
unpickler, CKPT-5) and, when every entry is a plain one, sends:

- a *skeleton*: the same ``Metadata`` with no chunks and only the non-tensor values' storage
  entries, pickled (its size grows with the keys, not with the chunks), read on every rank by
  the same restricted unpickler;
- the file names, and one int64 table: each tensor's chunk offsets and sizes, and each chunk's
  storage entry (file, offset, length; file -1 where the metadata has none).

Every rank reads the table as NumPy arrays. :class:`ColumnChunks` and :class:`ColumnStorage`
make a chunk's ``ChunkStorageMetadata`` or ``_StorageInfo`` only when it is read, and hand the
arrays to what works on all chunks at once (the chunk check, the overlap index).

Anything else (ByteCheckpoint's entries, storage transforms, an entry no chunk names, a value
that is not a plain int of int64) is not encoded: :func:`encode` returns None and rank 0 sends
the file's bytes, which every rank unpickles, as before.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import pickle
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain, compress, repeat
from operator import attrgetter, methodcaller
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from torch.distributed.checkpoint.metadata import Metadata

__all__ = ["ColumnChunks", "ColumnStorage", "decode", "encode"]

_MAGIC = b"shardspec-dcp-columns-1\0"
_INFO_FIELDS = frozenset({"relative_path", "offset", "length", "transform_descriptors"})
_FQN, _OFFSET = attrgetter("fqn"), attrgetter("offset")
_OFFSETS, _SIZES = attrgetter("offsets"), attrgetter("sizes")
_SIZE, _CHUNKS = attrgetter("size"), attrgetter("chunks")
_PATH, _AT, _LENGTH = attrgetter("relative_path"), attrgetter("offset"), attrgetter("length")
_TRANSFORMS = methodcaller("get", "transform_descriptors")


def encode(md: Metadata) -> bytes | None:
    """``md`` as a skeleton and a table (see the module), or None when an entry is not plain.

    Rank 0 runs this on every load, on up to millions of chunks of thousands of tensors, so
    each check is one C-level pass (``map``, ``set``) over a column of all the chunks, not
    Python code per chunk or per tensor."""
    import numpy as np
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    sdm, storage = md.state_dict_metadata, md.storage_data
    if type(sdm) is not dict or type(storage) is not dict or not _fields_known():
        return None
    keys = list(storage)
    if {*map(type, keys)} - {MetadataIndex} or {*map(type, map(_FQN, keys))} - {str}:
        return None
    # a dict lookup by MetadataIndex runs its Python __hash__: the entries are read in order
    infos, key_offsets = list(storage.values()), list(map(_OFFSET, keys))
    values: dict[Any, Any] = {}
    if None in key_offsets:  # the non-tensor values' entries, set apart
        is_value = list(map(operator.is_, key_offsets, repeat(None)))
        values = dict(compress(zip(keys, infos), is_value))
        kept = list(map(operator.not_, is_value))
        keys, infos = list(compress(keys, kept)), list(compress(infos, kept))
        key_offsets = list(compress(key_offsets, kept))
    if not _plain_infos(infos, _StorageInfo):
        return None
    # (key, offsets) -> entry, as the pickled dict files them (by fqn and offset)
    entries = dict(zip(zip(map(_FQN, keys), map(tuple, key_offsets)), infos))

    if {*map(type, sdm)} - {str} or {*map(type, sdm.values())} - {
        TensorStorageMetadata,
        BytesStorageMetadata,
    }:
        return None
    fqns = [f for f, smd in sdm.items() if type(smd) is TensorStorageMetadata]
    smds: list[Any] = list(map(sdm.__getitem__, fqns))
    shapes = list(map(_SIZE, smds))
    if {*map(type, map(_CHUNKS, smds))} - {list} or {*map(type, shapes)} - {torch.Size}:
        return None
    if not _ints(chain.from_iterable(shapes)):
        return None
    ndims, counts = list(map(len, shapes)), list(map(len, map(_CHUNKS, smds)))
    chunks = list(chain.from_iterable(map(_CHUNKS, smds)))
    if {*map(type, chunks)} - {ChunkStorageMetadata}:
        return None
    offsets, sizes = list(map(_OFFSETS, chunks)), list(map(_SIZES, chunks))
    if {*map(type, offsets), *map(type, sizes)} - {torch.Size}:
        return None
    want = list(chain.from_iterable(map(repeat, ndims, counts)))  # each chunk's tensor's ndim
    if list(map(len, offsets)) != want or list(map(len, sizes)) != want:
        return None
    # bools and floats refused here; a value past int64 makes fromiter raise below
    if {*map(type, chain.from_iterable(offsets)), *map(type, chain.from_iterable(sizes))} - {int}:
        return None
    owners = list(chain.from_iterable(map(repeat, fqns, counts)))
    at = list(zip(owners, map(tuple, offsets)))
    found = list(map(entries.get, at))
    files: dict[str, int] = {}
    # (`None in found` would compare by the entries' Python __eq__; two chunks at one offset
    # find one entry twice, as would two keys pickled as one object: both go entry by entry)
    if type(None) in {*map(type, found)} or len({*map(id, found)}) != len(found):
        if len({a for a, e in zip(at, found) if e is not None}) != len(entries):
            return None  # an entry no chunk names: only the pickle keeps it
        rows = list(chain.from_iterable(
            (-1, 0, 0) if e is None
            else (files.setdefault(e.relative_path, len(files)), e.offset, e.length)
            for e in found
        ))  # fmt: skip
    else:
        if len(found) != len(entries):
            return None
        paths = list(map(_PATH, found))
        for f in dict.fromkeys(paths):
            files[f] = len(files)
        rows = list(chain.from_iterable(
            zip(map(files.__getitem__, paths), map(_AT, found), map(_LENGTH, found))
        ))  # fmt: skip
    if any(not isinstance(sdm.get(k.fqn), BytesStorageMetadata) for k in values):
        return None  # a value entry of no saved value
    if any("\0" in f for f in files):
        return None
    n = sum(map(len, offsets))
    try:
        table = np.concatenate(
            [
                np.asarray(counts, dtype=np.int64),
                np.fromiter(chain.from_iterable(offsets), np.int64, n),
                np.fromiter(chain.from_iterable(sizes), np.int64, n),
                np.fromiter(rows, np.int64, 3 * len(chunks)),
            ]
        )
    except OverflowError:
        return None
    empty = [TensorStorageMetadata(s.properties, s.size, []) for s in smds]
    skeleton = {**sdm, **dict(zip(fqns, empty))}
    head = pickle.dumps(
        dataclasses.replace(md, state_dict_metadata=skeleton, storage_data=values), protocol=4
    )
    names = "\0".join(files).encode("utf-8", "surrogatepass")
    out = [_MAGIC, _u64(len(head)), head, _u64(len(names)), names, _u64(len(counts))]
    out.append(table.astype("<i8").tobytes())
    return b"".join(out)


def decode(blob: bytes, where: Path) -> Metadata:
    """The ``Metadata`` :func:`encode` encoded, its chunks and storage entries read from the
    table when asked. ``where`` names the metadata file in errors."""
    import numpy as np
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from .dcp_metadata import metadata_from_bytes

    view = memoryview(blob)
    if bytes(view[: len(_MAGIC)]) != _MAGIC:
        raise ValueError(f"{where}: the metadata rank 0 sent is not in the column encoding")
    at = len(_MAGIC)
    n, at = _read_u64(view, at)
    skeleton = metadata_from_bytes(bytes(view[at : at + n]), where)
    at += n
    n, at = _read_u64(view, at)
    names = bytes(view[at : at + n]).decode("utf-8", "surrogatepass")
    files = names.split("\0") if n else []
    at += n
    count, at = _read_u64(view, at)
    table = np.frombuffer(blob, dtype="<i8", offset=at)
    tensors = [
        (f, smd)
        for f, smd in skeleton.state_dict_metadata.items()
        if isinstance(smd, TensorStorageMetadata)
    ]
    if count != len(tensors) or len(table) < count:
        raise ValueError(f"{where}: the metadata rank 0 sent has a table of the wrong length")
    fqns, smds = [f for f, _ in tensors], [smd for _, smd in tensors]
    counts = table[:count]
    ndims = np.fromiter(map(len, map(_SIZE, smds)), np.int64, count)
    spans = counts * ndims
    n = int(spans.sum())
    m = int(counts.sum())
    if len(table) != count + 2 * n + 3 * m:
        raise ValueError(f"{where}: the metadata rank 0 sent has a table of the wrong length")
    ends = np.cumsum(spans).tolist()
    stops = np.cumsum(counts).tolist()
    offsets = table[count : count + n]
    sizes = table[count + n : count + 2 * n]
    entries = table[count + 2 * n :].reshape(m, 3)
    sdm = dict(skeleton.state_dict_metadata)
    per: dict[str, tuple[ColumnChunks, Any]] = {}
    first: dict[str, int] = {}
    begin = start = 0
    for fqn, smd, end, stop, nd in zip(fqns, smds, ends, stops, ndims.tolist()):
        k = stop - start
        chunks = ColumnChunks(offsets[begin:end].reshape(k, nd), sizes[begin:end].reshape(k, nd))
        per[fqn] = (chunks, entries[start:stop])
        first[fqn] = start
        sdm[fqn] = TensorStorageMetadata(smd.properties, smd.size, cast(Any, chunks))
        begin, start = end, stop
    storage = ColumnStorage(skeleton.storage_data or {}, per, files, (entries, first))
    return dataclasses.replace(skeleton, state_dict_metadata=sdm, storage_data=storage)


@functools.cache
def _fields_known() -> bool:
    """Whether ``TensorStorageMetadata`` has the fields this encoding rebuilds it from (a later
    torch that adds one gets the file's bytes, not a skeleton that drops it)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    names = [f.name for f in dataclasses.fields(TensorStorageMetadata)]
    return names == ["properties", "size", "chunks"]


class ColumnChunks(Sequence[Any]):
    """A tensor's saved chunks (``ChunkStorageMetadata``), read from two (m x ndim) int64
    arrays; each made when read. :attr:`arrays` gives the arrays themselves (read-only)."""

    __slots__ = ("_offsets", "_sizes")

    def __init__(self, offsets: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]) -> None:
        self._offsets, self._sizes = offsets, sizes

    @property
    def arrays(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        return self._offsets, self._sizes

    def __len__(self) -> int:
        return int(self._offsets.shape[0])

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        import torch
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        return ChunkStorageMetadata(
            torch.Size(self._offsets[i].tolist()), torch.Size(self._sizes[i].tolist())
        )


class ColumnStorage(Mapping[Any, Any]):
    """The storage entries of a checkpoint's metadata, ``MetadataIndex -> _StorageInfo``, as
    the pickled dict maps them (by key and offsets: a ``MetadataIndex``'s ``index`` is only
    where to look first), made when read."""

    def __init__(
        self,
        values: Mapping[Any, Any],
        per: Mapping[str, tuple[ColumnChunks, Any]],
        files: Sequence[str],
        table: tuple[npt.NDArray[np.int64], Mapping[str, int]],
    ) -> None:
        self._values, self._per, self._files = values, per, files
        # every chunk's entry in one (m x 3) array, and each tensor's first row in it
        self._table = table
        self._keys: list[Any] | None = None

    def position(self, fqn: str, offset: Sequence[int], hint: int | None) -> int | None:
        """Where the chunk of ``fqn`` at ``offset`` is in its chunks, or None."""
        import numpy as np

        found = self._per.get(fqn)
        if found is None:
            return None
        offsets = found[0].arrays[0]
        off = tuple(offset)
        m, nd = offsets.shape
        if len(off) != nd:
            return None
        if type(hint) is int and 0 <= hint < m and tuple(offsets[hint].tolist()) == off:
            return hint
        try:
            at = np.flatnonzero((offsets == np.asarray(off, dtype=np.int64)).all(axis=1))
        except OverflowError:
            return None
        return int(at[0]) if len(at) else None

    def rows(
        self, fqn: str, positions: list[int]
    ) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
        """Chunks ``positions`` of ``fqn`` as plain lists, in that order: their offsets, their
        sizes, and their entries as (file number, offset, length), file number -1 where there
        is none (:meth:`file`). Only those rows are converted: a rank reads a few of a
        tensor's W chunks."""
        chunks, entries = self._per[fqn]
        offsets, sizes = chunks.arrays
        return offsets[positions].tolist(), sizes[positions].tolist(), entries[positions].tolist()

    def entries_at(self, fqns: Sequence[str], position: int) -> npt.NDArray[np.int64]:
        """The entry of chunk ``position`` of each of ``fqns`` (tensors of the same chunks) as
        rows of (file number, offset, length), :meth:`rows`' values, in one gather: a stack's
        thousands of members at once."""
        import numpy as np

        entries, first = self._table
        at = np.fromiter(map(first.__getitem__, fqns), np.int64, len(fqns))
        out: npt.NDArray[np.int64] = entries[at + position]
        return out

    def file(self, number: int) -> str:
        """The relative path of file ``number`` of :meth:`rows`."""
        return self._files[number]

    def entry(self, fqn: str, position: int) -> tuple[str, int, int] | None:
        """(file, offset, length) of chunk ``position`` of ``fqn``, or None without one."""
        f, offset, length = self._per[fqn][1][position].tolist()
        return None if f < 0 else (self._files[f], offset, length)

    def __getitem__(self, key: Any) -> Any:
        from torch.distributed.checkpoint.filesystem import _StorageInfo

        offset = getattr(key, "offset", None)
        if offset is None:
            return self._values[key]
        fqn = getattr(key, "fqn", None)
        if not isinstance(fqn, str):
            raise KeyError(key)
        at = self.position(fqn, offset, getattr(key, "index", None))
        found = self.entry(fqn, at) if at is not None else None
        if found is None:
            raise KeyError(key)
        return _StorageInfo(*found)

    def _all_keys(self) -> list[Any]:
        if self._keys is None:
            import torch
            from torch.distributed.checkpoint.metadata import MetadataIndex

            keys = list(self._values)
            for fqn, (chunks, entries) in self._per.items():
                seen: set[tuple[int, ...]] = set()
                for i, (off, e) in enumerate(zip(chunks.arrays[0].tolist(), entries.tolist())):
                    if e[0] >= 0 and tuple(off) not in seen:
                        seen.add(tuple(off))
                        keys.append(MetadataIndex(fqn, torch.Size(off), i))
            self._keys = keys
        return self._keys

    def __iter__(self) -> Iterator[Any]:
        return iter(self._all_keys())

    def __len__(self) -> int:
        return len(self._all_keys())


def _plain_infos(infos: list[Any], cls: type) -> bool:
    """Every entry a plain ``_StorageInfo``: no other class, no attribute of its own beyond
    its fields (the readers ask for some by ``getattr``), no transform, a str path, int
    offset and length (their range is checked when the table is built)."""
    if {*map(type, infos)} - {cls}:
        return False
    fields = list(map(vars, infos))
    names = set().union(*fields)
    return (
        names <= _INFO_FIELDS
        # DCP pickles no transform_descriptors field where there are none
        and (
            "transform_descriptors" not in names
            or list(map(_TRANSFORMS, fields)).count(None) == len(fields)
        )
        and not {*map(type, map(_PATH, infos))} - {str}
        and not {*map(type, map(_AT, infos)), *map(type, map(_LENGTH, infos))} - {int}
    )


def _ints(values: Any) -> bool:
    """Every value a plain int (no bool, no float) that int64 holds."""
    return all(type(v) is int and -(2**63) <= v < 2**63 for v in values)


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "little")


def _read_u64(view: memoryview, at: int) -> tuple[int, int]:
    return int.from_bytes(view[at : at + 8], "little"), at + 8
