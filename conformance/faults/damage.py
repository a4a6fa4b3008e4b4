"""Damage done to a checkpoint's files before a load (the collective load's fault cases,
CKPT-26): a data file cut short or removed, the ``.metadata`` replaced by junk, a
tensor's chunk list made to leave a gap or to overlap while every chunk still finds
bytes of its own size, or fields no DCP writer writes (CKPT-5): a storage entry's file named
through ``..`` (the same file, reached from outside the checkpoint), a chunk's offsets as
floats (equal to the ints, so a reader that does not look finds every byte)."""

from __future__ import annotations

from typing import Any

__all__ = ["damage"]


def damage(path: str, how: str) -> str:
    """Spoil the checkpoint at ``path`` as ``checkpoint_collective_load`` says
    (:class:`conformance.interface.CollectiveLoad`); returns the file's name."""
    import os
    import pickle

    meta = os.path.join(path, ".metadata")
    if how == "metadata":
        with open(meta, "wb") as f:
            f.write(b"not a pickle")
        return ".metadata"
    with open(meta, "rb") as f:
        md = pickle.load(f)  # written by this run's own dcp.save: trusted
    if how in ("gap", "overlap", "outside", "floats"):
        if how in ("gap", "overlap"):
            _spoil_chunk_list(md, how)
        else:
            _spoil_fields(md, how, os.path.basename(os.path.normpath(path)))
        with open(meta, "wb") as f:
            pickle.dump(md, f)
        return ".metadata"
    # the file holding t's largest chunk (or v's, when t holds nothing)
    best: tuple[int, str, int, int] | None = None
    for index, info in md.storage_data.items():
        smd = md.state_dict_metadata[index.fqn]
        chunks = getattr(smd, "chunks", None)
        numel = 0  # a value: every rank loads it
        if chunks is not None:  # a chunk of t: an empty one is never read
            numel = -1
            for c in chunks:
                if list(c.offsets) == list(index.offset or []) and c.sizes.numel():
                    numel = int(c.sizes.numel())
        if best is None or numel > best[0]:
            best = (numel, info.relative_path, info.offset, info.length)
    assert best is not None
    _, rel, offset, length = best
    name = os.path.join(path, rel)
    if how == "remove":
        os.remove(name)
    elif how == "truncate":
        os.truncate(name, offset + length // 2)
    else:
        raise ValueError(
            f"damage must be metadata, remove, truncate, gap, overlap, outside or floats, got "
            f"{how!r}"
        )
    return rel


def _spoil_chunk_list(md: Any, how: str) -> None:
    """Spoil the chunk list of ``t`` in ``md`` (a valid one, of a non-empty tensor) in place
    as :func:`damage` says, the stored bytes left as they are: each chunk that stays still
    finds bytes of its own size, so only the chunk check (CKPT-1) can tell."""
    import dataclasses

    import torch

    smd = md.state_dict_metadata["t"]
    shape = list(smd.size)
    stored = [k for k in md.storage_data if k.fqn == "t"]
    chunks = sorted((c for c in smd.chunks if c.sizes.numel()), key=lambda c: -int(c.sizes.numel()))
    if not chunks:
        raise ValueError("a gap or an overlap needs a tensor with a non-empty chunk")
    if how == "overlap":
        # the chunks tile the tensor, so a chunk that stops short of the tensor's end in a
        # dim, moved one element along it, covers an element of another chunk
        for c in chunks:
            for d, (o, n) in enumerate(zip(c.offsets, c.sizes)):
                if o + n < shape[d]:
                    key = next(k for k in stored if list(k.offset) == list(c.offsets))
                    c.offsets = torch.Size([o + (k == d) for k, o in enumerate(c.offsets)])
                    moved = dataclasses.replace(key, offset=c.offsets)
                    md.storage_data[moved] = md.storage_data.pop(key)
                    return
    # no chunk can move (one holds the whole tensor), or a gap asked for: the largest goes
    smd.chunks.remove(chunks[0])
    key = next(k for k in stored if list(k.offset) == list(chunks[0].offsets))
    del md.storage_data[key]


def _spoil_fields(md: Any, how: str, folder: str) -> None:
    """Give ``t``'s first non-empty chunk in ``md`` a field no DCP writer writes, in place:
    its storage entry's file named as ``../<the checkpoint's folder>/<file>`` ("outside"), or
    its offsets as a list of floats ("floats"); either still finds the chunk's bytes."""
    import dataclasses

    smd = md.state_dict_metadata["t"]
    chunk = next((c for c in smd.chunks if c.sizes.numel()), None)
    if chunk is None:
        raise ValueError("outside or floats needs a tensor with a non-empty chunk")
    if how == "floats":
        chunk.offsets = [float(o) for o in chunk.offsets]
        return
    key = next(k for k in md.storage_data if k.fqn == "t" and list(k.offset) == list(chunk.offsets))
    info = md.storage_data[key]
    md.storage_data[key] = dataclasses.replace(
        info, relative_path=f"../{folder}/{info.relative_path}"
    )
