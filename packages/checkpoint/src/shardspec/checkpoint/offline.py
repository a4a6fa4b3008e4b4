"""``shardspec reshard SRC DST``: rewrite a DCP checkpoint offline into the chunk layout a
target job loads, so that each target rank reads one file of exactly its own data (CKPT-17).

One process, no process group. The target layout of every tensor comes from

* ``--like CKPT``: a checkpoint the target job saved (at step 0, say): each tensor gets that
  checkpoint's chunks, each chunk written to the file of the same name there; or
* ``--layouts FILE``: JSON ``{"key": <layout>, ...}``, each value the versioned JSON form of
  :mod:`shardspec.metadata.serialize` (``{"format": "shardspec.layout", "version": 1, ...}``);
  a chunk goes to ``__{rank}_0.distcp`` of the lowest rank holding its box. On the target
  mesh, :func:`layouts_of` writes this file from the model's state dict::

      from shardspec.checkpoint.offline import layouts_of
      open("layouts.json", "w").write(layouts_of(model.state_dict()))  # on any one rank

Everything is checked before anything is written: every tensor of SRC has a target of the
same shape (and dtype, for ``--like``) and no target names a tensor SRC lacks; the target
chunks are valid (CKPT-1); each target chunk plus the largest source chunk it reads fits in
``--max-memory``. Then each target chunk is filled by :class:`~.dcp_reader.FileSystemReader`
(reading only the source bytes it needs) and ``torch.save``\\ d as DCP's writer does;
non-tensor entries are copied byte for byte. The result is written to a temporary directory
beside DST and renamed to DST when complete.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

__all__ = ["OfflineError", "layouts_of", "main", "reshard_checkpoint"]

DEFAULT_MAX_MEMORY = 2**30


class OfflineError(ValueError):
    """The checkpoint cannot be rewritten as asked; nothing was written."""


@dataclass(frozen=True)
class _Target:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str  # relative path in DST


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardspec reshard",
        description="Rewrite a DCP checkpoint into the chunk layout a target job loads "
        "(offline, one process).",
    )
    p.add_argument("src", help="the checkpoint to rewrite")
    p.add_argument("dst", help="the new checkpoint's directory (must not exist)")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--like", metavar="CKPT", help="use the chunk layouts of this checkpoint")
    target.add_argument(
        "--layouts", metavar="FILE", help="JSON object: key -> layout (shardspec.layout v1)"
    )
    p.add_argument(
        "--max-memory",
        default=str(DEFAULT_MAX_MEMORY),
        metavar="BYTES",
        help="bound on the bytes held at once (suffixes K, M, G; default 1G)",
    )
    p.add_argument("--progress", choices=("auto", "always", "never"), default="auto")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from .dcp_reader import CheckpointReadError  # a chunk's file missing, short or damaged

    try:
        summary = reshard_checkpoint(
            args.src,
            args.dst,
            like=args.like,
            layouts=_read_layouts(args.layouts) if args.layouts else None,
            max_memory=_parse_bytes(args.max_memory),
            progress=args.progress,
        )
    except (OfflineError, OSError, pickle.UnpicklingError, ValueError, CheckpointReadError) as e:
        print(f"shardspec reshard: {e}", file=sys.stderr)
        return 2
    print(summary)
    return 0


def _parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if m is None:
        raise OfflineError(f"--max-memory {text!r}: give a number of bytes, e.g. 512M or 2G")
    scale: int = 1024 ** "_KMGT".index((m.group(2) or "_").upper())
    return int(m.group(1)) * scale


def _read_layouts(path: str) -> dict[str, Any]:
    from shardspec.metadata.serialize import layout_from_dict

    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise OfflineError(f"{path}: not JSON ({e})") from e
    if not isinstance(data, dict):
        raise OfflineError(f"{path}: expected a JSON object of key -> layout")
    out = {}
    for key, value in data.items():
        try:
            out[key] = layout_from_dict(value)
        except ValueError as e:
            raise OfflineError(f"{path}: key {key!r}: {e}") from e
    return out


def layouts_of(state_dict: dict[str, Any]) -> str:
    """The ``--layouts`` JSON of a state dict of DTensors and ShardedTensors (keys flattened
    as DCP flattens them); call it on any rank of the target job. Plain tensors are left
    out: give them a layout by hand (one box on rank 0) if SRC holds them sharded."""
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.tensor import DTensor

    from shardspec.metadata.dtensor import dtensor_layout
    from shardspec.metadata.serialize import layout_to_dict
    from shardspec.metadata.shard_metadata import from_sharded_tensor_metadata

    flat, _ = flatten_state_dict(state_dict)
    out: dict[str, Any] = {}
    for key, v in flat.items():
        if isinstance(v, DTensor):
            layout = dtensor_layout(tuple(v.shape), v.device_mesh, v.placements)
        elif isinstance(v, ShardedTensor):
            layout = from_sharded_tensor_metadata(v.metadata())
        else:
            continue
        out[key] = layout_to_dict(layout)
    return json.dumps(out, indent=1)


def reshard_checkpoint(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    like: str | os.PathLike[str] | None = None,
    layouts: dict[str, Any] | None = None,
    max_memory: int = DEFAULT_MAX_MEMORY,
    progress: str = "auto",
) -> str:
    """Rewrite checkpoint ``src`` as ``dst`` in the chunk layouts of checkpoint ``like`` or of
    ``layouts`` (key -> :class:`~shardspec.metadata.Layout`); returns a one-line summary."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from shardspec.checkpoint.dcp_metadata import read_metadata

    if (like is None) == (layouts is None):
        raise OfflineError("give exactly one target: like= (a checkpoint) or layouts=")
    src_p, dst_p = Path(src), Path(dst)
    if dst_p.exists():
        raise OfflineError(f"{dst_p} exists; give a new directory")
    md = read_metadata(src_p)
    tensors = {
        k: v for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)
    }
    if like is not None:
        targets, object_files = _targets_like(tensors, read_metadata(Path(like)), str(like))
    else:
        assert layouts is not None
        targets, object_files = _targets_from_layouts(tensors, layouts), {}
    _check_memory(md, tensors, targets, max_memory)
    tmp = dst_p.parent / f".{dst_p.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        summary = _write(src_p, tmp, md, tensors, targets, object_files, progress)
        os.rename(tmp, dst_p)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return f"wrote {dst_p}: {summary}"


