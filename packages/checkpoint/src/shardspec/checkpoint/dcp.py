"""Drop-in DCP planners and reader: ``dcp.load(sd, storage_reader=FileSystemReader(path),
planner=LoadPlanner())``. :class:`FileSystemReader` (from :mod:`.dcp_reader`) reads each
saved byte at most once and only the bytes a rank needs (CKPT-13 to CKPT-16).

:class:`LoadPlanner` is DCP's ``DefaultLoadPlanner`` with two changes (spec/09-checkpoint.md):

* Before any read, the chunks of every saved tensor this load reads are checked (CKPT-1:
  bounds, overlap, coverage); a bad checkpoint raises :class:`ChunkError` naming the tensor
  and the culprit chunks. The check runs in ``create_local_plan``, which DCP runs on every
  rank and whose errors it gathers and raises on every rank, so no rank is left waiting.
  What reaches the caller of ``dcp.load`` is therefore DCP's ``CheckpointException``, a
  ``BaseException`` (neither ``except ChunkError`` nor ``except Exception`` catches it), with
  our error inside its ``failures`` (rank -> (exception, traceback)); :func:`chunk_error`
  gets it out::

      try:
          dcp.load(sd, checkpoint_id=path, planner=LoadPlanner())
      except BaseException as e:
          if (bad := chunk_error(e)) is None:
              raise
          print(bad.fqn, bad.kind, bad.chunks)  # or: raise bad from e
* The read items come from :func:`chunk_overlaps`: the saved chunks are indexed once per
  tensor (:class:`shardspec.reshard.index.BoxIndex`, the planner's index), and each local
  chunk asks the index for the chunks it meets, so one rank's planning costs
  O((n + m) log(n + m) + k) for n saved and m local chunks and k reads (CKPT-2). Upstream
  sweeps one dim and compares every saved chunk the sweep keeps open with every local chunk,
  which grows as n x m when the chunks are cut along another dim.

The read items are those the default planner makes, without its zero-length reads (an empty
chunk lying inside another one), so the loaded bytes are the same (CKPT-3).

:class:`SavePlanner` is ``DefaultSavePlanner`` whose global plan check is CKPT-1 on every
tensor (one :meth:`Layout.validate` each, O(n log n) on grid layouts) instead of upstream's
own overlap sweep; with a single plan (one process saving) coverage is not required, as
upstream allows. It leaves out an empty chunk that starts where a non-empty chunk of the same
tensor does: DCP files chunks by offset, and the empty one would displace the other's data.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections import ChainMap
from collections.abc import Sequence
from itertools import chain
from typing import Any, TypeVar

import torch
from torch.distributed._shard.sharded_tensor.api import ShardedTensor
from torch.distributed.checkpoint import _version
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    DefaultSavePlanner,
    create_default_global_save_plan,
)
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    ReadItem,
    SavePlan,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import _create_chunk_list, _create_read_items
from torch.distributed.tensor import DTensor

from shardspec.checkpoint.chunks import (
    ChunkError,
    check_chunks,
    chunk_array_verdict,
    chunk_verdict,
)
from shardspec.metadata import Box, Layout
from shardspec.reshard.index import BoxIndex

from .dcp_columns import ColumnChunks
from .dcp_reader import PLAN_STAYS_LOCAL, CheckpointReadError, FileSystemReader

_E = TypeVar("_E", bound=BaseException)

__all__ = [
    "CheckpointReadError",
    "ChunkError",
    "FileSystemReader",
    "LoadPlanner",
    "SavePlanner",
    "checked_chunks",
    "chunk_error",
    "read_error",
    "read_items_for_chunks",
]


def chunk_error(error: BaseException) -> ChunkError | None:
    """The :class:`ChunkError` inside what ``dcp.load``/``dcp.save`` raised with our planners
    (DCP's ``CheckpointException``, a ``BaseException``, holds each rank's error in
    ``failures``: rank -> (exception, traceback)), or None when there is none. Looks in
    ``failures`` (lowest rank first), then ``__cause__`` and ``__context__``; ``error`` may be
    the ``ChunkError`` itself."""
    return _inner(error, ChunkError)


def read_error(error: BaseException) -> CheckpointReadError | None:
    """The :class:`CheckpointReadError` inside what ``dcp.load`` raised with our
    :class:`FileSystemReader` (a missing, truncated or wrong file: CKPT-16), found as
    :func:`chunk_error` finds a ``ChunkError``, or None."""
    return _inner(error, CheckpointReadError)


def _inner(error: BaseException, kind: type[_E]) -> _E | None:
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, kind):
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            for rank in sorted(failures, key=lambda r: r if isinstance(r, int) else -1):
                got = failures[rank]
                inner = got[0] if isinstance(got, tuple) and got else got
                if isinstance(inner, BaseException):
                    todo.append(inner)
        todo += [x for x in (e.__cause__, e.__context__) if x is not None]
    return None


class LoadPlanner(DefaultLoadPlanner):  # type: ignore[misc]
    """``DefaultLoadPlanner`` whose read items come from :func:`chunk_overlaps`, after checking
    the saved chunks of every tensor it reads. Takes the same arguments."""

    def create_local_plan(self) -> LoadPlan:
        md = self.metadata
        if md is None:
            raise ValueError("LoadPlanner.create_local_plan needs the checkpoint metadata")
        if self.flatten_state_dict:
            self._use_pre_2_4_keys_if_needed(md)
        saved = md.state_dict_metadata
        items: list[ReadItem] = []
        for fqn, obj in self.state_dict.items():
            smd = saved.get(fqn)
            if smd is None:
                if not self.allow_partial_load:
                    raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")
                continue
            if isinstance(smd, BytesStorageMetadata):
                items += _create_read_items(fqn, smd, obj)
                continue
            size = getattr(obj, "size", None)
            if size is not None and smd.size != obj.size():
                raise ValueError(
                    f"Size mismatch between saved {smd.size} and current: {obj.size()} for {fqn}"
                )
            # A DTensor on a submesh this rank is not part of has nothing to load here.
            if isinstance(obj, DTensor) and obj.device_mesh.get_coordinate() is None:
                continue
            try:
                local = _create_chunk_list(obj)
            except ValueError as e:
                raise ValueError(
                    f"Invalid checkpoint metadata for {fqn}, expected BytesStorageMetadata "
                    f"but found {type(smd)}"
                ) from e
            items += read_items_for_chunks(fqn, smd, local)
        # Our global step leaves the plans as they are: say so, so that our reader may keep
        # the items on this rank instead of sending them through DCP's gather and scatter.
        stays = (
            type(self).create_global_plan is LoadPlanner.create_global_plan
            and type(self).finish_plan is LoadPlanner.finish_plan
        )
        return LoadPlan(items, planner_data=PLAN_STAYS_LOCAL if stays else None)

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        # No coordination on load, as DCP's default: each rank's plan is its own (CKPT-18).
        return global_plan

    def finish_plan(self, new_plan: LoadPlan) -> LoadPlan:
        return new_plan

    def _use_pre_2_4_keys_if_needed(self, md: Metadata) -> None:
        # Checkpoints written before torch 2.4 flattened nested keys differently; like the
        # default planner, switch to that flattening when it explains the missing keys.
        missing = set(md.state_dict_metadata) - set(self.state_dict)
        if not missing:
            return
        _version._derived_version = "2_3"
        try:
            old, old_mappings = flatten_state_dict(self.original_state_dict)
        finally:
            _version._derived_version = None
        if set(old) & missing:
            self.state_dict, self.mappings = old, old_mappings


def checked_chunks(fqn: str, saved: TensorStorageMetadata) -> Layout:
    """The saved chunks of tensor ``fqn`` as a layout (chunk i on "rank" i), after checking them
    (CKPT-1): raises :class:`ChunkError` naming the tensor and the culprit chunks."""
    chunks = saved.chunks
    if isinstance(chunks, ColumnChunks):
        return _checked_arrays(fqn, tuple(saved.size), *chunks.arrays)
    src = None
    if len(chunks) <= _DIRECT_PAIRS:
        # Layers of one model share their shapes and chunkings: checked once per geometry.
        geometry = tuple((tuple(c.offsets), tuple(c.sizes)) for c in chunks)
        shape = tuple(saved.size)
        # ints only: the cache's key 0.0 or False equals 0, and would pass them as a valid 0
        if all(type(v) is int for v in chain(shape, *chain.from_iterable(geometry))):
            src = _valid_geometry(shape, geometry)
    if src is None:
        src = check_chunks(fqn, saved.size, [(c.offsets, c.sizes) for c in chunks])
    return src


def read_items_for_chunks(
    fqn: str,
    saved: TensorStorageMetadata,
    local: list[ChunkStorageMetadata],
    *,
    checked: Layout | None = None,
) -> list[ReadItem]:
    """The read items that fill ``local`` (this rank's chunks of tensor ``fqn``) from a
    checkpoint whose chunks are ``saved.chunks``, after checking them (CKPT-1); ``checked``:
    what :func:`checked_chunks` gave for them already (the check is not run again)."""
    chunks = saved.chunks
    src = checked if checked is not None else checked_chunks(fqn, saved)
    if not local:
        return []
    boxes = [(tuple(c.offsets), tuple(c.sizes)) for c in local]
    return [
        ReadItem(
            type=LoadItemType.TENSOR,
            dest_index=MetadataIndex(fqn, local[di].offsets, di),
            dest_offsets=torch.Size(dest_offsets),
            storage_index=MetadataIndex(fqn, chunks[si].offsets, si),
            storage_offsets=torch.Size(storage_offsets),
            lengths=torch.Size(lengths),
        )
        for di, si, dest_offsets, storage_offsets, lengths in chunk_overlaps(src, boxes)
    ]


def chunk_overlaps(
    src: Layout, local: Sequence[tuple[tuple[int, ...], tuple[int, ...]]]
) -> Sequence[Overlap]:
    """(local index, saved index, offsets in the local box, offsets in the saved chunk,
    lengths) of each non-empty overlap of the saved chunks ``src`` (checked, chunk i on
    "rank" i) with the boxes ``local`` (offsets, sizes)."""
    if len(src) * len(local) <= _DIRECT_PAIRS:
        saved = tuple((sh.box.offsets, sh.box.sizes) for sh in src.shards)
        return _direct_overlaps(saved, tuple(local))
    import numpy as np

    nd = len(src.shape)
    if len(src) * len(local) <= _ALL_PAIRS and _INDEXES.get(id(src)) is None:
        return _overlaps_of_all_pairs(src, local, nd)
    # The saved chunks were checked (CKPT-1): their non-empty boxes are disjoint, as a
    # BoxIndex wants them; each local box asks it for its clipped overlaps (a plan would build
    # a destination layout and pieces for the same answer). The index reads the boxes as
    # arrays: 10^4 saved chunks need not become objects unless it is no grid.
    saved_off = src.box_arrays()[0]
    kept_at, kept, index = _index_of(src)
    out: list[Overlap] = []
    many = index.query_clipped_many([o for o, _ in local], [n for _, n in local])
    if many is not None:  # a grid of saved chunks (the common case): all boxes at once
        q, pos, lo, lengths = many
        si = kept_at[pos]
        local_off = np.asarray([o for o, _ in local], dtype=np.int64).reshape(-1, nd)
        return _overlap_rows(q, si, lo, lengths, local_off, saved_off)
    shards = src.shards
    for di, (off, size) in enumerate(local):
        for pos, lo_, sizes in index.query_clipped(Box(off, size)):
            si = kept[pos]
            out.append((di, si, _minus(lo_, off), _minus(lo_, shards[si].box.offsets), sizes))
    return out


def _overlaps_of_all_pairs(
    src: Layout, local: Sequence[tuple[tuple[int, ...], tuple[int, ...]]], nd: int
) -> list[Overlap]:
    """:func:`chunk_overlaps` by one NumPy pass over every (local box, saved chunk) pair, in
    that order: a rank's few boxes against W saved chunks cost O(W) array work, where an
    index costs a sort of all W chunks (O(W log W) on every rank, for each chunking)."""
    import numpy as np

    saved_off, saved_sizes = src.box_arrays()
    local_off = np.asarray([o for o, _ in local], dtype=np.int64).reshape(len(local), nd)
    local_sizes = np.asarray([n for _, n in local], dtype=np.int64).reshape(len(local), nd)
    lo = np.maximum(local_off[:, None, :], saved_off[None, :, :])
    hi = np.minimum((local_off + local_sizes)[:, None, :], (saved_off + saved_sizes)[None, :, :])
    q, si = np.nonzero((hi > lo).all(axis=2))
    at = lo[q, si]
    return _overlap_rows(q, si, at, hi[q, si] - at, local_off, saved_off)


def _overlap_rows(
    q: Any, si: Any, at: Any, lengths: Any, local_off: Any, saved_off: Any
) -> list[Overlap]:
    """The overlaps as :data:`Overlap` tuples from arrays: local box ``q``, saved chunk ``si``,
    global offsets ``at`` and ``lengths`` of each."""
    return list(
        zip(
            q.tolist(),
            si.tolist(),
            map(tuple, (at - local_off[q]).tolist()),
            map(tuple, (at - saved_off[si]).tolist()),
            map(tuple, lengths.tolist()),
        )
    )


# Up to this many (local box, saved chunk) pairs with no index built for the chunking, the
# overlaps come from all pairs at once (_overlaps_of_all_pairs): 2**16 pairs of 3-d boxes are
# a few MiB of temporaries and well under a millisecond.
_ALL_PAIRS = 1 << 16


# The index of each saved-chunk layout, by identity: the tensors of a model that share a
# chunking share its checked layout (_CHECKED), so one index serves all. An index holds its
# layout (so no other object can take its id while the entry lives): the cache is bounded.
_INDEXES: dict[int, tuple[Layout, tuple[Any, list[int], BoxIndex]]] = {}
_INDEXES_MAX = 64


def _index_of(src: Layout) -> tuple[Any, list[int], BoxIndex]:
    """(positions of the non-empty chunks as an array and a list, their BoxIndex)."""
    hit = _INDEXES.get(id(src))
    if hit is not None and hit[0] is src:
        return hit[1]
    import numpy as np

    saved_off, saved_sizes = src.box_arrays()
    kept_at = np.flatnonzero((saved_sizes > 0).all(axis=1))
    kept: list[int] = kept_at.tolist()
    index = BoxIndex.of_arrays(saved_off[kept_at], saved_sizes[kept_at], src.shape)
    found = (kept_at, kept, index)
    if len(_INDEXES) >= _INDEXES_MAX:
        _INDEXES.clear()
    _INDEXES[id(src)] = (src, found)
    return found


@functools.lru_cache(maxsize=1024)
def _valid_geometry(
    shape: tuple[int, ...], chunks: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
) -> Layout | None:
    """The chunks' layout when they pass CKPT-1, else None (the caller raises, naming the
    tensor)."""
    verdict = chunk_verdict("", shape, chunks)
    return verdict if isinstance(verdict, Layout) else None


# Saved chunkings that passed CKPT-1, by shape and a digest of their arrays: the layers of a
# model repeat a few, and hashing the arrays costs microseconds where the check costs a sort.
_CHECKED: dict[tuple[tuple[int, ...], bytes], Layout] = {}
_CHECKED_MAX = 1024


def _checked_arrays(fqn: str, shape: tuple[int, ...], offsets: Any, sizes: Any) -> Layout:
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(offsets.shape).encode())
    h.update(offsets.tobytes())
    h.update(sizes.tobytes())
    key = (shape, h.digest())
    hit = _CHECKED.get(key)
    if hit is not None:
        return hit
    verdict = chunk_array_verdict(fqn, shape, offsets, sizes)
    if isinstance(verdict, ChunkError):
        raise verdict
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED[key] = verdict
    return verdict


def _minus(a: Sequence[int], b: Any) -> tuple[int, ...]:
    return tuple(x - y for x, y in zip(a, b))


# Below this many (saved, local) pairs every pair is tried directly: a state dict of thousands
# of small tensors pays per tensor for building layouts and a plan, more than the pairs cost.
_DIRECT_PAIRS = 64


Overlap = tuple[int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]


@functools.lru_cache(maxsize=1024)
def _direct_overlaps(
    saved: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...],
    local: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...],
) -> tuple[Overlap, ...]:
    """(local index, saved index, offsets in the local chunk, offsets in the saved chunk,
    lengths) of each non-empty overlap: the layers of a model share their chunkings, so this
    is worked out once per geometry (the items share the tuples)."""
    out: list[Overlap] = []
    for di, (d_off, d_size) in enumerate(local):
        d_end = tuple(o + n for o, n in zip(d_off, d_size))
        for si, (s_off, s_size) in enumerate(saved):
            lo = tuple(map(max, s_off, d_off))
            hi = tuple(map(min, (o + n for o, n in zip(s_off, s_size)), d_end))
            lengths = tuple(b - a for a, b in zip(lo, hi))
            if any(n <= 0 for n in lengths):
                continue
            out.append(
                (
                    di,
                    si,
                    _minus(lo, d_off),
                    _minus(lo, s_off),
                    lengths,
                )
            )
    return tuple(out)


class SavePlanner(DefaultSavePlanner):  # type: ignore[misc]
    """``DefaultSavePlanner`` whose global plan check is CKPT-1 (:meth:`Layout.validate` per
    tensor). Takes the same arguments."""

    def set_up_planner(self, *args: Any, **kwargs: Any) -> None:
        super().set_up_planner(*args, **kwargs)
        self._shards_by_box: dict[str, dict[tuple[Any, Any], torch.Tensor]] = {}

    def resolve_data(self, write_item: WriteItem) -> Any:
        data = write_item.tensor_data
        fqn = write_item.index.fqn
        obj = self.state_dict.get(fqn)
        if write_item.type == WriteItemType.SHARD and data and isinstance(obj, ShardedTensor):
            # DCP finds the shard by the item's index, which its global plan renumbers, then
            # by scanning for the offset alone: the wrong shard when an empty one starts at
            # the same offset. Offsets and sizes name the shard; indexed once per tensor.
            boxes = self._shards_by_box.get(fqn)
            if boxes is None:
                boxes = self._shards_by_box[fqn] = {
                    (tuple(s.metadata.shard_offsets), tuple(s.metadata.shard_sizes)): s.tensor
                    for s in obj.local_shards()
                }
            tensor = boxes.get((tuple(data.chunk.offsets), tuple(data.chunk.sizes)))
            if tensor is not None:
                return self.transform_object(write_item, tensor)
        return super().resolve_data(write_item)

    def _create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        plans = _without_shadowed_empty_chunks(all_plans)
        global_plan, metadata = create_default_global_save_plan(self._dedup_save_plans(plans))
        if self.flatten_state_dict:
            merged = dict(ChainMap(*(p.planner_data for p in global_plan)))
            metadata = dataclasses.replace(metadata, planner_data=merged)
        check_saved_chunks(metadata, require_cover=len(global_plan) > 1)
        return global_plan, metadata


def _without_shadowed_empty_chunks(plans: list[SavePlan]) -> list[SavePlan]:
    """The plans without the empty chunks that start where a non-empty chunk of the same
    tensor does, on any rank. DCP files chunks by (key, offset): such an empty chunk would win
    the dedup against the other (whose data would then not be saved) or, on one rank, take
    its storage entry. It holds no data, so leaving it out loses nothing (CKPT-1)."""

    def chunk(w: WriteItem) -> Any:
        return w.tensor_data.chunk if w.type == WriteItemType.SHARD and w.tensor_data else None

    filled = {
        (w.index.fqn, tuple(c.offsets))
        for p in plans
        for w in p.items
        if (c := chunk(w)) is not None and math.prod(c.sizes) > 0
    }

    def shadowed(w: WriteItem) -> bool:
        c = chunk(w)
        return (
            c is not None and math.prod(c.sizes) == 0 and (w.index.fqn, tuple(c.offsets)) in filled
        )

    return [
        dataclasses.replace(p, items=[w for w in p.items if not shadowed(w)])
        if any(shadowed(w) for w in p.items)
        else p
        for p in plans
    ]


def check_saved_chunks(metadata: Metadata, *, require_cover: bool = True) -> None:
    """Raise :class:`ChunkError` for the first tensor of ``metadata`` whose chunks break
    CKPT-1 (a gap only when ``require_cover``)."""
    for fqn, smd in metadata.state_dict_metadata.items():
        if not isinstance(smd, TensorStorageMetadata):
            continue
        verdict = chunk_verdict(fqn, smd.size, [(c.offsets, c.sizes) for c in smd.chunks])
        if isinstance(verdict, ChunkError) and (require_cover or verdict.kind != "gap"):
            raise verdict
