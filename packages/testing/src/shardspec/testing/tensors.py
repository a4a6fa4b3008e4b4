"""Tensors the tests of several packages build: arbitrary bit patterns, and ShardedTensors of a
Layout on the calling rank."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from shardspec.metadata import Layout


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Arbitrary bit patterns (NaN payloads, -0.0, subnormals): whatever moves or loads a tensor
    must move its bits, not its values."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g, dtype=torch.uint8).bool()
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(0, 256, (n * itemsize,), generator=g, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def make_sharded_tensor(full: torch.Tensor, layout: Layout) -> Any:
    """The ShardedTensor of ``layout`` holding ``full``'s values, built on every rank of the
    default group from this rank's shards (collective)."""
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed._shard.sharded_tensor.shard import Shard as TorchShard

    from shardspec.metadata.shard_metadata import to_sharded_tensor_metadata

    md = to_sharded_tensor_metadata(layout, full.dtype)
    me = dist.get_rank()
    shards = [
        TorchShard(full[s.box.slices()].clone(), m)
        for s, m in zip(layout.shards, md.shards_metadata)
        if s.rank == me
    ]
    return ShardedTensor._init_from_local_shards_and_global_metadata(shards, md)
