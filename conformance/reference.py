"""Reference oracles: single process, brute force, obviously correct.

Nothing here calls the code under test. Validity enumerates every element; the chunk rule
calls ``torch.chunk`` on an index tensor; DTensor placements are applied to per-dim index
lists exactly as the placement docs describe them (Shard: ``torch.chunk`` the current local
indices; _StridedShard(sf): chunk into ``sf`` pieces, chunk each piece, take your piece of
each; Replicate: nothing), so a local tensor is ``global[ix_(indices per dim)]``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch

from shardspec.metadata import Box, Layout, Shard

__all__ = [
    "chunk_intervals",
    "dtensor_indices",
    "gather",
    "indices_of_boxes",
    "is_valid",
    "layout_of_torch_spec",
    "mesh_coordinates",
]


def is_valid(layout: Layout) -> bool:
    """LAYOUT-1..3 by enumeration: every box in bounds with the layout's ndim, no (box, rank)
    twice, and every element held by exactly one distinct non-empty box (identical boxes on
    several ranks are replicas and count once)."""
    shape = layout.shape
    seen: set[tuple[Box, int]] = set()
    for s in layout.shards:
        if s.box.ndim != len(shape) or not s.box.fits_in(shape):
            return False
        if (s.box, s.rank) in seen:
            return False
        seen.add((s.box, s.rank))
    count: dict[tuple[int, ...], int] = {}
    for b in {s.box for s in layout.shards}:
        for p in itertools.product(*(range(o, o + n) for o, n in b)):
            count[p] = count.get(p, 0) + 1
    return all(count.get(p, 0) == 1 for p in itertools.product(*(range(n) for n in shape)))


def chunk_intervals(n: int, k: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of chunk ``i`` of ``torch.chunk(arange(n), k)``; the chunks torch
    does not return are empty at ``n`` (CHUNK-2)."""
    pieces = torch.arange(n).chunk(k) if n else ()
    out = []
    for i in range(k):
        if i < len(pieces) and pieces[i].numel():
            out.append((int(pieces[i][0]), int(pieces[i][-1]) + 1))
        else:
            out.append((n, n))
    return out


