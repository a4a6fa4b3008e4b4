"""Rank-side functions for the front-end tests (ShardedTensor and DTensor on a gloo pool)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from shardspec.metadata import ConversionError, Layout
from shardspec.reshard.frontends import (
    reshard_dtensor,
    reshard_dtensor_to_layout,
    reshard_sharded_tensor,
)
from shardspec.testing.tensors import make_sharded_tensor


def st_reshard(
    rank: int, world: int, full: torch.Tensor, src: Layout, spec: Any
) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    """Reshard a ShardedTensor; return (offsets, tensor) of this rank's new local shards."""
    st = make_sharded_tensor(full, src)
    out = reshard_sharded_tensor(st, spec)
    assert tuple(out.size()) == tuple(full.shape)
    return [(tuple(s.metadata.shard_offsets), s.tensor.clone()) for s in out.local_shards()]


def st_reshard_refused(
    rank: int, world: int, full: torch.Tensor, src: Layout, dst: Layout
) -> tuple[str | None, float]:
    """Reshard a ShardedTensor to a layout torch's ShardedTensor cannot hold: the refusal's
    text, and an all_reduce after it (every rank still in step: no collective half-done)."""
    st = make_sharded_tensor(full, src)
    try:
        reshard_sharded_tensor(st, dst)
        err = None
    except ConversionError as e:
        err = str(e)
    ones = torch.ones(1)
    dist.all_reduce(ones)
    return err, float(ones)


def st_upstream_reshard(rank: int, world: int, full: torch.Tensor, src: Layout, spec: Any) -> Any:
    """Upstream ``ShardedTensor.reshard`` on the same input, for the expected-failure tests."""
    st = make_sharded_tensor(full, src)
    st.reshard(spec)
    return [(tuple(s.metadata.shard_offsets), s.tensor.clone()) for s in st.local_shards()]


def _mesh(ranks: Any) -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", ranks)


def dt_reshard(
    rank: int,
    world: int,
    full: torch.Tensor,
    src_mesh: Any,
    src_placements: Any,
    dst_mesh: Any,
    dst_placements: Any,
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """Our reshard of a DTensor, next to upstream's distribute_tensor of the same target."""
    from torch.distributed.tensor import distribute_tensor

    # src_data_rank=None: every rank slices its own part of ``full``. The default (scatter
    # from rank 0) misplaces the data on a mesh whose ranks are not in ascending order.
    dt = distribute_tensor(full, _mesh(src_mesh), src_placements, src_data_rank=None)
    out = reshard_dtensor(dt, _mesh(dst_mesh), dst_placements)
    want = distribute_tensor(full, _mesh(dst_mesh), dst_placements, src_data_rank=None)
    return out.to_local().clone(), want.to_local().clone(), tuple(out.placements)


def dt_to_layout(
    rank: int, world: int, full: torch.Tensor, mesh: Any, placements: Any, dst: Layout
) -> tuple[list[torch.Tensor], list[tuple[int, ...]], bool]:
    from torch.distributed.tensor import distribute_tensor

    dt = distribute_tensor(full, _mesh(mesh), placements)
    got = reshard_dtensor_to_layout(dt, dst)
    wrapped = bool(got.tensors) and got.to_wrapper() is not None
    return [t.clone() for t in got.tensors], got.offsets, wrapped


def dt_upstream_redistribute_collectives(
    rank: int, world: int, full: torch.Tensor
) -> list[tuple[str, int]]:
    """The collectives (name, elements returned) DTensor's Shard(0) -> Shard(1) redistribute
    makes on CPU/gloo: its fallback all-gathers the whole tensor to every rank."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = _mesh(list(range(world)))
    dt = distribute_tensor(full, mesh, [Shard(0)])
    seen: list[tuple[str, int]] = []
    names = [
        n
        for n in ("all_gather_single", "all_gather_tensor", "all_to_all_single")
        if hasattr(funcol, n)
    ]
    real = {n: getattr(funcol, n) for n in names}

    def spy(name: str, fn: Any) -> Any:
        def inner(*a: Any, **k: Any) -> Any:
            out = fn(*a, **k)
            seen.append((name, int(out.numel())))
            return out

        return inner

    for n, fn in real.items():
        setattr(funcol, n, spy(n, fn))
    try:
        dt.redistribute(mesh, [Shard(1)]).to_local()
    finally:
        for n, fn in real.items():
            setattr(funcol, n, fn)
    return seen


def st_upstream_built_reshard(
    rank: int, world: int, full: torch.Tensor, src_spec: Any, dst_spec: Any
) -> tuple[
    list[tuple[tuple[int, ...], tuple[int, ...]]], list[tuple[tuple[int, ...], torch.Tensor]]
]:
    """A ShardedTensor built by torch itself from a ChunkShardingSpec (empty chunks past the
    end of the dim, CHUNK-2), filled with ``full``'s values, then resharded by us."""
    from torch.distributed._shard import sharded_tensor

    st = sharded_tensor.zeros(src_spec, *full.shape, dtype=full.dtype)
    for s in st.local_shards():
        box = tuple(
            slice(o, o + n) for o, n in zip(s.metadata.shard_offsets, s.metadata.shard_sizes)
        )
        if s.tensor.numel():
            s.tensor.copy_(full[box])
    raw = [(tuple(m.shard_offsets), tuple(m.shard_sizes)) for m in st.metadata().shards_metadata]
    out = reshard_sharded_tensor(st, dst_spec)
    return raw, [(tuple(s.metadata.shard_offsets), s.tensor.clone()) for s in out.local_shards()]


def dt_distribute_scatter(
    rank: int, world: int, full: torch.Tensor, mesh: Any, placements: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream distribute_tensor with its default scatter from rank 0, next to the local
    slicing (src_data_rank=None) of the same tensor."""
    from torch.distributed.tensor import distribute_tensor

    m = _mesh(mesh)
    scattered = distribute_tensor(full, m, placements).to_local().clone()
    sliced = distribute_tensor(full, m, placements, src_data_rank=None).to_local().clone()
    return scattered, sliced


def dt_reshard_warnings(
    rank: int,
    world: int,
    full: torch.Tensor,
    src_mesh: Any,
    src_placements: Any,
    dst_mesh: Any,
    dst_placements: Any,
) -> tuple[list[str], bool, bool]:
    """The warnings our reshard of a DTensor gives, whether its local shard is right, and
    whether torch's own full_tensor() of the result is."""
    import warnings

    from torch.distributed.tensor import distribute_tensor

    dt = distribute_tensor(full, _mesh(src_mesh), src_placements, src_data_rank=None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = reshard_dtensor(dt, _mesh(dst_mesh), dst_placements)
    want = distribute_tensor(full, _mesh(dst_mesh), dst_placements, src_data_rank=None)
    mine = [str(w.message) for w in seen if issubclass(w.category, UserWarning)]
    torch_full = bool(torch.equal(out.full_tensor(), full))
    return mine, bool(torch.equal(out.to_local(), want.to_local())), torch_full
