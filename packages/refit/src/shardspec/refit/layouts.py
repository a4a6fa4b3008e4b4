"""Serving layouts written with the existing :class:`Layout`: a packed tensor is several boxes
per rank in local storage order (REFIT-3), and FP8 scales follow their weight's boxes."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from shardspec.metadata import Box, Layout, Shard, chunk_bounds

from .errors import RefitError

if TYPE_CHECKING:
    import torch

__all__ = ["packed_layout", "scale_layout", "split_local"]


def packed_layout(
    shape: Sequence[int],
    dim: int,
    part_sizes: Sequence[int],
    ranks: Sequence[int],
    unit: int = 1,
    *,
    replicate: Collection[int] = (),
) -> Layout:
    """Tensor parallelism over ``ranks`` of a tensor packed from parts of ``part_sizes`` along
    ``dim``: the ``i``-th rank holds chunk ``i`` (the ``torch.chunk`` rule, in whole units of
    ``unit`` elements: heads of ``head_dim`` rows stay whole) of each part, in part order.
    vLLM's ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` layout.

    ``replicate``: indices of parts that, holding fewer units than there are ranks, are
    replicated instead of chunked, as vLLM replicates KV heads when the TP degree exceeds
    them: with ``u`` units over ``n`` ranks (``n`` a multiple of ``u``), rank ``i`` holds
    unit ``i * u // n`` (REFIT-3). Such a part with as many units as ranks or more is
    chunked as any other."""
    shape = tuple(shape)
    if sum(part_sizes) != shape[dim]:
        raise RefitError(f"parts {list(part_sizes)} do not add up to dim {dim} of {shape}")
    bad = [p for p in replicate if not isinstance(p, int) or not 0 <= p < len(part_sizes)]
    if bad:
        raise RefitError(f"replicate names parts {bad}, not among the {len(part_sizes)} parts")
    n = len(ranks)
    for p, size in enumerate(part_sizes):
        if size % unit:
            raise RefitError(f"a part of {size} elements is not whole units of {unit}")
        units = size // unit
        if p in replicate and 0 < units < n and n % units:
            raise RefitError(
                f"part {p} has {units} units of {unit} over {n} ranks: replicating it needs "
                f"the ranks to be a multiple of its units (vLLM refuses this TP degree too)"
            )
    # each part's chunks once, not once per rank: a layout over n ranks stays O(n)
    bounds = [chunk_bounds(size // unit, n) for size in part_sizes]
    shards = []
    for i, r in enumerate(ranks):
        at = 0
        for p, size in enumerate(part_sizes):
            units = size // unit
            if p in replicate and 0 < units < n:
                lo = i * units // n
                hi = lo + 1
            else:
                lo, hi = bounds[p][i]
            offs = tuple(at + lo * unit if d == dim else 0 for d in range(len(shape)))
            sizes = tuple((hi - lo) * unit if d == dim else n_ for d, n_ in enumerate(shape))
            shards.append(Shard(Box(offs, sizes), r))
            at += size
    return Layout(shape, shards)


def scale_layout(layout: Layout, block: tuple[int, int]) -> Layout:
    """The layout of the FP8 scales of a tensor in ``layout``: each box's blocks on its rank,
    in the same local order. Needs boxes on block boundaries (REFIT-10)."""
    from .fp8 import scale_shape

    bn, bk = block
    shards = []
    for s in layout.shards:
        b = s.box
        offs = b.offsets[:-2] + (b.offsets[-2] // bn, b.offsets[-1] // bk)
        stops = b.stops[:-2] + (-(-b.stops[-2] // bn), -(-b.stops[-1] // bk))
        shards.append(Shard(Box.from_bounds(offs, stops), s.rank))
    return Layout(scale_shape(layout.shape, block), shards)


def split_local(tensor: torch.Tensor, layout: Layout, rank: int, dim: int) -> list[torch.Tensor]:
    """Views of one local ``tensor`` (an engine's parameter), one per box of ``rank`` in
    ``layout``, the boxes laid end to end along ``dim`` in local order: what refit's ``out``
    takes so that it writes into the engine's storage."""
    views = []
    at = 0
    for b in layout.boxes_of(rank):
        views.append(tensor.narrow(dim, at, b.sizes[dim]))
        at += b.sizes[dim]
    if at != tensor.shape[dim]:
        raise RefitError(
            f"a local tensor of shape {tuple(tensor.shape)} is not rank {rank}'s boxes of "
            f"{layout} end to end along dim {dim} ({at} elements)"
        )
    return views
