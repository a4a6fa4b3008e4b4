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
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

__all__ = ["METADATA_FILE", "RefusedGlobal", "metadata_path", "read_metadata"]

METADATA_FILE = ".metadata"

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


def read_metadata(path: str | Path) -> Metadata:
    """The checkpoint's ``Metadata``, read with the restricted unpickler."""
    from torch.distributed.checkpoint.metadata import Metadata

    p = metadata_path(path)
    with open(p, "rb") as f:
        try:
            md = _MetadataUnpickler(f, str(p)).load()  # type: ignore[arg-type]
        except RefusedGlobal:
            raise
        except Exception as e:
            raise pickle.UnpicklingError(
                f"{p}: not a readable DCP metadata file ({type(e).__name__}: {e})"
            ) from e
    if not isinstance(md, Metadata):
        raise pickle.UnpicklingError(
            f"{p}: holds a {type(md).__name__}, not DCP's Metadata; is this a DCP checkpoint?"
        )
    return md
