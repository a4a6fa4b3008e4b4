"""Reading a DCP checkpoint's ``.metadata`` file without trusting it (CKPT-5).

DCP writes the checkpoint's ``Metadata`` with :mod:`pickle`, and unpickling runs whatever
callables the file names: an untrusted checkpoint could run code the moment it is opened.
:func:`read_metadata` unpickles with :meth:`pickle.Unpickler.find_class` restricted to an
allow-list: DCP's metadata dataclasses, DCP's save-plan dataclasses (a peer such as
Megatron-Core stores every rank's ``SavePlan`` in the metadata), ``torch.Size``, torch's
dtypes, the two helpers torch uses to pickle a tensor's layout and memory format, and
``pathlib`` paths (the checkpoint id). Any other global is refused with
:class:`RefusedGlobal`, which names it, before it is looked up. Only the metadata is read,
never the data files.

ByteCheckpoint (``bytecheckpoint`` 0.0.2) writes the same kind of file with two classes of its
own in place of DCP's: ``bytecheckpoint.checkpointer.meta_type.Metadata`` (DCP's fields plus
``all_tensor_metadata``, each saved tensor's pickle, and its version) and ``._StorageInfo``
(``relative_path``, ``offset``, ``length``). Its data files hold each tensor's raw storage
bytes, not a ``torch.save`` archive. Those two names, and no other name of that package, are
read as plain stand-ins (nothing of ByteCheckpoint is imported or run) and turned into DCP's
``Metadata`` whose storage entries are :class:`RawTensorStorage`: the byte range and the saved
tensor's pickle, which the readers use to decode the raw bytes (CKPT-19). The format is the one
the file's top-level class states (:func:`metadata_format`), never guessed from data bytes.
"""

from __future__ import annotations

import contextlib
import gc
import io
import pickle
import pickletools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .dcp_structure import check_structure

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

__all__ = [
    "BYTECHECKPOINT",
    "DCP",
    "METADATA_FILE",
    "RawTensorStorage",
    "RefusedGlobal",
    "metadata_format",
    "metadata_path",
    "read_metadata",
]

METADATA_FILE = ".metadata"
DCP = "dcp"
BYTECHECKPOINT = "bytecheckpoint"
_BYTECHECKPOINT_MODULE = "bytecheckpoint.checkpointer.meta_type"


@dataclass(frozen=True)
class RawTensorStorage:
    """Where a ByteCheckpoint checkpoint keeps one saved item: bytes ``[offset, offset +
    length)`` of ``relative_path``. For a tensor chunk ``tensor_pickle`` is the pickle
    ByteCheckpoint saved beside it (dtype, size, stride, storage offset; read with
    :func:`shardspec.checkpoint.dcp_files.raw_tensor`) and the bytes are the tensor's raw
    storage; for a non-tensor value it is None and the bytes are a ``torch.save`` archive, as
    in DCP. Its fields are those of DCP's ``_StorageInfo``, so DCP's reader can read the
    non-tensor values."""

    relative_path: str
    offset: int
    length: int
    tensor_pickle: bytes | None = None
    transform_descriptors: None = None


class _ByteCheckpointMetadata:
    """The stand-in ``bytecheckpoint.checkpointer.meta_type.Metadata`` unpickles into (its
    fields land in ``__dict__``); converted to DCP's ``Metadata`` by :func:`read_metadata`."""


class _ByteCheckpointStorageInfo:
    """The stand-in for ``bytecheckpoint.checkpointer.meta_type._StorageInfo``."""


_BYTECHECKPOINT_CLASSES: dict[str, type] = {
    "Metadata": _ByteCheckpointMetadata,
    "_StorageInfo": _ByteCheckpointStorageInfo,
}

_ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    # DCP's save plans: Megatron-Core's torch_dist backend keeps every rank's SavePlan in the
    # Metadata (``all_local_plans``). Frozen dataclasses of plain fields and one Enum, whose
    # unpickling runs no code of theirs.
    "torch.distributed.checkpoint.planner": frozenset(
        {"SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData"}
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),  # and every torch dtype, checked by type below
    "pathlib": frozenset({"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
    "builtins": frozenset({"set", "frozenset", "complex", "slice"}),
}


class RefusedGlobal(pickle.UnpicklingError):
    """The metadata file names a global outside the allow-list (it may be hostile)."""

    def __init__(self, path: str, module: str, name: str) -> None:
        super().__init__(
            f"{path}: refused to unpickle global '{module}.{name}': a DCP metadata file holds "
            f"only DCP's metadata classes, torch.Size and torch dtypes, so this file is not "
            f"one DCP wrote (or it was tampered with); nothing from it was run"
        )
        self.module = module
        self.name = name


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BufferedIOBase, path: str) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        if module == _BYTECHECKPOINT_MODULE and name in _BYTECHECKPOINT_CLASSES:
            return _BYTECHECKPOINT_CLASSES[name]
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch":
            import torch

            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype):
                return value
        raise RefusedGlobal(self._path, module, name)


