"""ShardedTensor's overlap check compares O(n^1.5) pairs of shards on a grid layout."""

import math
import sys

import torch.distributed._shard.sharding_spec._internals as internals
from torch.distributed._shard.metadata import ShardMetadata

DEFECT = {
    "id": "validate-overlap-grid-superlinear",
    "title": "validate_non_overlapping_shards_metadata grows as n^1.5 on grid layouts",
    "area": "validation",
    "rule": "LAYOUT-4",
    "kind": "performance",
    "probe": "validate-grid",
    "upstream": None,
    "nproc": 1,
    "torch_does": "sweeps one dim and compares every pair of shards active in the sweep: on a "
    "side x side grid that is side^3 = n^1.5 comparisons (3.1 s for a 316 x 316 grid)",
    "spec_says": "validation is O(n log n) on chunkings and product grids",
    "tests": [],
    "issue_text": """### validate_non_overlapping_shards_metadata is O(n^1.5) on 2-D grids

`torch.distributed._shard.sharding_spec._internals.validate_non_overlapping_shards_metadata`
sorts along one dim and then compares each shard with every shard still active along that
dim. On a `side x side` grid of blocks every block of a row band is active at once, so the
check makes about `side^3 = n^1.5` pairwise comparisons: 3.1 s for a 316 x 316 grid (torch
2.13.0, CPU). A product grid can be checked in O(n log n) (per-dim interval starts), and any
layout with an interval tree / sweep over both dims.

Repro: counts `_check_shard_metadata_pair_overlap` calls for 32x32 and 64x64 grids; the
count grows 4^1.5 = 8x when n grows 4x (expected about 4x for O(n log n)).
""",
}

calls = 0
pair_check = internals._check_shard_metadata_pair_overlap


def counting(a: ShardMetadata, b: ShardMetadata) -> bool:
    global calls
    calls += 1
    return pair_check(a, b)


internals._check_shard_metadata_pair_overlap = counting
counts = {}
for side in (32, 64):  # row i of the grid holds rows [3i, 3i + 3), column j [2j, 2j + 2)
    grid = [
        ShardMetadata([3 * i, 2 * j], [3, 2], f"rank:{i * side + j}/cpu")
        for i in range(side)
        for j in range(side)
    ]
    calls = 0
    internals.validate_non_overlapping_shards_metadata(grid)
    counts[side * side] = calls
(n0, c0), (n1, c1) = counts.items()
growth = math.log(c1 / c0) / math.log(n1 / n0)
print(f"pairs compared: {counts}; growth n^{growth:.2f}")
if growth > 1.25:
    print(
        f"DIVERGES: the overlap check compared {c1} pairs for {n1} grid shards, growing as "
        f"n^{growth:.2f}; the spec says O(n log n) (about n^1.1 over this range)"
    )
    sys.exit(1)