def _targets_like(
    tensors: dict[str, Any], like_md: Any, like: str
) -> tuple[dict[str, list[_Target]], dict[str, str]]:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    theirs = {
        k: v for k, v in like_md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)
    }
    _same_keys(set(tensors), set(theirs), f"--like {like}")
    storage = {(k.fqn, tuple(k.offset or ())): v for k, v in like_md.storage_data.items()}
    out: dict[str, list[_Target]] = {}
    for fqn, smd in tensors.items():
        t = theirs[fqn]
        if tuple(t.size) != tuple(smd.size) or t.properties.dtype != smd.properties.dtype:
            raise OfflineError(
                f"tensor {fqn!r}: SRC holds {smd.properties.dtype} of shape "
                f"{tuple(smd.size)}, {like} holds {t.properties.dtype} of shape {tuple(t.size)}"
            )
        chunks = []
        for c in t.chunks:
            info = storage.get((fqn, tuple(c.offsets)))
            if info is None:
                raise OfflineError(
                    f"{like}: tensor {fqn!r} chunk at {tuple(c.offsets)} has no storage entry"
                )
            chunks.append(_Target(tuple(c.offsets), tuple(c.sizes), info.relative_path))
        out[fqn] = _checked(fqn, tuple(smd.size), chunks)
    objects = {
        k.fqn: v.relative_path
        for k, v in like_md.storage_data.items()
        if k.fqn not in theirs and hasattr(v, "relative_path")
    }
    return out, objects