def packed_rows(
    part_sizes: Sequence[int], unit: int, k: int, replicate: Sequence[int] = ()
) -> list[list[tuple[int, int]]]:
    """Per rank ``i`` of ``k``, the ``[start, stop)`` it holds of each part along the packed
    dim, in part order (REFIT-3): chunk ``i`` of the part's ``unit``-element units by
    ``torch.chunk``; a part in ``replicate`` with fewer units than ranks is vLLM's replicated
    KV heads instead: ``num_kv_head_replicas = k // units`` and rank ``i`` loads unit
    ``i // num_kv_head_replicas`` (QKVParallelLinear's ``shard_id``)."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(k)]
    at = 0
    for p, size in enumerate(part_sizes):
        units = size // unit
        for i in range(k):
            if p in replicate and 0 < units < k:
                lo = i // (k // units)
                hi = lo + 1
            else:
                lo, hi = chunk_intervals(units, k)[i]
            out[i].append((at + lo * unit, at + hi * unit))
        at += size
    return out


def mesh_coordinates(mesh_shape: Sequence[int]) -> list[tuple[int, ...]]:
    """Coordinates in row-major order: rank ``r`` of ``arange(W).reshape(mesh_shape)``."""
    return list(itertools.product(*(range(m) for m in mesh_shape)))


def _chunk_list(xs: list[int], k: int) -> list[list[int]]:
    if not xs:
        return [[] for _ in range(k)]
    pieces = [p.tolist() for p in torch.tensor(xs).chunk(k)]
    return pieces + [[] for _ in range(k - len(pieces))]


def dtensor_indices(
    shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[Any], coord: Sequence[int]
) -> list[list[int]]:
    """The global indices, per dim and in local order, that the local tensor at ``coord``
    holds. ``placements`` are JSON: ``["S", d]``, ``["R"]``, ``["SS", d, split_factor]``."""
    idx = [list(range(n)) for n in shape]
    for m, p in enumerate(placements):
        k, c = mesh_shape[m], coord[m]
        if p[0] == "S":
            idx[p[1]] = _chunk_list(idx[p[1]], k)[c]
        elif p[0] == "SS":
            mine: list[int] = []
            for piece in _chunk_list(idx[p[1]], p[2]):
                mine += _chunk_list(piece, k)[c]
            idx[p[1]] = mine
    return idx


def indices_of_boxes(boxes: Sequence[Box], ndim: int) -> list[list[int]]:
    """Per-dim global indices of a local tensor made of ``boxes`` in local storage order (a
    product of per-dim runs, listed row-major, as a DTensor local tensor is)."""
    out: list[list[int]] = []
    for d in range(ndim):
        runs: list[tuple[int, int]] = []
        for b in boxes:
            run = (b.offsets[d], b.sizes[d])
            if run not in runs:
                runs.append(run)
        out.append([i for o, n in runs for i in range(o, o + n)])
    return out


def gather(global_tensor: torch.Tensor, indices: Sequence[Sequence[int]]) -> torch.Tensor:
    """``global_tensor[ix_(*indices)]``, contiguous."""
    t = global_tensor
    for d, ix in enumerate(indices):
        t = t.index_select(d, torch.tensor(list(ix), dtype=torch.long))
    return t.contiguous()


def volume(indices: Sequence[Sequence[int]]) -> int:
    return math.prod(len(ix) for ix in indices)


def dtensor_empty_offsets(
    shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[Any], coord: Sequence[int]
) -> list[int | None]:
    """Per dim, where an empty piece sits (DTENSOR-6: one past the last index of the piece it
    was cut from; an empty piece of an empty piece keeps its offset), or None where the piece
    is not empty. ``Shard`` and ``Replicate`` only."""
    idx: list[list[int]] = [list(range(n)) for n in shape]
    empty_at: list[int | None] = [None if n else 0 for n in shape]
    for m, p in enumerate(placements):
        if p[0] == "R":
            continue
        if p[0] != "S":
            raise ValueError("dtensor_empty_offsets covers Shard and Replicate only")
        d = p[1]
        parent = idx[d]
        idx[d] = _chunk_list(parent, mesh_shape[m])[coord[m]]
        if not idx[d] and parent:
            empty_at[d] = parent[-1] + 1
    return [empty_at[d] if not idx[d] else None for d in range(len(shape))]


def layout_of_torch_spec(spec: Any, shape: Sequence[int]) -> Layout:
    """What a torch sharding spec says, read by hand (CONVERT-4): a ``ChunkShardingSpec`` is
    chunk ``i`` of ``dim`` (the torch.chunk rule, empty chunks at n) on
    ``placements[i].rank()``; an ``EnumerableShardingSpec`` is its ShardMetadata, in order."""
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    if not isinstance(spec, ChunkShardingSpec):
        return Layout(
            tuple(shape),
            [
                Shard(Box(md.shard_offsets, md.shard_sizes), md.placement.rank())
                for md in spec.shards
            ],
        )
    nd = len(shape)
    dim = int(spec.dim) % nd
    ranks = [p.rank() for p in spec.placements]
    shards = []
    for (start, stop), rank in zip(chunk_intervals(shape[dim], len(ranks)), ranks):
        offs = [start if d == dim else 0 for d in range(nd)]
        sizes = [stop - start if d == dim else shape[d] for d in range(nd)]
        shards.append(Shard(Box(offs, sizes), rank))
    return Layout(tuple(shape), shards)


# ---------------------------------------------------------------- flat ranges (FLAT-*)


def _unravel(shape: Sequence[int], i: int) -> tuple[int, ...]:
    out = []
    for n in reversed(shape):
        i, r = divmod(i, n)
        out.append(r)
    return tuple(reversed(out))


def flat_boxes(shape: Sequence[int], start: int, stop: int) -> list[Box]:
    """FLAT-2's boxes of ``[start, stop)``, greedily: from the first element not yet taken,
    the outermost dim ``d`` whose inner indices are all 0 there, and as many of its rows as fit
    before ``stop`` (at least one); the innermost dim always fits one element."""
    shape = tuple(shape)
    if not shape:
        return [Box((), ())] if start < stop else []
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    out = []
    p = start
    while p < stop:
        idx = _unravel(shape, p)
        for d in range(len(shape)):
            if any(idx[d + 1 :]):
                continue
            k = min(shape[d] - idx[d], (stop - p) // strides[d])
            if k >= 1:
                out.append(Box(idx, (1,) * d + (k,) + shape[d + 1 :]))
                p += k * strides[d]
                break
    return out


def flat_is_valid(shape: Sequence[int], pieces: Sequence[tuple[int, int, int, int]]) -> bool:
    """FLAT-4 by enumeration: every piece within the tensor with stop >= start, no element
    held by two non-identical ranges, no range twice on one rank, every element held, and no
    two non-empty pieces of a rank overlapping in its buffer."""
    n = math.prod(shape)
    if any(not (0 <= a <= b <= n) or r < 0 or at < 0 for r, a, b, at in pieces):
        return False
    real = [p for p in pieces if p[2] > p[1]]
    for i, (r, a, b, at) in enumerate(real):
        for r2, a2, b2, at2 in real[i + 1 :]:
            if (a, b) != (a2, b2) and max(a, a2) < min(b, b2):
                return False
            if (a, b) == (a2, b2) and r == r2:
                return False
            if r == r2 and max(at, at2) < min(at + b - a, at2 + b2 - a2):
                return False
    held = set()
    for _, a, b, _ in real:
        held.update(range(a, b))
    return len(held) == n


def zero12_buffers(
    shapes: Sequence[Sequence[int]], dp: int, alignment: int, round_robin: bool
) -> list[list[tuple[int, int] | None]]:
    """Each rank's ZeRO-1/2 partition element by element, as DeepSpeed's stage_1_and_2.py
    builds it (FLAT-6): ``(parameter, row-major index)``, None for padding. The parameters
    reordered round robin when asked (``_round_robin_reorder``: by ``i % dp``, each group in
    order), concatenated, padded to a multiple of ``alignment * dp``, split into ``dp`` equal
    parts."""
    order = list(range(len(shapes)))
    if round_robin:
        groups: dict[int, list[int]] = {}
        for i in order:
            groups.setdefault(i % dp, []).append(i)
        order = [i for j in groups for i in groups[j]]
    flat: list[tuple[int, int] | None] = [
        (k, i) for k in order for i in range(math.prod(shapes[k]))
    ]
    while len(flat) % (alignment * dp):
        flat.append(None)
    size = len(flat) // dp
    return [flat[r * size : (r + 1) * size] for r in range(dp)]


def zero3_ranges(shape: Sequence[int], dp: int) -> list[tuple[int, int]]:
    """Each rank's real elements of one parameter under ZeRO-3 (FLAT-7), as DeepSpeed's
    ``_partition_param`` narrows them: padded to a multiple of ``dp``, ``aligned // dp`` a
    rank, what lies past the end dropped (empty at the end for ranks past the data)."""
    n = math.prod(shape)
    aligned = n + ((dp - n % dp) if n % dp else 0)
    p = aligned // dp
    return [(min(r * p, n), min((r + 1) * p, n)) for r in range(dp)]


def zero_truth(shapes: Sequence[Sequence[int]]) -> dict[str, list[torch.Tensor]]:
    """The values a ZeRO checkpoint case sets before it saves: for each parameter (flat, in
    order) its fp32 value and Adam's two moments, every element distinct within its key and
    exact in fp32, so a value moved to another place, parameter or key shows."""
    out: dict[str, list[torch.Tensor]] = {"fp32": [], "exp_avg": [], "exp_avg_sq": []}
    for i, s in enumerate(shapes):
        ids = torch.arange(math.prod(s), dtype=torch.float64) + 1 + 4096 * i
        out["fp32"].append((ids / 16).float())
        out["exp_avg"].append((-ids / 32).float())
        out["exp_avg_sq"].append((ids / 64).float())
    return out


def zero3_buffers(shapes: Sequence[Sequence[int]], dp: int) -> list[list[tuple[int, int] | None]]:
    """Each rank's ZeRO-3 flat partition of one parameter group, element by element (FLAT-7):
    each parameter's ``ceil(numel / dp)`` slice (:func:`zero3_ranges`), padded to that length,
    one after another in the group's order; None for padding."""
    out: list[list[tuple[int, int] | None]] = [[] for _ in range(dp)]
    for k, s in enumerate(shapes):
        n = math.prod(s)
        size = -(-n // dp)
        for r, (a, b) in enumerate(zero3_ranges(s, dp)):
            out[r] += [(k, i) for i in range(a, b)] + [None] * (size - (b - a))
    return out