def metadata_path(path: str | Path) -> Path:
    """The ``.metadata`` file of checkpoint ``path`` (a directory, or the file itself)."""
    p = Path(path)
    if p.is_dir():
        p = p / METADATA_FILE
    if not p.is_file():
        raise FileNotFoundError(
            f"{p}: no such file; a DCP checkpoint is a directory holding a "
            f"'{METADATA_FILE}' file (give the directory or that file)"
        )
    return p


def metadata_format(path: str | Path) -> str:
    """:data:`BYTECHECKPOINT` when the metadata file's top-level object is ByteCheckpoint's
    ``Metadata``, else :data:`DCP`: read from the pickle's first class reference, walking its
    opcodes without running any of them."""
    p = metadata_path(path)
    strings: list[str] = []
    with open(p, "rb") as f:
        try:
            for op, arg, _ in pickletools.genops(f):
                if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                    strings.append(str(arg))
                elif op.name == "GLOBAL":
                    module = str(arg).split(" ", 1)[0]
                    break
                elif op.name == "STACK_GLOBAL":
                    module = strings[-2] if len(strings) >= 2 else ""
                    break
            else:
                return DCP
        except Exception:
            return DCP  # not a pickle: read_metadata says so
    return BYTECHECKPOINT if module == _BYTECHECKPOINT_MODULE else DCP


def read_metadata(path: str | Path, *, strict: bool = True) -> Metadata:
    """The checkpoint's ``Metadata``, read with the restricted unpickler (a ByteCheckpoint
    metadata file as DCP's ``Metadata`` whose storage entries are :class:`RawTensorStorage`),
    its structure checked (:func:`.dcp_structure.check_structure`; ``strict=False``: sizes and
    offsets of any value, which a report names per tensor)."""
    # torch first: without it the command says what to install, whatever the path (CKPT-12)
    import torch.distributed.checkpoint.metadata  # noqa: F401

    p = metadata_path(path)
    with open(p, "rb") as f:
        return _parse(f, p, strict)  # type: ignore[arg-type]


def metadata_from_bytes(data: bytes, path: str | Path) -> Metadata:
    """:func:`read_metadata` of a ``.metadata`` file's bytes, read elsewhere (one rank of a
    collective load reads the file and sends its bytes to the others); ``path`` names it in
    errors."""
    return _parse(io.BytesIO(data), Path(path), True)


@contextlib.contextmanager
def collections_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (and back on after, if it was).

    The metadata of a large job is 10^5 objects and more, none in a cycle, made in one go: the
    collections their allocations trigger scan the whole process, a training process's heap,
    again and again (a 4,096-chunk parse took 21 ms alone and 150-180 ms with a second copy
    alive)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _parse(f: io.BufferedIOBase, p: Path, strict: bool) -> Metadata:
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        with collections_paused():
            md = _MetadataUnpickler(f, str(p)).load()
    except RefusedGlobal:
        raise
    except Exception as e:
        raise pickle.UnpicklingError(
            f"{p}: not a readable DCP metadata file ({type(e).__name__}: {e})"
        ) from e
    if isinstance(md, _ByteCheckpointMetadata):
        md = _from_bytecheckpoint(md, p)
    if not isinstance(md, Metadata):
        raise pickle.UnpicklingError(
            f"{p}: holds a {type(md).__name__}, not DCP's Metadata; is this a DCP checkpoint?"
        )
    check_structure(md, p, values=strict, entries=(RawTensorStorage,))
    return md


def _from_bytecheckpoint(bmd: _ByteCheckpointMetadata, p: Path) -> Metadata:
    """DCP's ``Metadata`` of what ByteCheckpoint's ``Metadata`` holds."""
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

    fields = vars(bmd)
    sdm = fields.get("state_dict_metadata")
    storage = fields.get("storage_data")
    pickles = fields.get("all_tensor_metadata") or {}
    if not isinstance(sdm, dict) or not isinstance(storage, dict) or not isinstance(pickles, dict):
        raise pickle.UnpicklingError(
            f"{p}: a ByteCheckpoint metadata file without its state_dict_metadata, "
            "storage_data or all_tensor_metadata"
        )
    out: dict[Any, RawTensorStorage] = {}
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _ByteCheckpointStorageInfo):
            raise pickle.UnpicklingError(
                f"{p}: a ByteCheckpoint storage entry {index!r} -> {type(info).__name__}"
            )
        data = vars(info)
        tensor_pickle = pickles.get(index)
        if tensor_pickle is not None and not isinstance(tensor_pickle, bytes):
            raise pickle.UnpicklingError(f"{p}: the saved tensor pickle of {index} is no bytes")
        try:
            out[index] = RawTensorStorage(
                str(data["relative_path"]), int(data["offset"]), int(data["length"]), tensor_pickle
            )
        except (KeyError, TypeError, ValueError) as e:
            raise pickle.UnpicklingError(f"{p}: a broken storage entry for {index} ({e})") from e
    return Metadata(sdm, planner_data=fields.get("planner_data"), storage_data=out)