def _targets_from_layouts(
    tensors: dict[str, Any], layouts: dict[str, Any]
) -> dict[str, list[_Target]]:
    _same_keys(set(tensors), set(layouts), "--layouts")
    out: dict[str, list[_Target]] = {}
    for fqn, smd in tensors.items():
        layout = layouts[fqn]
        if tuple(layout.shape) != tuple(smd.size):
            raise OfflineError(
                f"tensor {fqn!r}: SRC holds shape {tuple(smd.size)}, its target layout has "
                f"shape {tuple(layout.shape)}"
            )
        owner: dict[Any, int] = {}
        for s in layout.shards:
            owner[s.box] = min(owner.get(s.box, s.rank), s.rank)
        chunks = [
            _Target(tuple(b.offsets), tuple(b.sizes), f"__{r}_0.distcp") for b, r in owner.items()
        ]
        out[fqn] = _checked(fqn, tuple(smd.size), chunks)
    return out


def _same_keys(src: set[str], target: set[str], what: str) -> None:
    if src == target:
        return
    parts = []
    if src - target:
        parts.append(f"no target for {sorted(src - target)[:5]}")
    if target - src:
        parts.append(f"SRC lacks {sorted(target - src)[:5]}")
    raise OfflineError(f"{what} does not match SRC's tensors: {'; '.join(parts)}")


def _checked(fqn: str, shape: tuple[int, ...], chunks: list[_Target]) -> list[_Target]:
    from shardspec.checkpoint.chunks import check_chunks, storable

    layout = check_chunks(fqn, shape, [(c.offsets, c.sizes) for c in chunks])
    keep = {s.box for s in storable(layout).shards}
    return [c for c in chunks if any(b.offsets == c.offsets and b.sizes == c.sizes for b in keep)]


def _itemsize(smd: Any) -> int:
    import torch

    return torch.empty((), dtype=smd.properties.dtype).element_size()


def _check_memory(
    md: Any, tensors: dict[str, Any], targets: dict[str, list[_Target]], max_memory: int
) -> None:
    """Refuse before writing when a target chunk plus the largest source chunk it reads
    does not fit in ``max_memory`` (the reader stages at most one source chunk, CKPT-15)."""
    lengths = {(k.fqn, tuple(k.offset or ())): v.length for k, v in md.storage_data.items()}
    for fqn, chunks in targets.items():
        smd = tensors[fqn]
        size = _itemsize(smd)
        src = [(tuple(c.offsets), tuple(c.sizes)) for c in smd.chunks]
        for t in chunks:
            need = math.prod(t.sizes) * size
            staged = max(
                (lengths.get((fqn, o), 0) for o, n in src if _meets(o, n, t.offsets, t.sizes)),
                default=0,
            )
            if need + staged > max_memory:
                raise OfflineError(
                    f"tensor {fqn!r} chunk at {t.offsets} of size {t.sizes} needs {need} bytes "
                    f"plus up to {staged} bytes of a source chunk, more than --max-memory "
                    f"{max_memory}; raise --max-memory"
                )


def _meets(ao: Sequence[int], an: Sequence[int], bo: Sequence[int], bn: Sequence[int]) -> bool:
    return all(a < b + m and b < a + n for a, n, b, m in zip(ao, an, bo, bn)) and bool(
        math.prod(an) and math.prod(bn)
    )


class _IntoBuffer:
    """The least of a ``LoadPlanner`` the reader needs: read items land in ``buf``."""

    def __init__(self, buf: Any) -> None:
        self.buf = buf

    def resolve_tensor(self, req: Any) -> Any:
        from torch.distributed._shard._utils import narrow_tensor_by_index

        return narrow_tensor_by_index(self.buf, req.dest_offsets, req.lengths)

    def commit_tensor(self, req: Any, tensor: Any) -> None:
        pass


