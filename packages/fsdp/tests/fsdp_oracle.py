"""Brute-force oracles for the FSDP rules: materialise arange, chunk with torch, compare."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from shardspec.metadata.placements import Placement, Replicate, ShardDim


def arange(shape: tuple[int, ...]) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.int64).reshape(shape)


def chunk_or_empty(t: torch.Tensor, k: int, i: int, dim: int) -> torch.Tensor:
    """``torch.chunk(t, k, dim)[i]``, or an empty slice of ``t`` when torch.chunk returns
    fewer than k pieces."""
    pieces = t.chunk(k, dim)
    if i < len(pieces):
        return pieces[i]
    return t.narrow(dim, t.shape[dim], 0)


def fsdp_local(
    g: torch.Tensor, tp: Placement, tp_size: int, dp: int, t: int, p: int, shard_dim: int
) -> torch.Tensor:
    """What FSDP(+TP) leaves on coordinate (p, t): TP chunk, then FSDP chunk of that."""
    local = g if isinstance(tp, Replicate) else chunk_or_empty(g, tp_size, t, tp.dim)
    return chunk_or_empty(local, dp, p, shard_dim)


@st.composite
def fsdp_cases(draw: st.DrawFn, *, max_side: int = 9, max_dims: int = 3) -> dict[str, object]:
    """A parameter shape with a TP placement, TP size, dp size, replicate size and FSDP shard
    dim: uneven splits, empty chunks, zero-size dims, more ranks than rows."""
    shape = tuple(draw(st.lists(st.integers(0, max_side), min_size=1, max_size=max_dims)))
    tp: Placement = draw(
        st.one_of(st.just(Replicate()), st.integers(0, len(shape) - 1).map(ShardDim))
    )
    return {
        "shape": shape,
        "tp": tp,
        "tp_size": draw(st.integers(1, 4)),
        "dp": draw(st.integers(1, 4)),
        "replicate": draw(st.integers(1, 2)),
        "shard_dim": draw(st.integers(0, len(shape) - 1)),
    }
