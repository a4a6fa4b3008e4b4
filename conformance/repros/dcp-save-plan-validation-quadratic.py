"""DCP's save-plan validation compares O(n^2) pairs of chunks for column chunks."""

import math
import sys

import torch
import torch.distributed.checkpoint.default_planner as planner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)

DEFECT = {
    "id": "dcp-save-plan-validation-quadratic",
    "title": "DCP _validate_global_plan sweeps the largest dim, quadratic for chunks spanning it",
    "area": "checkpoint",
    "rule": "LAYOUT-4",
    "kind": "performance",
    "probe": "dcp-save-plan-validation",
    "upstream": "pytorch#163548",
    "nproc": 1,
    "torch_does": "the sweep that replaced the all-pairs check (#163548, PR #166820) runs along "
    "the largest dim only (dim 0 for a square tensor); n column chunks all span dim 0, so all "
    "are active together and every pair is compared: n^2 / 2",
    "spec_says": "validation is O(n log n) on chunkings and product grids",
    "tests": [],
}

calls = 0
box_overlap = planner._check_box_overlap


def counting(a: object, b: object) -> bool:
    global calls
    calls += 1
    return box_overlap(a, b)


planner._check_box_overlap = counting
counts = {}
for n in (200, 800):  # a (4n, 4n) tensor saved as n column chunks of 4 columns
    size = torch.Size([4 * n, 4 * n])
    chunks = [
        ChunkStorageMetadata(torch.Size([0, 4 * j]), torch.Size([4 * n, 4])) for j in range(n)
    ]
    md = TensorStorageMetadata(TensorProperties(dtype=torch.float32), size, chunks)
    calls = 0
    errors = planner._validate_global_plan([], Metadata(state_dict_metadata={"w": md}))
    counts[n] = calls
(n0, c0), (n1, c1) = counts.items()
growth = math.log(c1 / c0) / math.log(n1 / n0)
print(f"chunk pairs compared {counts}: growth n^{growth:.2f}")
if growth > 1.25:
    print(
        f"DIVERGES: validating {n1} disjoint column chunks compared {c1} pairs, growing as "
        f"n^{growth:.2f}; the spec says O(n log n)"
    )
    sys.exit(1)
