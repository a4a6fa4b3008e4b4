"""A one-process stand-in for rank ``r`` of a ``w``-rank world (torch's fake process group),
so upstream's DTensor/ShardedTensor helpers can be called without spawning ranks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch.distributed as dist
import torch.distributed.fsdp  # noqa: F401  (tensor.parallel.fsdp imports fsdp circularly)


@contextmanager
def fake_world(rank: int, world_size: int) -> Iterator[None]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.fail("a process group is already initialised in the test process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