def _write(
    src: Path,
    out: Path,
    md: Any,
    tensors: dict[str, Any],
    targets: dict[str, list[_Target]],
    object_files: dict[str, str],
    progress: str,
) -> str:
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorStorageMetadata,
    )
    from torch.distributed.checkpoint.planner import LoadPlan

    from .dcp import read_items_for_chunks
    from .dcp_reader import FileSystemReader

    reader = FileSystemReader(src, thread_count=1)
    reader.set_up_storage_reader(md, True)
    files: dict[str, Any] = {}

    def stream(rel: str) -> Any:
        f = files.get(rel)
        if f is None:
            f = files[rel] = open(out / rel, "wb")  # noqa: SIM115 (closed below)
        return f

    storage: dict[Any, Any] = {}
    sdm: dict[str, Any] = {}
    total = sum(
        math.prod(t.sizes) * _itemsize(tensors[fqn]) for fqn, ts in targets.items() for t in ts
    )
    bar = _bar(progress, total)
    n_chunks = 0
    try:
        for fqn in sorted(targets):
            smd = tensors[fqn]
            chunks = []
            for i, t in enumerate(targets[fqn]):
                chunk = ChunkStorageMetadata(torch.Size(t.offsets), torch.Size(t.sizes))
                buf = torch.empty(t.sizes, dtype=smd.properties.dtype)
                items = read_items_for_chunks(fqn, smd, [chunk])
                if items:
                    reader.read_data(LoadPlan(items), cast(Any, _IntoBuffer(buf))).wait()
                f = stream(t.file)
                offset = f.tell()
                torch.save(buf, f)
                del buf
                storage[MetadataIndex(fqn, t.offsets, i)] = _StorageInfo(
                    t.file, offset, f.tell() - offset
                )
                chunks.append(chunk)
                n_chunks += 1
                if bar is not None:
                    bar.update(math.prod(t.sizes) * _itemsize(smd))
            sdm[fqn] = TensorStorageMetadata(smd.properties, smd.size, chunks)
        default_file = min((t.file for ts in targets.values() for t in ts), default="__0_0.distcp")
        for key, info in md.storage_data.items():
            if key.fqn in tensors:
                continue
            # A non-tensor value: its bytes as they are (a transform, if any, stays valid).
            with open(src / info.relative_path, "rb") as g:
                # checked first: a damaged length (2**62) would otherwise be allocated
                if info.offset + info.length > os.fstat(g.fileno()).st_size:
                    raise OfflineError(f"{src / info.relative_path}: truncated at {key.fqn!r}")
                g.seek(info.offset)
                data = g.read(info.length)
            if len(data) != info.length:
                raise OfflineError(f"{src / info.relative_path}: truncated at {key.fqn!r}")
            rel = object_files.get(key.fqn, default_file)
            f = stream(rel)
            offset = f.tell()
            f.write(data)
            storage[key] = _StorageInfo(
                rel, offset, info.length, getattr(info, "transform_descriptors", None)
            )
            sdm[key.fqn] = md.state_dict_metadata[key.fqn]
    finally:
        for f in files.values():
            f.close()
        if bar is not None:
            bar.close()
    new = Metadata(
        state_dict_metadata=sdm,
        planner_data=md.planner_data,
        storage_data=storage,
        version=getattr(md, "version", None),
    )
    try:
        blob = pickle.dumps(new)
    except RecursionError:  # the C unpickler reads nesting that pickling recurses into
        raise OfflineError(
            f"{src}: its metadata nests too deeply to be written again "
            "(planner_data?); nothing was written in its place"
        ) from None
    with open(out / ".metadata", "wb") as f:
        f.write(blob)
    nbytes = sum(os.path.getsize(out / rel) for rel in files)
    return f"{len(targets)} tensors, {n_chunks} chunks in {len(files)} files, {nbytes} bytes"


def _bar(mode: str, total: int) -> Any:
    show = mode == "always" or (mode == "auto" and sys.stderr.isatty() and total >= 2**30)
    if not show:
        return None
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(total=total, unit="B", unit_scale=True, desc="reshard", file=sys.stderr)
