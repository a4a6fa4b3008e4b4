"""Writing DCP checkpoints with chosen chunk layouts in one process, byte for byte as DCP's
``FileSystemWriter`` stores them: each chunk ``torch.save``d at an offset of a ``.distcp`` file,
the ``.metadata`` pickle naming ``_StorageInfo(file, offset, length)`` for it. Chunk ``i`` of
every tensor goes to file ``__{i % files}_0.distcp``. ``test_checkpoint_data`` checks that
``dcp.load`` reads these back (so the helper writes what DCP writes)."""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex

from shardspec.metadata import Layout
from shardspec.metadata.dcp import to_tensor_storage_metadata


def write_data_checkpoint(
    path: Path,
    tensors: dict[str, tuple[Layout, torch.Tensor]],
    objects: dict[str, Any] | None = None,
    files: int = 2,
) -> Path:
    """A checkpoint at ``path`` holding each ``key -> (layout, global tensor)`` cut into the
    layout's boxes (the reference: slicing the global tensor), and ``objects`` torch.saved."""
    path.mkdir(parents=True, exist_ok=True)
    streams: dict[str, io.BytesIO] = {}
    sdm: dict[str, Any] = {}
    storage: dict[Any, Any] = {}

    def put(name: str, data: Any) -> _StorageInfo:
        f = streams.setdefault(name, io.BytesIO())
        start = f.tell()
        torch.save(data, f)
        return _StorageInfo(name, start, f.tell() - start)

    for key, (layout, value) in tensors.items():
        md = to_tensor_storage_metadata(layout, value.dtype)
        sdm[key] = md
        for i, c in enumerate(md.chunks):
            part = value[tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes))].clone()
            storage[MetadataIndex(key, c.offsets, i)] = put(f"__{i % files}_0.distcp", part)
    for key, obj in (objects or {}).items():
        sdm[key] = BytesStorageMetadata()
        buf = io.BytesIO()
        torch.save(obj, buf)
        f = streams.setdefault("__0_0.distcp", io.BytesIO())
        start = f.tell()
        f.write(buf.getvalue())
        storage[MetadataIndex(key)] = _StorageInfo("__0_0.distcp", start, f.tell() - start)
    for name, f in streams.items():
        (path / name).write_bytes(f.getvalue())
    (path / ".metadata").write_bytes(pickle.dumps(Metadata(sdm, storage_data=storage)))
    return path


def storage_of(path: Path, key: str, chunk: int = 0) -> _StorageInfo:
    md = pickle.loads((path / ".metadata").read_bytes())
    (info,) = [v for k, v in md.storage_data.items() if k.fqn == key and k.index == chunk]
    return info


def tensor_bytes_at(path: Path, key: str, chunk: int = 0) -> tuple[Path, int, int]:
    """The file, absolute offset and length of the raw tensor bytes of a saved chunk (the
    ``data/0`` record of its torch.save archive), found with zipfile (not the code under test)."""
    info = storage_of(path, key, chunk)
    file = path / info.relative_path
    raw = file.read_bytes()
    archive = raw[info.offset : info.offset + info.length]
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        (zi,) = [i for i in z.infolist() if i.filename.endswith("/data/0")]
    h = info.offset + zi.header_offset
    name_len, extra_len = struct.unpack("<HH", raw[h + 26 : h + 30])
    return file, h + 30 + name_len + extra_len, zi.file_size
