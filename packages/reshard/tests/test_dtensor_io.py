"""DTensors made the spec's way on a pool of 4 gloo ranks (spec/06-reshard.md RESHARD-12):
``distribute_dtensor`` puts each coordinate's boxes on the rank at that coordinate, whatever
the mesh's rank order and source rank; ``dtensor_from_local`` refuses, on every rank, local
shards that are not the chunk rule's."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from dtensor_io_cases import distribute, from_local
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from shardspec.metadata.dtensor import dtensor_local_boxes
from shardspec.testing import RankPool, get_pool

WORLD = 4
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120)


def _coord(mesh: Any, rank: int) -> tuple[int, ...]:
    t = torch.tensor(mesh)
    (where,) = (t == rank).nonzero().tolist()
    return tuple(where)


MESHES = [[[3, 2], [1, 0]], [[0, 1], [2, 3]], [2, 0, 3, 1]]
PLACEMENTS = [
    [Shard(1), Shard(0)],
    [Shard(0), Shard(0)],
    [Replicate(), _StridedShard(0, split_factor=2)],
    [Shard(0)],
]


@pytest.mark.rule("RESHARD-12")
@pytest.mark.parametrize("src", [0, 3, None])
@pytest.mark.parametrize(
    ("mesh", "placements"),
    [(m, p) for m, p in itertools.product(MESHES, PLACEMENTS) if len(p) == torch.tensor(m).ndim],
)
def test_distribute_puts_each_coordinates_boxes_on_its_rank(
    pool: RankPool, mesh: Any, placements: Any, src: int | None
) -> None:
    full = torch.arange(7 * 5).reshape(7, 5)  # uneven on both dims: a wrong offset shows
    mesh_shape = torch.tensor(mesh).shape
    for rank, (local, shape, coord) in enumerate(
        pool.call(distribute, full, mesh, placements, src)
    ):
        assert shape == (7, 5)
        assert coord == _coord(mesh, rank)
        boxes = dtensor_local_boxes((7, 5), mesh_shape, placements, coord)
        # Hand-built from the boxes: each dim's runs, in order (DTENSOR-7).
        rows = [
            i
            for b in dict.fromkeys((b.offsets[0], b.sizes[0]) for b in boxes)
            for i in range(b[0], b[0] + b[1])
        ]
        cols = [
            i
            for b in dict.fromkeys((b.offsets[1], b.sizes[1]) for b in boxes)
            for i in range(b[0], b[0] + b[1])
        ]
        want = full[rows][:, cols]
        assert torch.equal(local, want), (
            f"rank {rank} at {coord}: {local.tolist()} != {want.tolist()}"
        )


@pytest.mark.rule("RESHARD-12", "DTENSOR-5")
def test_from_local_accepts_the_chunk_rule_and_rebuilds_the_tensor(pool: RankPool) -> None:
    full = torch.arange(5 * 3).reshape(5, 3)
    locals_ = list(full.chunk(WORLD)) + [full[5:]] * (WORLD - len(full.chunk(WORLD)))
    for rank, got in enumerate(
        pool.call(from_local, locals_, list(range(WORLD)), [Shard(0)], (5, 3))
    ):
        assert isinstance(got, torch.Tensor), f"rank {rank}: {got}"
        assert torch.equal(got, full)


@pytest.mark.rule("RESHARD-12", "DTENSOR-5")
def test_from_local_refuses_a_split_that_is_not_the_chunk_rule_on_every_rank(
    pool: RankPool,
) -> None:
    full = torch.arange(4)
    # 1 + 1 + 1 + 1 is the rule for 4 rows; 2 + 0 + 1 + 1 is not: ranks 0 and 1 are wrong.
    locals_ = [full[0:2], full[2:2], full[2:3], full[3:4]]
    for rank, got in enumerate(
        pool.call(from_local, locals_, list(range(WORLD)), [Shard(0)], (4,))
    ):
        assert isinstance(got, str), f"rank {rank} accepted the shards"
        assert "rank 0 holds (2,), the placements give it (1,)" in got, got
        assert "rank 1 holds (0,), the placements give it (1,)" in got, got
        assert "rank 2 holds" not in got, got
